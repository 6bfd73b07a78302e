"""`minillm bench`: is decode running at the speed of memory?

For each context length it measures, interleaved and repeated (medians reported):
  - cached decode: one decode_step at that position, tokens/s and achieved GB/s;
  - naive decode: one forward over that many tokens (LM head on the last only), tokens/s;
  - prefill of that many tokens, seconds;
and, in the same run, the **matrix-vector ceiling**: a bare NumPy pass over every weight a decode
step reads (each linear layer and the LM head as one vector-matrix product, nothing else). A decode
step cannot beat it; the gap between the two is Python and the small operations.

It also measures the two weight layouts a matrix-vector product can stream ([in, out] as the
checkpoint stores them, `x @ W`; and [out, in], `W @ x`), and the cost of the meter: the decode step
with no meter active against the same step with the counting code removed from the operations.
"""

from __future__ import annotations

import ast
import inspect
import json
import statistics
import textwrap
import time
import types
from contextlib import contextmanager

import numpy as np

from ..measure import hardware
from ..cache import contiguous as kvcache
from ..models import ops, plan
from ..errors import MiniLLMError
from ..checkpoints.load import load
from ..meter import Meter
from .threads import add_threads_option, blas_kernel, blas_name, blas_threads, limited


# -- the ceiling ---------------------------------------------------------------------------------

