"""`minillm bench`'s modes, each a measurement from `minillm.measure` run under a progress bar on
stderr and shown as its tables (or returned for --json): decode against the context lengths
(`bench_contexts`), batched decode against the roofline (`bench_batches`), speculative decoding
(`bench_speculation`), the weight formats (`bench_weights`), the context sweep
(`bench_context_sweep`). The command that picks one is cli/bench.py."""

from __future__ import annotations

import json

from rich import box
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from ..checkpoints.load import load
from ..engine.speculative import check_draft_model
from ..errors import MiniLLMError
from ..measure.batching import run_batch_benches
from ..measure.bench import run_bench
from ..measure.speculation import heldout_prompts, run_speculation_bench
from .. import closeness
from ..measure import residency
from ..threads import blas_kernel, blas_name, blas_spin, blas_threads
from ..ui.report import fmt_bytes, fmt_mib
from ..checkpoints.families import all_options
from .bench_options import DEFAULT_CONTEXTS, kernels_title, parse_contexts, parse_kernels, parse_option_values
from .common import err, out


def _run_with_bar(args, title: str, total: int, work):
    """`work(tick)` under a progress bar on stderr (none with --json); the busy note was said in `run`.
    `tick()` advances it a step; `tick(more=n)` adds n steps to its total (rounds added to settle)."""
    with Progress(console=err, transient=True, disable=args.json) as bar:
        task, planned = bar.add_task(title, total=total), [total]

        def tick(more: int = 0):
            if more:
                planned[0] += more
                bar.update(task, total=planned[0])
            else:
                bar.advance(task)
        return work(tick)


def _verdict(a_rounds, b_rounds) -> str:
    """Two sides' tokens/s rounds in words, by the one closeness rule (closeness.py)."""
    side = closeness.apart(a_rounds, b_rounds)
    return "faster" if side > 0 else "slower" if side < 0 else f"no winner: {closeness.why_not(a_rounds, b_rounds)}"


def sets_words(name: str, k: str, first: str, rows: dict, base: dict) -> str:
    """One kernel set's tokens/s against another's at each B: the ratio of the medians and the smallest
    and largest ratio of the same rounds, stated with no verdict word. Both sets do the same counted
    work, so the ratio is what the kernels make of the machine as it is: fused against NumPy at B = 1
    read "no winner" idle on 2 threads and "slower" beside two burners on 1 (issue 53), where quiet it
    was 0.93× on 1 thread and 0.94× on 2, a near-tie the load pushed past the rule's minimum effect."""
    shared = sorted(set(base) & set(rows))
    n = min(len(rows[B]["tok_s_rounds"]) for B in shared) if shared else 0

    def ratio(B: int) -> str:
        lo, hi = closeness.ratio_span(rows[B]["tok_s_rounds"], base[B]["tok_s_rounds"])
        return f"B = {B} {rows[B]['tok_s'] / base[B]['tok_s']:.2f}× ({lo:.2f}×–{hi:.2f}×)"     # the table's ratio
    return (f"{escape(name)}, {k} against {first} at the same B, tokens/s (the medians' ratio; the range "
            f"over {n} paired rounds): " + ", ".join(ratio(B) for B in shared) + ". Figures, not ranked: "
            f"both sets do the same counted work, so the ratio is what the kernels make of this machine "
            f"as it is, its thread count (above) and its load, and either moves it.")


def print_growth(rows: list[dict]) -> None:
    """Each batch's tokens/s against B = 1's, by the closeness rule on the paired rounds. Not "which B is
    best": past the critical batch the curve flattens, and neighbours on a plateau rank one way or the
    other from run to run; against B = 1 the effect is the batch's whole gain."""
    one = next((r for r in rows if r["batch"] == 1), None)
    if one is None or len(rows) < 2:
        return
    out.print("Tokens/s against B = 1's: " + ", ".join(
        f"B = {r['batch']} {r['tok_s'] / one['tok_s']:.2f}× ({_verdict(r['tok_s_rounds'], one['tok_s_rounds'])})"
        for r in rows if r is not one) + f"; {closeness.holds_for()}.")


