"""The `minillm` command. Each subcommand is a small function; user errors print one red line."""

from __future__ import annotations

import argparse
import codecs
import json
import sys
import time

import numpy as np
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from .. import __version__
from ..measure import hardware
from ..ui import report
from ..errors import MiniLLMError, PromptError
from ..engine.generate import check_fits, check_sampling, generate
from ..checkpoints.load import load, model_names
from ..measure.meter import Meter
from ..tokenizer import tokenizer

out = report.console()
err = report.console(stderr=True)

MODEL_HELP = ("checkpoint directory or .safetensors file, or a name: " + ", ".join(model_names()))


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, metavar="MODEL", help=MODEL_HELP + " (default: the bundled model)")


def add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); higher = more random")
    p.add_argument("--top-k", type=int, default=None, help="sample only from the K most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample only from the smallest set reaching probability P")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling: the same seed gives the same text")


def load_model(source):
    """`load`, with a spinner on stderr while it works (random-1558m takes a while to build)."""
    with err.status(f"loading {escape(str(source or 'the bundled model'))}…"):
        return load(source)


def encode_prompt(model, prompt: str, max_new_tokens: int) -> np.ndarray:
    """Tokenize a prompt and check, before any work, that it fits the model's vocabulary and context."""
    if not prompt:
        raise PromptError("the prompt is empty: give some text to continue, e.g. \"ROMEO:\"")
    ids = tokenizer().encode(prompt, allowed_special={"<|endoftext|>"})
    ids = model.check_ids(ids)
    if max_new_tokens < 1:
        raise PromptError(f"--max-new-tokens {max_new_tokens}: must be at least 1")
    check_fits(ids.size, max_new_tokens, model.config.n_ctx)
    return ids


class TextStream:
    """Print tokens as they come; a character split across tokens is held until it is whole."""

    def __init__(self) -> None:
        self.enc = tokenizer()
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token: int) -> None:
        sys.stdout.write(self.utf8.decode(self.enc.decode_single_token_bytes(token)))
        sys.stdout.flush()


# -- generate ------------------------------------------------------------------------------------

def cmd_generate(args) -> int:
    check_sampling(args.temperature, args.top_k, args.top_p, args.seed)
    model = load_model(args.model)
    ids = encode_prompt(model, args.prompt, args.max_new_tokens)
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    t0 = time.perf_counter()
    new = generate(model, ids, args.max_new_tokens, kv_cache=not args.no_cache, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p, seed=args.seed, on_token=TextStream())
    seconds = time.perf_counter() - t0
    sys.stdout.write("\n")
    sys.stdout.flush()
    err.print(f"[dim]{len(new)} tokens in {seconds:.2f} s ({len(new) / seconds:.1f} tokens/s), "
              f"{'naive (no KV cache)' if args.no_cache else 'KV-cached'}, model {escape(model.name)}[/]")
    return 0


# -- compare -------------------------------------------------------------------------------------

def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def cmd_compare(args) -> int:
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

    rows = report.select(m_c.steps, args.rows)
    out.print(report.steps_table(m_c.steps, hw, "KV-cached: prefill once, then one token per step", rows))
    out.print(report.steps_table(m_n.steps, hw, "Naive: every step runs the whole sequence again", rows))

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
    note = report.cache_note(model.nbytes(), hw)
    if note:
        out.print(f"[yellow]{note}[/]")
    out.print(f"[dim]this machine: {hw.bandwidth_gbs:.1f} GB/s ({hw.method}), {hw.peak_gflops:.0f} GFLOP/s "
              f"float32 matmul, measured {hw.measured_at} (minillm hardware --remeasure to redo)[/]")
    return 0


def fmt_total(m: Meter, seconds: float, n_new: int) -> str:
    return (f"{seconds:.3f} s for {n_new} tokens ({n_new / seconds:.1f} tokens/s), "
            f"{report.fmt_flops(m.total('total_flops'))}, {report.fmt_bytes(m.total('total_bytes'))} moved")


# -- traffic -------------------------------------------------------------------------------------

