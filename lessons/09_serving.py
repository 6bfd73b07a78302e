"""Lesson 9: Serving. Requests arrive; a scheduler decides who runs each step: continuous batching,
static batching and one at a time on the same workload, and the KV memory a paged cache saves.

Run:  python lessons/09_serving.py        (or: minillm learn 9)
"""

from __future__ import annotations

import statistics

from rich import box
from rich.markup import escape
from rich.table import Table

from minillm.cache.paged import PagedKVPool
from minillm.lessons._common import Lesson, bar_chart, fmt_x, gpu_ridge_range, roofline_clock, run_lesson
from minillm import closeness
from minillm.serving.metrics import serve
from minillm.serving.workloads import WorkItem, generate_workload
from minillm.ui.report import fmt_bytes, fmt_time

TITLE = "Serving: continuous batching"
MINUTES = 8  # 1,669 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "three schedulers, one workload; KV waste; preemption"


def lesson(L: Lesson) -> None:
    model = L.load_model(default="random-124m", fast="random-tiny")
    hw = L.machine()
    intro(L)
    clock = roofline_clock(L)
    items, per_request = workload(L, model, clock)
    runs = policies(L, model, items, hw, clock)
    L.pause()
    goodput(L, runs, per_request, clock)
    L.pause()
    kv_waste(L, model, runs)
    preemption(L, model, items, clock)
    adapters_and_grammars(L)
    L.try_it("""
        `minillm serve-sim --workload poisson --rate 4 --requests 64 --compare` is this lesson's comparison
        on a workload of your choice, with a live view of the running sequences and the KV block map;
        `--json` for scripts, `--workload FILE.jsonl` for your own trace (one request per line).
    """)


def intro(L: Lesson) -> None:
    L.say("""
        Lesson 8 ran B prompts that all started together. A server's requests **arrive** one by one, at
        random times, with prompts and answers of every length. Each step, minillm's scheduler
        (`minillm/engine/scheduler.py`) picks what runs: every running sequence's next token, and new
        requests while the step's token budget and the free KV blocks allow. Three policies, same code:

        - **sequential**: one request at a time;
        - **static**: a batch of up to B requests runs until its last member finishes; then the next batch;
        - **continuous**: a finished sequence's place is given to a waiting request at the very next step
          (Orca's iteration-level scheduling);
        - and, in minillm's continuous and static policies, long prompts are prefilled in chunks beside
          the others' decode tokens under a token budget per step (*chunked prefill*, from
          Sarathi-Serve; vLLM's `--enable-chunked-prefill`).

        Time here is priced, not stopwatched: the **roofline clock**. Every step really runs: the tokens
        are real, and the meter counts every byte and FLOP. But the engine's clock advances by the step's
        price on this machine's roofline, max(bytes ÷ bandwidth, FLOPs ÷ peak), at the figures above. So the three
        policies see the same arrivals, and a run served again, or beside other work, is the same run:
        its verdicts cannot flip with the load. What the roofline leaves out (Python, dispatch, kernels
        below peak) shows as the measured time beside it.
    """)
    L.pause()
    L.say("""
        What a user feels, measured per request:

        - **TTFT**, time to first token: from the request's arrival to its first token, queueing and
          prefill included;
        - **TBT**, time between tokens: each gap between two consecutive tokens of one request;
        - **TPOT**, time per output token: one request's average gap (its TBTs averaged);
        - **p50, p95**: the median, and the value 95% of the measurements stay under (the slow tail).
    """)


def workload(L: Lesson, model, clock) -> tuple[list[WorkItem], float]:
    """Poisson arrivals at a rate one-at-a-time cannot keep up with: priced, not guessed."""
    c = model.config
    probe = generate_workload("poisson", rate=1.0, n=3, seed=1, vocab_size=c.vocab_size, n_ctx=c.n_ctx)
    probe = [WorkItem(0.0, w.prompt, w.max_tokens) for w in probe]
    with L.status("timing a few requests alone…"):
        r, _ = serve(model, probe, policy="sequential", step_time=clock)
    per_request = r["duration_s"] / len(probe)
    rate = 3.0 / per_request
    n = L.pick(24, 16)
    items = generate_workload("poisson", rate=rate, n=n, seed=0, vocab_size=c.vocab_size, n_ctx=c.n_ctx)
    items = [WorkItem(w.arrival, w.prompt, w.max_tokens, 0.8, top_k=40, seed=i) for i, w in enumerate(items)]
    L.say(f"""
        One request alone took about {fmt_time(per_request)} on {clock.words()}, so one at a time serves about
        {1 / per_request:.2g} request{'' if f'{1 / per_request:.2g}' == '1' else 's'} a second. The workload: {n} requests arriving at **{rate:.2g} per second**
        (three times that), prompts of {min(len(w.prompt) for w in items)}-{max(len(w.prompt) for w in items)}
        tokens, answers of {min(w.max_tokens for w in items)}-{max(w.max_tokens for w in items)}, sampled at
        temperature 0.8 from the 40 likeliest tokens, each request with its own seed.
    """)
    return items, per_request


