"""Lesson 10: Prefix caching, and diagnosing a workload. Requests that share a system prompt skip its
prefill; block size limits the hits; long prompts make a service prefill-bound, long answers
decode-bound, and the run's own numbers say which.

Run:  python lessons/10_prefix_caching.py        (or: minillm learn 10)
"""

from __future__ import annotations

from rich import box
from rich.table import Table

from minillm.lessons._common import Lesson, fall_words, fmt_kib, fmt_x, roofline_clock, run_lesson
from minillm import closeness

from minillm.serving.metrics import serve
from minillm.serving.workloads import generate_workload
from minillm.ui.report import fmt_flops, fmt_time

TITLE = "Prefix caching; diagnosis"
MINUTES = 6  # 1,245 words printed (a fast run) at 200 a minute
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
    offload(L, model, hw)
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
    L.pause()
    runs = {}
    # On the roofline clock: which request finds the prompt's blocks, and each TTFT, follow from counts,
    # so the fall of TTFT against the work (more or less than it) is the same on a busy run as a quiet one.
    clock = roofline_clock(L)
    for pc in (False, True):
        with L.status(f"serving, prefix cache {'on' if pc else 'off'}…"):
            runs[pc] = serve(model, items, prefix_cache=pc, hw=hw, step_time=clock)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("prefix cache", "prompt run", "prefill FLOPs", "hits", "TTFT p50", "TTFT p95", "tok/s"):
        t.add_column(col, justify="right", no_wrap=True)
    for pc, (r, _) in runs.items():
        t.add_row("on" if pc else "off", f"{r['prefill_tokens']:,}", fmt_flops(r["prefill_flops"]),
                  f"{r['prefix_hit_rate']:.0%}" if pc else "—", fmt_time(r["ttft_p50_s"]), fmt_time(r["ttft_p95_s"]),
                  f"{r['output_tokens_per_s']:.1f}")
    took = ", ".join(f"{fmt_x(1 / r['roofline_share'])} (cache {'on' if pc else 'off'})"
                     for pc, (r, _) in runs.items() if r.get("roofline_share"))
    L.show(t, f"[dim]times and tok/s on {clock.words()}: each step priced from its counted bytes and FLOPs; "
              f"the model steps took {took} their price, measured[/]")
    off, on = runs[False][0], runs[True][0]
    same = [q.output for q in runs[False][1].requests.values()] == [q.output for q in runs[True][1].requests.values()]
    L.claim(same, "every request got the same tokens with the prefix cache as without it (greedy)")
    cut = 1 - on["prefill_flops"] / off["prefill_flops"]
    tcut = 1 - on["prefill_tokens"] / off["prefill_tokens"]
    head = on["prefill_flops"] and model.config.vocab_size * model.config.n_embd / model.n_params()
    L.claim(tcut >= 0.5 and cut >= L.pick(0.5, 0.2),
            f"the prefix cache cut the prompt positions run by {tcut:.0%} and the prefill FLOPs by {cut:.0%} "
            f"(counted by the meter; each prompt still runs the LM head once for its first token, and in "
            f"{model.name} the LM head is {head:.0%} of the weights)")
    flops_fell = off["prefill_flops"] / on["prefill_flops"]
    ttft_fell = off["ttft_p50_s"] / on["ttft_p50_s"]
    why = ("Time also goes to waiting and decode, which the cache does not shorten." if ttft_fell < flops_fell / 1.1
           else "Shorter prefills also shorten the queue behind them, so waiting falls too." if ttft_fell > 1.1 * flops_fell
           else "")
    L.say(f"""
        The first request computes the system prompt; later ones find its blocks. Requests that arrive
        together, before the first has finished its prefill, all miss: the cache holds only what has been
        computed. A prompt cached whole still computes its last position, because its logits give the first
        new token. Priced: the median {fall_words(ttft_fell, flops_fell, "time to first token")} (prefill
        FLOPs). {why}
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
        {system} tokens holds tokens of one request only, so it misses. With block size s a request finds
        at most the first ⌊{system} / s⌋·s shared positions. Small blocks hit more and waste less memory
        (last lesson), but each one is another table entry to hash, look up and gather through: vLLM uses
        16, SGLang's radix tree shares at single tokens.
    """)
    L.pause()


