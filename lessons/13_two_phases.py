"""Lesson 13: When the two phases meet. Prefill and decode in one batch interfere; a step's token
budget trades the gap between tokens against throughput; goodput is not throughput; splitting the
phases onto two engines moves KV bytes. Every figure from runs made here.

Run:  python lessons/13_two_phases.py        (or: minillm learn 13)
"""

from __future__ import annotations

from minillm.lessons._common import Lesson, bar_chart, fmt_x, paired_chart, run_lesson

from rich import box
from rich.table import Table

from minillm.measure.chips import CHIPS, roofline
from minillm.serving.disagg import (OnThreads, colocated_summary, disaggregated_engines,
                                    measure_copy_gbps, run_interleaved)
from minillm.serving.metrics import engine_for, serve, step_fit, summarize
from minillm.serving.workloads import WorkItem, generate_workload
from minillm.ui.report import fmt_bytes, fmt_time

TITLE = "When the two phases meet"
MINUTES = 10
WHAT_YOU_WILL_SEE = "a long prefill stalling decodes; the budget sweep; goodput; the P/D split"


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
        Prefill runs a whole prompt through the model at once: arithmetic-bound. Decode runs one token per
        sequence: bound by reading the weights. A server runs both **in the same step**: that is what
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
        caps the prompt tokens per step, so the long prompt is spread over several steps, each a
        little longer than a pure decode step.
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
    for line in budget_verdict(results, fit, slo):
        L.console.print(line)
    L.claim(fit is not None and fit["per_token_s"] > 0,
            f"a step's time grows with the tokens in it: {fmt_time(fit['per_token_s'])} per token on top of "
            f"{fmt_time(fit['fixed_s'])} (a least-squares fit over {fit['steps']} measured steps)")
    L.say("""
        The budget is a dial. Small: every step stays short, so the gap between tokens stays close to a
        pure decode step, but a long prompt takes many steps to finish, each paying the step's fixed cost
        (reading every weight once). Large: fewer, longer steps, and a long prompt lands in one of them.
        The fit says where the dial bites on this machine; vLLM's guidance (about 2048 for latency, more
        than 8192 for throughput) is for a GPU, where a step's fixed cost is larger in tokens (see below).
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
    L.say("""
        A bigger batch shares each weight read among more sequences: more tokens per second. But each
        sequence's step is longer, so its time per output token grows, and past the target a request
        counts for nothing. **Goodput** (DistServe; `vllm bench serve --goodput`) counts only the
        requests that met every target: the measure a product with a latency promise lives by.
    """)


def disaggregation(L: Lesson, model, items) -> dict:
    L.section("Splitting the phases: two engines, KV on the wire")
    with L.status("measuring this machine's copy bandwidth…"):
        link = measure_copy_gbps()
    budget = L.pick(32, 16)
    one = OnThreads(engine_for(model, items, max_batched_tokens=budget), 2)
    split = disaggregated_engines(model, items, p_threads=1, d_threads=1, link_gbps=link,
                                  max_batched_tokens=budget)
    with L.status("serving the workload on one engine (2 threads) and split 1:1, interleaved…"):
        run_interleaved([one, split])
    a = colocated_summary(one.engine, 2, label="one engine")
    b = split.summary(label="split 1:1")
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("", "tok/s", "TTFT p95", "TPOT p95", "TBT p99", "busy", "KV moved"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in (a, b):
        t.add_row(r["label"], f"{r['output_tokens_per_s']:.1f}", fmt_time(r["ttft_p95_s"]),
                  fmt_time(r["tpot_p95_s"]), fmt_time(r["tbt_p99_s"]),
                  "/".join(f"{x:.0%}" for x in r["busy"]), fmt_bytes(r["kv_bytes_moved"]))
    L.show(t, f"[dim]link: {link:.3g} Gb/s, this machine's measured copy; busy: the share of the run each "
              "engine's steps took[/]")
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
        step with a decode, and each can have its own batch and budget. The price: each has half the
        machine, one of them idles whenever its phase has no work (busy {b['busy'][0]:.0%} and
        {b['busy'][1]:.0%} here), and every prompt's KV crosses a link ({fmt_bytes(expect / max(1, b['handoffs']))}
        per request on average; {fmt_time(at25 / max(1, b['handoffs']))} each at 25 Gb/s). DistServe,
        Splitwise, Mooncake and the P/D modes of vLLM, SGLang and NVIDIA Dynamo do this across GPUs and
        networks; vLLM's own note: it does not raise throughput, it lets TTFT and the gap between tokens
        be tuned apart.
    """)
    return {"one": a, "split": b}


