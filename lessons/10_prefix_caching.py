"""Lesson 10: Prefix caching, and diagnosing a workload. Requests that share a system prompt skip its
prefill; block size limits the hits; long prompts make a service prefill-bound, long answers
decode-bound, and the run's own numbers say which.

Run:  python lessons/10_prefix_caching.py        (or: minillm learn 10)
"""

from __future__ import annotations

try:
    from minillm.lessons._common import Lesson, fmt_x, run_lesson
except ModuleNotFoundError as e:  # run from a checkout in which minillm is not installed
    raise SystemExit(f"{e}: install minillm first (pip install -e . in the checkout), then run this again")

from rich import box
from rich.table import Table

from minillm.serving.metrics import serve
from minillm.serving.workloads import WorkItem, generate_workload
from minillm.ui.report import fmt_flops, fmt_time

TITLE = "Prefix caching; diagnosis"
MINUTES = 8
WHAT_YOU_WILL_SEE = "a shared prompt computed once; block size; which phase bound it"


def lesson(L: Lesson) -> None:
    model = L.load_model(default="random-124m", fast="random-tiny")
    hw = L.machine()
    c = model.config
    items = generate_workload("shared-prefix", rate=L.pick(2.0, 20.0), n=L.pick(16, 12), seed=0,
                              vocab_size=c.vocab_size, n_ctx=c.n_ctx)
    shared = len(items[0].prompt) - next(i for i, (a, b) in enumerate(zip(items[0].prompt, items[1].prompt)) if a != b)
    system = len(items[0].prompt) - shared
    with_and_without(L, model, items, system, hw)
    block_sizes(L, model, items, system)
    diagnose(L, model, hw)
    L.try_it("""
        `minillm serve-sim --workload shared-prefix --compare prefix-cache` and
        `--compare block-size` are this lesson's first two parts; `--workload long-prompt` and
        `--workload long-answer` the third. A trace of your own (`--workload FILE.jsonl`) with your real
        system prompt shows what prefix caching would save you.
    """)


def with_and_without(L: Lesson, model, items, system: int, hw) -> None:
    L.say(f"""
        Chat services put the same **system prompt** in front of every request. Its keys and values are
        the same every time: they depend only on the tokens at and before each position. minillm's block
        manager (`minillm/engine/block_manager.py`) names every full KV block by a hash of its parent
        block's name and its own tokens, so two prompts that start alike have the same first names. A new
        request takes the blocks it finds, shared by reference count, and runs only the rest of its prompt.

        The workload: {len(items)} requests, each a {system}-token system prompt and 8-32 tokens of its own.
    """)
    runs = {}
    for pc in (False, True):
        with L.status(f"serving, prefix cache {'on' if pc else 'off'}…"):
            runs[pc] = serve(model, items, prefix_cache=pc, hw=hw)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("prefix cache", "prompt run", "prefill FLOPs", "hits", "TTFT p50", "TTFT p95", "tok/s"):
        t.add_column(col, justify="right", no_wrap=True)
    for pc, (r, _) in runs.items():
        t.add_row("on" if pc else "off", f"{r['prefill_tokens']:,}", fmt_flops(r["prefill_flops"]),
                  f"{r['prefix_hit_rate']:.0%}" if pc else "—", fmt_time(r["ttft_p50_s"]), fmt_time(r["ttft_p95_s"]),
                  f"{r['output_tokens_per_s']:.1f}")
    L.show(t)
    L.busy_note()
    off, on = runs[False][0], runs[True][0]
    same = [q.output for q in runs[False][1].requests.values()] == [q.output for q in runs[True][1].requests.values()]
    L.claim(same, "every request got the same tokens with the prefix cache as without it (greedy)")
    cut = 1 - on["prefill_flops"] / off["prefill_flops"]
    tcut = 1 - on["prefill_tokens"] / off["prefill_tokens"]
    L.claim(tcut >= 0.5 and cut >= L.pick(0.5, 0.2),
            f"the prefix cache cut the prompt positions run by {tcut:.0%} and the prefill FLOPs by {cut:.0%} "
            "(counted by the meter; each prompt still runs the LM head once for its first token, which for a "
            "model as narrow as random-tiny is most of a short prefill's FLOPs)")
    if not L.fast:
        L.claim(on["ttft_p50_s"] < off["ttft_p50_s"],
                f"and the median time to first token from {fmt_time(off['ttft_p50_s'])} to {fmt_time(on['ttft_p50_s'])}")
    L.say(f"""
        The first request computes the system prompt; later ones find its blocks. Requests that arrive
        together, before the first has finished its prefill, all miss: the cache holds only what has been
        computed. A prompt cached whole still computes its last position, because its logits give the first
        new token. TTFT falls by less than FLOPs when time also goes to waiting and decode: here
        {fmt_x(off['ttft_p50_s'] / on['ttft_p50_s'])} at the median.
    """)
    L.pause()