def reload_rows(model, hw) -> list[dict]:
    """Reload a cached prefix's KV, or compute it again? Per prompt token: its KV bytes over the link
    against its prefill FLOPs (2 per weight, attention's aside: at least) at the peak. Reload when
    bytes ÷ link bandwidth < FLOPs ÷ peak. This model on this machine (its measured copy bandwidth
    and matmul peak), and published shapes on an H100 from host memory and from an NVMe drive."""
    from minillm.measure.chips import LINKS, get_chip
    from minillm.measure.shapes import kv_bytes_per_token, shape
    c = model.config
    rows = [{"what": model.name, "chip": "here", "kv": 2 * c.n_layer * c.n_kv_head * c.head_dim * model.dtype.itemsize,
             "kv_dtype": {4: "fp32", 2: "bf16"}.get(model.dtype.itemsize, str(model.dtype)),
             "flops": 2 * model.n_params(), "link": hw.bandwidth_gbs, "link_name": "memory", "peak": hw.peak_gflops}]
    h100 = get_chip("h100-sxm")
    for name in ("llama-2-7b", "llama-3-8b"):
        s = shape(name)
        for link in ("pcie5", "nvme4"):
            rows.append({"what": name, "chip": "H100", "kv": kv_bytes_per_token(s, 2), "kv_dtype": "bf16",
                         "flops": 2 * s["n_params"],
                         "link": LINKS[link][0], "link_name": {"pcie5": "PCIe 5", "nvme4": "NVMe"}[link],
                         "peak": h100.peak_gflops})
    for r in rows:
        r["reload_s"] = r["kv"] / (r["link"] * 1e9)
        r["compute_s"] = r["flops"] / (r["peak"] * 1e9)
    return rows


