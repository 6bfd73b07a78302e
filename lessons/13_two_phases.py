"""Lesson 13: When the two phases meet. Prefill and decode in one batch interfere; a step's token
budget trades the gap between tokens against throughput; goodput is not throughput; splitting the
phases onto two engines moves KV bytes. Every figure from runs made here.

Run:  python lessons/13_two_phases.py        (or: minillm learn 13)
"""

from __future__ import annotations

import math

from minillm.lessons._common import Lesson, bar_chart, fmt_x, paired_chart, roofline_clock, run_lesson
from minillm import closeness

from rich import box
from rich.table import Table

from minillm.measure.chips import get_chip, roofline
from minillm.measure.comparisons import fit_problem
from minillm.threads import blas_threads
from minillm.serving.disagg import colocated, disaggregated
from minillm.serving.metrics import serve, step_fit, summarize
from minillm.serving.rates import (capacity_words, highest_rate, price_lines, rate_engines, rate_summaries,
                                   token_prices)
from minillm.serving.workloads import WorkItem, generate_workload
from minillm.ui.report import fmt_bytes, fmt_time

TITLE = "When the two phases meet"
MINUTES = 13  # 2,606 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "a long prefill stalling decodes; the budget sweep; goodput; the P/D split"
CHUNKS = (16, 32, 64, 128)   # prompt tokens a step may carry beside the decodes, in the fit's chart
PRICE_PER_HOUR = 1.0         # an example price of one engine an hour, in dollars: edit it (the rest is measured)


def fmt_rate(rate: float) -> str:
    """A request rate in words: '410 per second', '2.5 per second'."""
    return f"{rate:,.0f} per second" if rate >= 10 else f"{rate:.2g} per second"


def lesson(L: Lesson) -> None:
    model = L.load_model(default="large", fast="random-tiny")
    clock = roofline_clock(L)
    items = workload(L, model, clock)
    L.pause()
    interference(L, model, items, clock)
    L.pause()
    sweep = budgets(L, model, items, clock)
    L.pause()
    goodput_vs_throughput(L, model, clock)
    L.pause()
    rates_and_prices(L, model, clock)
    L.pause()
    split = disaggregation(L, model, items, clock, sweep)
    L.pause()
    remedies(L, model, sweep, split, clock)
    L.try_it("""
        `minillm serve-sim --workload mixed --compare budget --slo ttft=2,tpot=0.1` sweeps the budget
        on your machine; `--compare disagg` (with `--link-gbps 25` for a real network link) puts the
        split beside one engine; `minillm loadgen --slo ...` measures goodput against `minillm serve`.
    """)


def alone_seconds(model, clock) -> float:
    """Seconds a request takes served alone on `clock` (the roofline clock: the same every run): two
    seeded requests one after the other."""
    c = model.config
    probe = [WorkItem(0.0, w.prompt, w.max_tokens) for w in
             generate_workload("poisson", rate=1.0, n=2, seed=1, vocab_size=c.vocab_size, n_ctx=c.n_ctx)]
    r, _ = serve(model, probe, policy="sequential", step_time=clock)
    return r["duration_s"] / 2


def price_words(L: Lesson, runs: list[dict]) -> str:
    """The measured time beside the priced: how long the model steps of `runs` took against their
    price (each run's `roofline_share`), and under what conditions. No verdict on it."""
    share = [r["roofline_share"] for r in runs if r.get("roofline_share")]
    if not share:
        return "the model steps' measured time was not recorded"
    lo, hi = 1 / max(share), 1 / min(share)
    span = fmt_x(lo) if f"{lo:.2g}" == f"{hi:.2g}" else f"{fmt_x(lo)}-{fmt_x(hi)}"
    return f"measured ({L.conditions()}), the model steps took {span} their price"


