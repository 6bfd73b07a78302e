"""`minillm compare` (naive, KV-cached and speculative decode side by side, with the counters) and
`minillm traffic` (every step's counters, as a table or JSON lines)."""

from __future__ import annotations

import json
import time

import numpy as np
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from ..engine.generate import generate
from ..engine.sampling import check_sampling
from ..engine.speculative import check_k, speculative_generate
from ..errors import PromptError
from ..measure import hardware
from ..measure.gpu import as_hardware, gpu_figures, summary as gpu_summary
from ..meter import Meter
from ..bpe import tokenizer
from ..ui import report
from .common import (add_model, add_sampling, add_speculative, encode_prompt, load_draft, load_model, model_options,
                     note_if_busy, out, warm_up)


def add_compare_arguments(p) -> None:
    p.add_argument("prompt", metavar="PROMPT")
    add_model(p)
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to generate (default 50)")
    add_sampling(p)
    p.add_argument("--rows", type=int, default=12, help="most steps to show per table (default 12)")
    add_speculative(p, default="ngram")


def add_traffic_arguments(p) -> None:
    add_model(p)
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt length in tokens (default 16)")
    p.add_argument("--steps", type=int, default=8, help="decode steps after the prefill (default 8)")
    p.add_argument("--no-cache", action="store_true", help="naive decode instead of KV-cached")
    p.add_argument("--json", action="store_true", help="one JSON object per step, for scripts")


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_compare(args) -> int:
    check_sampling(args.temperature, args.top_k, args.top_p, args.seed)
    check_k(args.speculate_k, "--speculate-k")   # before loading anything
    model = load_model(args.model, args.weights, args.device, getattr(args, "kernels", None),
                       options=model_options(args))
    ids = encode_prompt(model, args.prompt, args.max_new_tokens)
    draft = load_draft(args.draft, model, getattr(args, "weights", None))
    hw = hardware.machine(progress=True)
    gpu = gpu_figures()                                   # None without a GPU
    if model.device.is_gpu:                               # the roofline of the chip the model runs on
        hw = as_hardware(gpu, model.dtype.name)
    note_if_busy(args)
    enc = tokenizer(model)
    warm_up(model, ids)          # first touches of weights and cache pages; the fused kernels compiled
    runs = {}
    for path, kv in (("cached", True), ("naive", False)):
        with out.status(f"[bold]{path} decode[/]: {args.max_new_tokens} tokens with {escape(model.name)}…"):
            with Meter() as m:
                t0 = time.perf_counter()
                new = generate(model, ids, args.max_new_tokens, kv_cache=kv, temperature=args.temperature,
                               top_k=args.top_k, top_p=args.top_p, seed=args.seed)
                seconds = time.perf_counter() - t0
        runs[path] = (new, m, seconds)
    spec = None
    if draft is not None:
        name = "ngram" if draft == "ngram" else draft.name
        with out.status(f"[bold]speculative decode[/]: draft {escape(name)}, k {args.speculate_k}…"):
            with Meter() as m:
                t0 = time.perf_counter()
                new, stats = speculative_generate(model, ids, args.max_new_tokens, draft=draft, k=args.speculate_k,
                                                  temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                                  seed=args.seed)
                seconds = time.perf_counter() - t0
        runs["speculative"] = (new, m, seconds)
        spec = stats
    (new_c, m_c, s_c), (new_n, m_n, s_n) = runs["cached"], runs["naive"]

    out.print(Text(repr(model), style="bold"))
    out.print(f"prompt: {len(ids)} tokens, {args.max_new_tokens} new tokens, "
              f"{'greedy' if args.temperature == 0 else f'temperature {args.temperature}, seed {args.seed}'}")
    out.print(Panel(Text(args.prompt + enc.decode(new_c)), title="KV-cached", title_align="left"))
    out.print(Panel(Text(args.prompt + enc.decode(new_n)), title="naive (recompute everything)", title_align="left"))
    if spec is not None:
        out.print(Panel(Text(args.prompt + enc.decode(runs["speculative"][0])),
                        title=f"speculative (draft {spec.draft}, k {spec.k})", title_align="left"))
    others = [("naive", new_n)] + ([("speculative", runs["speculative"][0])] if spec is not None else [])
    for path, new in others:
        diff = first_difference(new_c, new)
        if diff is None:
            out.print(f"[green]✓ {path}: identical tokens to cached[/] ({len(new_c)} of {len(new_c)})")
        elif path == "speculative" and args.temperature > 0:
            out.print(f"[dim]• speculative sampling: each token follows the model's own distribution, but the "
                      f"random draws differ, so the text may too (from new token {diff})[/]")
        else:
            out.print(f"[red]✗ {path}: the tokens differ from cached from new token {diff}[/] "
                      f"(cached {new_c[diff]}, {path} {new[diff]})")

    decode_gbs = [r.gbps for r in m_c.of_kind("decode")]
    step_gbs = sorted(decode_gbs)[len(decode_gbs) // 2] if decode_gbs and not model.device.is_gpu else None
    note = report.cache_note(model.nbytes(), hw, step_gbs, args.model or model.name)
    if note:   # said first: a cache-resident run does not show the memory wall this command is about
        out.print(Panel(Text(note), title="cache-resident model", title_align="left", border_style="yellow"))
    rows = report.select(m_c.steps, args.rows)
    w = out.width
    out.print(report.steps_table(m_c.steps, hw, "KV-cached: prefill once, then one token per step", rows, width=w))
    out.print(report.steps_table(m_n.steps, hw, "Naive: every step runs the whole sequence again", rows, width=w))

    for path, (new, m, seconds) in runs.items():
        out.print(f"[bold]{path:6}[/] {fmt_total(m, seconds, len(new))}")
    out.print(f"[bold]speedup of the KV cache: {s_n / s_c:.2f}×[/] in time (one run of each: `minillm bench` "
              "times them over rounds), "
              f"{m_n.totals().flops / m_c.totals().flops:.1f}× fewer FLOPs, "
              f"{m_n.totals().bytes / m_c.totals().bytes:.2f}× fewer bytes")
    if spec is not None:
        out.print(speculative_summary(spec, m_c, runs["speculative"][2], s_c))

    out.print("\n[bold]Verdict[/]")
    out.print("• " + report.verdict(m_c.steps[0], hw, "prefill"))
    if len(m_c.steps) > 1:
        out.print("• " + report.verdict(m_c.steps[-1], hw, "cached"))
        out.print("• " + report.verdict(m_n.steps[-1], hw, "naive"))
    if note:
        out.print("[yellow]• cache-resident, by this run's GB/s: these verdicts describe a cache, not DRAM[/]")
    if not model.device.is_gpu:
        out.print(f"[dim]this machine: {escape(hardware.provenance(hw))}[/]")
    if gpu:
        out.print(f"[dim]{'ran on the' if model.device.is_gpu else 'beside it, a'} {escape(gpu_summary(gpu))}[/]")
    return 0


def speculative_summary(stats, m_cached: Meter, s_spec: float, s_cached: float) -> str:
    """The speculative run against cached decode: guesses kept, tokens per weight read, bytes per token."""
    decode = m_cached.totals("decode")
    if not stats.rounds:
        return "[bold]speculative[/]: one token only, from the prefill: nothing to guess"
    plain = decode.bytes / decode.steps if decode.steps else 0.0
    per = (f"{report.fmt_bytes(stats.bytes_per_token)} moved per token kept "
           f"(draft {report.fmt_bytes(stats.draft_bytes / stats.kept)}, model {report.fmt_bytes(stats.target_bytes / stats.kept)})")
    if plain:
        per += f" against {report.fmt_bytes(plain)} per cached decode step"
    return (f"[bold]speculative: {s_cached / s_spec:.2f}× the speed of cached decode[/] (one run of each: "
            f"`minillm bench --speculate` ranks them over rounds); {stats.accepted} of "
            f"{stats.drafted} guesses accepted ({stats.acceptance_rate:.0%}), {stats.tokens_per_round:.2f} tokens per "
            f"step of the model ({len(stats.rounds)} steps); {per}")


def fmt_total(m: Meter, seconds: float, n_new: int) -> str:
    return (f"{seconds:.3f} s for {n_new} tokens ({n_new / seconds:.1f} tokens/s), "
            f"{report.fmt_flops(m.totals().flops)}, {report.fmt_bytes(m.totals().bytes)} moved")


# -- traffic -------------------------------------------------------------------------------------

def run_traffic(args) -> int:
    model = load_model(args.model, args.weights, args.device, getattr(args, "kernels", None),
                       options=model_options(args))
    c = model.config
    if args.prompt_tokens < 1 or args.steps < 1:
        raise PromptError("--prompt-tokens and --steps must be at least 1")
    if args.prompt_tokens >= c.n_ctx:
        raise PromptError(f"--prompt-tokens {args.prompt_tokens} does not fit {escape(model.name)}'s context of "
                          f"{c.n_ctx} tokens with room for a decode step: give at most {c.n_ctx - 1}")
    if args.prompt_tokens + args.steps > c.n_ctx:
        raise PromptError(f"--prompt-tokens {args.prompt_tokens} + --steps {args.steps} is beyond the context of "
                          f"{c.n_ctx}: with this prompt at most {c.n_ctx - args.prompt_tokens} steps fit")
    ids = np.random.default_rng(0).integers(0, c.vocab_size, args.prompt_tokens)   # a seeded random prompt
    note_if_busy(args)                       # on stderr: --json too
    warm_up(model, ids, kv_cache=not args.no_cache)     # compile time is not a step (said when it is long)
    with Meter() as m:   # the prefill, then --steps decode steps (the prefill gives the first new token)
        generate(model, ids, args.steps + 1, kv_cache=not args.no_cache)
    if args.json:
        for r in m.steps:
            print(json.dumps(r.as_dict()))
        return 0
    hw = hardware.machine(progress=True)
    title = f"{escape(model.name)}: {'naive' if args.no_cache else 'KV-cached'} decode, {args.prompt_tokens}-token prompt"
    out.print(report.steps_table(m.steps, hw, title, width=out.width))
    return 0