def policies(L: Lesson, model, items, hw, clock) -> dict:
    L.section("Three schedulers, one workload")
    names = ("sequential", "static", "continuous")
    with L.status(f"serving {len(items)} requests three ways, step by step…"):
        runs = {p: serve(model, items, label=p, hw=hw, policy=p, max_seqs=8, step_time=clock) for p in names}
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("policy", "tok/s", "TTFT p50", "TTFT p95", "TBT p50", "TBT p95", "batch", "steps"):
        t.add_column(col, justify="right", no_wrap=True)
    for p, (r, _) in runs.items():
        t.add_row(p, f"{r['output_tokens_per_s']:.1f}", fmt_time(r["ttft_p50_s"]), fmt_time(r["ttft_p95_s"]),
                  fmt_time(r["tbt_p50_s"]), fmt_time(r["tbt_p95_s"]), f"{r['mean_batch']:.1f}", str(r["steps"]))
    took = ", ".join(f"{fmt_x(1 / r['roofline_share'])} ({p})" for p, (r, _) in runs.items() if r.get("roofline_share"))
    L.show(t, f"[dim]on {clock.words()}; tok/s: output tokens per second; batch: sequences per step, on "
              f"average. Measured ({L.conditions()}), the model steps took {took} their price: what the "
              "roofline leaves out (minillm serve-sim --clock measured serves on the stopwatch)[/]",
           bar_chart("output tokens per second", [(p, r["output_tokens_per_s"], f"{r['output_tokens_per_s']:.1f}")
                                                     for p, (r, _) in runs.items()]))
    outs = {p: [q.output for q in e.requests.values()] for p, (_, e) in runs.items()}
    L.claim(outs["sequential"] == outs["static"] == outs["continuous"],
            f"every one of the {len(items)} requests got the same tokens under all three schedulers "
            "(its sampling stream is its own; what it is batched with does not enter)")
    seq, sta, con = (runs[p][0] for p in names)
    L.claim(con["steps"] < seq["steps"],
            f"continuous batching ran {con['steps']} steps for the {con['output_tokens']} tokens; one at a time "
            f"ran {seq['steps']}: {con['mean_batch']:.1f} sequences share each weight read on average")
    speed = con["output_tokens_per_s"] / seq["output_tokens_per_s"]
    faster = closeness.figures_apart(con["output_tokens_per_s"], seq["output_tokens_per_s"])
    sooner = closeness.figures_apart(con["ttft_p95_s"], sta["ttft_p95_s"])
    ttft = sta["ttft_p95_s"] / con["ttft_p95_s"]
    tbt = con["tbt_p50_s"] / seq["tbt_p50_s"]
    L.say(f"""
        Priced: continuous batching served {fmt_x(speed)} the output tokens per second
        of one at a time: {"more, with fewer steps sharing each weight read" if faster > 0 else "fewer"
        if faster < 0 else "no winner (within 5%)"} ({closeness.PRICED_RULE}).

        One at a time, requests **queue**: time to first token is mostly waiting. Static batching shares
        the weight reads, but a request that arrives while a batch runs waits for the whole batch to finish.
        Here static batching's p95 TTFT was {fmt_time(sta['ttft_p95_s'])} and continuous batching's
        {fmt_time(con['ttft_p95_s'])} ({fmt_x(ttft)}): {"continuous admitted late arrivals sooner"
        if sooner < 0 else "continuous was later" if sooner > 0 else "no winner (within 5%)"}.
    """)
    L.say(tbt_words(tbt, con["mean_batch"]))
    return runs