def workload(L: Lesson, model, clock) -> list[WorkItem]:
    """`mixed`: short chats and, one in eight, a long document, at a rate that keeps several running
    (four requests in the time of one alone, priced) -> the requests."""
    c = model.config
    with L.status("pricing two requests alone…"):
        alone = alone_seconds(model, clock)
    rate = 4.0 / alone
    n = L.pick(24, 16)
    items = generate_workload("mixed", rate=rate, n=n, seed=0, vocab_size=c.vocab_size, n_ctx=c.n_ctx)
    long = [w for w in items if len(w.prompt) > c.n_ctx // 2]
    L.say(f"""
        Prefill runs a whole prompt through the model at once: arithmetic-bound once the prompt is longer
        than about the machine's ridge in tokens (lesson 7). Decode runs one token per sequence: bound by
        reading the weights. A server runs both **in the same step**: that is what
        continuous batching does. This lesson looks at what that costs the sequences that are decoding.

        The workload (`--workload mixed`): {n} requests at {fmt_rate(rate)}, short chats (prompts
        {min(len(w.prompt) for w in items if w not in long)}-{max(len(w.prompt) for w in items if w not in long)}
        tokens) and {len(long)} long documents of {', '.join(str(len(w.prompt)) for w in long)} tokens on
        `{model.name}` (context {c.n_ctx}): four requests in the time one takes alone
        ({fmt_time(alone)}).

        Time here is priced, not stopwatched, on the roofline clock of lesson 9. Every step really runs (the tokens are
        real, the meter counts every byte and FLOP), but the engine's clock advances by the step's price
        on {clock.words()}: max(bytes ÷ bandwidth, FLOPs ÷ peak). So every configuration below sees the
        same arrivals, and a run served again, or beside other work, is the same run: its verdicts cannot
        flip with the load. What the roofline leaves out (Python, dispatch, kernels below peak) is said
        beside each table as the measured time.
    """)
    return items


def gaps_of(req) -> list[float]:
    t = req.token_times
    return [b - a for a, b in zip(t, t[1:])]


def interference(L: Lesson, model, items, clock) -> None:
    L.section("Interference, in one picture")
    budget = L.pick(32, 16)
    L.recheck()
    with L.status("serving the workload whole and in chunks…"):
        a, whole = serve(model, items, max_batched_tokens=model.config.n_ctx * 16, step_time=clock)
        b, chunked = serve(model, items, max_batched_tokens=budget, step_time=clock)
    # the step that ran the most prompt tokens beside running decodes, and a request that waited in it
    stall = max((s for s in whole.steps if s.decode_tokens), key=lambda s: (s.prefill_tokens, s.seconds))
    end = stall.start + stall.seconds
    victim = next(r for r in whole.requests.values()
                  if any(abs(t - end) < 1e-12 for t in r.token_times[1:]))
    at = next(i for i, t in enumerate(victim.token_times) if abs(t - end) < 1e-12)
    g1, g2 = gaps_of(victim), gaps_of(chunked.requests[victim.id])
    rows = [(f"gap {i + 1}" + (" ◆" if i + 1 == at else ""), a, b, fmt_time(a), fmt_time(b))
            for i, (a, b) in enumerate(zip(g1, g2))]
    L.show(paired_chart(f"request {victim.id}: the gap before each of its tokens", rows,
                        ("whole", f"chunk {budget}")),
           f"[dim]◆ the step that ran {stall.prefill_tokens} prompt tokens beside {stall.decode_tokens} "
           f"decodes: {fmt_time(stall.seconds)}; on {clock.words()}; {price_words(L, [a, b])}[/]")
    L.claim(stall.prefill_tokens > budget and max(s.n_tokens for s in chunked.steps) <= budget,
            f"without chunking, a step ran {stall.prefill_tokens} prompt tokens beside {stall.decode_tokens} "
            f"decodes; with a budget of {budget} no step ran more than {budget} tokens")
    decode_only = sorted(s.seconds for s in whole.steps if not s.prefill_tokens)
    if decode_only:                      # priced: words from the numbers, the same every run
        typical = decode_only[len(decode_only) // 2]
        r = stall.seconds / typical
        how = "longer than" if r > 1.25 else "shorter than" if r < 0.8 else "about as long as"
        L.say(f"That step's price: {fmt_time(stall.seconds)}, {fmt_x(r)} a median decode-only step "
              f"({fmt_time(typical)}), {how} one.")
    same = all(whole.requests[k].output == chunked.requests[k].output for k in whole.requests)
    L.claim(same, "both runs gave every request the same tokens: only the timing changed")
    side = closeness.figures_apart(b["tbt_p99_s"], a["tbt_p99_s"])
    how = (f"chunking {'lowered' if side < 0 else 'raised'} it ({closeness.PRICED_RULE})" if side
           else f"no winner (within {closeness.CLOSE:.0%})")
    L.say(f"The p99 gap between tokens, priced: {fmt_time(a['tbt_p99_s'])} with whole prompts, "
          f"{fmt_time(b['tbt_p99_s'])} in chunks of {budget}: {how}.")
    L.say(f"""
        A running sequence gets its next token only when the step it is in ends. A step that also runs
        a {stall.prefill_tokens}-token prompt lasts as long as that prompt's arithmetic: every decode
        in it waits ({fmt_time(stall.seconds)} here, priced). Chunked prefill (Sarathi-Serve; always on in vLLM V1)
        caps the prompt tokens per step, so the long prompt is spread over several steps, each longer than
        a pure decode step by its chunk's work (the budget sweep below fits how much).
    """)


def budgets(L: Lesson, model, items, clock) -> dict:
    L.section("The budget sweep")
    from minillm.ui.report import budget_verdict
    c = model.config
    sizes = L.pick((16, 32, 64, 128, None), (16, 64, None))
    L.recheck()
    with L.status(f"serving the workload at {len(sizes)} budgets…"):
        engines = [serve(model, items, max_batched_tokens=b or c.n_ctx * 16, step_time=clock)[1] for b in sizes]
    probe = summarize(engines[-1])
    slo = {"ttft": round(2 * probe["ttft_p50_s"], 3), "tpot": round(1.5 * probe["tbt_p50_s"], 4)}
    results = []
    for b, e in zip(sizes, engines):
        r = summarize(e, "no chunking" if b is None else f"budget {b}", slo=slo)
        r["budget"], r["threads"] = b, blas_threads()
        results.append(r)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("budget", "tok/s", "TTFT p50", "p95", "TBT p95", "p99", "good/s"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in results:
        t.add_row("none" if r["budget"] is None else str(r["budget"]), f"{r['output_tokens_per_s']:.1f}",
                  fmt_time(r["ttft_p50_s"]), fmt_time(r["ttft_p95_s"]), fmt_time(r["tbt_p95_s"]),
                  fmt_time(r["tbt_p99_s"]), f"{r['goodput_rps']:.2f}")
    fit = step_fit([s for e in engines for s in e.steps])
    L.show(t, f"[dim]on {clock.words()}; targets: TTFT ≤ {fmt_time(slo['ttft'])} (twice the no-chunking run's "
              f"median), TPOT ≤ {fmt_time(slo['tpot'])} (1.5× its median gap); good/s: requests per second "
              f"meeting both; {price_words(L, results)}[/]")
    problem = fit_problem(fit, priced=True)   # served on the roofline clock
    if problem is not None:                 # a fit that explains nothing: say so, conclude nothing from it
        L.note(f"the fit of step time against tokens is not used: {problem}.")
    for line in budget_verdict(results, None if problem else fit, slo, weight_read_s=None, priced=clock.words()):
        L.console.print(line)
    L.console.print()
    if problem is None:
        a, b = fit["fixed_s"], fit["per_token_s"]
        B = L.pick(16, 8)
        rows = [(f"decode step, {B} seqs", a + B * b, fmt_time(a + B * b))] + [
            (f"+ chunk of {n}", a + (B + n) * b, f"{fmt_time(a + (B + n) * b)} ({fmt_x((a + (B + n) * b) / (a + B * b))})")
            for n in CHUNKS]
        L.show(bar_chart(f"a step by the fit: {fmt_time(a)} + {fmt_time(b)} per token (r² {fit['r2']:.2f})", rows),
               "[dim]the fit of the steps' prices against their tokens[/]")
        worst = rows[-1][1] / rows[0][1]
        how = ("hardly longer" if worst < 1.25 else "somewhat longer" if worst < 2 else "much longer")
        L.say(f"A step that carries a chunk of up to {CHUNKS[-1]} prompt tokens beside {B} decodes is {how} than a pure "
              f"decode step here: up to {fmt_x(worst)}, by the fit of the prices.")
        L.say("""
            The budget is a dial. Small: every step stays short, so the gap between tokens stays close to a
            pure decode step, but a long prompt takes many steps to finish, each paying the step's fixed
            cost. Large: fewer, longer steps, and a long prompt lands in one of them. vLLM's guidance (about
            2048 for latency, more than 8192 for throughput) is for a GPU: the last section weighs it.
        """)
    return {"results": results, "fit": fit, "slo": slo}


def goodput_vs_throughput(L: Lesson, model, clock) -> None:
    L.section("Goodput is not throughput")
    c = model.config
    n = L.pick(16, 8)
    items = [WorkItem(0.0, w.prompt, L.pick(16, 8)) for w in
             generate_workload("poisson", rate=1.0, n=n, seed=2, vocab_size=c.vocab_size, n_ctx=c.n_ctx)]
    caps = L.pick((1, 2, 4, 8, 16), (1, 4, 8))
    L.recheck()
    with L.status(f"serving {n} requests with batches of {', '.join(map(str, caps))}…"):
        engines = [serve(model, items, max_seqs=b, step_time=clock)[1] for b in caps]
    lo_, hi_ = summarize(engines[0]), summarize(engines[-1])
    slo = {"tpot": (lo_["tpot_p50_s"] * hi_["tpot_p50_s"]) ** 0.5}   # between the smallest and largest batch
    rs = [summarize(e, f"batch {b}", slo=slo) for b, e in zip(caps, engines)]
    L.show(bar_chart("output tokens per second", [(r["policy"], r["output_tokens_per_s"],
                                                  f"{r['output_tokens_per_s']:.1f}") for r in rs]),
           bar_chart(f"goodput: requests/s with TPOT ≤ {fmt_time(slo['tpot'])}",
                     [(r["policy"], r["goodput_rps"], f"{r['goodput_rps']:.2f} ({r['slo_met']['all']:.0%})")
                      for r in rs], style="green"),
           f"[dim]on {clock.words()}; the target: halfway (geometric mean) between the median TPOT of batch "
           f"{caps[0]} ({fmt_time(lo_['tpot_p50_s'])}) and of batch {caps[-1]} ({fmt_time(hi_['tpot_p50_s'])}); "
           f"{price_words(L, rs)}[/]")
    tput = closeness.rank_priced({r["policy"]: r["output_tokens_per_s"] for r in rs})
    good = closeness.rank_priced({r["policy"]: r["goodput_rps"] for r in rs})
    L.say(closeness.best_words(tput, "Tokens per second", lambda v: f"{v:.1f}") + " "
          + closeness.best_words(good, "Goodput", lambda v: f"{v:.2f}/s"))
    L.say(f"""
        A bigger batch shares each weight read among more sequences: more tokens per second, up to the
        critical batch, where a step turns compute-bound (lesson 8) and tokens per second flatten. Here
        tokens per second {peak_words(tput, [r['policy'] for r in rs])}. Each sequence's step is longer, so its
        time per output token grows, and past the target a request counts for nothing. **Goodput** (as
        `vllm bench serve --goodput` counts it, at one rate) counts only the requests that met every
        target: the measure a product with a latency promise lives by. The target here comes from the run
        itself; a real one comes from the product. And one rate says little: systems are compared by the
        **highest request rate** at which, say, 90% of requests still meet the target (DistServe's 4.48×
        and 10.2× are such rates), found by sweeping the rate: next.
    """)


def peak_words(ranking, order: list[str]) -> str:
    """Where tokens/s peaked over the batch caps, by the ranking (`closeness.rank_priced`: apart by over
    5%): 'grew up to the largest batch' only when the largest is apart from every other; 'peaked at' a
    smaller one only when it is apart from every larger batch; else no batch stands out."""
    if ranking.winner is None:
        return f"showed no batch apart from the others ({ranking.reason})"
    if ranking.winner == order[-1]:
        return f"grew up to the largest batch, {order[-1]}, apart from every other batch"
    return f"peaked at {ranking.winner}, below the largest ({order[-1]}): the larger batches fell apart from it"


def rates_and_prices(L: Lesson, model, clock) -> None:
    """X16, X26: the rate sweep `serve-sim --rates` runs, and what a token costs at the capacity found."""
    L.section("Goodput against the request rate, and what a token costs")
    c = model.config
    probe = [WorkItem(0.0, w.prompt, w.max_tokens) for w in
             generate_workload("poisson", rate=1.0, n=2, seed=3, vocab_size=c.vocab_size, n_ctx=c.n_ctx)]
    with L.status("pricing two requests alone…"):
        alone, _ = serve(model, probe, policy="sequential", step_time=clock)
    per = alone["duration_s"] / len(probe)
    rates = [float(f"{x / per:.3g}") for x in L.pick((0.5, 1, 2, 4, 8), (0.5, 1, 2, 4))]
    n = L.pick(16, 8)
    L.recheck()
    with L.status(f"serving {n} requests at {len(rates)} rates…"):
        engines = rate_engines(model, rates, workload="poisson", n=n, seed=0, step_time=clock)
    first, last = (summarize(e) for e in (engines[0], engines[-1]))      # the targets: between the two ends
    # TTFT: twice the lowest rate's p95 (priced, TTFT hardly grows over these rates: the batches absorb
    # them, so a target between the two ends could fail the lowest rate); TPOT: between the two ends
    slo = {"ttft": round(2 * first["ttft_p95_s"], 4),
           "tpot": round((first["tpot_p95_s"] * last["tpot_p95_s"]) ** 0.5, 5)}
    runs = rate_summaries(engines, rates, slo)
    h = highest_rate(runs)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("rate", "tok/s", "TTFT p95", "TPOT p95", "goodput", "met"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in runs:
        mark = " ◆" if r is h["run"] else ""
        t.add_row(f"{fmt_rate(r['rate']).split(' ')[0]}/s{mark}", f"{r['output_tokens_per_s']:.1f}",
                  fmt_time(r["ttft_p95_s"]), fmt_time(r["tpot_p95_s"]), f"{r['goodput_rps']:.2f}/s",
                  f"{r['attainment']:.0%}")
    L.say(f"""
        `minillm serve-sim --rates` serves the same seeded requests at each rate (the arrivals scaled),
        every rate's engine stepped in turn, and finds the highest rate at which 90% of the requests meet
        every target: one engine's **capacity**. Here {n} requests at {len(rates)} rates, from half the pace
        of one request alone ({fmt_time(per)}, priced) up; targets TTFT ≤ {fmt_time(slo['ttft'])}, twice the
        lowest rate's p95, and TPOT ≤ {fmt_time(slo['tpot'])}, halfway (geometric mean) between the lowest and
        the highest rate's p95.
    """)
    L.show(t, f"[dim]on {clock.words()}; met: the share of requests that met every target; ◆ the highest "
              f"rate where 90% did; {price_words(L, runs)}[/]")
    for line in capacity_words(h, "the targets", priced=clock.words()):
        L.console.print(line)
    L.console.print()
    run = h["run"] or runs[0]
    kv_tok = 2 * c.n_layer * c.n_kv_head * c.head_dim * model.dtype.itemsize
    hw = clock.hw                       # the figures the steps were priced at
    prices = token_prices(run, kv_tok, hw.bandwidth_gbs)
    L.say(f"""
        Providers price **input**, **cached input** and **output** tokens apart (cached input often about
        a tenth of input). The same run says why, {'at the capacity found' if h['run'] else 'at the lowest rate'}
        ({fmt_rate(run['rate'])}): split each step's priced seconds between its prompt and its output tokens by their
        FLOPs, charge the idle time to both, and a cached prompt token costs only the reload of its KV
        ({kv_tok:,} bytes at this machine's {hw.bandwidth_gbs:.1f} GB/s, lesson 10), not its prefill. At an
        example ${PRICE_PER_HOUR:g} an engine-hour (`PRICE_PER_HOUR` at the top of this lesson):
    """)
    for line in price_lines(prices, PRICE_PER_HOUR):
        L.console.print(line)
    L.console.print()
    L.fact("cost per million tokens = engine-seconds spent on them × (duration ÷ busy seconds) ÷ tokens × 10⁶ "
           "× price per hour ÷ 3,600; a reasoning or agent workload (long decode, shared prefixes) is priced "
           "mostly by its output and cached-input columns")


def disaggregation(L: Lesson, model, items, clock, sweep: dict) -> dict:
    """One engine against the split, every engine on the roofline clock; the remedies' table's other two
    options (whole prompts, the sweep's smallest budget) are served here again: priced, they give the
    budget sweep's figures, checked."""
    from minillm.ui.report import disagg_verdict
    L.section("Splitting the phases: two engines, KV on the wire")
    link = clock.copy_gbps()
    chunk = min(r["budget"] for r in sweep["results"] if r["budget"])
    budget = L.pick(32, 64)           # fast: not the sweep's smallest (16), a row of its own
    uncapped = model.config.n_ctx * 16   # a budget above any prompt: no chunking
    L.recheck()
    T = blas_threads() or 1              # every engine's steps alike (their price does not depend on it)
    with L.status(f"serving the workload on one engine and split (and whole prompts, budget {chunk} for the "
                  "last section)…"):
        one = colocated(model, items, threads=T, label="one engine", max_batched_tokens=budget, step_time=clock)
        b, split = disaggregated(model, items, label="split", p_threads=T, d_threads=T, link_gbps=link,
                                 max_batched_tokens=budget, prefill_batched_tokens=uncapped, step_time=clock)
        whole, _ = colocated(model, items, threads=T, label="no chunking", max_batched_tokens=uncapped,
                             step_time=clock)
        chunked, _ = colocated(model, items, threads=T, label=f"budget {chunk}", max_batched_tokens=chunk,
                               step_time=clock)
    a, one = one
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("", "tok/s", "per engine", "TTFT p95", "TPOT p95", "TBT p99", "KV moved"):
        t.add_column(col, justify="right", no_wrap=True)
    for r, n in split_rows(a, b, whole, chunked):
        t.add_row(r["label"], f"{r['output_tokens_per_s']:.1f}", f"{r['output_tokens_per_s'] / n:.1f}",
                  fmt_time(r["ttft_p95_s"]), fmt_time(r["tpot_p95_s"]), fmt_time(r["tbt_p99_s"]),
                  fmt_bytes(r["kv_bytes_moved"]))
    L.show(t, f"[dim]on {clock.words()}; link: {link:.3g} Gb/s, a copy in this machine's memory priced at "
              f"its bandwidth (each byte read and written once); per engine: tok/s ÷ the engines that served; "
              f"one engine: the split's decode budget, {budget}; {price_words(L, [a, b, whole, chunked])}[/]")
    c = model.config
    per_pos = 2 * c.n_layer * c.n_kv_head * c.head_dim * model.dtype.itemsize
    expect = sum(per_pos * len(w.prompt) for w in items if w.max_tokens > 1)
    L.claim(b["kv_bytes_moved"] == expect,
            f"the KV handed over: {fmt_bytes(expect)} = 2 (K, V) × {c.n_layer} layers × "
            f"{c.n_kv_head} heads × {c.head_dim} × {model.dtype.itemsize} bytes = {per_pos:,} bytes per prompt "
            "position")
    L.claim(all(split.outputs()[k] == one.requests[k].output for k in split.outputs()),
            "every request got the same tokens from the split as from one engine")
    swept = {r["budget"]: r for r in sweep["results"]}
    again = [(r, swept[k]) for r, k in ((whole, None), (chunked, chunk), (a, budget)) if k in swept]
    L.claim(all(math.isclose(r[f], s[f], rel_tol=1e-9) for r, s in again
                for f in ("output_tokens_per_s", "ttft_p95_s", "tbt_p99_s")),
            f"served again here, {', '.join(r['label'] for r, _ in again)} gave the budget sweep's "
            "tokens/s, TTFT p95 and TBT p99: priced, a configuration served twice is the same run")
    at25 = expect * 8 / 25e9
    L.console.print()
    for line in disagg_verdict([{**a, "link_gbps": link}, {**b, "link_gbps": link}], priced=clock.words()):
        if not line.startswith("  "):            # the rankings; the details are in the table and below
            L.console.print(line.removesuffix(" Measured:").removesuffix(" Priced:"))
    L.console.print()
    L.say(f"""
        The prefill engine runs prompts only, the decode engine decodes only: no prompt ever shares a
        step with a decode, and each can have its own batch and budget: here the prefill engine takes
        each prompt whole (no decode waits behind it, so nothing to chunk for), the decode engine
        keeps the budget of {budget}. Each engine steps on
        the same roofline as the one engine: two devices like this one against one, as DistServe
        puts prefill and decode on GPUs of their own (each with its full bandwidth and its own
        parallelism). The price: one of them idles whenever its phase has no work (busy
        {b['busy'][0]:.0%} and {b['busy'][1]:.0%} here), and every prompt's KV crosses a link
        ({fmt_bytes(expect / max(1, b['handoffs']))} per request on average; {fmt_time(at25 / max(1, b['handoffs']))}
        each at 25 Gb/s).
    """)
    L.say("""
        The simulation is not neutral, in two ways. It runs one engine's step at a time, so the two never
        compete for memory bandwidth or cache as two engines on one box would: that **favours** the
        split. And it sends a prompt's KV only after the whole prefill, where DistServe, Splitwise and
        Mooncake stream it layer by layer under the computation: that **disfavours** it. vLLM's own note
        on its P/D mode: it does not raise throughput, it lets TTFT and the gap between tokens be tuned
        apart. SGLang and NVIDIA Dynamo do it across GPUs and networks too.
    """)
    return {"one": a, "split": b, "whole": whole, "chunked": chunked, "threads": T}


def split_rows(one: dict, split: dict, whole: dict, chunked: dict) -> list[tuple[dict, int]]:
    """The split table's rows, (summary, engines that served): one engine with the decode budget, the
    split, and the remedies' other two options from the same section, so each configuration shows one
    throughput (issue 53: "no chunking" was printed with three)."""
    rows = [(one, 1), (split, 2), (whole, 1), (chunked, 1)]
    labels = [r["label"] for r, _ in rows]
    if len(set(labels)) != len(labels):
        raise ValueError(f"split_rows: two rows named alike: {labels}")
    return rows


def remedies(L: Lesson, model, sweep: dict, split: dict, clock) -> None:
    L.section("Which remedy, for which target, here and on a GPU")
    # the runs of disaggregation's section; per engine: the split serves with two engines' steps, the
    # others with one
    options = {"no chunking": (split["whole"], 1), split["chunked"]["label"]: (split["chunked"], 1),
               "split": (split["split"], 2)}

    def figure(r, n, key):
        if key == "per_engine":
            return r["output_tokens_per_s"] / n
        return r[key]
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("target", "best here", "its figure", "worst"):
        t.add_column(col, no_wrap=True)
    for key, what, high in (("per_engine", "tok/s per engine", True), ("ttft_p95_s", "TTFT p95", False),
                            ("tbt_p99_s", "TBT p99", False)):
        ranking = closeness.rank_priced({k: figure(r, n, key) for k, (r, n) in options.items()}, higher=high)
        f = (lambda x: f"{x:.1f} tok/s") if high else fmt_time
        t.add_row(what, ranking.winner or "no winner",
                  f(ranking.medians[ranking.winner]) if ranking.winner else f"within {closeness.CLOSE:.0%}",
                  ranking.loser or "—")
    L.show(t, f"[dim]the mixed workload, the previous section's runs, on {clock.words()}: a best or worst only "
              f"apart by over {closeness.CLOSE:.0%} from every other option[/]")
    fit = sweep["fit"]
    n_params, wbytes = model.n_params(), model.nbytes()
    fp16 = wbytes / model.dtype.itemsize * 2
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("chip", "ridge", "knee", "512 tokens", "2048 tokens"):
        t.add_column(col, justify="right", no_wrap=True)
    knees, cost = {}, {}
    for name in ("a100-80gb", "h100-sxm", "h200"):
        hw = get_chip(name)
        # the fewest tokens whose 2·params·N FLOPs outlast the weight read, by the roofline itself
        knees[name] = next(n for n in range(1, 100_000) if roofline(fp16, 2 * n_params * n, hw).bound == "compute")
        decode = roofline(fp16, 2 * n_params, hw).seconds
        cost[name] = {n: roofline(fp16, 2 * n_params * n, hw).seconds / decode for n in (512, 2048)}
        t.add_row(name, f"{hw.ridge:.0f}", f"{knees[name]}", fmt_x(cost[name][512]), fmt_x(cost[name][2048]))
    L.show(t, f"[dim]{model.name} in fp16 by the roofline: knee, the tokens at which a step turns compute-bound; "
              "512, 2048: a step of that many tokens against a batch-1 decode step (the weight read)[/]")
    h100 = get_chip("h100-sxm")
    L.fact(f"on an H100 a step turns compute-bound at {knees['h100-sxm']} tokens: its ridge "
           f"({h100.ridge:.0f} FLOPs per byte) × {fp16 / (2 * n_params):.0f} byte per FLOP of fp16 weights")
    lo = min(c[512] for c in cost.values())
    hi = max(c[2048] for c in cost.values())
    L.say(f"""
        Up to the knee a chunk rides almost free on the weight read. Past it each step grows in
        proportion to its tokens: a budget of 512 makes a step {fmt_x(lo)} to {fmt_x(max(c[512] for c in cost.values()))}
        a decode step on these chips, 2048 makes it {fmt_x(min(c[2048] for c in cost.values()))} to {fmt_x(hi)}.
        vLLM's "about 2048 for latency" is that compromise, not a free lunch. (A model this small on a
        GPU is bound by its kernels' count and size, not by this roofline: lesson 17 measures it.)
    """)
    problem = fit_problem(fit, priced=True)   # served on the roofline clock
    if problem is None:
        bw = clock.hw.bandwidth_gbs
        read = wbytes / (bw * 1e9)
        rest = fit["fixed_s"] - read
        if closeness.figures_apart(fit["fixed_s"], read) == 0:
            part = f"about all of it (within {closeness.CLOSE:.0%})"
        elif rest > 0:
            part = (f"{fmt_time(read)} of it; the rest, {fmt_time(rest)}, is the straight line's estimate of what "
                    "else a step reads (the KV cache, activations)")
        else:
            part = f"{fmt_time(read)}, more than the fit's fixed part: a straight line through the steps' prices"
        L.say(f"""
            Here, on the roofline clock, the fit's fixed part per step is {fmt_time(fit['fixed_s'])}. Reading
            the weights once ({fmt_bytes(wbytes)} at this machine's {bw:.1f} GB/s) takes {part}.
            The time the roofline leaves out (NumPy's and Python's per-step work) is not in it:
            {price_words(L, sweep['results'])}. The GPU's knee above is another quantity: where
            arithmetic overtakes that read.
        """)
    else:
        L.note(f"no comparison with this machine's step: its fit is not used ({problem}).")
    L.takeaway("""
        Prefill and decode want different things from a step. In one batch they interfere: a long prompt
        stalls every decode beside it. Chunking caps the stall at the price of more steps; splitting the
        phases removes it at the price of KV bytes on a link and an engine that idles. Which one
        fits is a measurement against a target: goodput, not throughput.
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