def rounds_words(result: dict) -> str:
    """'6 rounds', or '9 rounds: 6 asked, 3 more until each B against B = 1 was ranked or could not be by
    12' (`closeness.settled`, up to closeness.CAP)."""
    taken, asked = result["repeats"], result.get("repeats_asked", result["repeats"])
    if taken == asked:
        return f"{taken} rounds"
    return (f"{taken} rounds: {asked} asked, {taken - asked} more until each B against B = 1 was ranked or "
            f"could not be by {closeness.CAP}")


def _blas(result) -> str:
    spin = f", idle threads spin 2^{result['blas_spin']} cycles" if result.get("blas_spin") else ""
    return f"BLAS: {result['blas']} ({result['blas_kernel']} kernels), {result['threads']} threads{spin}"


def _table(title: str, columns) -> Table:
    """A bench table: right-aligned columns that never wrap, narrow padding (80 columns)."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in columns:
        t.add_column(col, justify="right", no_wrap=True)
    return t


def bench_contexts(args, model, contexts: list[int], hw):
    result = _run_with_bar(args, f"benchmarking {escape(model.name)}", args.repeats * (len(contexts) + 1),
                           lambda tick: run_bench(model, contexts, args.repeats, progress=tick))
    result["machine"] = {"bandwidth_gbs": hw.bandwidth_gbs, "method": hw.method, "peak_gflops": hw.peak_gflops}
    for row in result["rows"]:
        row["of_bandwidth"] = row["achieved_gbs"] / hw.bandwidth_gbs

    def show():
        t = _table(f"{escape(model.name)}: {model.n_params():,} params, {model.dtype}, batch 1 "
                   f"(medians of {args.repeats} interleaved rounds)",
                   ("ctx", "tok/s", "ms/step", "naive tok/s", "prefill", "bytes/step", "GB/s", "% BW", "% bare"))
        for r in result["rows"]:
            t.add_row(str(r["context"]), f"{r['cached_tok_s']:.1f}", f"{r['cached_ms']:.1f}",
                      f"{r['naive_tok_s']:.2f}", f"{r['prefill_s']:.3f} s", fmt_bytes(r["step_bytes"]),
                      f"{r['achieved_gbs']:.1f}", f"{100 * r['of_bandwidth']:.0f}%", f"{100 * r['of_ceiling']:.0f}%")
        out.print(t)
        out.print("[dim]ctx: context length; tok/s, ms/step, bytes/step, GB/s: cached decode; naive: the whole "
                  "sequence again every step; % BW: of this machine's bandwidth; % bare: the step's speed as a share "
                  "of the bare pass below (over 100%: the step was faster; a bare NumPy pass is no ceiling for the "
                  "fused kernels)[/]")
        out.print(f"bare matrix-vector pass (every weight a decode step reads, bare NumPy, same run): "
                  f"{result['ceiling_ms']:.1f} ms = {result['ceiling_tok_s']:.1f} tok/s, "
                  f"{fmt_bytes(result['ceiling_bytes'])} at {result['ceiling_gbs']:.1f} GB/s")
        out.print(f"weight layout: \\[in, out] (x @ W) {result['layout_in_out_ms']:.1f} ms, "
                  f"\\[out, in] (W @ x) {result['layout_out_in_ms']:.1f} ms per pass over every weight")
        out.print(f"the meter's cost, decode step at context {contexts[0]}: no meter {result['meter_idle_ms']:.2f} ms, "
                  f"counting code removed {result['meter_removed_ms']:.2f} ms, meter on {result['meter_on_ms']:.2f} ms")
        if result.get("meter_compiled"):
            out.print("[dim]with no meter this model's decode step runs its blocks in one compiled call, with one its "
                      "operations one by one: \"meter on\" is both the meter and those calls[/]")
        out.print(f"[dim]this machine: {hw.bandwidth_gbs:.1f} GB/s ({hw.method}), {hw.peak_gflops:.0f} GFLOP/s; "
                  f"{_blas(result)}; {result['kernels_title']}[/]")
    return result, show


def bench_batches(args, models: dict, batches: list[int], hw):
    names = ", ".join(escape(n) for n in models)
    results = _run_with_bar(args, f"batched decode, {names}", args.repeats,
                            lambda tick: run_batch_benches(models, batches, hw, context=args.batch_context,
                                                           repeats=args.repeats, progress=tick,
                                                           prefill="batch-invariant" in args.kernel_list,
                                                           more=lambda: tick(more=1)))
    machine_ = {"bandwidth_gbs": hw.bandwidth_gbs, "method": hw.method, "peak_gflops": hw.peak_gflops}
    for label, r in results.items():
        r["machine"] = machine_
        r["kernels"] = models[label].kernels
    result = next(iter(results.values())) if len(results) == 1 else {"models": list(results.values())}
    together = "" if len(results) == 1 else f", interleaved with {len(results) - 1} other model(s)"

    def show():
        for name, res in results.items():
            _show_batches(args, name, res, hw, together, f"{_blas(result)}; {result.get('kernels_title', '')}")
        by_model: dict = {}
        for label, m in models.items():
            by_model.setdefault(m.name, {})[m.kernels] = results[label]
        for name, by in by_model.items():
            first, *others = by                              # every other set against the first one listed
            base = {r["batch"]: r for r in by[first]["rows"]}
            for k in others:
                rows = {r["batch"]: r for r in by[k]["rows"]}
                out.print(sets_words(name, k, first, rows, base))
                if by[k]["prefill_timed"]:
                    out.print(sets_table(by[first], by[k], first, k))

    return result, show


def _show_batches(args, name: str, result: dict, hw, together: str, blas: str) -> None:
    moe = result["experts"] is not None
    cols = ["B", "tok/s", "ms/step", "weights/step", "roofline", "FLOP/byte", "GB/s", "x @ W", "engine"]
    t = _table(f"{escape(name)}: decode with B sequences at once, prompts of {result['context']} "
               f"(medians of {rounds_words(result)}{together})", cols)
    for r in result["rows"]:
        cells = [str(r["batch"]), f"{r['tok_s']:.0f}", f"{r['ms_step']:.1f}", fmt_bytes(r["weight_bytes"]),
                 f"{r['roofline_ms']:.1f} {r['bound'][:3]}", f"{r['intensity']:.1f}", f"{r['gbps']:.1f}",
                 f"{r['bare_plain_ms']:.1f}", f"{r['bare_engine_ms']:.1f}"]
        t.add_row(*cells)
    out.print(t)
    if moe:                                  # a second table: the two together are wider than 80 columns
        E, k = result["experts"]
        u = _table(f"{escape(name)}: the experts a step reads", ("B", "chose", "uniform", "its bytes", "weights/step"))
        for r in result["rows"]:
            u.add_row(str(r["batch"]), f"{r['experts_chosen']:.1f}", f"{r['experts_uniform']:.1f}",
                      fmt_bytes(r["uniform_weight_bytes"]), fmt_bytes(r["weight_bytes"]))
        out.print(u)
    out.print("[dim]weights/step: the meter's weight bytes of one step; roofline: max(bytes / bandwidth, FLOPs / "
              "peak) for the step's counted bytes and FLOPs; x @ W and engine: ms for one bare pass of B rows "
              "over every weight, the plain product and minillm's ops.matmul (2 rows as matrix-vector products, "
              "3-63 padded to a multiple of 8). A bare pass is no ceiling: the plain product can be far slower "
              "than the engine's whole step (the small-batch cliff, lesson 8)[/]")
    if moe:
        out.print(f"[dim]a mixture of E = {E} experts, top-k = {k}: chose: the experts its router chose in the "
                  "counted step, mean over the sparse layers; uniform: E·(1 − (1 − k/E)^B), uniform routing's "
                  "expected union; its bytes: the weight bytes of that union by the closed form; its bare "
                  "passes run the chosen experts with all B rows each[/]")
    base = next((r for r in result["rows"] if r["batch"] == 1), None)
    if base:
        step = [B1 / t * 1e3 for B1, t in ((1, x) for x in base["tok_s_rounds"])]      # ms a step, each round
        bare = result["bare_rounds_ms"]
        ratios = sorted(a / b for a, b in zip(step, bare)) if len(step) == len(bare) else []
        spread = f" ({ratios[0]:.2f}-{ratios[-1]:.2f}× over the rounds)" if len(ratios) > 1 else ""
        out.print(f"B = 1: {base['ms_step']:.1f} ms a step; bare matrix-vector pass \\[in, out] "
                  f"{result['bare_in_out_ms']:.1f} ms, \\[out, in] {result['bare_out_in_ms']:.1f} ms: the engine's "
                  f"step took {base['ms_step'] / min(result['bare_in_out_ms'], result['bare_out_in_ms']):.2f}× the "
                  f"faster{spread}: what a step costs beyond one pass over its weights (a figure, not ranked: near "
                  "1 it would rank one way or the other from run to run).")
        print_growth(result["rows"])
    fast = max(result["rows"], key=lambda r: r["gbps"])
    if residency.outran(fast["gbps"], hw):
        out.print(f"B = {fast['batch']}: " + outran(fast["gbps"], hw, fast["weight_bytes"]))
    cb = result["critical_batch"]
    from ..measure.batching import CRITICAL_BATCH_LIMIT
    crit = f"none up to B = {CRITICAL_BATCH_LIMIT:,} on this run's counts" if cb is None else f"B ≈ {cb:,}"
    out.print(f"critical batch on this machine: {crit} — ridge {result['ridge_flops_per_byte']:.1f} FLOP/byte "
              f"= {hw.peak_gflops:.0f} GFLOP/s ÷ {hw.bandwidth_gbs:.1f} GB/s; {blas}")


def outran(gbs: float, hw, nbytes: int) -> str:
    """What to say of a step that read faster than this machine's measured bandwidth: a read of a buffer
    of its weights' size decides whether they came from a cache or the DRAM figure is low (the cache size
    the operating system lists decides nothing: measure/residency.py)."""
    probe = residency.probe_at(nbytes)
    said = (f"its steps read {gbs:.1f} GB/s, more than the {hw.bandwidth_gbs:.1f} GB/s measured for memory, and a "
            f"read of {fmt_bytes(nbytes)} (its weights' size) ran at {probe:.1f} GB/s")
    if residency.verdict(nbytes, hw, probe_gbs=probe) == "cache":
        return f"{said}: the weights came from a cache ({residency.os_reports(hw)})"
    return f"{said}: the memory figure is low for now; `minillm hardware --remeasure` measures it again"


def sets_table(base: dict, other: dict, first: str, k: str) -> Table:
    """One kernel set against another on one model, per B, prefill and decode, from the same
    interleaved rounds (what the batch-invariant set costs)."""
    t = _table(f"{k} against {first}, same rounds, prompts of {base['context']}; ms",
               ("B", "prefill", k[:6] + ".", "×", "a step", k[:6] + ".", "×", "tok/s"))
    mine = {r["batch"]: r for r in other["rows"]}
    for r in base["rows"]:
        o = mine[r["batch"]]
        t.add_row(str(r["batch"]), f"{r['prefill_ms']:.1f}", f"{o['prefill_ms']:.1f}",
                  f"{o['prefill_ms'] / r['prefill_ms']:.2f}", f"{r['ms_step']:.1f}", f"{o['ms_step']:.1f}",
                  f"{o['ms_step'] / r['ms_step']:.2f}", f"{o['tok_s']:.0f}")
    return t


def bench_speculation(args, model, ks: list[int], hw):
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
    result = _run_with_bar(args, f"speculative decode, {escape(model.name)}", args.repeats * len(prompts),
                           lambda tick: run_speculation_bench(model, drafts, ks, prompts, args.new_tokens,
                                                              args.repeats, progress=tick))
    result.update(model=model.name, model_bytes=model.nbytes(),
                  machine={"bandwidth_gbs": hw.bandwidth_gbs, "llc_bytes": hw.llc_bytes})

    def show():
        p = result["plain"]
        t = Table(title=f"{escape(model.name)} ({fmt_bytes(model.nbytes())} of weights): speculative against "
                        f"plain cached decode, greedy, {len(prompts)} held-out prompt{'s' if len(prompts) > 1 else ''} "
                        f"of {length} tokens, {args.new_tokens} new tokens each (medians of {args.repeats} "
                        "interleaved rounds)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1, 0, 0))
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
                  "plain decode; MB/tok: draft and model, as metered, per token kept; ms: one step of the model "
                  "over k+1 tokens (plain row: one decode step)[/]")
        out.print("[green]✓ every run gave plain greedy decode's tokens[/]" if not differ else
                  f"[red]✗ the tokens differ from plain decode's: {escape(', '.join(differ))}[/]")
        rounds = {f"{r['draft']} k = {r['k']}": r["speedup_rounds"] for r in result["rows"]}
        rounds["plain"] = [1.0] * args.repeats
        ranked = closeness.rank(rounds, higher=True)
        out.print(escape(closeness.best_words(ranked, "Speed-up over plain decode", lambda v: f"{v:.2f}×")))
        out.print(f"[dim]{_blas(result)}[/]")
    return result, show


def bench_weights(args, hw, kernels=None) -> int:
    from ..measure.quantization import TILE_BYTES, parse_first_context, parse_formats, run_quant_bench

    formats = parse_formats(args.weights)
    source = args.model or "random-124m"
    context = parse_first_context(DEFAULT_CONTEXTS if args.contexts is None else args.contexts)
    kernels = kernels or parse_kernels(None)
    with Progress(console=err, transient=True, disable=args.json) as bar:
        task = bar.add_task(f"weights {', '.join(formats)}", total=args.repeats * len(formats) * len(kernels or [None]))
        result = run_quant_bench(source, formats, context=context, repeats=args.repeats,
                                 progress=lambda: bar.advance(task), bandwidth_gbs=hw.bandwidth_gbs, kernels=kernels)
    kernels = list(dict.fromkeys(r["kernels"] for r in result["rows"]))   # without --kernels: each format's default
    several = len(kernels) > 1
    bw = hw.bandwidth_gbs
    result.update(threads=blas_threads(), blas=blas_name(), blas_kernel=blas_kernel(), blas_spin=blas_spin(),
                  machine={"bandwidth_gbs": bw, "llc_bytes": hw.llc_bytes}, kernels=kernels,
                  kernels_title=kernels_title(kernels), conditions=args.conditions)
    if args.json:
        print(json.dumps(result))
        return 0
    t = Table(title=f"{escape(result['model'])}: decode at context {context}, batch 1, by weight format, "
                    f"{result['kernels_title']} (medians of {args.repeats} interleaved rounds)", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("weights", *(("kernels",) if several else ()), "bytes/step", "ceiling", "tok/s", "% ceil", "widen ms", "widen %", "prefill"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in result["rows"]:
        t.add_row(r["weights"], *((r["kernels"],) if several else ()), fmt_bytes(r["step_bytes"]), f"{r['ceiling_tok_s']:.0f}/s", f"{r['tok_s']:.1f}",
                  f"{100 * r['of_ceiling']:.0f}%", f"{r['widen_ms']:.1f}" if r["widen_ms"] else "-",
                  f"{100 * r['widen_share']:.0f}%" if r["widen_ms"] else "-",
                  f"{result['prefill'] / r['prefill_s']:.0f}/s")
    out.print(t)
    out.print("[dim]bytes/step: counted by the meter (quantized matrices at their own size, scales included); "
              f"ceiling: those bytes at this machine's {bw:.1f} GB/s; widen: turning every quantized weight "
              f"into floats as a decode step does, alone; prefill: {result['prefill']} tokens[/]")
    base = next((r for r in result["rows"] if r["weights"] == "float32" and r["kernels"] == "numpy"),
                next((r for r in result["rows"] if r["weights"] == "float32"), None))
    for r in result["rows"]:
        if base is None or r is base:
            continue
        verdict = _verdict([1 / x for x in r["decode_rounds_s"]], [1 / x for x in base["decode_rounds_s"]])
        name = f"{r['weights']} {r['kernels']}" if several else r["weights"]
        widen = (f"; widening alone takes {r['widen_ms']:.1f} ms, {r['widen_ms'] / base['decode_ms']:.2f}× "
                 "float32's whole step") if r["widen_ms"] else ("; no widening pass (the fused kernel widens in registers)"
                                                               if r["kernels"] == "fused" and r["weights"] != "float32" else
                                                               "; no widening pass (integer products on the blocks as stored)"
                                                               if r["kernels"] == "int8" and r["weights"] != "float32" else "")
        base_name = f"float32 {base['kernels']}" if several else "float32"
        fewer = base["step_bytes"] / r["step_bytes"]
        fewer = (f"{fewer:.1f}× fewer bytes than {base_name}" if fewer >= 1.05 else f"{fewer:.2f}× the bytes of {base_name}"
                 if fewer <= 0.95 else f"about the bytes of {base_name} ({fewer:.3f}×)")
        out.print(f"{name}: {fewer}, "
                  f"decode {r['tok_s'] / base['tok_s']:.2f}× {base_name}'s tokens/s ({verdict}), prefill "
                  f"{base['prefill_s'] / r['prefill_s']:.2f}×{widen}")
    over = [r for r in result["rows"] if residency.outran(r["of_ceiling"] * bw, hw)]
    if over:
        fastest = max(over, key=lambda r: r["of_ceiling"])
        name = f"{fastest['weights']} {fastest['kernels']}" if several else fastest["weights"]
        out.print(f"{name} ran at {100 * fastest['of_ceiling']:.0f}% of its ceiling: "
                  + outran(fastest["of_ceiling"] * bw, hw, fastest["step_bytes"]))
    out.print(f"[dim]{residency.os_reports(hw)}; where the weights came from is the measurement's to say[/]")
    load_note = f"; load average {result['load_average']:.1f}" if result["load_average"] is not None else ""
    out.print(f"{_blas(result)}; widening: "
              f"NumPy, one thread, tiles of {fmt_mib(TILE_BYTES)}{load_note}")
    return 0


SWEEP_MODELS = "random-hybrid,random-hybrid-full"


def bench_context_sweep(args) -> int:
    """`--context-sweep`: measure/contexts.py's sweep, one table per context, the crossover named; a
    latent-attention model once per way (--mla-decode), with its attention's FLOPs per KV byte."""
    from ..measure.contexts import CONTEXTS, run_context_sweep
    if args.repeats < 1:
        raise MiniLLMError(f"--repeats {args.repeats}: must be at least 1")
    contexts = parse_contexts(args.contexts) if args.contexts is not None else list(CONTEXTS)
    names = [n.strip() for n in (args.model or SWEEP_MODELS).split(",") if n.strip()]
    if len(set(names)) != len(names):
        raise MiniLLMError(f"--model {args.model}: each model once")
    kernels = parse_kernels(args.kernels)
    if len(kernels) > 1:
        raise MiniLLMError("--context-sweep runs one kernel set: give --kernels numpy or --kernels fused")
    ways = parse_option_values(args)
    models = [load(n, kernels=kernels[0]) for n in names]
    for o in all_options():
        if o.name in ways and not any(o in m.OPTIONS for m in models):
            raise MiniLLMError(f"{o.flag}: none of these models has {o.needs}")
    result = _run_with_bar(args, f"decode against the context, {', '.join(escape(m.name) for m in models)}",
                           len(contexts) * args.repeats,
                           lambda tick: run_context_sweep(models, contexts, args.repeats, progress=tick, ways=ways))
    result.update(threads=blas_threads(), blas=blas_name(), blas_kernel=blas_kernel(), blas_spin=blas_spin(),
                  kernels=kernels, kernels_title=kernels_title(kernels))
    if args.json:
        print(json.dumps(result))
        return 0
    runs = result["models"]
    rows = {(r["model"], r["context"]): r for r in result["rows"]}
    t = _table(f"decode, batch 1: time and bytes per step against the context (medians of {args.repeats} "
               f"interleaved rounds of {result['steps']} steps)", ["ctx"] + [c for i, _ in enumerate(runs)
                                                                            for c in (f"ms {i + 1}", "KV", "state")])
    for T in result["contexts"]:
        t.add_row(f"{T:,}", *(x for name in runs for x in (
            f"{rows[(name, T)]['ms']:.1f}", fmt_bytes(rows[(name, T)]["kv"]),
            fmt_bytes(rows[(name, T)]["state"]))))
    out.print(t)
    for i, name in enumerate(runs):
        r = rows[(name, result["contexts"][0])]
        fb = sorted({round(rows[(name, T)]["attention_flops"] / rows[(name, T)]["kv_read"], 1)
                     for T in result["contexts"]}) if r["kv_read"] else []
        out.print(f"{i + 1}: {escape(name)}, weights {fmt_bytes(r['weights'])} a step"
                  + (f", attention {'–'.join(map(str, fb))} FLOPs a KV byte" if fb else ""))
    out.print("[dim]ms: a decode step's median time; KV (read and written) and state (read and written): one step "
              "at that context, counted by the meter; caches filled with random keys, values and states (a "
              "step's work does not depend on them); attention FLOPs a KV byte: its scores and weighted sums "
              "over what it read[/]")
    if len(result["contexts"]) < 2:              # no growth and no crossover from one context
        out.print(f"[dim]one context ({result['contexts'][0]:,} tokens): no growth and no crossover to "
                  "say; give --contexts two or more[/]")
        out.print(f"[dim]{_blas(result)}; {result['kernels_title']}[/]")
        return 0
    for name in runs:
        a, b = rows[(name, result["contexts"][0])], rows[(name, result["contexts"][-1])]
        out.print(f"{escape(name)}: from {a['context']:,} to {b['context']:,} tokens its step went from "
                  f"{a['ms']:.1f} to {b['ms']:.1f} ms ({b['ms'] / a['ms']:.2f}×), its weights, KV and state "
                  f"{fmt_bytes(a['moved'])} to {fmt_bytes(b['moved'])} ({b['moved'] / a['moved']:.2f}×)")
    firsts = [next(name for name in runs if name.split(" ")[0] == m.name) for m in models]
    if len(models) > 1:
        first, second = escape(firsts[0]), escape(firsts[1])
        for key, what in (("crossover_time", "time"), ("crossover_bytes", "weights, KV and state")):
            T = result[key]
            how = (" by the verdict rule on the paired rounds" if key == "crossover_time" else " (counted)")
            out.print(f"{what}: " + (f"{first}'s step is below {second}'s from {T:,} tokens on (every longer "
                                     f"context measured){how}" if T is not None else
                                     f"{first}'s step is not below {second}'s at {result['contexts'][-1]:,} "
                                     f"tokens{how}"))
    out.print(f"[dim]{_blas(result)}; {result['kernels_title']}[/]")
    return 0
