"""Lesson 7: Diagnose your bottleneck. Put each phase on the roofline, then ask which one dominates a workload.

Run:  python lessons/07_diagnose.py        (or: minillm learn 7)
"""

from __future__ import annotations

try:
    from minillm.lessons._common import (Lesson, fmt_ratio, ratio_range, time_interleaved, bar_chart, fmt_bytes, fmt_flops, fmt_time, fmt_x, plural, roofline_plot,
                                         run_lesson)
except ModuleNotFoundError as e:  # run from a checkout in which minillm is not installed
    raise SystemExit(f"{e}: install minillm first (pip install -e . in the checkout), then run this again")

import math
import statistics

import numpy as np
from rich.markup import escape
from rich.table import Table

import minillm
from minillm.ui import report
from minillm.config import PRESETS as MODELS
from minillm.measure.chips import PRESETS, decode_ceiling, roofline
from minillm.measure.batching import run_batch_bench

TITLE = "Diagnose your bottleneck"
MINUTES = 12
WHAT_YOU_WILL_SEE = "the roofline, which phase dominates three workloads, what each optimization buys"

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
    """Prefill and decode totals of a run: counted work, measured time, and roofline times."""
    out = {}
    for kind in ("prefill", "decode"):
        rs = m.of_kind(kind)
        out[kind] = {
            "steps": len(rs),
            "tokens": sum(r.n_tokens for r in rs),
            "flops": sum(r.total_flops for r in rs),
            "bytes": sum(r.total_bytes for r in rs),
            "seconds": sum(r.seconds for r in rs),
            "roof_here": sum(roofline(r.total_bytes, r.total_flops, hw).seconds for r in rs),
            "roof_gpu": sum(gpu_roof(r, GPUS[0]).seconds for r in rs),
            "roof_gpu_fused": sum(gpu_roof_fused(r, GPUS[0], model).seconds for r in rs),
        }
    return out


def first_steps(L: Lesson):
    """Section: the opening."""
    model = L.load_model(default="random-124m", fast="random-tiny")
    c = model.config
    enc = minillm.tokenizer()
    with L.status("measuring this machine's memory bandwidth and matmul peak (once; then cached)…"):
        hw = L.machine()
    rng = np.random.default_rng(0)
    L.say(f"""
        The article closes with a diagnosis guide: find out **which phase** your workload spends its time
        in, then pick the optimization that attacks **that** phase. This lesson does it with numbers, on
        `{escape(model.name)}` and on this machine ({hw.bandwidth_gbs:,.1f} GB/s, {hw.peak_gflops:,.0f} GFLOP/s,
        ridge {hw.ridge:.3g} FLOP/byte), beside two GPUs whose published figures minillm carries.
    """)
    return c, enc, hw, model, rng