def tbt_words(ratio: float, mean_batch: float) -> str:
    """Continuous batching's median time between tokens against one at a time's: the words follow the ratio."""
    if ratio < 1.25:
        how = f"about the same as one at a time's ({fmt_x(ratio)})"
    elif ratio < 2:
        how = f"{fmt_x(ratio)} one at a time's: somewhat higher"
    else:
        how = f"{fmt_x(ratio)} one at a time's: much higher"
    return (f"Continuous batching's median time between tokens was {how}. Its steps held {mean_batch:.1f} "
            "sequences on average, now and then with a prompt chunk. Below the critical batch (lesson 8), a "
            "bigger step costs little more than a small one. Past it, a step's time grows about in proportion "
            "to B. Lesson 8 measured where that comes on this CPU. On a GPU in fp16, from the weights alone, it "
            f"comes past about the ridge: B ≈ {gpu_ridge_range()} on an A100, H200 and H100 (more once KV reads "
            "count). Sarathi-Serve tunes the token budget per step (`--max-batched-tokens`) for it.")


def tpot_target(runs: dict) -> tuple[float, str]:
    """The TPOT target: 1.5 × the largest of the policies' median gaps between tokens, so that no policy
    fails it at its median (M51: 3 × one at a time's gap sat below continuous batching's median gap, and
    the best policy's goodput was 0). -> (target in seconds, the policy with the largest median gap)."""
    slowest = max(runs, key=lambda p: runs[p][0]["tbt_p50_s"])
    return 1.5 * runs[slowest][0]["tbt_p50_s"], slowest


def goodput(L: Lesson, runs: dict, per_request: float, clock) -> None:
    L.section("Latency targets and goodput")
    ttft_slo = 2 * per_request
    tpot_slo, slowest = tpot_target(runs)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("policy", "requests", "meet both", "goodput, req/s", "tok/s"):
        t.add_column(col, justify="right", no_wrap=True)
    good, met_counts = {}, {}
    for p, (r, e) in runs.items():
        reqs = list(e.requests.values())
        ok = [q for q in reqs if q.ttft is not None and q.ttft <= ttft_slo
              and (not q.tbt or statistics.mean(q.tbt) <= tpot_slo)]
        dur = r["duration_s"]
        good[p] = len(ok) / dur if dur else 0.0
        met_counts[p] = [len(ok)]
        t.add_row(p, str(len(reqs)), str(len(ok)), f"{good[p]:.2f}", f"{r['output_tokens_per_s']:.1f}")
    L.claim(any(max(c) > 0 for c in met_counts.values()),
            "at least one policy met both targets for some request: the targets separate the policies "
            "instead of failing them all")
    L.say(f"""
        A service promises latency targets (*SLOs*), say TTFT under {fmt_time(ttft_slo)} (twice one request
        alone here) and TPOT under {fmt_time(tpot_slo)} (1.5 times the largest of the three policies'
        median gaps, {slowest}'s: a target each can meet at its median, so the queue decides). **Goodput**
        is the requests per second that meet both (the formula of `vllm bench serve --goodput`):
        throughput that users feel. These targets come from this run; real ones come from the product.
        Comparing systems by goodput means sweeping the request rate and finding the highest rate that
        still meets the targets (DistServe's figures; lesson 13 runs `minillm serve-sim --rates`).
    """)
    L.show(t, f"[dim]on {clock.words()}[/]")
    ranking = closeness.rank_priced(good, higher=True)
    L.say(f"""
        {closeness.best_words(ranking, "Goodput on this run", lambda v: f"{v:.2f} requests/s")} Bigger batches
        raise throughput until each step's time pushes TPOT past its target: the batch a server should run is
        as many sequences as the KV memory holds *and the latency targets allow*. When long prefills
        keep stalling decodes, large services run prefill and decode on separate machines
        (*disaggregation*: DistServe, Splitwise, Mooncake), each phase on hardware suited to it.
    """)


