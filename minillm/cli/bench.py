"""`minillm bench`: decode against the matrix-vector ceiling per context length (default), batched
decode against the roofline (--batch), speculative decoding against plain decode (--speculate), or
several models' decode step against the context, interleaved (--context-sweep).
The measurements live in `minillm.measure` (bench, batching, speculation); this module runs them
with a progress bar on stderr and prints their tables: this module is the command, its flags and
the table of its modes (MODES), each mode's run and tables in cli/bench_modes.py, what its lists
mean in cli/bench_options.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from rich.markup import escape

from ..checkpoints.load import load
from ..engine.speculative import MAX_K
from ..errors import MiniLLMError
from ..measure.batching import check_batches
from ..models import kernel_sets
from ..measure.bench import check_contexts
from ..measure.gpu import gpu_figures, summary as gpu_summary
from ..measure.hardware import machine
from ..backend import get_device
from ..measure.busy import conditions
from ..measure.comparisons import comparison_threads
from ..threads import blas_kernel, blas_name, blas_spin, blas_threads, limited
from ..trace import TraceMeter, check_path, trace_line, write_trace
from .bench_modes import bench_batches, bench_context_sweep, bench_contexts, bench_speculation, bench_weights
from .bench_options import (DEFAULT_CONTEXTS, kernels_title, parse_contexts, parse_kernels,
                            parse_option_values)
from .common import add_options, add_trace, err, out

TRACE_STEPS = 8      # --trace: decode steps traced after the prefill, for each model measured


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None,
                        help="model to benchmark (default random-124m; with --speculate, the bundled large model); "
                             "with --batch, several comma-separated, measured in the same interleaved rounds "
                             "(e.g. random-moe-16x2,random-moe-16x2-dense)")
    parser.add_argument("--contexts", default=None,
                        help="comma-separated context lengths (default 16,128,512,1000; with --context-sweep "
                             "256,512,...,16384)")
    parser.add_argument("--context-sweep", action="store_true",
                        help="instead: the decode step's time and bytes (weights, KV, a hybrid's state) against the "
                             "context for each --model (default random-hybrid,random-hybrid-full), interleaved, "
                             "and the context where the first becomes the cheaper")
    parser.add_argument("--repeats", type=int, default=6,
                        help="interleaved rounds, the order alternated; medians are reported, and a verdict needs "
                             "6, the fewest a sign test at 5%% ranks (default 6). With --batch and 6 or more, "
                             "rounds are added, up to 12, until each B against B = 1 is ranked or can no "
                             "longer be; the table says how many ran")
    parser.add_argument("--batch", default=None, metavar="B,B,...",
                        help="instead: decode with B sequences at once, for each B (e.g. 1,2,4,8,16,32), against "
                             "the roofline and bare passes over the weights; shows this machine's critical batch")
    parser.add_argument("--batch-context", type=int, default=16, metavar="N",
                        help="with --batch: prompt length of every sequence (default 16)")
    parser.add_argument("--speculate", default=None, metavar="K,K,...",
                        help="instead: speculative decoding with K guesses per round, for each K (e.g. 1,2,4,8), "
                             "against plain cached decode, on real held-out text")
    parser.add_argument("--draft", default="ngram,small", metavar="D,D,...",
                        help="with --speculate: the drafts, 'ngram' and/or models (default ngram,small)")
    parser.add_argument("--prompts", type=int, default=4, metavar="N",
                        help="with --speculate: prompts from the held-out text (default 4)")
    parser.add_argument("--new-tokens", type=int, default=48, metavar="N",
                        help="with --speculate: greedy tokens per prompt (default 48)")
    parser.add_argument("--weights", default=None, metavar="W,W,...",
                        help="instead: decode and prefill with the model's weights in each format (float32, "
                             "q8_0, q4_0, q4_1; native: a GGUF's own, e.g. SmolLM2's Q4_1), interleaved: bytes per step, tokens/s, %% of each format's own "
                             "ceiling, the widening's share (at the first of --contexts)")
    parser.add_argument("--kernels", default=None, metavar="K,K",
                        help=f"kernel sets: {', '.join(kernel_sets.NAMES)}, several comma-separated side by side "
                             "in one interleaved run with --weights or --batch (e.g. numpy,fused,int8; "
                             "fused,batch-invariant: what batch invariance costs, prefill too); default: "
                             f"{kernel_sets.default_described()} (said in the title)")
    add_options(parser, several=True)       # --mla-decode, ...: from the families' rows
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    add_trace(parser, f"; after the measurements, a prefill of the first context and {TRACE_STEPS} decode steps "
                      "of each model, weight format and kernel set measured, each on a track of its own")
    parser.add_argument("--device", default="cpu", metavar="DEVICE",
                        help="cpu (default): bench measures NumPy on this CPU; a GPU's figures are printed beside")


def run(args) -> int:
    """Every timed side of a bench runs on one thread count: the one asked for (or BLAS's) on a quiet
    machine, one on a busy one (the note says so, on stderr, --json too; the JSON's `conditions` too).
    --trace: after the measurements, on the same threads (`trace_runs`)."""
    if getattr(args, "trace", None) is not None:
        check_path(args.trace)                   # before measuring anything
    if getattr(args, "contexts", None) is not None:
        parse_contexts(args.contexts)            # a bad list is one line before the machine is probed
    threads, why = comparison_threads(getattr(args, "threads", None), default=blas_threads())
    if why:
        err.print(f"[yellow]note:[/] {escape(why)}", soft_wrap=False)
    args.conditions = conditions(threads, why)
    with limited(threads):
        rc = _run(args)
        if getattr(args, "trace", None) is not None and rc == 0:
            trace_runs(args)
    return rc


def trace_runs(args) -> None:
    """--trace: what each measured model, format and kernel set does in a prefill and TRACE_STEPS decode
    steps, outside the timed rounds, one track each, in one file."""
    import numpy as np
    formats = [w.strip() for w in args.weights.split(",") if w.strip()] if args.weights else ["float32"]
    kernels = parse_kernels(args.kernels) if args.kernels is not None else [None]
    if args.weights is None and args.kernels is None:
        kernels = parse_kernels(None)
    names = [n.strip() for n in (args.model or "").split(",") if n.strip()] or \
        [args.model or ("large" if args.speculate is not None else "random-124m")]
    n = args.batch_context if args.batch is not None else parse_contexts(DEFAULT_CONTEXTS if args.contexts is None else args.contexts)[0]
    meters, origin = [], None
    for name in names:
        for w in formats:
            for k in kernels:
                model = load(name, weights=w, kernels=k)
                prompt = np.random.default_rng(0).integers(0, model.config.vocab_size, n)
                tm = TraceMeter(f"{model.name}, {model.weights} weights, {model.kernels} kernels", pid=len(meters) + 1,
                                origin=origin)
                origin = tm._origin
                with tm:
                    logits, cache = model.prefill(prompt)
                    for _ in range(min(TRACE_STEPS, model.config.n_ctx - n - 1)):
                        logits = model.decode_step(int(np.argmax(logits[-1] if logits.ndim > 1 else logits)), cache)
                meters.append(tm)
    write_trace(meters, args.trace)
    (err if args.json else out).print(f"[dim]{escape(trace_line(args.trace, meters))}[/]", soft_wrap=False)


def given(args, flag: str) -> bool:
    """Was this flag given on the command line (a value, or a switch that is on)?"""
    return vars(args).get(flag[2:].replace("-", "_")) not in (None, False)


def chosen_mode(args) -> "Mode":
    """The mode the flags ask for (MODES, the first given; none: the context lengths), and one line
    when a flag it does not combine with is given too."""
    mode = next(m for m in MODES if m.flag is None or given(args, m.flag))
    clash = [f for f in mode.excludes if given(args, f)]
    if clash:
        listed = clash[0] if len(clash) == 1 else f"{', '.join(clash[:-1])} and {clash[-1]}"
        raise MiniLLMError(f"{mode.flag} {mode.what}: leave out {listed}")
    return mode


def _run(args) -> int:
    return chosen_mode(args).run(args)


def _checked(args) -> tuple[list[int], list[str]]:
    """What every mode but the sweep checks first: the contexts, the kernel sets, the repeats, a CPU."""
    contexts = parse_contexts(DEFAULT_CONTEXTS if args.contexts is None else args.contexts)
    kernels = args.kernel_list = parse_kernels(args.kernels)
    if args.repeats < 1:
        raise MiniLLMError(f"--repeats {args.repeats}: must be at least 1")
    if get_device(args.device).is_gpu:       # without a GPU: get_device's one line
        raise MiniLLMError("bench measures the CPU's NumPy steps against its bare passes (a GPU's figures are "
                           "printed beside them); a model's steps on the GPU: minillm learn 17, or "
                           "python benchmarks/gpu_check.py")
    return contexts, kernels


def _bench_formats(args) -> int:
    """--weights: each weight format's decode and prefill, interleaved (measure/quantization.py)."""
    _, kernels = _checked(args)
    from ..measure.quantization import parse_formats
    parse_formats(args.weights)
    return bench_weights(args, machine(progress=not args.json), kernels if args.kernels is not None else None)


def _bench_steps(args) -> int:
    """The model's steps: decode against the context lengths (the default), --batch's batched decode
    against the roofline, or --speculate's drafts against plain decode."""
    batches = parse_contexts(args.batch, "--batch") if args.batch is not None else None
    ks = parse_contexts(args.speculate, "--speculate") if args.speculate is not None else None
    if ks is not None:
        if not ks or any(not 1 <= k <= MAX_K for k in ks):
            raise MiniLLMError(f"--speculate {args.speculate}: each K must be 1 to {MAX_K}, e.g. 1,2,4,8")
        if args.prompts < 1 or args.new_tokens < 2:
            raise MiniLLMError("--prompts must be at least 1 and --new-tokens at least 2")
    contexts, kernels = _checked(args)
    if len(kernels) > 1 and batches is None:
        raise MiniLLMError(f"--kernels {','.join(kernels)} compares kernel sets with --weights or --batch: give one of "
                           "them (or one kernel set)")
    first = {name: values[0] for name, values in parse_option_values(args).items()}
    names = [n.strip() for n in (args.model or "").split(",") if n.strip()] if batches is not None else []
    names = names or [args.model or ("large" if ks is not None else "random-124m")]
    models = {}
    for n in names:                                   # each model once per kernel, all in the same rounds
        for k in kernels:
            m = load(n, kernels=k, options=first)
            if batches is not None:
                check_batches(m, batches, args.batch_context)
            label = m.name if len(kernels) == 1 else f"{m.name} {k}"
            models[label if label not in models else f"{label} ({len(models) + 1})"] = m
    model = next(iter(models.values()))
    if batches is not None:
        check_batches(model, batches, args.batch_context)
    elif ks is None:
        check_contexts(model, contexts)
    hw = machine(progress=not args.json)     # this thread count's figures (measured once, then cached)
    if ks is not None:
        result, show = bench_speculation(args, model, ks, hw)
    elif batches is not None:
        result, show = bench_batches(args, models, batches, hw)
    else:
        result, show = bench_contexts(args, model, contexts, hw)
    result.update(threads=blas_threads(), blas=blas_name(), blas_kernel=blas_kernel(), blas_spin=blas_spin(),
                  kernels=kernels, kernels_title=kernels_title(kernels), conditions=args.conditions)
    gpu = gpu_figures() if ks is None else None          # this machine's GPU beside the CPU (None: no GPU)
    if gpu:
        result["gpu"] = gpu
    if args.json:
        print(json.dumps(result))
    else:
        show()
        if gpu:
            out.print(f"[dim]beside it, {escape(gpu_summary(gpu))}[/]")
    return 0


@dataclass(frozen=True)
class Mode:
    """One thing bench measures: the flag that asks for it (None: the default), what it measures (for
    a refusal), the flags it does not combine with, and what runs it (args -> exit code)."""
    flag: str | None
    what: str
    excludes: tuple[str, ...]
    run: Callable[..., int]


MODES = (
    Mode("--context-sweep", "measures batch-1 decode against the context", ("--batch", "--speculate", "--weights"),
         bench_context_sweep),
    Mode("--weights", "measures weight formats alone", ("--batch", "--speculate"), _bench_formats),
    Mode("--speculate", "measures speculative decoding against plain decode", ("--batch",), _bench_steps),
    Mode("--batch", "measures batched decode against the roofline", (), _bench_steps),
    Mode(None, "measures decode against the context lengths", (), _bench_steps),
)
