"""Lesson 13: When the two phases meet. Prefill and decode in one batch interfere; a step's token
budget trades the gap between tokens against throughput; goodput is not throughput; splitting the
phases onto two engines moves KV bytes. Every figure from runs made here.

Run:  python lessons/13_two_phases.py        (or: minillm learn 13)
"""

from __future__ import annotations

from minillm.lessons._common import Lesson, bar_chart, fmt_x, paired_chart, plural, run_lesson

from rich import box
from rich.table import Table

from minillm.measure.chips import get_chip, roofline
from minillm.measure.comparisons import comparison_threads, fit_problem
from minillm.threads import blas_threads
from minillm.serving.disagg import (OnThreads, colocated_summary, disaggregated_engines,
                                    measure_copy_gbps, run_interleaved)
from minillm.serving.metrics import engine_for, serve, step_fit, summarize
from minillm.serving.workloads import WorkItem, generate_workload
from minillm.ui.report import fmt_bytes, fmt_time

TITLE = "When the two phases meet"
MINUTES = 10
WHAT_YOU_WILL_SEE = "a long prefill stalling decodes; the budget sweep; goodput; the P/D split"
CHUNKS = (16, 32, 64, 128)   # prompt tokens a step may carry beside the decodes, in the fit's chart


def lesson(L: Lesson) -> None:
    model = L.load_model(default="large", fast="random-tiny")
    items = workload(L, model)
    L.pause()
    interference(L, model, items)
    L.pause()
    sweep = budgets(L, model, items)
    L.pause()
    goodput_vs_throughput(L, model)
    L.pause()
    split = disaggregation(L, model, items)
    L.pause()
    remedies(L, model, sweep, split)
    L.try_it("""
        `minillm serve-sim --workload mixed --compare budget --slo ttft=2,tpot=0.1` sweeps the budget
        on your machine; `--compare disagg` (with `--link-gbps 25` for a real network link) puts the
        split beside one engine; `minillm loadgen --slo ...` measures goodput against `minillm serve`.
    """)