def decode_weights(model) -> list[np.ndarray]:
    """The matrices of every linear layer a decode step multiplies a vector by (the LM head's wte aside)."""
    return [p[name] for p in model.blocks
            for name in ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")]


def matvec_pass(mats: list[np.ndarray], head: np.ndarray) -> None:
    """One vector through every [in, out] matrix (x @ W), then the LM head stored [d, V]: the engine's layout."""
    for w in mats:
        np.ones((1, w.shape[0]), dtype=w.dtype) @ w
    np.ones((1, head.shape[0]), dtype=head.dtype) @ head


def matvec_pass_out_in(mats_t: list[np.ndarray], wte: np.ndarray) -> None:
    """The other layout: every matrix stored [out, in] (W @ x), the LM head as the checkpoint's [V, d]."""
    for w in mats_t:
        w @ np.ones(w.shape[1], dtype=w.dtype)
    wte @ np.ones(wte.shape[1], dtype=wte.dtype)


# -- the meter's cost ----------------------------------------------------------------------------

def _strip_meter(fn) -> types.FunctionType:
    """A copy of `fn` with its meter report removed (`m = meter.active()` and `if m is not None: ...`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    func = tree.body[0]
    func.body = [s for s in func.body if not _is_meter_stmt(s)]
    func.decorator_list = []
    code = compile(ast.fix_missing_locations(tree), inspect.getsourcefile(fn), "exec")
    namespace = dict(fn.__globals__)
    exec(code, namespace)
    return namespace[fn.__name__]


def _is_meter_stmt(s: ast.stmt) -> bool:
    src = ast.unparse(s)
    return src.startswith("m = meter.active()") or src.startswith("if m is not None")


def _reporters() -> list[tuple[object, str]]:
    """Every function that reports to the meter: the operations and the caches' reads and writes."""
    from ..cache import paged
    return ([(ops, name) for name in ("embedding", "layer_norm", "linear", "gelu", "add", "attention",
                                      "decode_attention", "lm_head")]
            + [(cls, name) for cls in (kvcache.KVCache, paged.PagedKVCache, plan.BatchedDecode)
               for name in ("write", "read")]
            + [(kvcache.PassKV, "read")])


@contextmanager
def counting_code_removed():
    """Run with the counting code cut out of every operation, to measure what the meter costs idle."""
    saved = [(owner, name, getattr(owner, name)) for owner, name in _reporters()]
    try:
        for owner, name, fn in saved:
            setattr(owner, name, _strip_meter(fn))
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


# -- timing --------------------------------------------------------------------------------------

def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_bench(model, contexts: list[int], repeats: int = 5, decode_steps: int = 8, progress=None) -> dict:
    c = model.config
    if not contexts:
        raise MiniLLMError("--contexts: give at least one context length")
    for n in contexts:
        if not 1 <= n < c.n_ctx - decode_steps:
            raise MiniLLMError(f"context {n}: must be between 1 and {c.n_ctx - decode_steps - 1} for this model "
                               f"(context {c.n_ctx}, {decode_steps} decode steps after it)")
    rng = np.random.default_rng(0)
    prompts = {n: rng.integers(0, c.vocab_size, n) for n in contexts}
    mats = decode_weights(model)
    mats_t = [np.ascontiguousarray(w.T) for w in mats]     # the [out, in] layout, for the comparison
    wte_vd = np.ascontiguousarray(model.wte)                # [V, d], as the checkpoint stores it
    samples: dict = {n: {"cached": [], "naive": [], "prefill": []} for n in contexts}
    ceiling, layout_oi, stripped, idle, metered = [], [], [], [], []

    # bytes of one cached decode step at each context: from the meter, as the engine reports them
    step_bytes, step_flops = {}, {}
    for n in contexts:
        _, cache = model.prefill(prompts[n])
        with Meter() as m:
            model.decode_step(1, cache)
        step_bytes[n], step_flops[n] = m.steps[0].total_bytes, m.steps[0].total_flops

    for _ in range(repeats):
        for n in contexts:                                   # interleaved: every measurement once per round
            prompt = prompts[n]
            samples[n]["prefill"].append(_time(lambda: model.prefill(prompt)))
            _, cache = model.prefill(prompt)
            times = []
            for _ in range(decode_steps):
                times.append(_time(lambda: model.decode_step(1, cache)))
            samples[n]["cached"].append(statistics.median(times))
            samples[n]["naive"].append(_time(lambda: model.forward(prompt, last_only=True)))
            if progress:
                progress()
        io, oi = [], []
        for _ in range(3):                                   # the two layouts alternate, best of 3 each
            io.append(_time(lambda: matvec_pass(mats, model.wte_t)))
            oi.append(_time(lambda: matvec_pass_out_in(mats_t, wte_vd)))
        ceiling.append(min(io))
        layout_oi.append(min(oi))
        # the meter's idle cost: the same decode step with no meter, with the counting code cut out, metered
        n0 = contexts[0]
        _, cache = model.prefill(prompts[n0])
        idle.append(statistics.median(_time(lambda: model.decode_step(1, cache)) for _ in range(decode_steps)))
        with counting_code_removed():
            _, cache = model.prefill(prompts[n0])
            stripped.append(statistics.median(_time(lambda: model.decode_step(1, cache)) for _ in range(decode_steps)))
        _, cache = model.prefill(prompts[n0])
        with Meter():
            metered.append(statistics.median(_time(lambda: model.decode_step(1, cache)) for _ in range(decode_steps)))
        if progress:
            progress()

    med = statistics.median
    ceiling_s = med(ceiling)
    ceiling_bytes = sum(w.nbytes for w in mats) + model.wte.nbytes
    rows = []
    for n in contexts:
        s = samples[n]
        t_cached = med(s["cached"])
        rows.append({
            "context": n,
            "cached_tok_s": 1 / t_cached,
            "cached_ms": t_cached * 1e3,
            "naive_tok_s": 1 / med(s["naive"]),
            "naive_ms": med(s["naive"]) * 1e3,
            "prefill_s": med(s["prefill"]),
            "step_bytes": step_bytes[n],
            "step_flops": step_flops[n],
            "achieved_gbs": step_bytes[n] / t_cached / 1e9,
            "of_ceiling": ceiling_s / t_cached,
        })
    return {
        "model": model.name,
        "n_params": model.n_params(),
        "repeats": repeats,
        "decode_steps_per_sample": decode_steps,
        "ceiling_ms": ceiling_s * 1e3,
        "ceiling_tok_s": 1 / ceiling_s,
        "ceiling_bytes": ceiling_bytes,
        "ceiling_gbs": ceiling_bytes / ceiling_s / 1e9,
        "layout_in_out_ms": ceiling_s * 1e3,
        "layout_out_in_ms": med(layout_oi) * 1e3,
        "meter_idle_ms": med(idle) * 1e3,
        "meter_removed_ms": med(stripped) * 1e3,
        "meter_on_ms": med(metered) * 1e3,
        "rows": rows,
    }


# -- the command ---------------------------------------------------------------------------------

def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None,
                        help="model to benchmark (default random-124m; with --speculate, the bundled large model)")
    parser.add_argument("--contexts", default="16,128,512,1000",
                        help="comma-separated context lengths (default 16,128,512,1000)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds; medians are reported (default 5)")
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
    add_threads_option(parser)
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")