def cmd_traffic(args) -> int:
    model = load_model(args.model)
    c = model.config
    if args.prompt_tokens < 1 or args.steps < 1:
        raise PromptError("--prompt-tokens and --steps must be at least 1")
    if args.prompt_tokens + args.steps > c.n_ctx:
        raise PromptError(f"--prompt-tokens {args.prompt_tokens} + --steps {args.steps} is beyond the context of "
                          f"{c.n_ctx}: at most {c.n_ctx - args.prompt_tokens} steps fit")
    ids = np.random.default_rng(0).integers(0, c.vocab_size, args.prompt_tokens)   # a seeded random prompt
    with Meter() as m:
        generate(model, ids, args.steps, kv_cache=not args.no_cache)
    if args.json:
        for r in m.steps:
            print(json.dumps(r.as_dict()))
        return 0
    hw = hardware.machine(progress=True)
    title = f"{escape(model.name)}: {'naive' if args.no_cache else 'KV-cached'} decode, {args.prompt_tokens}-token prompt"
    out.print(report.steps_table(m.steps, hw, title))
    return 0


# -- the parser ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minillm",
        description="A from-scratch GPT-2 in NumPy that shows where inference time goes: prefill is "
                    "compute-bound, decode is memory-bound, measured on your machine.",
        epilog="Start with `minillm learn`, or `minillm compare \"ROMEO:\"`.")
    parser.add_argument("--version", action="version", version=f"minillm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("generate", help="continue a prompt, streaming the text",
                       description="Continue PROMPT with the model, printing tokens as they are generated.")
    p.add_argument("prompt", metavar="PROMPT")
    add_model(p)
    p.add_argument("--max-new-tokens", type=int, default=100, help="how many tokens to generate (default 100)")
    add_sampling(p)
    p.add_argument("--no-cache", action="store_true", help="naive decode: recompute the whole sequence every step")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("compare", help="naive vs KV-cached decode, step by step, with the counters",
                       description="Run naive and KV-cached decode on the same prompt with the same sampling; "
                                   "show both texts, whether the tokens are identical, per-step FLOPs and bytes "
                                   "against this machine's measured bandwidth, and a verdict.")
    p.add_argument("prompt", metavar="PROMPT")
    add_model(p)
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens to generate (default 50)")
    add_sampling(p)
    p.add_argument("--rows", type=int, default=12, help="most steps to show per table (default 12)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("traffic", help="per-step memory traffic and FLOPs, as a table or JSON lines",
                       description="Generate from a seeded random prompt and print every step's counters.")
    add_model(p)
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt length in tokens (default 16)")
    p.add_argument("--steps", type=int, default=8, help="tokens to generate (default 8)")
    p.add_argument("--no-cache", action="store_true", help="naive decode instead of KV-cached")
    p.add_argument("--json", action="store_true", help="one JSON object per step, for scripts")
    p.set_defaults(func=cmd_traffic)

    p = sub.add_parser("hardware", help="this machine's measured bandwidth and peak, presets, decode ceilings",
                       description="Measure (once, then cached) this machine's memory bandwidth and float32 "
                                   "matmul peak; show known chips; compute the decode ceiling of a model size.")
    hardware.add_arguments(p)
    p.set_defaults(func=hardware.run)

    from ..measure import bench
    from ..checkpoints import download
    from ..cli import learn
    from ..training import train
    p = sub.add_parser("learn", help="the lessons: from tokens to why decode is memory-bound",
                       description="List the lessons, or run lesson NN. Every number a lesson shows is measured live.")
    learn.add_arguments(p)
    p.set_defaults(func=learn.run)

    p = sub.add_parser("train", help="train a small GPT-2 from scratch in NumPy (hand-written backward)",
                       description="Train a GPT-2 on a text file with the GPT-2 tokenizer; checkpoints are written "
                                   "atomically in the Hugging Face layout.")
    train.add_arguments(p)
    p.set_defaults(func=train.run)

    p = sub.add_parser("eval", help="held-out loss of a model on the last 10%% of a text",
                       description="Mean cross-entropy (nats/token) on the last 10%% of the text's tokens, in "
                                   "windows of the model's context.")
    train.add_eval_arguments(p)
    p.set_defaults(func=train.run_eval)

    p = sub.add_parser("bench", help="decode speed against the matrix-vector ceiling, per context length",
                       description="Benchmark cached decode, naive decode and prefill at several context lengths, "
                                   "beside a bare NumPy matrix-vector pass over the same weights (the ceiling).")
    bench.add_arguments(p)
    p.set_defaults(func=bench.run)

    p = sub.add_parser("download", help="fetch a real GPT-2 checkpoint (the only command that uses the network)",
                       description="Download a GPT-2 checkpoint from Hugging Face into ~/.cache/minillm "
                                   "(or $MINILLM_HOME), resuming and verifying it.")
    download.add_arguments(p)
    p.set_defaults(func=download.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except MiniLLMError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
