"""Lesson 7: Diagnose your bottleneck. Put each phase on the roofline, then ask which one dominates a workload.

Run:  python lessons/07_diagnose.py        (or: minillm learn 7)
"""

from __future__ import annotations

import math
import statistics

import numpy as np
from rich import box
from rich.markup import escape
from rich.table import Table

import minillm
from minillm.models.gpt2 import GPT2_SIZES as MODELS
from minillm.lessons._common import (Lesson, fmt_bytes, fmt_flops, fmt_kib, fmt_time, fmt_x, plural,
                                     roofline_plot, run_lesson)
from minillm import closeness
from minillm.measure.chips import CHIPS, decode_ceiling, roofline
from minillm.ui import report

TITLE = "Diagnose your bottleneck"
MINUTES = 13  # 2,505 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "the roofline, which phase dominates three workloads, what each optimization cuts"

SYSTEM = ("You are a helpful assistant who answers every question in the manner of William Shakespeare. "
          "Answer briefly, in verse when you can, and never break character. Address the user as 'good "
          "friend'. If you do not know the answer, say so plainly, as an honest player would, rather than "
          "invent one. Keep to the facts the user gives you, be courteous, and end every answer with a "
          "short couplet that sums it up.\n")
QUESTIONS = ["Q: What is the capital of France?\nA:", "Q: Why is the sky blue?\nA:",
             "Q: How do I boil an egg?\nA:", "Q: Should I learn to play the lute?\nA:"]
GPUS = ("a100-80gb", "h100-sxm")
FP16 = 0.5  # the GPU columns assume fp16 weights and activations: half the float32 bytes the meter counted


def gpu_roof(r, chip: str):
    """The roofline on a GPU, unfused view: every byte the meter counted, in fp16."""
    return roofline(r.total_bytes * FP16, r.total_flops, chip)


def gpu_roof_fused(r, chip: str, model):
    """The roofline on a GPU, fused view: weights, KV and each block's input and output, in fp16."""
    return roofline(report.fused_bytes(r, model.config, 4) * FP16, r.total_flops, chip)


def phases(m: minillm.Meter, hw, model) -> dict:
    """Prefill and decode totals of a run (`Meter.totals`): counted work, measured time, and roofline times."""
    out = {}
    for kind in ("prefill", "decode"):
        tot, rs = m.totals(kind), m.of_kind(kind)
        out[kind] = {
            "steps": tot.steps, "tokens": tot.tokens, "flops": tot.flops, "bytes": tot.bytes,
            "seconds": tot.seconds,
            "roof_here": sum(roofline(r.total_bytes, r.total_flops, hw).seconds for r in rs),
            "roof_gpu": sum(gpu_roof(r, GPUS[0]).seconds for r in rs),
            "roof_gpu_fused": sum(gpu_roof_fused(r, GPUS[0], model).seconds for r in rs),
        }
    return out


def lesson(L: Lesson) -> None:
    model = L.load_model(default="random-124m", fast="random-tiny")
    with L.status("measuring this machine's memory bandwidth and matmul peak (once; then cached)…"):
        hw = L.machine()
    rng = np.random.default_rng(0)
    intro(L, model, hw)
    dec = three_steps_on_the_roofline(L, model, hw, rng)
    L.pause()
    work = which_phase_dominates(L, model, hw, rng)
    L.pause()
    what_each_buys(L, model, hw, dec, work)
    L.pause()
    on_a_gpu(L)
    L.pause()
    the_diagnosis(L, dec, hw, work["results"])


def intro(L: Lesson, model, hw) -> None:
    L.say(f"""
        The article closes with a diagnosis guide: find out **which phase** your workload spends its time
        in, then pick the optimization that attacks **that** phase. The other lessons each measure one
        optimization; this one asks which of them a workload needs. It does it with numbers, on
        `{escape(model.name)}` and on this machine ({hw.bandwidth_gbs:,.1f} GB/s, {hw.peak_gflops:,.0f} GFLOP/s,
        ridge {hw.ridge:.3g} FLOP/byte), beside two GPUs whose published figures minillm carries.

        The **roofline** model: a piece of work that moves *N* bytes and does *F* FLOPs needs at least
        *N* / bandwidth seconds and at least *F* / peak seconds, so its best time is the larger of the
        two. Which one is larger depends only on its **intensity** *F*/*N* against the machine's
        **ridge** (peak ÷ bandwidth). `minillm.measure.chips.roofline(bytes, flops, hw)` applies it.
    """)
    L.pause()