def parse_contexts(text: str, option: str = "--contexts") -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MiniLLMError(f"{option} {text!r}: expected comma-separated integers such as 16,128,512") from None


def run(args) -> int:
    contexts = parse_contexts(args.contexts)
    if args.repeats < 1:
        raise MiniLLMError(f"--repeats {args.repeats}: must be at least 1")
    batches = parse_contexts(args.batch, "--batch") if args.batch is not None else None
    ks = parse_contexts(args.speculate, "--speculate") if args.speculate is not None else None
    if ks is not None:
        from ..engine.speculative import MAX_K
        if batches is not None:
            raise MiniLLMError("--batch and --speculate measure different things: give one of them")
        if not ks or any(not 1 <= k <= MAX_K for k in ks):
            raise MiniLLMError(f"--speculate {args.speculate}: each K must be 1 to {MAX_K}, e.g. 1,2,4,8")
        if args.prompts < 1 or args.new_tokens < 2:
            raise MiniLLMError("--prompts must be at least 1 and --new-tokens at least 2")
    model = load(args.model or ("large" if ks is not None else "random-124m"))
    hw = hardware.machine(progress=not args.json)
    with limited(args.threads):
        if ks is not None:
            return run_speculation(args, model, ks, hw)
        if batches is not None:
            return run_batches(args, model, batches, hw)
        return run_contexts(args, model, contexts, hw)


def run_contexts(args, model, contexts: list[int], hw) -> int:
    from rich.markup import escape
    from rich.progress import Progress
    from rich.table import Table

    from ..ui.report import console, fmt_bytes

    with Progress(console=console(stderr=True), transient=True, disable=args.json) as bar:
        task = bar.add_task(f"benchmarking {escape(model.name)}", total=args.repeats * (len(contexts) + 1))
        result = run_bench(model, contexts, args.repeats, progress=lambda: bar.advance(task))
    result["machine"] = {"bandwidth_gbs": hw.bandwidth_gbs, "method": hw.method, "peak_gflops": hw.peak_gflops}
    for row in result["rows"]:
        row["of_bandwidth"] = row["achieved_gbs"] / hw.bandwidth_gbs
    if args.json:
        print(json.dumps(result))
        return 0
    out = console()
    t = Table(title=f"{escape(model.name)}: {model.n_params():,} params, float32, batch 1 "
                    f"(medians of {args.repeats} interleaved rounds)", title_justify="left")
    for col in ("context", "cached tok/s", "cached ms/step", "naive tok/s", "prefill", "bytes/step",
                "achieved GB/s", "% of BW", "% of ceiling"):
        t.add_column(col, justify="right")
    for r in result["rows"]:
        t.add_row(str(r["context"]), f"{r['cached_tok_s']:.1f}", f"{r['cached_ms']:.1f}", f"{r['naive_tok_s']:.2f}",
                  f"{r['prefill_s']:.3f} s", fmt_bytes(r["step_bytes"]), f"{r['achieved_gbs']:.1f}",
                  f"{100 * r['of_bandwidth']:.0f}%", f"{100 * r['of_ceiling']:.0f}%")
    out.print(t)
    out.print(f"matrix-vector ceiling (every weight a decode step reads, bare NumPy, same run): "
              f"{result['ceiling_ms']:.1f} ms = {result['ceiling_tok_s']:.1f} tok/s, "
              f"{fmt_bytes(result['ceiling_bytes'])} at {result['ceiling_gbs']:.1f} GB/s")
    out.print(f"weight layout: \\[in, out] (x @ W) {result['layout_in_out_ms']:.1f} ms, "
              f"\\[out, in] (W @ x) {result['layout_out_in_ms']:.1f} ms per pass over every weight")
    out.print(f"the meter's cost, decode step at context {contexts[0]}: no meter {result['meter_idle_ms']:.2f} ms, "
              f"counting code removed {result['meter_removed_ms']:.2f} ms, meter on {result['meter_on_ms']:.2f} ms")
    out.print(f"[dim]this machine: {hw.bandwidth_gbs:.1f} GB/s ({hw.method}), {hw.peak_gflops:.0f} GFLOP/s[/]")
    return 0


