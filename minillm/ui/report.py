"""Turning step records into what a learner reads: rich tables, selections and plain-words verdicts.

Every number printed here comes from a `StepRecord` the meter filled while the engine ran, or from
this machine's measured figures (`hardware.machine()`); nothing is typed in.
"""

from __future__ import annotations

from rich import box
from rich.markup import escape
from rich.table import Table

from .. import closeness
from ..measure.chips import Hardware, roofline
from ..measure.comparisons import fit_problem
from ..meter import StepRecord


def fmt_units(n: float, unit: str) -> str:
    """A count in decimal multiples of `unit` (k, M, G, T = 10³ ...), three figures or the whole number."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:,.0f} {prefix}{unit}" if v >= 100 else f"{v:.3g} {prefix}{unit}"
    return f"{n:,.0f} {unit}"


def fmt_bytes(n: float) -> str:
    """Decimal units (1 MB = 10⁶ bytes), as bandwidths are quoted: 498 MB, 75.5 MB, 73.7 kB."""
    return fmt_units(n, "B")


def fmt_flops(n: float) -> str:
    return fmt_units(n, "FLOP")


def fmt_time(s: float) -> str:
    if s >= 10:
        return f"{s:,.1f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    if s >= 1e-6 or s == 0:
        return f"{s * 1e6:.3g} µs"
    return f"{s * 1e9:.3g} ns"


def select(records: list[StepRecord], most: int = 12) -> list[int]:
    """Indexes of the records to show: all of them when few, else the first ones, evenly spaced
    middle ones and the last one."""
    n, most = len(records), max(most, 2)
    if n <= most:
        return list(range(n))
    head = list(range(min(3, most - 1)))                 # the prefill and the first decode steps
    k = most - len(head) - 1                              # evenly spaced ones between them and the last
    middle = [round(len(head) + (i + 1) * (n - 1 - len(head)) / (k + 1)) for i in range(k)]
    return sorted(set(head + middle + [n - 1]))


NARROW = 120   # below this many columns, a table of steps drops the bytes-by-kind breakdown


def last_position(r: StepRecord) -> int:
    """The position of the last token a step runs through the blocks: the one whose logits it gives.

    A cached decode step runs one token (its own position); a prefill or a naive step runs every
    position from 0, so its last position is where the new token is predicted from."""
    return r.position + r.n_tokens - 1


def steps_table(records: list[StepRecord], hw: Hardware | None, title: str, rows: list[int] | None = None,
                width: int | None = None) -> Table:
    """One row per step: tokens processed, FLOPs, bytes, intensity, time, GB/s, % of bandwidth.

    `width` is the console's: below `NARROW` columns the bytes are one total (fits 80 columns);
    wider, they are split by kind (weights, KV read, KV write, activations)."""
    narrow = width is not None and width < NARROW
    t = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
              padding=(0, 1) if not narrow else (0, 0, 0, 1), collapse_padding=True)
    byte_cols = ("bytes",) if narrow else ("weights", "KV read", "KV write", "activations")
    for col in ("step", "kind", "pos", "tokens", "FLOPs", *byte_cols, "FLOP/B", "time", "GB/s"):
        t.add_column(col, justify="left" if col == "kind" else "right", no_wrap=True)
    if hw is not None:
        t.add_column("% BW" if narrow else "% of BW", justify="right", no_wrap=True)
    for i in rows if rows is not None else range(len(records)):
        r = records[i]
        b = r.bytes
        moved = ([fmt_bytes(r.total_bytes)] if narrow else
                 [fmt_bytes(b["weights"]), fmt_bytes(b["kv_read"]), fmt_bytes(b["kv_write"]), fmt_bytes(b["activations"])])
        row = [str(i), r.kind, str(last_position(r)), str(r.n_tokens), fmt_flops(r.total_flops), *moved,
               f"{r.intensity:.3g}", fmt_time(r.seconds), f"{r.gbps:.1f}"]
        if hw is not None:
            row.append(f"{100 * r.gbps / hw.bandwidth_gbs:.0f}%")
        t.add_row(*row)
    return t


def fused_bytes(r: StepRecord, config, itemsize: int) -> int:
    """The bytes of a step under **ideal fusion**: a lower bound on what a GPU engine moves.

    The meter counts the unfused view, as NumPy runs: every operation reads its inputs from memory
    and writes its outputs back, so a long prefill moves its activations many times over. Ideal
    fusion keeps the inside of a block on chip: it moves the weights, the KV cache read and written,
    each block's input and output ([T, d] each), the embedding's output and the logits it keeps.
    Real engines sit between the two: FlashAttention keeps attention's T×T scores on chip, but the
    separate matrix kernels still write their outputs (about 10-14·T·d per layer) to memory."""
    L, d, V = config.n_layer, config.n_embd, config.vocab_size
    T = r.n_tokens
    lm_rows = T if r.kind == "forward" else 1
    activations = (2 * L * T * d + T * d + lm_rows * V) * itemsize
    return r.bytes["weights"] + r.bytes["kv_read"] + r.bytes["kv_write"] + activations


def bound_of(r: StepRecord, hw: Hardware) -> str:
    """"memory" or "compute": which roof binds this step on this machine."""
    return roofline(r.total_bytes, r.total_flops, hw).bound


def verdict(r: StepRecord, hw: Hardware, path: str) -> str:
    """One sentence on a step, in plain words, with the numbers that decide it (bytes as the meter counts
    them: the unfused view, every operation's inputs and outputs through memory, as NumPy runs)."""
    bound = bound_of(r, hw)
    if r.kind == "prefill":
        what = f"prefill of {r.n_tokens} tokens"
    else:
        what = f"{path} step at position {last_position(r)}"
        if r.n_tokens > 1:
            what += f" recomputes {r.n_tokens} tokens"
    at = (f" at {hw.blas_threads} BLAS thread{'s' if hw.blas_threads != 1 else ''}"
          if getattr(hw, "blas_threads", None) else "")
    return (f"{what}: {r.intensity:.3g} FLOP/byte, {fmt_bytes(r.total_bytes)} moved (unfused) → {bound}-bound "
            f"(this machine's ridge{at} is {hw.ridge:.3g} FLOP/byte); {r.gbps:.1f} GB/s and {r.gflops:.1f} GFLOP/s "
            f"achieved, {100 * r.gbps / hw.bandwidth_gbs:.0f}% of this machine's {hw.bandwidth_gbs:.1f} GB/s "
            f"and {100 * r.gflops / hw.peak_gflops:.0f}% of its {hw.peak_gflops:.0f} GFLOP/s{at}")   # the threads said


def fmt_kib(n: float) -> str:
    """KV bytes a token in KiB, on every screen that prints one (the lessons, `hardware --shape`), so
    two screens never compare kB with KiB (issue 53): 72 KiB, 1,152 KiB."""
    return f"{n / 1024:,.4g} KiB"


def fmt_mib(n: float) -> str:
    """A cache size in binary units, as CPUs quote them: 32 MiB, 512 KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def cache_note(model_bytes: int, hw: Hardware, step_gbs: float | None, name: str = "") -> str | None:
    """When this run's decode steps read faster than the DRAM bandwidth measured here, they read the
    weights from a cache, and the GB/s below are not DRAM's: said from the measurement (`step_gbs`, the
    median decode step's), never from the cache size the operating system lists (measure/residency.py).
    The advice names a bigger model than the one running (`name`), never the same one."""
    from ..measure import residency
    if step_gbs is None or not residency.outran(step_gbs, hw):
        return None
    bigger = residency.larger_model(name, model_bytes)
    return (f"This run's decode steps read {step_gbs:,.1f} GB/s, more than the {hw.bandwidth_gbs:,.1f} GB/s measured "
            f"for this machine's memory: the weights ({fmt_mib(model_bytes)}) came from a cache, not DRAM "
            f"({residency.os_reports(hw)}), and this run cannot show decode waiting on memory."
            + (f" To see it, add --model {bigger}." if bigger else ""))


# -- serving verdicts: sentences from the figures of serve-sim's runs (serve-sim and lesson 13 print them)

def slo_text(slo: dict) -> str:
    return ", ".join(f"{k.upper()}≤{fmt_time(v)}" for k, v in slo.items())


def best(results: list[dict], key: str, high: bool) -> tuple[dict, dict]:
    """(best, worst) run by a figure; runs without it are left out."""
    have = [r for r in results if r.get(key) is not None]
    order = sorted(have, key=lambda r: r[key], reverse=high)
    return order[0], order[-1]


CLOSE = closeness.CLOSE     # the one closeness rule's band (closeness.py)


def rounds_of(r: dict, key: str) -> list[float]:
    """A run's figure in each round it was served (`serving.metrics.merge_rounds`); one run: its value."""
    return list(r.get("rounds", {}).get(key) or [r[key]])


def counts_of(results: list[dict], key: str, name) -> dict | None:
    """Goodput counts requests: the count behind each round, for the closeness rule's counting test."""
    if key != "goodput_rps":
        return None
    return {name(r): [int(x) for x in r.get("rounds", {}).get("good_requests") or [r["good_requests"]]]
            for r in results if r.get(key) is not None}


def favours(results: list[dict], key: str, high: bool, what: str, show, name, priced: str | None = None) -> str:
    """One sentence of a sweep: which run a figure favours, by the one closeness rule on each run's rounds
    (closeness.py): a run is favoured only when the sign test on the paired rounds ranks it above every other;
    otherwise no run stands out, said with the reason. The words say what the ranking holds for.

    priced: the runs were served once on a clock priced from counts (`serving.metrics.RooflineClock`;
    its words, e.g. "the roofline clock (21.4 GB/s, 204 GFLOP/s)"): each figure is ranked as it is,
    by `closeness.rank_priced` (apart by over 5%), and the sentence says so."""
    have = [r for r in results if r.get(key) is not None]
    if priced is not None:
        ranking = closeness.rank_priced({name(r): r[key] for r in have}, higher=high, on=priced)
        if ranking.winner is None:
            figs = ", ".join(f"{k} {show(ranking.medians[k])}" for k in ranking.order)
            return f"{what}: no budget stands out ({ranking.reason}): {figs}; on {priced}."
        w, lo = ranking.winner, ranking.worst
        return (f"{what} favours {w} ({show(ranking.medians[w])}; {lo}: {show(ranking.medians[lo])}), on "
                f"{priced}, {closeness.PRICED_RULE}.")
    ranking = closeness.rank({name(r): rounds_of(r, key) for r in have}, higher=high,
                             counts=counts_of(have, key, name))
    threads = next((r.get("threads") for r in have if isinstance(r.get("threads"), int)), None)
    if ranking.winner is None:
        figs = ", ".join(f"{k} {closeness.spread_text(ranking, k, show)}" for k in ranking.order)
        return f"{what}: no budget stands out ({ranking.reason}): {figs}."
    w, lo = ranking.winner, ranking.worst
    n = ranking.rounds[w]
    return (f"{what} favours {w} ({closeness.spread_text(ranking, w, show)}; {lo}: "
            f"{closeness.spread_text(ranking, lo, show)}), ranked by {closeness.rule_words(n)}; "
            f"{closeness.holds_for(threads)}.")


def budget_verdict(results: list[dict], fit: dict | None, slo: dict, weight_read_s: float | None = None,
                   priced: str | None = None) -> list[str]:
    """Which budget this machine favours for which target, from the runs and the fit of step time. A fit
    that `fit_problem` finds meaningless is named and nothing is concluded from it. `weight_read_s`: the
    model's bytes ÷ this machine's bandwidth, printed beside the fit's fixed part (the rest is overhead).
    priced: the runs' clock words when they were priced from counts, one run each (`favours`)."""
    lines = []
    name = lambda r: r["policy"]  # noqa: E731
    problem = fit_problem(fit, priced=priced is not None) if fit is not None else None
    if problem is not None:
        lines.append(f"Step time against tokens: the fit is not used ({problem}).")
        fit = None
    if fit is not None:
        a, b = fit["fixed_s"], fit["per_token_s"]
        step = "Step price" if priced else "Step time"
        lines.append(f"{step} ≈ {fmt_time(a)} + {fmt_time(b)} per token (least squares over "
                     f"{fit['steps']} steps of every budget, r² {fit['r2']:.2f}).")
        read = ("" if weight_read_s is None else
                f" (reading the weights once is {fmt_time(weight_read_s)} of it; the rest, per-step overhead)"
                if weight_read_s < a else f" (less than reading the weights once, {fmt_time(weight_read_s)})")
        lines.append(f"The fixed part{read} costs as much as {a / b:.0f} tokens: a budget well below that "
                     f"pays it in many more steps; a prompt of N tokens in one step holds every running "
                     f"decode about N × {fmt_time(b)}.")
    lines.append(favours(results, "output_tokens_per_s", True, "Throughput", lambda v: f"{v:.1f} tok/s", name,
                         priced))
    lines.append(favours(results, "tbt_p99_s", False, "The p99 gap between tokens", fmt_time, name, priced))
    lines.append(favours(results, "ttft_p95_s", False, "TTFT p95", fmt_time, name, priced))
    if slo:
        if fit is not None and "tpot" in slo and fit["per_token_s"] > 0:
            room = (slo["tpot"] - fit["fixed_s"]) / fit["per_token_s"]
            lines.append(f"A TPOT target of {fmt_time(slo['tpot'])}: by the fit a step stays within it "
                         f"up to {max(0, room):.0f} tokens" + ("" if room > 0 else
                         " (the fixed part alone is longer: no budget meets it on every step here)") + ".")
        hi, lo = best(results, "goodput_rps", True)
        if hi["good_requests"] == 0:
            met = ", ".join(f"{k.upper()} {max(r['slo_met'][k] for r in results):.0%}" for k in slo)
            lines.append(f"No budget met every target ({slo_text(slo)}) for any request: goodput 0 at every "
                         f"budget (the most that met each: {met}).")
        elif hi["goodput_rps"] == lo["goodput_rps"]:
            lines.append(f"Goodput ({slo_text(slo)}) is the same at every budget ({hi['goodput_rps']:.2f} req/s).")
        else:
            lines.append(favours(results, "goodput_rps", True, f"Goodput ({slo_text(slo)})",
                                 lambda v: f"{v:.2f} req/s", name, priced))
    return lines


def diagnosis(r: dict) -> str:
    """Which kind of step took the time, and what bound it: read from the run's own phase verdicts."""
    ph = r["phases"]
    pre = sum(ph[k]["seconds"] for k in ("prefill", "mixed") if k in ph)
    dec = ph.get("decode", {}).get("seconds", 0.0)
    total = pre + dec or 1.0
    if pre > dec:
        kinds = [ph[k] for k in ("prefill", "mixed") if k in ph]
        bound = max(kinds, key=lambda d: d["seconds"]).get("bound")
        how = f", mostly {bound}-bound by the roofline" if bound else ""
        return (f"{escape(r['policy'])}: steps with prompt tokens took {pre / total:.0%} of the time{how}; "
                "what helps: prefix caching and shorter prompts (less prefill), faster arithmetic; a smaller "
                "token budget (chunked prefill) keeps long prompts from stalling the others' decode")
    bound = ph.get("decode", {}).get("bound")
    if bound == "compute":
        return (f"{escape(r['policy'])}: decode steps took {dec / total:.0%} of the time and were mostly "
                f"compute-bound by the roofline (mean batch {r['mean_batch']:.1f}: past the critical batch, where "
                "this machine's roofline turns): bigger "
                "batches no longer come free; fewer FLOPs per token or faster arithmetic help")
    how = " and were mostly memory-bound" if bound == "memory" else ""
    continuous = r.get("scheduler", r["policy"]) == "continuous"
    bigger = ("bigger batches (more KV memory, a higher --max-seqs) and fewer bytes per weight help" if continuous
              else "bigger batches (continuous batching, more KV memory) and fewer bytes per weight help")
    return (f"{escape(r['policy'])}: decode steps took {dec / total:.0%} of the time{how}: "
            + (bigger if bound == "memory" else "run with the machine's figures for a verdict"))


def disagg_verdict(results: list[dict], priced: str | None = None) -> list[str]:
    """Where the split wins and where it loses, and why, from the runs' own figures.

    priced: the runs were served once on a clock priced from counts (its words: `RooflineClock.words`):
    every figure ranked as it is by `closeness.rank_priced` / `figures_apart`, and the words say so."""
    lines = []
    one = [r for r in results if r["split"] == "colocated"]
    splits = [r for r in results if r["split"] != "colocated"]
    if not one or not splits:
        return lines
    figures = [("output_tokens_per_s", "tok/s", True), ("ttft_p95_s", "TTFT p95", False),
               ("tpot_p95_s", "TPOT p95", False)] + ([("goodput_rps", "goodput", True)] if "slo" in one[0] else [])
    for key, what, high in figures:
        have = [r for r in results if r.get(key) is not None]
        if not have:
            continue
        f = (lambda x: f"{x:.2f}") if key in ("output_tokens_per_s", "goodput_rps") else fmt_time
        if priced is not None:
            ranking = closeness.rank_priced({escape(r["label"]): r[key] for r in have}, higher=high, on=priced)
            if ranking.winner is None:
                lines.append(f"{what}: no winner ({ranking.reason}): " + ", ".join(
                    f"{k} {f(ranking.medians[k])}" for k in ranking.order) + ".")
            else:
                lines.append(f"{what}: best {ranking.winner} ({f(ranking.medians[ranking.winner])}), worst "
                             f"{ranking.worst} ({f(ranking.medians[ranking.worst])}); apart by over "
                             f"{closeness.CLOSE:.0%}.")
            continue
        ranking = closeness.rank({escape(r["label"]): rounds_of(r, key) for r in have}, higher=high,
                                 counts=counts_of(have, key, lambda r: escape(r["label"])))
        if ranking.winner is None:
            lines.append(f"{what}: no winner ({ranking.reason}): " + ", ".join(
                f"{k} {closeness.spread_text(ranking, k, f)}" for k in ranking.order) + ".")
            continue
        lines.append(f"{what}: best {ranking.winner} ({closeness.spread_text(ranking, ranking.winner, f)}), worst "
                     f"{ranking.worst} ({closeness.spread_text(ranking, ranking.worst, f)}).")
    s, c = splits[0], one[0]
    sides = {"one engine": c.get("threads"), **dict(zip(("prefill engine", "decode engine"),
                                                          (int(x) for x in s["split"].split(":"))))}
    if len(set(sides.values())) != 1:          # different thread counts rank upside down on a busy machine
        lines.append("Not ranked: the steps ran on different thread counts (" + ", ".join(
            f"{k} {v}" for k, v in sides.items()) + "); run the split as T:T beside one engine on T threads.")
        return lines
    per_engine = {id(s): 2, id(c): 1}          # the split serves with two engines' steps, one engine with one
    figures = [("tok_s_per_engine", "tok/s per engine", True)] + figures[1:]

    def rounds(r, key):
        if key == "tok_s_per_engine":
            return [x / per_engine[id(r)] for x in rounds_of(r, "output_tokens_per_s")]
        return rounds_of(r, key)
    known = [(key, what, high) for key, what, high in figures
             if (key == "tok_s_per_engine" or (s.get(key) is not None and c.get(key) is not None))]
    if priced is not None:
        side = {what: closeness.figures_apart(rounds(s, key)[0], rounds(c, key)[0]) * (1 if high else -1)
                for key, what, high in known}
    else:
        side = {what: closeness.apart(rounds(s, key), rounds(c, key)) * (1 if high else -1)
                for key, what, high in known}
    tied = [what for what, v in side.items() if v == 0]
    lost = [what for what, v in side.items() if v < 0]
    won = [what for what, v in side.items() if v > 0]
    verdict = "; ".join(x for x in (f"wins on {', '.join(won)}" if won else "",
                                    f"loses on {', '.join(lost)}" if lost else "",
                                    f"has no winner against it on {', '.join(tied)}" if tied else "") if x)
    if priced is not None:
        lines.append(f"Against {escape(c['label'])} the split {verdict}, on {priced}: "
                     f"{closeness.PRICED_RULE}. Priced:")
    else:
        lines.append(f"Against {escape(c['label'])} the split {verdict}, by the verdict rule "
                     f"({closeness.rule_words(len(rounds(c, known[0][0])))}); every engine's steps alike: "
                     f"{closeness.holds_for(c['threads'])}. Measured:")
    lines.append(f"  busy: prefill engine {s['busy'][0]:.0%}, decode engine {s['busy'][1]:.0%} of the run "
                 f"(one engine: {c['busy'][0]:.0%}); an engine idles when its phase has no work.")
    fp, fd, fc = s["fit"][0], s["fit"][1], c["fit"][0]
    bad = [f"{who}: {fit_problem(f).split(':')[0]}" for who, f in (("prefill engine", fp), ("decode engine", fd),
                                                                     ("one engine", fc))
           if f is not None and fit_problem(f) is not None]      # the words before the colon: no noise named
    if bad:
        lines.append("  fits of step time against tokens not used, they explain too little here ("
                     + "; ".join(bad) + ").")
    else:
        if fp and fc:
            lines.append(f"  a prompt token: {fmt_time(fp['per_token_s'])} on the prefill engine, "
                         f"{fmt_time(fc['per_token_s'])} on one engine (fits of step time against tokens).")
        if fd and fc:
            lines.append(f"  a step's fixed part: {fmt_time(fd['fixed_s'])} on the decode engine, "
                         f"{fmt_time(fc['fixed_s'])} on one engine.")
    lines.append("  The simulation runs one engine's step at a time (the two never compete for bandwidth: "
                 "favours the split) and sends the KV after the whole prefill (not layer by layer: "
                 "disfavours it).")
    n = max(1, s["handoffs"])
    lines.append(f"  KV moved: {fmt_bytes(s['kv_bytes_moved'])} in {s['handoffs']} handoffs "
                 f"({fmt_bytes(s['kv_bytes_moved'] / n)} each), {fmt_time(s['link_seconds'] / n)} each on a "
                 f"{s['link_gbps']:.3g} Gb/s link, before the request's second token.")
    return lines