def remedies(L: Lesson, model, sweep: dict, split: dict) -> None:
    L.section("Which remedy, for which target, here and on a GPU")
    res = sweep["results"]
    whole = next(r for r in res if r["budget"] is None)
    best_chunk = min((r for r in res if r["budget"] is not None), key=lambda r: r["tbt_p99_s"])
    options = {"no chunking": whole, f"chunked ({best_chunk['policy']})": best_chunk,
               "split 1:1": split["split"]}
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("target", "best here", "its figure", "worst"):
        t.add_column(col, no_wrap=True)
    for key, what, high in (("output_tokens_per_s", "throughput", True), ("ttft_p95_s", "TTFT p95", False),
                            ("tbt_p99_s", "TBT p99", False)):
        order = sorted(options, key=lambda k: options[k][key], reverse=high)
        f = (lambda x: f"{x:.1f} tok/s") if high else fmt_time
        t.add_row(what, order[0], f(options[order[0]][key]), order[-1])
    L.show(t, "[dim]from this lesson's runs of the mixed workload (the split ran in its own interleaved "
              "pair, so compare it with care)[/]")
    fit = sweep["fit"]
    n_params, wbytes = model.n_params(), model.nbytes()
    here_knee = fit["fixed_s"] / fit["per_token_s"] if fit["per_token_s"] > 0 and fit["fixed_s"] > 0 else None
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("chip", "ridge, FLOP/byte", "step saturates at", "step of 2048 tokens"):
        t.add_column(col, justify="right", no_wrap=True)
    knees = {}
    fp16 = wbytes / model.dtype.itemsize * 2
    for name in ("a100-80gb", "h100-sxm", "h200"):
        hw = CHIPS[name]
        # the fewest tokens whose 2·params·N FLOPs outlast the weight read, by the roofline itself
        knee = next(n for n in range(1, 100_000) if roofline(fp16, 2 * n_params * n, hw).bound == "compute")
        knees[name] = knee
        t.add_row(name, f"{hw.ridge:.0f}", f"{knee} tokens", fmt_time(roofline(fp16, 2 * n_params * 2048, hw).seconds))
    L.show(t, f"[dim]{model.name} in fp16 by the roofline: a step reads the weights once and does 2 FLOPs per "
              "weight per token[/]")
    h100 = CHIPS["h100-sxm"]
    L.claim(abs(knees["h100-sxm"] - h100.ridge * fp16 / (2 * n_params)) <= 1,
            f"on an H100 a step turns compute-bound at {knees['h100-sxm']} tokens: its ridge "
            f"({h100.ridge:.0f} FLOPs per byte) × {fp16 / (2 * n_params):.0f} byte per 2 FLOPs of a token")
    if here_knee is not None:
        more = knees["h100-sxm"] > here_knee
        L.say(f"""
            Here a step's fixed part equals {here_knee:.0f} tokens' work (the fit above); on an H100 the
            weight read equals {knees['h100-sxm']} tokens' arithmetic, {'more' if more else 'fewer'} than
            here. {'So on the GPU a chunk of a few hundred tokens rides almost free on the weight read, and budgets of 512-2048 cost a decode little: the budget that suits a latency target is larger there than here.' if more else 'So on the GPU, as here, large chunks lengthen every step they share.'}
        """)
    L.takeaway("""
        Prefill and decode want different things from a step. In one batch they interfere: a long prompt
        stalls every decode beside it. Chunking caps the stall at the price of more steps; splitting the
        phases removes it at the price of KV bytes on a link and a machine share that idles. Which one
        fits is a measurement against a target: goodput, not throughput.
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