def run_batches(args, model, batches: list[int], hw) -> int:
    from rich.markup import escape
    from rich.progress import Progress
    from rich.table import Table

    from ..ui.report import console
    from .batching import run_batch_bench

    with Progress(console=console(stderr=True), transient=True, disable=args.json) as bar:
        task = bar.add_task(f"batched decode, {escape(model.name)}", total=args.repeats * len(batches))
        result = run_batch_bench(model, batches, hw, context=args.batch_context, repeats=args.repeats,
                                 progress=lambda: bar.advance(task))
    result["machine"] = {"bandwidth_gbs": hw.bandwidth_gbs, "method": hw.method, "peak_gflops": hw.peak_gflops}
    result["threads"] = blas_threads()
    result["blas"] = blas_name()
    result["blas_kernel"] = blas_kernel()
    if args.json:
        print(json.dumps(result))
        return 0
    out = console()
    t = Table(title=f"{escape(model.name)}: decode with B sequences at once, prompts of {result['context']} "
                    f"(medians of {args.repeats} interleaved rounds)", title_justify="left")
    for col in ("B", "tok/s", "ms/step", "roofline", "FLOP/B", "GB/s", "GFLOP/s", "x @ W", "engine"):
        t.add_column(col, justify="right")
    for r in result["rows"]:
        t.add_row(str(r["batch"]), f"{r['tok_s']:.0f}", f"{r['ms_step']:.1f}",
                  f"{r['roofline_ms']:.1f} {r['bound'][:3]}", f"{r['intensity']:.1f}", f"{r['gbps']:.1f}",
                  f"{r['gflops']:.1f}", f"{r['bare_plain_ms']:.1f}", f"{r['bare_engine_ms']:.1f}")
    out.print(t)
    out.print("[dim]roofline: max(bytes / bandwidth, FLOPs / peak) for the step's counted bytes and FLOPs; "
              "x @ W and engine: ms for one bare pass of B rows over every weight, the plain product and "
              "minillm's ops.matmul (2 rows as matrix-vector products, 3-63 padded to a multiple of 8)[/]")
    base = next((r for r in result["rows"] if r["batch"] == 1), None)
    if base:
        best = max(result["rows"], key=lambda r: r["tok_s"])
        out.print(f"B = 1: {base['ms_step']:.1f} ms a step; bare matrix-vector pass \\[in, out] "
                  f"{result['bare_in_out_ms']:.1f} ms, \\[out, in] {result['bare_out_in_ms']:.1f} ms: the engine runs "
                  f"at {100 * result['b1_of_bare']:.0f}% of the faster. Best: B = {best['batch']}, "
                  f"{best['tok_s'] / base['tok_s']:.1f}× the tokens/s of B = 1.")
    cb = result["critical_batch"]
    out.print(f"critical batch on this machine: {'none (the KV cache grows as fast as the work)' if cb is None else f'B ≈ {cb}'}"
              f" — ridge {result['ridge_flops_per_byte']:.1f} FLOP/byte = {hw.peak_gflops:.0f} GFLOP/s ÷ "
              f"{hw.bandwidth_gbs:.1f} GB/s; BLAS: {result['blas']} ({result['blas_kernel']} kernels), "
              f"{result['threads']} threads")
    return 0



