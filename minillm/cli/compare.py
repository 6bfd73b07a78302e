"""`minillm compare` (naive against KV-cached decode, with the counters) and `minillm traffic`
(every step's counters, as a table or JSON lines)."""

from __future__ import annotations

import json
import time

import numpy as np
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from ..engine.generate import generate
from ..engine.sampling import check_sampling
from ..errors import PromptError
from ..measure import hardware
from ..measure.meter import Meter
from ..measure.threads import add_threads_option, limited
from ..tokenizer import tokenizer
from ..ui import report
from .common import add_model, add_sampling, encode_prompt, load_model, out


def add_compare_arguments(p) -> None:
    p.add_argument("prompt", metavar="PROMPT")
    add_model(p)
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to generate (default 50)")
    add_sampling(p)
    p.add_argument("--rows", type=int, default=12, help="most steps to show per table (default 12)")
    add_threads_option(p)


def add_traffic_arguments(p) -> None:
    add_model(p)
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt length in tokens (default 16)")
    p.add_argument("--steps", type=int, default=8, help="decode steps after the prefill (default 8)")
    p.add_argument("--no-cache", action="store_true", help="naive decode instead of KV-cached")
    p.add_argument("--json", action="store_true", help="one JSON object per step, for scripts")
    add_threads_option(p)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_compare(args) -> int:
    with limited(args.threads):
        return _compare(args)


def _compare(args) -> int:
    check_sampling(args.temperature, args.top_k, args.top_p, args.seed)
    model = load_model(args.model)
    ids = encode_prompt(model, args.prompt, args.max_new_tokens)
    hw = hardware.machine(progress=True)
    enc = tokenizer()
    generate(model, ids, min(2, args.max_new_tokens))   # warm-up: first touches of weights and cache pages
    runs = {}
    for path, kv in (("cached", True), ("naive", False)):
        with out.status(f"[bold]{path} decode[/]: {args.max_new_tokens} tokens with {escape(model.name)}…"):
            with Meter() as m:
                t0 = time.perf_counter()
                new = generate(model, ids, args.max_new_tokens, kv_cache=kv, temperature=args.temperature,
                               top_k=args.top_k, top_p=args.top_p, seed=args.seed)
                seconds = time.perf_counter() - t0
        runs[path] = (new, m, seconds)
    (new_c, m_c, s_c), (new_n, m_n, s_n) = runs["cached"], runs["naive"]

    out.print(Text(repr(model), style="bold"))
    out.print(f"prompt: {len(ids)} tokens, {args.max_new_tokens} new tokens, "
              f"{'greedy' if args.temperature == 0 else f'temperature {args.temperature}, seed {args.seed}'}")
    out.print(Panel(Text(args.prompt + enc.decode(new_c)), title="KV-cached", title_align="left"))
    out.print(Panel(Text(args.prompt + enc.decode(new_n)), title="naive (recompute everything)", title_align="left"))
    diff = first_difference(new_c, new_n)
    if diff is None:
        out.print(f"[green]✓ identical tokens[/] ({len(new_c)} of {len(new_c)})")
    else:
        out.print(f"[red]✗ the tokens differ from new token {diff}[/] (cached {new_c[diff]}, naive {new_n[diff]})")

    note = report.cache_note(model.nbytes(), hw)
    if note:   # said first: a cache-resident model does not show the memory wall this command is about
        out.print(Panel(Text(note), title="cache-resident model", title_align="left", border_style="yellow"))
    rows = report.select(m_c.steps, args.rows)
    w = out.width
    out.print(report.steps_table(m_c.steps, hw, "KV-cached: prefill once, then one token per step", rows, width=w))
    out.print(report.steps_table(m_n.steps, hw, "Naive: every step runs the whole sequence again", rows, width=w))

    for path, (new, m, seconds) in runs.items():
        out.print(f"[bold]{path:6}[/] {fmt_total(m, seconds, len(new))}")
    out.print(f"[bold]speedup of the KV cache: {s_n / s_c:.2f}×[/] in time, "
              f"{m_n.total('total_flops') / m_c.total('total_flops'):.1f}× fewer FLOPs, "
              f"{m_n.total('total_bytes') / m_c.total('total_bytes'):.2f}× fewer bytes")

    out.print("\n[bold]Verdict[/]")
    out.print("• " + report.verdict(m_c.steps[0], hw, "prefill"))
    if len(m_c.steps) > 1:
        out.print("• " + report.verdict(m_c.steps[-1], hw, "cached"))
        out.print("• " + report.verdict(m_n.steps[-1], hw, "naive"))
    if note:
        out.print("[yellow]• cache-resident: the weights came from the CPU cache, so these verdicts describe "
                  "the cache, not DRAM (try --model random-124m)[/]")
    out.print(f"[dim]this machine: {escape(hardware.provenance(hw))}[/]")
    return 0


def fmt_total(m: Meter, seconds: float, n_new: int) -> str:
    return (f"{seconds:.3f} s for {n_new} tokens ({n_new / seconds:.1f} tokens/s), "
            f"{report.fmt_flops(m.total('total_flops'))}, {report.fmt_bytes(m.total('total_bytes'))} moved")


# -- traffic -------------------------------------------------------------------------------------

def run_traffic(args) -> int:
    with limited(args.threads):
        return _traffic(args)


def _traffic(args) -> int:
    model = load_model(args.model)
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