def three_steps_on_the_roofline(L: Lesson, c, hw, model, rng):
    """Section: 1. Three kinds of step on the roofline."""
    L.section("1. Three kinds of step on the roofline")
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
        The roofline model: a piece of work that moves *B* bytes and does *F* FLOPs needs at least
        *B* / bandwidth seconds and at least *F* / peak seconds, so its best time is the larger of the two.
        Which one is larger depends only on its **intensity** *F*/*B* against the machine's **ridge**
        (peak ÷ bandwidth). `minillm.hardware.roofline(bytes, flops, hw)` applies it. The GPU columns
        assume fp16: half the float32 bytes.

        The bytes depend on a **view of memory**. *Unfused*, as NumPy runs and as the meter counts:
        every operation reads its inputs from memory and writes its outputs back, so a long prefill
        moves its activations many times over. *Fused*, as a fused GPU kernel runs: only the weights,
        the KV cache and each block's input and output cross memory; the rest stays on chip.
        `minillm.report.fused_bytes(record, config, 4)` computes the second from the first.
    """)
    t = Table(header_style="bold")
    for col in ("step (tokens)", "FLOPs", "bytes unfused", "fused", "FLOP/B unfused", "fused", "time here"):
        t.add_column(col, justify="left" if col.startswith("step") else "right", no_wrap=col != "step (tokens)")
    roof = Table(header_style="bold")
    for col in ("step", "here, unfused", "A100, unfused", "A100, fused", "H100, fused"):
        roof.add_column(col, justify="left" if col == "step" else "right", no_wrap=True)
    rows = [(f"P prefill {pre.n_tokens}", pre), ("D decode 1", dec), (f"N naive {naive.n_tokens}", naive)]
    for label, r in rows:
        fused = report.fused_bytes(r, c, 4)
        t.add_row(label, fmt_flops(r.total_flops), fmt_bytes(r.total_bytes), fmt_bytes(fused),
                  f"{r.intensity:.3g}", f"{r.total_flops / fused:.3g}", fmt_time(r.seconds))
        cells = [roofline(r.total_bytes, r.total_flops, hw), gpu_roof(r, GPUS[0]), gpu_roof_fused(r, GPUS[0], model),
                 gpu_roof_fused(r, GPUS[1], model)]
        roof.add_row(label[0], *(f"{x.bound} ≥{fmt_time(x.seconds)}" for x in cells))
    L.show(t)
    L.show("[bold]The roofline's verdict for each step (memory- or compute-bound) and its best possible time, "
           "in the view of memory each column names[/]", roof)
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
        roof is flat: only more arithmetic would help. Ridges: this machine {hw.ridge:.3g}, A100
        {PRESETS['a100-80gb'].ridge:.0f}, H100 {PRESETS['h100-sxm'].ridge:.0f} FLOP/byte. A GPU's ridge
        is far higher: it has much more arithmetic per byte of bandwidth than a CPU.
    """)
    L.claim(pre.intensity > dec.intensity,
            f"prefill's intensity ({pre.intensity:.3g}) is above cached decode's ({dec.intensity:.3g})")
    L.claim(dec.intensity < hw.ridge, f"cached decode ({dec.intensity:.3g} FLOP/B) is below this machine's ridge "
                                      f"({hw.ridge:.3g}): memory-bound")
    L.claim(all(gpu_roof(dec, g).bound == gpu_roof_fused(dec, g, model).bound == "memory" for g in GPUS),
            "cached decode is memory-bound on the A100 and H100 too, in both views of memory")
    L.claim(all(report.fused_bytes(r, c, 4) <= r.total_bytes for _, r in rows),
            "the fused view never moves more bytes than the unfused one the meter counted")
    L.claim(naive.intensity > dec.intensity,
            f"naive decode has the higher intensity ({naive.intensity:.3g}), because it redoes the whole "
            "sequence: a high FLOPs-per-byte figure is not a goal in itself, useful work per second is")
    return dec


def which_phase_dominates(L: Lesson, c, enc, hw, model, rng):
    """Section: 2. Which phase dominates? Three workloads."""
    L.section("2. Which phase dominates? Three workloads")
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
    for col in ("", "tokens in + out", "prefill's FLOPs", "decode's bytes", "here: prefill | decode",
                "A100, fused: prefill | decode"):
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
    L.say("""
        Shares are of the workload's total; *here* is the time measured on this machine (one run, summed over
        its steps), *A100, fused* the roofline time of the same FLOPs on an A100 with the fused view's fp16
        bytes. The larger of each pair is in bold.
    """)
    (_, _, a), (_, _, b_), _ = results

    def dominant(ph, key):
        return "prefill" if ph["prefill"][key] > ph["decode"][key] else "decode"

    L.say(f"""
        Workload A: prefill does {a['prefill']['flops'] / (a['prefill']['flops'] + a['decode']['flops']):.0%} of
        the FLOPs; {dominant(a, 'seconds')} took longer here, and {dominant(a, 'roof_gpu_fused')} would take longer
        on the A100. Workload B: decode moves {b_['decode']['bytes'] / (b_['prefill']['bytes'] + b_['decode']['bytes']):.0%}
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
    L.say("""
        The same counters can give different verdicts on different machines. A CPU has little arithmetic
        per byte of bandwidth (a low ridge), so a long prompt's prefill is slow there. A GPU has a huge
        peak, so prefill gets cheap and the token-by-token decode, waiting on memory, is what is left.
        That is why the article's rules of thumb are about GPUs: **prompts over ~1k tokens → look at
        prefill; answers over ~500 tokens → look at decode; many short requests → look at batching.**
        Measure your own mix before optimizing.
    """)
    return mc, n_answer, plain_answers, q_ids, results, sys_ids


def prefix_caching(L: Lesson, hw, mc, model, n_answer, plain_answers, q_ids, sys_ids):
    """Section: 3a. Prefix caching: compute a shared prompt once."""
    L.section("3a. Prefix caching: compute a shared prompt once")
    L.say(f"""
        Workload C sends the same {len(sys_ids)}-token system prompt with every question, and each request
        prefilled it again. With **prefix caching** a server keeps the KV cache of the shared prefix and
        starts each request from a copy of it, prefilling only the new tokens. minillm's public API can
        do it: `model.prefill(ids, cache)` continues a cache that already holds tokens.

        ```python
        _, base = model.prefill(system_ids)                 # once
        for q in questions:
            cache = base.fork()                     # the prefix's keys and values
            logits, cache = model.prefill(q, cache)         # only the question
            ...decode_step(token, cache) as before
        ```
    """)
    caches, cached_answers = [], []
    with L.status("C again, with the system prompt's KV cache computed once…"):
        with minillm.Meter() as mp:
            _, base = model.prefill(sys_ids)
            for q in q_ids:
                cache = base.fork()
                logits, cache = model.prefill(q, cache)
                out = [minillm.sample(logits)]
                for _ in range(n_answer - 1):
                    out.append(minillm.sample(model.decode_step(out[-1], cache)))
                cached_answers.append(out)
                caches.append(cache)
    full_logits, _ = model.prefill(sys_ids + q_ids[-1])                  # the whole prompt at once
    part_logits, _ = model.prefill(q_ids[-1], base.fork())       # the question after the cached prefix
    logit_gap = float(np.abs(full_logits - part_logits).max())
    before, after = phases(mc, hw, model)["prefill"], phases(mp, hw, model)["prefill"]
    with L.status("timing both ways of prefilling C's prompts, in turns…"):
        times = time_interleaved({
            "full": lambda: [model.prefill(sys_ids + q) for q in q_ids],
            "prefix": lambda: [model.prefill(q, base.fork()) for q in q_ids],
        }, L.rounds())
    t = Table(header_style="bold")
    for col in ("", "prefill calls", "tokens", "FLOPs", "bytes", "time"):
        t.add_column(col, justify="left" if not col else "right", no_wrap=bool(col))
    t.add_row("every request prefills everything", str(before["steps"]), f"{before['tokens']:,}",
              fmt_flops(before["flops"]), fmt_bytes(before["bytes"]), times["full"].short())
    t.add_row("prefix computed once", str(after["steps"]), f"{after['tokens']:,}", fmt_flops(after["flops"]),
              fmt_bytes(after["bytes"]), times["prefix"].short())
    L.show(t)
    L.timing_note()
    L.say(f"""
        Timed in turns, prefilling everything took {fmt_ratio(ratio_range(times['full'], times['prefix']))} the
        time of starting from the cached prefix (the prefix's own prefill, done once, is not in the second
        figure). Time follows FLOPs only partly: every prefill call reads all the weights once, whatever
        its length, so short prefills gain less than their FLOPs suggest. The saving grows with the length
        of the shared prefix.
    """)
    L.claim(after["flops"] < before["flops"],
            f"prefix caching cut the prefill FLOPs of workload C by {1 - after['flops'] / before['flops']:.0%}")
    L.claim(logit_gap < 1e-3, f"and gives the same logits as prefilling the whole prompt (largest difference {logit_gap:.1e})")
    L.busy_note()
    same = sum(a == b for a, b in zip(plain_answers, cached_answers))
    L.say(f"""
        Same answers: {same} of {len(q_ids)} requests generated identical tokens both ways. Prefix caching attacks
        **prefill**; it does nothing for the decode steps that follow.
    """)
    return caches


def kv_cache_management(L: Lesson, c, caches, sys_ids):
    """Section: 3b. KV-cache management: memory reserved vs used."""
    L.section("3b. KV-cache management: memory reserved vs used")
    per_tok = caches[0].bytes_per_token()
    lengths = [cache.length for cache in caches]
    block = 16
    reserved = sum(cache.k.nbytes + cache.v.nbytes for cache in caches)
    used = sum(cache.nbytes_used() for cache in caches)
    paged = paged_bytes(c, lengths, block, 0)                  # a real paged pool, filled to these lengths
    shared_blocks = len(sys_ids) // block
    paged_shared = paged_bytes(c, lengths, block, len(sys_ids))  # ... the system prompt's full blocks shared
    t = Table(header_style="bold")
    for col in ("policy", f"KV memory for these {len(caches)} requests", "vs used", "requests per GB"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for name, total in ((f"whole context ({c.n_ctx}) each, KVCache", reserved),
                        ("exactly what is used", used),
                        (f"{block}-token pages, PagedKVPool", paged),
                        ("pages, prefix pages shared", paged_shared)):
        t.add_row(name, fmt_bytes(total), fmt_x(total / used), f"{1e9 / (total / len(caches)):,.0f}")
    L.show(t)
    L.claim(reserved > paged >= used and paged - used < len(caches) * block * per_tok,
            f"the requests use {used / reserved:.1%} of what a whole-context reservation sets aside; "
            f"{block}-token pages waste less than one page per request")
    if shared_blocks:
        L.claim(paged_shared < paged, f"sharing the prefix's {plural(shared_blocks, 'full page')} saves another "
                                      f"{fmt_bytes(paged - paged_shared)}")
    L.say(f"""
        Each request here holds {min(lengths)}–{max(lengths)} positions of a {c.n_ctx}-position cache. Reserving
        the maximum per request (simple, and what the lessons' `KVCache` does) wastes most of the memory;
        allocating the cache in small pages on demand, as vLLM's PagedAttention does and minillm's
        `PagedKVPool` does (the page rows above are that pool's blocks in use), lets a server fit many
        more requests in the same memory, and pages of a shared prefix can be stored once. Lesson 9
        measures the waste over a whole workload (`minillm serve-sim --compare block-size`), lesson 10
        what prefix sharing saves (`--compare prefix-cache`).
    """)


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


def batching(L: Lesson, dec, hw, model):
    """Section: 3c. Batching: share each read of the weights."""
    L.section("3c. Batching: share each read of the weights")
    W = dec.bytes["weights"]
    measured = L.pick([1, 4, 16], [1, 4])
    with L.status(f"decode steps with B = {', '.join(map(str, measured))} sequences at once…"):
        sweep = run_batch_bench(model, measured, hw, context=16, repeats=L.pick(3, 2))
    rows = sweep["rows"]
    one, top = rows[0], rows[-1]
    per_seq = (top["bytes"] - one["bytes"]) / (top["batch"] - 1)       # each extra sequence's own bytes
    per_flops = (top["flops"] - one["flops"]) / (top["batch"] - 1)
    shared = one["bytes"] - per_seq                                      # read once per step: the weights
    L.say(f"""
        `minillm.generate_batch` and `model.step` decode **B** sequences in one step: their B tokens are B
        rows of every product, so the weights are read once for all of them. The rows below are measured
        with the engine (lesson 8 has the whole sweep); the larger B are projected from the counts the meter
        made at B = {one['batch']} and {top['batch']}: {fmt_bytes(shared)} read once per step, {fmt_bytes(per_seq)} and
        {fmt_flops(per_flops)} more for each sequence.
    """)
    t = Table(header_style="bold")
    for col in ("batch B", "FLOP/B", "tokens/s here", "bound here", "A100 (fp16)", "tokens/s A100 (roof)"):
        t.add_column(col, justify="right")
    crossing, inten = None, []
    for B in measured + [64, 256, 1024]:
        row = next((r for r in rows if r["batch"] == B), None)
        nbytes, flops = (row["bytes"], row["flops"]) if row else (shared + B * per_seq, B * per_flops)
        here = roofline(nbytes, flops, hw)
        gpu = roofline(nbytes * FP16, flops, GPUS[0])
        inten.append(here.intensity)
        if crossing is None and gpu.bound == "compute":
            crossing = B
        speed = f"{row['tok_s']:,.0f} measured" if row else f"{B / here.seconds:,.0f} roof"
        t.add_row(str(B), f"{here.intensity:.3g}", speed, here.bound, gpu.bound, f"{B / gpu.seconds:,.0f}")
    L.show(t)
    L.busy_note()
    L.claim(all(y > x for x, y in zip(inten, inten[1:])),
            "the more sequences share a weight read, the higher the intensity (counted at the measured B)")
    L.claim(top["tok_s"] > one["tok_s"], f"B = {top['batch']} made {fmt_x(top['tok_s'] / one['tok_s'])} the tokens "
                                         f"per second of B = 1 on this machine, measured")
    cap_gpu = per_flops / (per_seq * FP16)
    if crossing:
        verdict = f"On the A100 decode turns compute-bound at around B = {crossing}."
    else:
        verdict = (f"On the A100 it stays memory-bound even at B = 1,024: each sequence brings its own KV-cache reads "
                   f"and activations, so the intensity can never pass its FLOPs ÷ its own bytes = {cap_gpu:.3g} "
                   "FLOP/byte in fp16, below the A100's ridge. That is why newer models shrink the KV cache "
                   "(multi-query and grouped-query attention share keys and values between heads).")
    L.say(f"""
        Batching turns the weight read from a per-token cost into a per-step cost: tokens per second grow
        almost in proportion to B as long as the weights dominate the traffic. {verdict}
        Servers batch continuously (*continuous batching*): a finished sequence leaves the batch and a
        waiting one joins at the next step, which is also the answer to "many short requests".
    """)
    return W


def quantization(L: Lesson, hw, model):
    """Section: 3d. Quantization: fewer bytes per weight."""
    L.section("3d. Quantization: fewer bytes per weight")
    t = Table(header_style="bold")
    t.add_column("weights in")
    t.add_column("model bytes", justify="right")
    t.add_column("decode ceiling here", justify="right")
    t.add_column("decode ceiling, A100", justify="right")
    ceil = {}
    for dt in ("fp32", "fp16", "int8", "int4"):
        here = decode_ceiling(model.n_params(), dt, hw)
        gpu = decode_ceiling(model.n_params(), dt, GPUS[0])
        ceil[dt] = here["tokens_per_s"]
        t.add_row(dt, fmt_bytes(here["bytes_per_token"]), f"{here['tokens_per_s']:,.0f} tok/s", f"{gpu['tokens_per_s']:,.0f} tok/s")
    L.show(f"[bold]{escape(model.name)}, {model.n_params():,} parameters, batch 1: minillm.hardware.decode_ceiling[/]", t)
    L.show(bar_chart("Decode ceiling on this machine:", [(dt, v, f"{v:,.0f} tok/s") for dt, v in ceil.items()], style="green"))
    # The ceiling's premise, checked on the engine: a step's weight bytes scale with the bytes per weight.
    tiny = {np.dtype(dt).itemsize: minillm.load("random-tiny", dtype=dt, quiet=True) for dt in (np.float32, np.float64)}
    read = {}
    for size, m in tiny.items():
        with minillm.Meter() as mm:
            minillm.generate(m, [1, 2, 3], 2)
        read[size] = mm.of_kind("decode")[0].bytes["weights"]
    L.claim(read[8] == 2 * read[4] and read[4] > 0,
            f"the engine's decode step reads weight bytes in proportion to the bytes per weight (random-tiny: "
            f"{fmt_bytes(read[8])} in float64, {fmt_bytes(read[4])} in float32), so 4-bit weights, 8× fewer "
            f"bytes than float32, raise the ceiling {ceil['int4'] / ceil['fp32']:.0f}×")
    L.say("""
        Quantization helps **decode** directly, because decode's time is bytes ÷ bandwidth. It helps
        prefill only if the chip also computes faster in the smaller type (GPU tensor cores do).
    """)


def the_diagnosis(L: Lesson, W, dec, hw, results):
    """Section: The diagnosis."""
    L.section("The diagnosis")
    (_, _, a), (_, _, b_), (_, _, cc) = results
    L.say(f"""
        - **Long prompts** → *prefill*, which waits on arithmetic once the prompt is long enough: in fp16
          with fused kernels, past about the chip's ridge in tokens ({PRESETS['a100-80gb'].ridge:.0f} on an A100),
          sooner on this CPU (ridge {hw.ridge:.2g}). In this run, A's prefill did
          {a['prefill']['flops'] / (a['prefill']['flops'] + a['decode']['flops']):.0%} of the FLOPs.
          What helps: more FLOP/s, prefix caching when prompts repeat, lower-precision math.
        - **Long answers** → *decode*, which waits on memory. B's decode moved
          {b_['decode']['bytes'] / (b_['prefill']['bytes'] + b_['decode']['bytes']):.0%} of the bytes, at
          {dec.intensity:.2g} FLOP/byte. What helps: more bandwidth, quantization, batching, a lean KV cache.
        - **Many short requests** → the weights are read again for every request's every step. C made
          {cc['decode']['steps']} decode steps, each reading {fmt_bytes(W)} of weights, and prefilled the same
          system prompt {len(QUESTIONS)} times. What helps: continuous batching, prefix caching, paged KV memory
          so more requests fit.
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
        about: `minillm hardware --chip h100 --params 70B --dtype fp16` prints its decode ceiling.
        For your own mix of prompt and answer lengths, `minillm diagnose --prompt-tokens 800
        --answer-tokens 200 --chip h100` runs it under the meter and says which phase dominates,
        the time to first token, batched throughput against latency, and what helps.
    """)


def lesson(L: Lesson) -> None:
    c, enc, hw, model, rng = first_steps(L)
    dec = three_steps_on_the_roofline(L, c, hw, model, rng)
    L.pause()
    mc, n_answer, plain_answers, q_ids, results, sys_ids = which_phase_dominates(L, c, enc, hw, model, rng)
    L.pause()
    caches = prefix_caching(L, hw, mc, model, n_answer, plain_answers, q_ids, sys_ids)
    L.pause()
    kv_cache_management(L, c, caches, sys_ids)
    L.pause()
    W = batching(L, dec, hw, model)
    L.pause()
    quantization(L, hw, model)
    L.pause()
    the_diagnosis(L, W, dec, hw, results)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv, number=7, title=TITLE, minutes=MINUTES, what=WHAT_YOU_WILL_SEE,
                      prog="python lessons/07_diagnose.py")


if __name__ == "__main__":
    raise SystemExit(main())