def run_speculation(args, model, ks: list[int], hw) -> int:
    from rich import box
    from rich.markup import escape
    from rich.progress import Progress
    from rich.table import Table

    from ..ui.report import console, fmt_bytes
    from ..engine.speculative import check_draft_model
    from .speculation import heldout_prompts, run_speculation_bench

    drafts = {}
    for name in [d.strip() for d in args.draft.split(",") if d.strip()]:
        if name == "ngram":
            drafts[name] = "ngram"
        else:
            d = load(name)
            check_draft_model(d, model)
            drafts[d.name] = d
    if not drafts:
        raise MiniLLMError("--draft: give at least one draft, e.g. ngram,small")
    length = 32
    if length + args.new_tokens > model.config.n_ctx:
        raise MiniLLMError(f"--new-tokens {args.new_tokens}: with {length}-token prompts at most "
                           f"{model.config.n_ctx - length} fit {model.name}'s context")
    prompts = heldout_prompts(args.prompts, length)
    with Progress(console=console(stderr=True), transient=True, disable=args.json) as bar:
        task = bar.add_task(f"speculative decode, {escape(model.name)}", total=args.repeats * len(prompts))
        result = run_speculation_bench(model, drafts, ks, prompts, args.new_tokens, args.repeats,
                                       progress=lambda: bar.advance(task))
    result.update(model=model.name, model_bytes=model.nbytes(), threads=blas_threads(), blas=blas_name(),
                  blas_kernel=blas_kernel(), machine={"bandwidth_gbs": hw.bandwidth_gbs, "llc_bytes": hw.llc_bytes})
    if args.json:
        print(json.dumps(result))
        return 0
    out = console()
    p = result["plain"]
    t = Table(title=f"{escape(model.name)} ({fmt_bytes(model.nbytes())} of weights): speculative against plain "
                    f"cached decode, greedy, {len(prompts)} held-out prompt{'s' if len(prompts) > 1 else ''} of {length} tokens, {args.new_tokens} "
                    f"new tokens each (medians of {args.repeats} interleaved rounds)", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("draft", "k", "acc", "tok/check", "tok/s", "×", "MB/tok", "ms"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_row("plain", "-", "-", "1.00", f"{p['tok_s']:.1f}", "1.00", f"{p['bytes_per_token'] / 1e6:.1f}",
              f"{p['ms_step']:.1f}")
    for r in result["rows"]:
        t.add_row(escape(r["draft"]), str(r["k"]), f"{100 * r['acceptance']:.0f}%", f"{r['tokens_per_step']:.2f}",
                  f"{r['tok_s']:.1f}", f"{r['speedup']:.2f}", f"{r['bytes_per_token'] / 1e6:.1f}",
                  "-" if r["verify_ms"] is None else f"{r['verify_ms']:.1f}")
    out.print(t)
    differ = [f"{r['draft']} k={r['k']}" for r in result["rows"] if r["same_tokens"] is False]
    out.print("[dim]acc: guesses accepted; tok/check: tokens kept per step of the model; ×: tokens/s against "
              "plain decode; MB/tok: draft and model, as metered, per token kept; ms: one step of the model over "
              "k+1 tokens (plain row: one decode step)[/]")
    out.print("[green]✓ every run gave plain greedy decode's tokens[/]" if not differ else
              f"[red]✗ the tokens differ from plain decode's: {escape(', '.join(differ))}[/]")
    best = max(result["rows"], key=lambda r: r["speedup"])
    out.print(f"best: draft {escape(best['draft'])}, k = {best['k']}: {best['speedup']:.2f}× plain decode "
              f"({best['tokens_per_step']:.2f} tokens per step of the model, {100 * best['acceptance']:.0f}% of guesses "
              f"accepted); BLAS: {result['blas']} ({result['blas_kernel']} kernels), {result['threads']} threads")
    return 0