def offload(L: Lesson, model, hw) -> None:
    L.section("Prefixes beyond one engine's memory: offloading and routing")
    rows = reload_rows(model, hw)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("model", "chip", "from", "KV/token", "reload", "recompute", "cheaper"):
        t.add_column(col, justify="left" if col in ("model", "chip", "from") else "right", no_wrap=True)
    for r in rows:
        t.add_row(r["what"], r["chip"], r["link_name"], f"{fmt_kib(r['kv'])} {r['kv_dtype']}", fmt_time(r["reload_s"]),
                  fmt_time(r["compute_s"]), "reload" if r["reload_s"] < r["compute_s"] else "recompute")
    L.say("""
        A GPU's memory holds only so many prefixes. With **KV offloading** engines keep more in host memory
        or on SSD (LMCache, SGLang's HiCache, Mooncake's store, vLLM's KV connectors) and load a prefix back
        when a request needs it. That pays when moving its KV is quicker than computing it again:
        **reload when KV bytes ÷ link bandwidth < prefill FLOPs ÷ peak**. Per prompt token:
    """)
    L.show(t, "[dim]reload: one token's KV over the link (here: this machine's measured memory bandwidth; PCIe 5 x16 "
              "64 GB/s and one NVMe drive 7 GB/s: published, measure/chips.LINKS); KV/token in its dtype: this "
              "model's own, the published shapes' bf16 as served; recompute: 2 FLOPs per weight at the peak, "
              "attention's aside, so at least that[/]")
    here = rows[0]
    L.say(f"""
        Here, {'reloading' if here['reload_s'] < here['compute_s'] else 'computing again'} is cheaper, by
        {fmt_x(max(here['reload_s'], here['compute_s']) / min(here['reload_s'], here['compute_s']))}. The rule
        favours models with a small KV cache per token for their size (grouped-query attention) and fast
        links. With several replicas, each holds its own cache: **cache-aware routing** sends each request
        to the replica already holding its prefix (NVIDIA Dynamo's KV router, SGLang's router) and gets
        the hit that random routing would spread thin, one replica in N. One engine, as here, cannot show
        that.
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
    L.say("""
        For each workload: the positions run as prompt tokens and as decode tokens; the share of the
        model's time in steps with prompt tokens (P: prefill and mixed steps) and in decode-only steps
        (D); and the roofline verdict of each (its counted bytes and FLOPs against this machine's
        bandwidth and peak: the verdict that covered most of its time).
    """)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("workload", "prompt", "decode", "time P", "time D", "bound P", "bound D"):
        t.add_column(col, justify="right", no_wrap=True)
    verdicts = {}
    for name, r in runs.items():
        ph = r["phases"]
        pre = sum(ph[k]["share"] for k in ("prefill", "mixed") if k in ph)
        verdict = lambda k: (ph[k]["bound"] if k in ph and "bound" in ph[k] else "—")  # noqa: E731
        pv = verdict("prefill") if "prefill" in ph else verdict("mixed")
        verdicts[name] = (pre, ph.get("decode", {}).get("share", 0.0), pv, verdict("decode"))
        t.add_row(name, f"{r['prefill_tokens']:,}", f"{r['decode_tokens']:,}", f"{pre:.0%}",
                  f"{verdicts[name][1]:.0%}", pv, verdict("decode"))
    L.show(t)
    lp, la = runs["long-prompt"], runs["long-answer"]
    L.claim(lp["prefill_tokens"] > 10 * lp["decode_tokens"] and la["decode_tokens"] > 2 * la["prefill_tokens"],
            f"long prompts: {lp['prefill_tokens']:,} prompt positions for {lp['decode_tokens']:,} decode tokens; "
            f"long answers: {la['prefill_tokens']:,} for {la['decode_tokens']:,}")
    L.say(diagnosis_words(verdicts["long-prompt"], verdicts["long-answer"]))
    L.say("""
        What helps a **prefill-bound** service: doing less of it (prefix caching, shorter prompts), faster
        arithmetic (8-bit math on a GPU), and keeping long prefills from stalling everyone's decode
        (chunked prefill and a smaller token budget: they do not make a prefill cheaper, they spread it,
        so time between tokens stays low). On a GPU a prefill is compute-bound only past about the ridge
        in prompt tokens (lesson 7), and in a busy server the usual symptom is prefills delaying
        decodes; large services then split the two phases onto separate machines (*disaggregation*).
        What helps a **decode-bound** service: more sequences per step while decode stays memory-bound
        (continuous batching, more KV memory, a paged cache so the memory holds them) and fewer bytes
        per weight.
    """)
    L.takeaway("""
        Shared prompt prefixes are work done once: name KV blocks by their content and share them. Whether a
        service needs that, or bigger batches, is written in its own step records: which phase took the
        time, and what bound it.
    """)


def diagnosis_words(long_prompt: tuple, long_answer: tuple) -> str:
    """Which phase took each workload's time, and what bound it, read from the run (share, share, verdicts)."""
    out = []
    for name, (pre, dec, pv, dv) in (("long prompts", long_prompt), ("long answers", long_answer)):
        if closeness.figures_apart(pre, dec) == 0:          # one run's shares: the closeness rule's band
            out.append(f"{name}: prompt and decode steps took about the same share of the model's time "
                       f"({pre:.0%} and {dec:.0%}, within {closeness.CLOSE:.0%})")
            continue
        phase, share, bound = ("prefill", pre, pv) if pre > dec else ("decode", dec, dv)
        out.append(f"{name}: {share:.0%} of the model's time went to {phase} steps, which were "
                   f"{bound}-bound by the roofline" if bound != "—" else
                   f"{name}: {share:.0%} of the model's time went to {phase} steps")
    return ("The diagnosis comes from the run's own numbers: " + "; ".join(out) + ". A decode step over many "
            "sequences can be compute-bound on this CPU: past lesson 8's critical batch it waits on arithmetic.")


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