def workload(L: Lesson, model) -> list[WorkItem]:
    """`mixed`: short chats and, one in eight, a long document, at a rate that keeps several running."""
    c = model.config
    probe = [WorkItem(0.0, w.prompt, w.max_tokens) for w in
             generate_workload("poisson", rate=1.0, n=2, seed=1, vocab_size=c.vocab_size, n_ctx=c.n_ctx)]
    with L.status("timing two requests alone…"):
        r, _ = serve(model, probe, policy="sequential")
    rate = 4.0 / (r["duration_s"] / 2)
    n = L.pick(24, 16)
    items = generate_workload("mixed", rate=rate, n=n, seed=0, vocab_size=c.vocab_size, n_ctx=c.n_ctx)
    long = [w for w in items if len(w.prompt) > c.n_ctx // 2]
    L.say(f"""
        Prefill runs a whole prompt through the model at once: arithmetic-bound once the prompt is longer
        than about the machine's ridge in tokens (lesson 7). Decode runs one token per sequence: bound by
        reading the weights. A server runs both **in the same step**: that is what
        continuous batching does. This lesson looks at what that costs the sequences that are decoding.

        The workload (`--workload mixed`): {n} requests at {rate:.2g} per second, short chats (prompts
        {min(len(w.prompt) for w in items if w not in long)}-{max(len(w.prompt) for w in items if w not in long)}
        tokens) and {len(long)} long documents of {', '.join(str(len(w.prompt)) for w in long)} tokens on
        `{model.name}` (context {c.n_ctx}).
    """)
    return items


def gaps_of(req) -> list[float]:
    t = req.token_times
    return [b - a for a, b in zip(t, t[1:])]


def interference(L: Lesson, model, items) -> None:
    L.section("Interference, in one picture")
    budget = L.pick(32, 16)
    whole = engine_for(model, items, max_batched_tokens=model.config.n_ctx * 16)
    chunked = engine_for(model, items, max_batched_tokens=budget)
    with L.status("serving the workload twice, whole prompts and chunks, step by step in turn…"):
        run_interleaved([whole, chunked])
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
           f"decodes: {fmt_time(stall.seconds)}[/]")
    L.claim(stall.prefill_tokens > budget and max(s.n_tokens for s in chunked.steps) <= budget,
            f"without chunking, a step ran {stall.prefill_tokens} prompt tokens beside {stall.decode_tokens} "
            f"decodes; with a budget of {budget} no step ran more than {budget} tokens")
    decode_only = sorted(s.seconds for s in whole.steps if not s.prefill_tokens)
    if decode_only:                      # a timing: words from the numbers, never a failing claim
        typical = decode_only[len(decode_only) // 2]
        r = stall.seconds / typical
        how = "longer than" if r > 1.25 else "shorter than" if r < 0.8 else "about as long as"
        L.say(f"That step took {fmt_time(stall.seconds)}: {fmt_x(r)} a median decode-only step "
              f"({fmt_time(typical)}), {how} one.")
    a, b = summarize(whole), summarize(chunked)
    same = all(whole.requests[k].output == chunked.requests[k].output for k in whole.requests)
    L.claim(same, "both runs gave every request the same tokens: only the timing changed")
    r = b["tbt_p99_s"] / a["tbt_p99_s"] if a["tbt_p99_s"] else 1.0
    how = ("chunking lowered it" if r < 0.9 else "chunking raised it" if r > 1.1
           else "within 10%: on this run chunking did not change it")
    L.say(f"The p99 gap between tokens: {fmt_time(a['tbt_p99_s'])} with whole prompts, "
          f"{fmt_time(b['tbt_p99_s'])} in chunks of {budget}: {how}.")
    L.say(f"""
        A running sequence gets its next token only when the step it is in ends. A step that also runs
        a {stall.prefill_tokens}-token prompt lasts as long as that prompt's arithmetic: every decode
        in it waits ({fmt_time(stall.seconds)} here). Chunked prefill (Sarathi-Serve; always on in vLLM V1)
        caps the prompt tokens per step, so the long prompt is spread over several steps, each longer than
        a pure decode step by its chunk's work (the budget sweep below fits how much).
    """)


def budgets(L: Lesson, model, items) -> dict:
    L.section("The budget sweep")
    from minillm.ui.report import budget_verdict
    c = model.config
    sizes = L.pick((16, 32, 64, 128, None), (16, 64, None))
    engines = [engine_for(model, items, max_batched_tokens=b or c.n_ctx * 16) for b in sizes]
    with L.status(f"serving the workload at {len(sizes)} budgets, interleaved…"):
        run_interleaved(engines)
    probe = summarize(engines[-1])
    slo = {"ttft": round(2 * probe["ttft_p50_s"], 3), "tpot": round(1.5 * probe["tbt_p50_s"], 4)}
    results = []
    for b, e in zip(sizes, engines):
        r = summarize(e, "no chunking" if b is None else f"budget {b}", slo=slo)
        r["budget"] = b
        results.append(r)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("budget", "tok/s", "TTFT p50", "p95", "TBT p95", "p99", "good/s"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in results:
        t.add_row("none" if r["budget"] is None else str(r["budget"]), f"{r['output_tokens_per_s']:.1f}",
                  fmt_time(r["ttft_p50_s"]), fmt_time(r["ttft_p95_s"]), fmt_time(r["tbt_p95_s"]),
                  fmt_time(r["tbt_p99_s"]), f"{r['goodput_rps']:.2f}")
    fit = step_fit([s for e in engines for s in e.steps])
    L.show(t, f"[dim]targets: TTFT ≤ {fmt_time(slo['ttft'])} (twice the no-chunking run's median), TPOT ≤ "
              f"{fmt_time(slo['tpot'])} (1.5× its median gap); good/s: requests per second meeting both[/]")
    L.busy_note()
    problem = fit_problem(fit)
    if problem is not None:                 # a fit that explains nothing: say so, conclude nothing from it
        L.note(f"the fit of step time against tokens is not used: {problem}. Run again with --threads 1 on a "
               "quieter machine for the budget's per-token cost.")
    read = model.nbytes() / (L.machine().bandwidth_gbs * 1e9)
    for line in budget_verdict(results, None if problem else fit, slo, weight_read_s=read):
        L.console.print(line)
    L.console.print()
    if problem is None:
        a, b = fit["fixed_s"], fit["per_token_s"]
        B = L.pick(16, 8)
        rows = [(f"decode step, {B} seqs", a + B * b, fmt_time(a + B * b))] + [
            (f"+ chunk of {n}", a + (B + n) * b, f"{fmt_time(a + (B + n) * b)} ({fmt_x((a + (B + n) * b) / (a + B * b))})")
            for n in CHUNKS]
        L.show(bar_chart(f"a step by the fit: {fmt_time(a)} + {fmt_time(b)} per token (r² {fit['r2']:.2f})", rows))
        worst = rows[-1][1] / rows[0][1]
        how = ("hardly longer" if worst < 1.25 else "somewhat longer" if worst < 2 else "much longer")
        L.say(f"A step that carries a chunk of up to {CHUNKS[-1]} prompt tokens beside {B} decodes is {how} than a pure "
              f"decode step here: up to {fmt_x(worst)}, by the fit.")
        L.say("""
            The budget is a dial. Small: every step stays short, so the gap between tokens stays close to a
            pure decode step, but a long prompt takes many steps to finish, each paying the step's fixed
            cost. Large: fewer, longer steps, and a long prompt lands in one of them. vLLM's guidance (about
            2048 for latency, more than 8192 for throughput) is for a GPU: the last section weighs it.
        """)
    return {"results": results, "fit": fit, "slo": slo}


def goodput_vs_throughput(L: Lesson, model) -> None:
    L.section("Goodput is not throughput")
    c = model.config
    n = L.pick(16, 8)
    items = [WorkItem(0.0, w.prompt, L.pick(16, 8)) for w in
             generate_workload("poisson", rate=1.0, n=n, seed=2, vocab_size=c.vocab_size, n_ctx=c.n_ctx)]
    caps = L.pick((1, 2, 4, 8, 16), (1, 4, 8))
    engines = [engine_for(model, items, max_seqs=b) for b in caps]
    with L.status(f"serving {n} requests with batches of {', '.join(map(str, caps))}, interleaved…"):
        run_interleaved(engines)
    lo_, hi_ = summarize(engines[0]), summarize(engines[-1])
    slo = {"tpot": (lo_["tpot_p50_s"] * hi_["tpot_p50_s"]) ** 0.5}   # between the smallest and largest batch
    rs = [summarize(e, f"batch {b}", slo=slo) for b, e in zip(caps, engines)]
    L.show(bar_chart("output tokens per second", [(r["policy"], r["output_tokens_per_s"],
                                                  f"{r['output_tokens_per_s']:.1f}") for r in rs]),
           bar_chart(f"goodput: requests/s with TPOT ≤ {fmt_time(slo['tpot'])}",
                     [(r["policy"], r["goodput_rps"], f"{r['goodput_rps']:.2f} ({r['slo_met']['all']:.0%})")
                      for r in rs], style="green"),
           f"[dim]the target: halfway (geometric mean) between the median TPOT of batch {caps[0]} "
           f"({fmt_time(lo_['tpot_p50_s'])}) and of batch {caps[-1]} ({fmt_time(hi_['tpot_p50_s'])})[/]")
    fast_ = max(rs, key=lambda r: r["output_tokens_per_s"])
    good = max(rs, key=lambda r: r["goodput_rps"])
    if fast_ is good:     # a busy machine can blur the steps' times; say what this run showed
        L.note(f"on this run {fast_['policy']} led both tokens/s and goodput: the target did not separate "
               "them here (see the TPOT medians above); run it again on a quieter machine")
    else:
        L.say(f"On this run the most tokens per second came from {fast_['policy']} "
              f"({fast_['output_tokens_per_s']:.1f}); the most requests meeting the target from {good['policy']} "
              f"({good['goodput_rps']:.2f}/s).")
    top = caps[[r is fast_ for r in rs].index(True)]
    grew = top == caps[-1]
    L.say(f"""
        A bigger batch shares each weight read among more sequences: more tokens per second, up to the
        critical batch, where a step turns compute-bound (lesson 8) and tokens per second flatten. Here
        tokens per second {'grew up to the largest batch, ' + str(top) if grew else f'peaked at batch {top}, below the largest ({caps[-1]})'}.
        Each sequence's step is longer, so its time per output token grows, and past the target a request
        counts for nothing. **Goodput** (as `vllm bench serve --goodput` counts it, at one rate)
        counts only the requests that met every target: the measure a product with a latency promise
        lives by. The target here comes from the run itself; a real one comes from the product. And one
        rate says little: systems are compared by the **highest request rate** at which, say, 90% of
        requests still meet the target (DistServe's 4.48× and 10.2× are such rates), found by sweeping
        the rate: `minillm serve-sim --rates 1,2,4,8 --slo ...` does that here.
    """)


def disaggregation(L: Lesson, model, items) -> dict:
    L.section("Splitting the phases: two engines, KV on the wire")
    with L.status("measuring this machine's copy bandwidth…"):
        link = measure_copy_gbps()
    budget = L.pick(32, 16)
    threads, why = comparison_threads(blas_threads())
    T = threads or 1
    one = OnThreads(engine_for(model, items, max_batched_tokens=budget), T)
    split = disaggregated_engines(model, items, p_threads=T, d_threads=T, link_gbps=link,
                                  max_batched_tokens=budget)
    with L.status(f"serving the workload on one engine and split, every step on {T} thread(s), interleaved…"):
        run_interleaved([one, split])
    a = colocated_summary(one.engine, T, label="one engine")
    b = split.summary(label="split")
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("", "tok/s", "per engine", "TTFT p95", "TPOT p95", "TBT p99", "KV moved"):
        t.add_column(col, justify="right", no_wrap=True)
    for r, n in ((a, 1), (b, 2)):
        t.add_row(r["label"], f"{r['output_tokens_per_s']:.1f}", f"{r['output_tokens_per_s'] / n:.1f}",
                  fmt_time(r["ttft_p95_s"]), fmt_time(r["tpot_p95_s"]), fmt_time(r["tbt_p99_s"]),
                  fmt_bytes(r["kv_bytes_moved"]))
    L.show(t, f"[dim]every step of every engine on {plural(T, 'BLAS thread')}; link: {link:.3g} Gb/s, this "
              "machine's measured copy; per engine: tok/s ÷ the engines that served[/]")
    if why:
        L.note(why)
    c = model.config
    per_pos = 2 * c.n_layer * c.n_kv_head * c.head_dim * model.dtype.itemsize
    expect = sum(per_pos * len(w.prompt) for w in items if w.max_tokens > 1)
    L.claim(b["kv_bytes_moved"] == expect,
            f"the KV handed over: {fmt_bytes(expect)} = 2 (K, V) × {c.n_layer} layers × {c.n_kv_head} heads × "
            f"{c.head_dim} × {model.dtype.itemsize} bytes = {per_pos:,} bytes per prompt position")
    outs = split.outputs()
    L.claim(all(outs[k] == one.engine.requests[k].output for k in outs),
            "every request got the same tokens from the split as from one engine")
    at25 = expect * 8 / 25e9
    L.say(f"""
        The prefill engine runs prompts only, the decode engine decodes only: no prompt ever shares a
        step with a decode, and each can have its own batch and budget. Here each engine steps on
        {plural(T, 'thread')}, as the one engine does: two devices like this one against one, as DistServe
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
    return {"one": a, "split": b}


def remedies(L: Lesson, model, sweep: dict, split: dict) -> None:
    L.section("Which remedy, for which target, here and on a GPU")
    res = sweep["results"]
    whole = next(r for r in res if r["budget"] is None)
    best_chunk = min((r for r in res if r["budget"] is not None), key=lambda r: r["tbt_p99_s"])
    # throughput per engine: the split serves with two engines' steps, the others with one
    options = {"no chunking": {**whole, "per_engine": whole["output_tokens_per_s"]},
               f"chunked ({best_chunk['policy']})": {**best_chunk, "per_engine": best_chunk["output_tokens_per_s"]},
               "split": {**split["split"], "per_engine": split["split"]["output_tokens_per_s"] / 2}}
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("target", "best here", "its figure", "worst"):
        t.add_column(col, no_wrap=True)
    for key, what, high in (("per_engine", "tok/s per engine", True), ("ttft_p95_s", "TTFT p95", False),
                            ("tbt_p99_s", "TBT p99", False)):
        order = sorted(options, key=lambda k: options[k][key], reverse=high)
        f = (lambda x: f"{x:.1f} tok/s") if high else fmt_time
        t.add_row(what, order[0], f(options[order[0]][key]), order[-1])
    L.show(t, "[dim]from this lesson's runs of the mixed workload (the split ran in its own interleaved "
              "pair, on as many threads per step as one engine, so compare it with care)[/]")
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
        GPU is bound by kernel launches, not by this roofline: lesson 6.)
    """)
    problem = fit_problem(fit)
    if problem is None:
        read = wbytes / (L.machine().bandwidth_gbs * 1e9)
        rest = fit["fixed_s"] - read
        L.say(f"""
            Here, the fit's fixed part per step is {fmt_time(fit['fixed_s'])}. Reading the weights once
            ({fmt_bytes(wbytes)} at this machine's {L.machine().bandwidth_gbs:.1f} GB/s) takes
            {fmt_time(read)} of it; {'the rest, ' + fmt_time(rest) + ', is overhead' if rest > 0 else 'the fit puts it below the read'}
            (NumPy's and Python's per-step work, and what the token count does not capture). The GPU's knee
            above is another quantity: where arithmetic overtakes that read.
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