def three_steps_on_the_roofline(L: Lesson, model, hw, rng):
    L.section("1. Three kinds of step on the roofline")
    c = model.config
    P = min(L.pick(128, 64), c.n_ctx // 2)
    ids = rng.integers(0, c.vocab_size, P)
    model.prefill(ids[:8])  # warm-up
    with L.status(f"prefill of {P} tokens, cached decode, naive decode…"):
        with minillm.Meter() as m:
            logits, cache = model.prefill(ids)
            token = minillm.sample(logits)
            for _ in range(4):
                token = minillm.sample(model.decode_step(token, cache))
        with minillm.Meter() as mn:
            minillm.generate(model, ids, 3, kv_cache=False)
    pre = m.steps[0]
    dec = sorted(m.of_kind("decode"), key=lambda r: r.seconds)[len(m.of_kind("decode")) // 2]   # the median step
    naive = mn.of_kind("decode")[-1]
    L.say("""
        The bytes depend on a **view of memory**. *Unfused*, as NumPy runs and as the meter counts:
        every operation reads its inputs from memory and writes its outputs back, so a long prefill
        moves its activations many times over (the T×T attention scores among them). *Ideal fusion*,
        a lower bound: only the weights, the KV cache and each block's input and output cross memory;
        the rest stays on chip. Real GPU engines sit between the two: FlashAttention keeps the T×T
        scores on chip, but separate matrix kernels still write their outputs to memory.
        `minillm.ui.report.fused_bytes(record, config, 4)` computes the ideal from the meter's counts.

        The tables below give, for a prefill (P), a cached decode step (D) and a naive decode step (N):
        their counts, then each view's verdict and its **best possible time** (≥: no run can be faster).
        The GPU columns assume fp16: half the float32 bytes.
    """)
    t = Table(header_style="bold")
    for col in ("step (tokens)", "FLOPs", "bytes", "fused", "FLOP/byte", "fused", "time here"):
        t.add_column(col, justify="left" if col.startswith("step") else "right", no_wrap=col != "step (tokens)")
    roof = Table(header_style="bold")
    for col in ("step", "here (unfused)", "A100 (ideal fusion)", "H100 (ideal fusion)"):
        roof.add_column(col, justify="left" if col == "step" else "right", no_wrap=True)
    rows = [(f"P prefill {pre.n_tokens}", pre), ("D decode 1", dec), (f"N naive {naive.n_tokens}", naive)]
    for label, r in rows:
        fused = report.fused_bytes(r, c, 4)
        t.add_row(label, fmt_flops(r.total_flops), fmt_bytes(r.total_bytes), fmt_bytes(fused),
                  f"{r.intensity:.3g}", f"{r.total_flops / fused:.3g}", fmt_time(r.seconds))
        cells = [roofline(r.total_bytes, r.total_flops, hw), gpu_roof_fused(r, GPUS[0], model),
                 gpu_roof_fused(r, GPUS[1], model)]
        roof.add_row(label[0], *(f"{x.bound} ≥{fmt_time(x.seconds)}" for x in cells))
    L.show(t, "[dim]bytes, FLOP/byte: unfused, as the meter counts; fused: the ideal fusion view[/]")
    L.show("[bold]Each step's roofline verdict (memory- or compute-bound) and best possible time, in the "
           "view of memory each column names (fused: the ideal)[/]", roof)
    pre_a100 = gpu_roof_fused(pre, GPUS[0], model)
    L.say(f"""
        Fused, the {pre.n_tokens}-token prefill does {pre.total_flops / report.fused_bytes(pre, c, 4):.3g} FLOPs per
        float32 byte ({pre_a100.intensity:.3g} per fp16 byte); the A100's ridge is {pre_a100.ridge:.0f}, so on
        the A100 this prefill is **{pre_a100.bound}-bound**. In fp16 a prefill does about one FLOP per byte per
        prompt token on the weights, so prompts longer than about the ridge in tokens make it wait on
        arithmetic there, shorter ones still wait on memory.
    """)
    L.show(roofline_plot(hw.bandwidth_gbs, hw.peak_gflops,
                         [("P", pre.intensity, pre.gflops), ("D", dec.intensity, dec.gflops),
                          ("N", naive.intensity, naive.gflops)]))
    L.say(f"""
        Each letter sits at its intensity and at the GFLOP/s it **achieved** here (FLOPs ÷ measured time).
        Left of the ridge the roof slopes: there, more bandwidth would mean more speed. Right of it the
        roof is flat: only more arithmetic would help. Ridges: this machine {hw.ridge:.3g} (float32, as
        measured at {plural(hw.blas_threads, "BLAS thread") if hw.blas_threads else "? BLAS threads"}), A100 {CHIPS['a100-80gb'].ridge:.0f}, H100
        {CHIPS['h100-sxm'].ridge:.0f} FLOP/byte (dense fp16 tensor math). The GPUs' ridges are higher
        partly from fp16 tensor cores: a server CPU computing in bf16 on many cores reaches tens of
        FLOP/byte, and this figure is for float32 on a shared machine.
    """)
    L.claim(pre.intensity > dec.intensity,
            f"prefill's intensity ({pre.intensity:.3g}) is above cached decode's ({dec.intensity:.3g})")
    here = "below" if dec.intensity < hw.ridge else "above"
    L.say(f"Cached decode's {dec.intensity:.3g} FLOP/byte is {here} this machine's ridge ({hw.ridge:.3g}): "
          f"{'memory' if here == 'below' else 'compute'}-bound here.")
    L.fact("cached decode at batch 1 is memory-bound on the A100 and H100: about 2 FLOPs per weight, 2 bytes "
           f"per fp16 weight, 1 FLOP/byte, against ridges of {CHIPS['a100-80gb'].ridge:.0f} and "
           f"{CHIPS['h100-sxm'].ridge:.0f}")
    L.claim(naive.intensity > dec.intensity,
            f"naive decode has the higher intensity ({naive.intensity:.3g}), because it redoes the whole "
            "sequence: a high FLOPs-per-byte figure is not a goal in itself, useful work per second is")
    return dec


def which_phase_dominates(L: Lesson, model, hw, rng) -> dict:
    L.section("2. Which phase dominates? Three workloads")
    c, enc = model.config, minillm.tokenizer()
    cap = c.n_ctx
    scen = [
        ("A: long prompt, short answer", min(L.pick(384, 160), cap - 16), L.pick(8, 4), 1),
        ("B: short prompt, long answer", 16, min(L.pick(48, 32), cap - 16), 1),
    ]
    sys_ids = enc.encode(SYSTEM)
    q_ids = [enc.encode(q) for q in QUESTIONS]
    n_answer = L.pick(8, 4)
    results = []
    for label, p_len, n_new, _ in scen:
        prompt = rng.integers(0, c.vocab_size, p_len)
        with L.status(f"{label.strip()}: {p_len}-token prompt, {n_new} new tokens…"):
            with minillm.Meter() as ms:
                minillm.generate(model, prompt, n_new)
        results.append((label, f"{p_len} + {n_new}", phases(ms, hw, model)))
    label_c = f"C: {len(QUESTIONS)} short requests with a shared system prompt"
    with L.status("C: short requests one after another…"):
        with minillm.Meter() as mc:
            plain_answers = [minillm.generate(model, sys_ids + q, n_answer) for q in q_ids]
    results.append((label_c, f"{len(QUESTIONS)} × ({len(sys_ids)}+~{round(statistics.mean(map(len, q_ids)))} + {n_answer})",
                    phases(mc, hw, model)))
    t = Table(header_style="bold")
    L.say("""
        Below, for each workload: the share of its FLOPs done in prefill, the share of its bytes moved
        in decode, and the time of each phase, prefill | decode: *here* as measured on this machine (one
        run, summed over its steps), *A100* the roofline time of the same FLOPs on an A100 with the ideal
        fused view's fp16 bytes. The larger of each pair is in bold.
    """)
    for col in ("", "tokens in + out", "prefill's share of FLOPs", "decode's share of bytes", "here: prefill | decode",
                "A100: prefill | decode"):
        t.add_column(col, justify="left" if not col else "right")

    def versus(p: float, d: float) -> str:
        return f"[bold]{fmt_time(p)}[/] | {fmt_time(d)}" if p > d else f"{fmt_time(p)} | [bold]{fmt_time(d)}[/]"

    for label, sizes, ph in results:
        p, d = ph["prefill"], ph["decode"]
        t.add_row(label[0], sizes, f"{p['flops'] / (p['flops'] + d['flops']):.0%}",
                  f"{d['bytes'] / (p['bytes'] + d['bytes']):.0%}",
                  versus(p["seconds"], d["seconds"]), versus(p["roof_gpu_fused"], d["roof_gpu_fused"]))
    L.show("\n".join(f"[bold]{escape(label)}[/]" for label, _, _ in results), t)
    L.busy_note()
    (_, _, a), (_, _, b_), _ = results

    def dominant(ph, key):
        return "prefill" if ph["prefill"][key] > ph["decode"][key] else "decode"

    here = closeness.figures_apart(a["prefill"]["seconds"], a["decode"]["seconds"])   # one run: the rule's band
    took = ("prefill took longer here" if here > 0 else "decode took longer here" if here < 0 else
            f"prefill and decode took about as long here (within {closeness.CLOSE:.0%}, one run)")
    L.say(f"""
        Workload A: prefill does {a['prefill']['flops'] / (a['prefill']['flops'] + a['decode']['flops']):.0%} of
        the FLOPs; {took}, and {dominant(a, 'roof_gpu_fused')} would take longer on the A100. Workload B: decode moves {b_['decode']['bytes'] / (b_['prefill']['bytes'] + b_['decode']['bytes']):.0%}
        of the bytes, and {dominant(b_, 'roof_gpu_fused')} would dominate on the A100.
    """)
    L.claim(a["prefill"]["flops"] > a["decode"]["flops"],
            f"A: the long prompt makes prefill do most of the arithmetic "
            f"({a['prefill']['flops'] / (a['prefill']['flops'] + a['decode']['flops']):.0%} of the FLOPs)")
    L.claim(b_["decode"]["bytes"] > b_["prefill"]["bytes"]
            and b_["decode"]["roof_gpu_fused"] > b_["prefill"]["roof_gpu_fused"]
            and b_["decode"]["roof_gpu"] > b_["prefill"]["roof_gpu"],
            "B: the long answer makes decode move most of the bytes, and decode dominates on the A100 "
            "in both views of memory")
    a100 = CHIPS["a100-80gb"]
    P_, N_, B_ = 1000, 200, 32
    alone = (P_ / N_) / a100.ridge
    batched = alone * B_
    L.say(f"""
        The same counters can give different verdicts on different machines. A CPU has little arithmetic
        per byte of bandwidth (a low ridge), so a long prompt's prefill is slow there. A GPU has a huge
        peak, so prefill gets cheap and the token-by-token decode, waiting on memory, is what is left.
        On a GPU in fp16, for one request alone: prefill ≈ 2·params·P ÷ peak and decode ≈ N_out · 2·params ÷
        bandwidth, so **prefill ÷ decode ≈ (P ÷ N_out) ÷ ridge**. A {P_:,}-token prompt with a {N_}-token answer
        on an A100: {fmt_x(alone)}, {dominates(alone)}. In a server, B requests' decodes share each weight
        read, so decode's time per request falls by about B and the ratio becomes ≈ P·B ÷ (N_out·ridge): at
        B = {B_}, {fmt_x(batched)}, {dominates(batched)}. That is where the article's rule of thumb **prompts over ~1k tokens → look
        at prefill** comes from: batched serving. Measure your own mix before optimizing.
    """)
    return {"mc": mc, "n_answer": n_answer, "plain_answers": plain_answers, "q_ids": q_ids,
            "results": results, "sys_ids": sys_ids}


# Every optimisation the course measures: what it cuts (bytes, FLOPs or waiting) and the lesson that
# measures it. Lesson 7 comes last in its track and refers back to each (tests: every lesson of the
# other tracks has a row).
OPTIMISATIONS = (
    ("batching", "bytes: a weight read shared by B tokens", 8),
    ("paged KV blocks", "bytes held: KV memory", 9),
    ("continuous batching", "waiting: a finished slot refilled", 9),
    ("prefix caching", "FLOPs: a shared prompt prefilled once", 10),
    ("speculative decoding", "waiting: tokens a weight read", 11),
    ("GQA, windows", "bytes: KV a token", 12),
    ("chunked prefill", "waiting: decode behind a prefill", 13),
    ("quantized weights", "bytes: weights", 14),
    ("mixture of experts", "bytes and FLOPs: active weights", 15),
    ("flash attention", "bytes: the T×T scores", 16),
    ("a GPU", "time: bandwidth and peak", 17),
    ("latent attention", "bytes: KV a token", 18),
    ("a fixed state", "bytes: KV growing with context", 19),
    ("fused, integer kernels", "passes; FLOP time (8-bit math)", 20),
    ("tensor parallelism", "bytes a GPU reads", 7),
)


def what_each_buys(L: Lesson, model, hw, dec, work: dict) -> None:
    """Section 3: one table, a row an optimisation: what it cuts, this run's figure where this lesson
    computes one, and the lesson that measures it (the course's lessons, referred back to)."""
    L.section("3. What each optimisation buys, and the lesson that measures it")
    c = model.config
    q_ids, sys_ids = work["q_ids"], work["sys_ids"]
    with L.status("C again, its system prompt's KV cache computed once…"):
        with minillm.Meter() as mp:
            _, base = model.prefill(sys_ids)                       # the shared prefix, once
            caches = [model.prefill(q, base.fork())[1] for q in q_ids]
    full_logits, _ = model.prefill(sys_ids + q_ids[-1])          # the whole prompt at once
    part_logits, _ = model.prefill(q_ids[-1], base.fork())       # the question after the cached prefix
    logit_gap = float(np.abs(full_logits - part_logits).max())
    before, after = work["mc"].totals("prefill").flops, mp.totals("prefill").flops
    lengths = [cache.length for cache in caches]
    reserved = sum(cache.k.nbytes + cache.v.nbytes for cache in caches)
    used = sum(cache.nbytes_used() for cache in caches)
    paged = paged_bytes(c, lengths, 16, 0)                       # a real paged pool, 16-token blocks
    a100 = CHIPS[GPUS[0]]
    W = dec.bytes["weights"]
    own = report.fused_bytes(dec, c, 4) - W                      # a sequence's own bytes, fused, fp32
    b_star = critical_batch(dec.total_flops, W * FP16, own * FP16, a100.ridge)
    ceil = {dt: decode_ceiling(model.n_params(), dt, hw)["tokens_per_s"] for dt in ("fp32", "int4")}
    L.say(f"""
        Every optimisation in the course cuts one of three things: the *bytes* a step moves, the
        *FLOPs* it does, or the *waiting* between useful steps. Section 2 says which a workload needs:
        a long prompt's prefill wants fewer FLOPs, a long answer's decode fewer bytes, many requests
        less waiting. Below, each optimisation with the lesson that measures it, and this run's own
        figure where this lesson computes one (workload C: its {len(QUESTIONS)} requests sharing one prompt).
    """)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("optimisation")
    t.add_column("cuts")
    t.add_column("this run")
    t.add_column("lesson", justify="right", no_wrap=True)
    figure = {   # this run's own figures, where this lesson computes one
        "batching": f"A100: compute-bound near B ≈ {b_star:,.0f}" if b_star else "A100: memory-bound at any B",
        "paged KV blocks": f"C used {used / reserved:.1%} of whole-context KV; 16-token pages held "
                           f"{fmt_x(paged / used)} it",
        "prefix caching": f"C: {1 - after / before:.0%} fewer prefill FLOPs",
        "GQA, windows": f"{fmt_kib(caches[0].bytes_per_token())} a token here",
        "quantized weights": f"ceiling here {ceil['fp32']:,.0f} → {ceil['int4']:,.0f} tok/s (fp32 → int4)",
        "a GPU": f"A100: {fmt_x(a100.bandwidth_gbs / hw.bandwidth_gbs)} this bandwidth",
        "tensor parallelism": "below",
    }
    for name, cuts, number in OPTIMISATIONS:
        t.add_row(name, cuts, figure.get(name, ""), str(number))
    L.show(t, "[dim]this run: computed here from this run's counts and this machine's figures (blank: "
              "the lesson named measures it); A100 figures in fp16, ideal fusion[/]")
    L.claim(after < before, f"prefix caching cut the prefill FLOPs of workload C by {1 - after / before:.0%}")
    L.claim(logit_gap < 1e-3, f"and gives the same logits as prefilling the whole prompt (largest difference "
                              f"{logit_gap:.1e})")
    L.claim(reserved > paged >= used,
            f"the requests use {used / reserved:.1%} of what a whole-context reservation sets aside, and the "
            f"paged pool held {fmt_x(paged / used)} what they use")
    # The ceiling's premise, checked on the engine: a step's weight bytes scale with the bytes per weight.
    tiny = {np.dtype(dt).itemsize: minillm.load("random-tiny", dtype=dt, quiet=True) for dt in (np.float32, np.float64)}
    read = {}
    for size, m in tiny.items():
        with minillm.Meter() as mm:
            minillm.generate(m, [1, 2, 3], 2)
        read[size] = mm.of_kind("decode")[0].bytes["weights"]
    L.claim(read[8] == 2 * read[4] and read[4] > 0,
            f"the engine's decode step reads weight bytes in proportion to the bytes per weight (random-tiny: "
            f"{fmt_bytes(read[8])} in float64, {fmt_bytes(read[4])} in float32, measured)")
    L.say(batching_words(dec.total_flops, W * FP16, own * FP16, a100.ridge, dec.attended))


def paged_bytes(c, lengths: list[int], block: int, shared: int) -> int:
    """K and V bytes a paged pool holds for sequences of these lengths, whose first `shared` positions
    are one prefix stored once (forked from one sequence): the allocator's blocks in use × block bytes."""
    pool = minillm.PagedKVPool(c, sum(math.ceil(n / block) for n in lengths) + 1, block)
    base = pool.sequence()
    base.reserve(shared)
    base.advance(shared)
    for n in lengths:
        s = base.fork() if shared else pool.sequence()
        s.reserve(n - s.length)
        s.advance(n - s.length)
    if shared:
        base.free()
    return pool.allocator.n_used * pool.block_nbytes


def dominates(prefill_over_decode: float) -> str:
    """Which phase a prefill ÷ decode time ratio says takes longer (within 10%: neither)."""
    if prefill_over_decode > 1.1:
        return "prefill dominates"
    if prefill_over_decode < 1 / 1.1:
        return "decode dominates"
    return "prefill about equals decode"


def critical_batch(flops: float, weight_bytes: float, own_bytes: float, ridge: float) -> float | None:
    """The batch B* where decode turns compute-bound, from one sequence's FLOPs and bytes (None: never).

    A step of B sequences does B·flops over weight_bytes + B·own_bytes: its intensity rises with B
    toward the cap flops ÷ own_bytes. The crossing B* = ridge·weight_bytes ÷ (flops − ridge·own_bytes)
    exists only when the cap is above the ridge; weights alone (own_bytes = 0) give ridge·b ÷ 2."""
    cap = flops / own_bytes if own_bytes else math.inf
    return ridge * weight_bytes / (flops - ridge * own_bytes) if cap > ridge else None


def batching_words(flops: float, weight_bytes: float, own_bytes: float, ridge: float, context: int) -> str:
    """Where decode turns compute-bound on a GPU, in words (`critical_batch`), against the ridge."""
    cap = flops / own_bytes if own_bytes else math.inf
    weights_only = ridge * weight_bytes / flops
    b_star = critical_batch(flops, weight_bytes, own_bytes, ridge)
    if b_star is not None:
        return (f"On the A100 (ideal fusion, fp16) decode turns compute-bound near **B ≈ {b_star:,.0f}**: the "
                f"weights alone would give B\\* ≈ ridge·b/2 = {weights_only:,.0f}, and each sequence's own bytes "
                f"(KV cache at {context} positions, activations) raise it. The intensity can rise to "
                f"{cap:,.0f} FLOP/byte, above the ridge of {ridge:.0f}.")
    return (f"On the A100 (ideal fusion, fp16) decode never turns compute-bound at this context. Each sequence "
            f"brings its own bytes (its KV cache, its row of logits). So the intensity can never pass its FLOPs ÷ "
            f"its own bytes, {cap:.3g} FLOP/byte, below the ridge of {ridge:.0f}. (Weights alone would turn at B ≈ "
            f"{weights_only:,.0f}.) That is why newer models shrink the KV cache: multi-query and grouped-query "
            "attention share keys and values between heads.")


def on_a_gpu(L: Lesson) -> None:
    L.section("Beyond this machine: one GPU, then several")
    h100 = CHIPS["h100-sxm"]
    big = decode_ceiling(70e9, "fp16", h100)
    L.say(f"""
        On a GPU the questions are the same and lesson 17 asks them: each step's % BW and % peak
        there are what GPU people call MBU and MFU. (`nvidia-smi dmon`'s sm% and mem% are the share of
        time a kernel ran or memory was busy, not of the peak used: a memory-bound decode can show sm
        100%.) Lesson 17 stays on one GPU; below, what splitting a model over several costs.

        70B parameters in fp16 are {big['gb_per_token']:.0f} GB, more
        than an 80 GB H100 holds, so `minillm hardware --chip h100 --params 70B` prints a ceiling
        ({big['tokens_per_s']:.0f} tokens/s) no single H100 can run. **Tensor parallelism** splits every
        weight matrix over n GPUs: each reads 1/n of the weights per step, so the ceiling becomes n ×
        bandwidth ÷ bytes (2 H100s: {2 * h100.bandwidth_gbs / big['gb_per_token']:.0f} tokens/s, 4:
        {4 * h100.bandwidth_gbs / big['gb_per_token']:.0f}), less the time of the all-reduces that join
        the parts.
    """)
    tensor_parallel_cost(L, h100)


ALLREDUCE_LATENCY_S = 10e-6   # an assumed order for one small NCCL all-reduce over NVLink (5-20 µs is typical)


def tensor_parallel_cost(L: Lesson, h100) -> None:
    """What tensor parallelism costs, on paper: two all-reduces per layer, each of B·d·b bytes."""
    from minillm.measure.shapes import SHAPES, shape
    s = shape("llama-3-70b")
    d, layers, b = SHAPES["llama-3-70b"].n_embd, s["n_layer"], 2
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("GPUs", "weights/GPU", "weight read", "all-reduce bytes", "latency floor"):
        t.add_column(col, justify="right", no_wrap=True)
    rows = {}
    for n in (2, 4, 8):
        per_gpu = s["n_params"] * b / n
        read = per_gpu / (h100.bandwidth_gbs * 1e9)
        moved = 2 * layers * 2 * (n - 1) / n * d * b         # batch 1, ring all-reduce, per GPU per step
        floor = 2 * layers * ALLREDUCE_LATENCY_S
        rows[n] = (read, floor)
        t.add_row(str(n), fmt_bytes(per_gpu), fmt_time(read), fmt_bytes(moved), fmt_time(floor))
    L.show(t, f"[dim]llama-3-70b in fp16 on H100s, batch 1: two all-reduces per layer ({layers} layers) of "
              f"B·d·b = {d * b:,} bytes each; latency floor at an assumed {fmt_time(ALLREDUCE_LATENCY_S)} per "
              "all-reduce[/]")
    read8, floor8 = rows[8]
    read2, floor2 = rows[2]
    L.say(f"""
        Tensor parallelism splits each layer's matrices by columns then rows, so every layer ends twice
        with an **all-reduce** that sums the GPUs' partial outputs: B·d·b bytes each, tiny at batch 1 and
        B times more in a batch. The bytes hardly matter; the count does. At 8 GPUs the weight read
        falls to {fmt_time(read8)} while {2 * layers} all-reduces stay at about {fmt_time(floor8)}
        ({fmt_x(floor8 / read8)} the read, against {fmt_x(floor2 / read2)} at 2 GPUs): the more GPUs, the
        larger the share of a small-batch step the all-reduces take. **Pipeline**
        parallelism (layers split into stages) sends far fewer bytes but leaves stages idle (the
        *bubble*) unless many micro-batches are in flight; **expert** parallelism puts a mixture of
        experts' experts on different GPUs and sends each token to the ones it needs (all-to-all).
    """)


def the_diagnosis(L: Lesson, dec, hw, results) -> None:
    L.section("The diagnosis")
    (_, _, a), (_, _, b_), (_, _, cc) = results
    W = dec.bytes["weights"]
    L.say(f"""
        - **Long prompts** → *prefill*, which waits on arithmetic once the prompt is long enough: in fp16
          with fused kernels, past about the chip's ridge in tokens ({CHIPS['a100-80gb'].ridge:.0f} on an A100),
          sooner on this CPU (ridge {hw.ridge:.2g}). In this run, A's prefill did
          {a['prefill']['flops'] / (a['prefill']['flops'] + a['decode']['flops']):.0%} of the FLOPs.
          What helps: more FLOP/s (8-bit math: W8A8, FP8; lesson 20), prefix caching when prompts
          repeat (10), fewer prompt tokens, several GPUs (tensor parallelism). Separate prefill machines
          (disaggregation, 13) do not make a prefill cheaper: they stop it stalling others' decode.
        - **Long answers** → *decode*, which waits on memory. B's decode moved
          {b_['decode']['bytes'] / (b_['prefill']['bytes'] + b_['decode']['bytes']):.0%} of the bytes, at
          {dec.intensity:.2g} FLOP/byte. What helps: more bandwidth (17), quantization (weight-only
          or not, 14), batching (8), a lean KV cache (12, 18, 19), speculative decoding (11).
        - **Many short requests** → the weights are read again for every request's every step. C made
          {cc['decode']['steps']} decode steps, each reading {fmt_bytes(W)} of weights, and prefilled the same
          system prompt {len(QUESTIONS)} times. What helps: continuous batching and paged KV memory (9),
          prefix caching (10).
    """)
    L.takeaway("""
        When someone says an inference engine is faster, ask: **faster at prefill or at decode?** Did it
        cut the arithmetic (prefill), or the bytes per token and the number of times they are read
        (decode)? The meter, the hardware figures and the roofline answer it for any workload.
    """)
    L.try_it(f"""
        Run this lesson on a bigger model: `minillm learn 7 --model random-355m --no-pause`
        (decode reads {fmt_x(MODELS["355m"].n_params() / MODELS["124m"].n_params())} GPT-2 small's bytes per token;
        see which verdicts shift). Or ask about a chip and a model you care
        about: `minillm hardware --chip h100 --params 8B --dtype fp16` prints its decode ceiling.
        For your own mix of prompt and answer lengths, `minillm diagnose --prompt-tokens 800
        --answer-tokens 200 --chip h100` runs it under the meter and says which phase dominates,
        the time to first token, batched throughput against latency, and what helps.
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