def block_sizes(L: Lesson, model, items, system: int) -> None:
    L.section("Block size limits the hits")
    sizes = [1, 4, 16, 64]
    rows = []
    for bs in sizes:
        with L.status(f"block size {bs}…"):
            r, _ = serve(model, items, prefix_cache=True, block_size=bs, policy="sequential")
        rows.append((bs, r))
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("block size", "positions found cached", "hit rate", "per later request"):
        t.add_column(col, justify="right")
    for bs, r in rows:
        t.add_row(str(bs), f"{r['prefix_hit_tokens']:,}", f"{r['prefix_hit_rate']:.0%}",
                  f"{r['prefix_hit_tokens'] / (len(items) - 1):.0f} of {system} shared")
    L.show(t)
    hits = [r["prefix_hit_tokens"] for _, r in rows]
    L.claim(all(a >= b for a, b in zip(hits, hits[1:])) and hits[0] > hits[-1],
            f"bigger blocks find fewer cached positions: {', '.join(f'{h:,}' for h in hits)} at block sizes "
            f"{', '.join(map(str, sizes))} (one request at a time, so every later request could hit)")
    L.say(f"""
        Only **full** blocks are named and shared: a block that straddles the end of the shared
        {system} tokens holds tokens of one request only, so it misses. With block size B a request finds
        at most the first ⌊{system} / B⌋·B shared positions. Small blocks hit more and waste less memory
        (last lesson), but each one is another table entry to hash, look up and gather through: vLLM uses
        16, SGLang's radix tree shares at single tokens.
    """)
    L.pause()


def diagnose(L: Lesson, model, hw) -> None:
    L.section("Diagnosing a workload: prefill-bound or decode-bound?")
    c = model.config
    runs = {}
    for name in ("long-prompt", "long-answer"):
        items = generate_workload(name, rate=L.pick(2.0, 10.0), n=L.pick(8, 6), seed=0,
                                  vocab_size=c.vocab_size, n_ctx=c.n_ctx)
        with L.status(f"serving {name}…"):
            runs[name] = serve(model, items, hw=hw)[0]
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("workload", "prompt", "decode", "t prompt", "t decode", "prompt is", "decode is"):
        t.add_column(col, justify="right", no_wrap=True)
    for name, r in runs.items():
        ph = r["phases"]
        pre = sum(ph[k]["share"] for k in ("prefill", "mixed") if k in ph)
        verdict = lambda k: (ph[k]["bound"] if k in ph and "bound" in ph[k] else "—")  # noqa: E731
        pv = verdict("prefill") if "prefill" in ph else verdict("mixed")
        t.add_row(name, f"{r['prefill_tokens']:,}", f"{r['decode_tokens']:,}", f"{pre:.0%}",
                  f"{ph.get('decode', {}).get('share', 0):.0%}", pv, verdict("decode"))
    L.show(t, "[dim]prompt, decode: positions run as prompt and decode tokens; t: the share of the model's time in steps with prompt tokens and in decode-only steps; "
              "prompt is, decode is: what bound those steps by the roofline, most of their time[/]")
    lp, la = runs["long-prompt"], runs["long-answer"]
    L.claim(lp["prefill_tokens"] > 10 * lp["decode_tokens"] and la["decode_tokens"] > 2 * la["prefill_tokens"],
            f"long prompts: {lp['prefill_tokens']:,} prompt positions for {lp['decode_tokens']:,} decode tokens; "
            f"long answers: {la['prefill_tokens']:,} for {la['decode_tokens']:,}")
    dec = la["phases"].get("decode", {})
    if not L.fast:   # fast mode's machine figures are rough, and random-tiny is mostly its LM head
        L.claim(dec.get("bound") == "memory",
                "the long answers' decode steps are memory-bound by the roofline (their counted bytes and FLOPs "
                "against this machine's bandwidth and peak)")
        pre = sum(lp["phases"][k]["share"] for k in ("prefill", "mixed") if k in lp["phases"])
        L.claim(pre > 0.5 and dec.get("share", 0) > 0.5,
                f"long prompts spent {pre:.0%} of the model's time in steps with prompt tokens; long answers "
                f"{dec.get('share', 0):.0%} in decode steps")
    L.say("""
        The diagnosis comes from the run's own numbers. **Prefill-bound** (long prompts): the time goes to
        matrix-matrix work near the machine's peak; what helps is doing less of it (prefix caching, shorter
        prompts) and keeping long prefills from stalling everyone's decode (chunked prefill, a smaller
        token budget). **Decode-bound** (long answers): every step reads all the weights for a few tokens;
        what helps is more sequences per step (continuous batching, more KV memory for bigger batches,
        a paged cache so the memory holds them) and fewer bytes per weight.
    """)
    L.takeaway("""
        Shared prompt prefixes are work done once: name KV blocks by their content and share them. Whether a
        service needs that, or bigger batches, is written in its own step records: which phase took the
        time, and what bound it.
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv, number=10, title=TITLE, minutes=MINUTES, what=WHAT_YOU_WILL_SEE,
                      prog="python lessons/10_prefix_caching.py")


if __name__ == "__main__":
    raise SystemExit(main())