def kv_waste(L: Lesson, model, runs: dict) -> None:
    L.section("KV memory: reserved against used")
    r = runs["continuous"][0]
    c = model.config
    per_pos = PagedKVPool.block_nbytes_for(c, 1, model.dtype)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("cache")
    t.add_column("wasted: reserved but holding no key", justify="right")
    t.add_row(f"contiguous, {c.n_ctx} positions per sequence", f"{r['kv_waste_contiguous']:.1%}")
    for bs, w in r["kv_waste_by_block_size"].items():
        t.add_row(f"paged, block size {bs}", f"{w:.1%}")
    t.add_row(f"paged as it ran (block size {r['block_size']}, whole prompts reserved at admission)", f"{r['kv_waste']:.1%}")
    L.show(t)
    L.claim(r["kv_waste"] < r["kv_waste_contiguous"] / 2,
            f"the paged pool wasted {r['kv_waste']:.1%} of what it reserved; a contiguous cache of n_ctx per "
            f"sequence would have wasted {r['kv_waste_contiguous']:.1%} for the same sequences")
    ws = list(r["kv_waste_by_block_size"].values())
    L.claim(all(a <= b + 1e-12 for a, b in zip(ws, ws[1:])),
            "bigger blocks waste more: a sequence's last block is partly empty, on average half a block")
    L.say(f"""
        Summed over every step of the run: positions reserved against positions holding a key
        ({per_pos:,} bytes each for `{escape(model.name)}`). A contiguous cache must reserve the longest a
        sequence could get; the vLLM paper measured 20-38% of KV memory holding tokens in the systems before
        it. A paged cache takes a block when the previous one is full, so it wastes under one block per
        sequence: the shorter the sequences, the more that last block matters. Smaller blocks waste less
        and (next lesson) share prefixes at a finer grain. But each block is one more table entry to
        hash, look up and gather through per step, and kernels run less efficiently on small blocks.
        Blocks can sit anywhere in the pool, so a paged cache also has no *external* fragmentation:
        free memory never needs to be in one piece.
    """)
    L.pause()


def preemption(L: Lesson, model, items, clock) -> None:
    L.section("When the blocks run out: preemption by recompute")
    c = model.config
    bs = 16
    biggest = max(-(-(len(w.prompt) + w.max_tokens) // bs) for w in items)
    blocks = biggest + 2
    with L.status(f"serving with {blocks} KV blocks…"):
        r, e = serve(model, items, policy="continuous", max_seqs=8, num_blocks=blocks, block_size=bs,
                     step_time=clock)
        roomy, e2 = serve(model, items, policy="continuous", max_seqs=8, block_size=bs, step_time=clock)
    same = [q.output for q in e.requests.values()] == [q.output for q in e2.requests.values()]
    L.claim(r["preemptions"] > 0 and same,
            f"with {blocks} blocks ({blocks * bs} positions) the scheduler preempted {r['preemptions']} times, "
            "and every request still got the tokens it gets with room to spare")
    L.say(f"""
        A running sequence needs a new block every {bs} tokens. When none is free, the scheduler takes the
        newest running sequence's blocks back and puts it at the head of the queue; later it runs its prompt
        and the tokens it had made again, as one prompt, and continues. Its random stream was not touched,
        so it continues exactly where it was. The price is the recomputation:
        {r['prefill_tokens']:,} prompt positions ran here against {roomy['prefill_tokens']:,} with room, and a
        throughput of {r['output_tokens_per_s']:.1f} tokens/s against {roomy['output_tokens_per_s']:.1f}, priced.
        Context {c.n_ctx}, so one request can never need more than {-(-c.n_ctx // bs)} blocks.
    """)
    L.takeaway("""
        Serving is scheduling: below the critical batch a decode step costs about one weight read, so
        every step should carry as many sequences as the KV memory holds and the latency targets allow.
        Continuous batching refills the batch every step; a paged cache lets the memory hold more of
        them; preemption keeps the promise when it runs out.
    """)


LORA_RANK = 16


def lora_bytes(name: str = "llama-3-8b", rank: int = LORA_RANK) -> tuple[float, float]:
    """A LoRA adapter on every attention projection (q, k, v, o) of a published shape, bf16: rank·(d_in +
    d_out) parameters a matrix; and the base model's weights (bf16)."""
    from minillm.measure.shapes import SHAPES, shape
    c, s = SHAPES[name], shape(name)
    d, q, kv = c.n_embd, c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    per_layer = rank * ((d + q) + 2 * (d + kv) + (q + d))
    return 2 * c.n_layer * per_layer, 2 * s["n_params"]


def adapters_and_grammars(L: Lesson) -> None:
    """X27: two serving features this course's bottleneck story touches only at its edge."""
    adapter, base = lora_bytes()
    L.say(f"""
        Two features servers add on top. **Multi-LoRA** serving (S-LoRA, Punica) batches requests for
        different fine-tuned adapters in one step: the base weights are read once for all of them, and
        each request's small adapter matrices beside them. A rank-{LORA_RANK} adapter on Llama-3-8B's
        attention projections is {fmt_bytes(adapter)}, {adapter / base:.2%} of the {fmt_bytes(base)} base read,
        so even a batch of a hundred different adapters adds {100 * adapter / base:.0%} to a decode step's
        bytes. **Structured output** (grammar-constrained decoding: JSON schemas, regular expressions) masks
        each step's logits to the tokens the grammar allows: host work per token, not bytes or FLOPs of the
        model.
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
