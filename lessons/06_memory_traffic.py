"""Lesson 6: Memory traffic. A decode step reads every weight to produce one token: memory sets the pace.

Run:  python lessons/06_memory_traffic.py        (or: minillm learn 6)
"""

from __future__ import annotations

import statistics

import numpy as np
from rich.markup import escape
from rich.table import Table

import minillm
from minillm.lessons._common import (Lesson, Timing, bar, bar_chart, fmt_bytes, fmt_kib, fmt_time, fmt_x, plural,
                                     run_lesson, stacked_bar)
from minillm.measure import residency
from minillm.measure.chips import CHIPS
from minillm.measure.chips import decode_ceiling

TITLE = "Memory traffic: why decode waits on memory"
MINUTES = 5  # 1,048 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "a decode step's bytes, this machine's bandwidth, the decode ceiling, 7B on an A100"

PROMPT = "ROMEO: But soft, what light through yonder window breaks?"
KIND_STYLE = {"weights": "blue", "kv_read": "magenta", "kv_write": "red", "activations": "yellow"}


def decode_run(model, ids, steps: int) -> list:
    """`steps` cached decode steps after a prefill, under a Meter (after a short warm-up)."""
    minillm.generate(model, ids, 3)  # warm-up: first touches of the weights and cache pages
    with minillm.Meter() as m:
        minillm.generate(model, ids, steps + 1)
    return m.of_kind("decode")


def lesson(L: Lesson) -> None:
    model = L.load_model(default="large", fast="random-tiny")   # real text, weights beyond the CPU's cache
    ids = minillm.tokenizer().encode(PROMPT)
    intro(L, model)
    with L.status(f"decode steps on {model.name}…"):
        steps = decode_run(model, ids, L.pick(12, 8))
    what_one_decode_step_moves(L, model, steps[-1])
    L.pause()
    counters_equal_closed_forms(L, model, steps[-1])
    L.pause()
    hw = can_memory_keep_up(L, model, ids, steps)
    L.pause()
    a_big_model_on_a_gpu(L, model, hw, steps[-1])


def intro(L: Lesson, model) -> None:
    L.say(f"""
        Lesson 5 left one token's arithmetic per step, but it still reads **all** the weights for
        that token. Here are those bytes on `{escape(model.name)}` ({model.n_params():,} parameters,
        {fmt_bytes(model.nbytes())} in {np.dtype(model.dtype).name}) against this machine's bandwidth.
    """)
    L.pause()


def what_one_decode_step_moves(L: Lesson, model, r) -> None:
    L.section("What one decode step moves")
    V, t = model.config.vocab_size, r.attended
    total = r.total_bytes
    kinds = Table(header_style="bold")
    for col in ("kind", "bytes", "share", ""):
        kinds.add_column(col, justify="left" if col in ("kind", "") else "right")
    for kind, n in r.bytes.items():
        kinds.add_row(f"[{KIND_STYLE[kind]}]{kind}[/]", fmt_bytes(n), f"{n / total:.1%}",
                      f"[{KIND_STYLE[kind]}]{bar(n, total, 40)}[/]")
    kinds.add_row("[bold]total[/]", fmt_bytes(total), "", stacked_bar([(n, KIND_STYLE[k]) for k, n in r.bytes.items()], total, 40))
    L.show(f"[bold]A decode step at position {r.position} ({t} attended), from the meter[/]", kinds)
    ops = sorted(r.ops.items(), key=lambda kv: -kv[1]["bytes"])[:3]
    L.show(bar_chart("The same bytes by operation, the three biggest:",
                     [(f"{name} ×{o['calls']}", o["bytes"], f"{fmt_bytes(o['bytes'])}  {o['bytes'] / total:.0%}") for name, o in ops],
                     style="blue"))
    L.claim(r.bytes["weights"] > total / 2, f"weights are most of what a decode step moves: {r.bytes['weights'] / total:.0%}")
    head = r.ops["lm_head"]["bytes"] / total
    L.say(f"""
        The biggest read is the **LM head**: all of `wte` ({fmt_bytes(model.params['wte.weight'].nbytes)},
        {head:.0%} of the step) to score {V:,} ids. The KV read grows with the position.
    """)


def counters_equal_closed_forms(L: Lesson, model, r) -> None:
    L.section("The counters agree with the closed forms")
    c, t, b = model.config, r.attended, np.dtype(model.dtype).itemsize
    L_, d, V = c.n_layer, c.n_embd, c.vocab_size
    forms = [
        ("weights read", "(12·L·d² + 13·L·d + 2·d + V·d)·b + 2·d·b", r.bytes["weights"],
         (12 * L_ * d * d + 13 * L_ * d + 2 * d + V * d) * b + 2 * d * b),
        ("KV read", "2·L·t·d·b", r.bytes["kv_read"], 2 * L_ * t * d * b),
        ("KV written", "2·L·d·b", r.bytes["kv_write"], 2 * L_ * d * b),
        ("matmul FLOPs", "24·L·d² + 2·d·V", r.flops["matmul"], 24 * L_ * d * d + 2 * d * V),
        ("attention FLOPs", "4·L·t·d", r.flops["attention"], 4 * L_ * t * d),
    ]
    ft = Table(header_style="bold")
    for col in ("", "formula", "formula gives", "meter counted"):
        ft.add_column(col, justify="right" if col in ("formula gives", "meter counted") else "left")
    for name, form, counted, expected in forms:
        ft.add_row(name, form, f"{expected:,}", f"{counted:,}")
    L.show(f"[bold]L = {L_}, d = {d}, V = {V:,}, b = {b} bytes, t = {t}[/]  "
           "[dim](2·d·b: the embedding's rows of wte and wpe)[/]", ft)
    for name, _, counted, expected in forms:
        L.claim(counted == expected, f"{name}: the meter's count equals the formula")
    L.say(f"""
        So a decode step does about **2 FLOPs per weight** (a multiply, an add) and reads **{b} bytes
        per weight**: about 2/{b} = {2 / b:.2g} FLOP/byte at any model size. The meter says
        {r.intensity:.3g}.
    """)


def can_memory_keep_up(L: Lesson, model, ids, steps):
    L.section("This machine: can memory keep up?")
    r, n_steps = steps[-1], len(steps)
    with L.status("measuring this machine's memory bandwidth and matmul peak (once; then cached)…"):
        hw = L.machine()
    if hw.fast:     # the figures above are minillm.measure.hardware.machine()'s
        L.note("fast mode: a small buffer, rough figures")
    side = "below" if r.intensity < hw.ridge else "above"
    L.say(f"""
        The **ridge**, peak ÷ bandwidth, is the FLOPs per byte that keep the arithmetic busy.
        Decode's {r.intensity:.3g} FLOP/byte is {side} this machine's ridge of {hw.ridge:.3g} (float32,
        {plural(hw.blas_threads, "BLAS thread") if hw.blas_threads else "? BLAS threads"}):
        {"decode is memory-bound here" if side == "below" else "decode is compute-bound here"}.
    """)
    sec = statistics.median(s.seconds for s in steps)
    spread = Timing(tuple(s.seconds for s in steps))
    step_bytes = statistics.median(s.total_bytes for s in steps)
    achieved = step_bytes / sec / 1e9
    ceiling = hw.bandwidth_gbs * 1e9 / step_bytes
    measured = 1.0 / sec
    L.roofline(hw, [("decode step (median)", r.intensity, r.total_flops / sec / 1e9)])
    L.say(f"""
        A step moves {fmt_bytes(step_bytes)}; at {hw.bandwidth_gbs:,.1f} GB/s that takes at least
        {fmt_time(step_bytes / (hw.bandwidth_gbs * 1e9))}: **{ceiling:,.1f} tokens/s is the ceiling**
        however fast the arithmetic (at the matmul peak it would take only
        {fmt_time(r.total_flops / (hw.peak_gflops * 1e9))}). minillm's {len(steps)} steps took
        {spread.text()}: at the median, {measured:,.1f} tokens/s, {achieved:,.1f} GB/s,
        {achieved / hw.bandwidth_gbs:.0%} of the measured bandwidth.
    """)
    L.console.print(f"[dim]steps timed under {L.conditions()}[/]")
    L.console.print()
    fastest = max(s.gbps for s in steps)
    bigger = residency.larger_model(L.model_name or model.name, model.nbytes())
    if not residency.outran(fastest, hw):
        L.say(f"No decode step read faster than the measured bandwidth: the fastest reached "
              f"{fastest:,.1f} GB/s of {hw.bandwidth_gbs:,.1f} ({residency.os_reports(hw)}).")
    else:       # faster than DRAM: a cache, or a DRAM figure measured while the machine was busier
        probe = residency.probe_at(model.nbytes())
        if residency.verdict(model.nbytes(), hw, probe_gbs=probe) == "cache":
            L.note(f"the fastest step read {fastest:,.1f} GB/s, above DRAM's {hw.bandwidth_gbs:,.1f} GB/s, "
                   f"and a read of {fmt_bytes(model.nbytes())} (these weights) ran at {probe:,.1f} GB/s: the "
                   "weights came from a cache, so a step may beat the DRAM ceiling (or, this small, be held "
                   "back by per-call overhead)"
                   + (f". Run with --model {bigger} to measure DRAM." if bigger else "."))
        else:
            L.note(f"the fastest step reached {fastest:,.1f} GB/s, above the {hw.bandwidth_gbs:,.1f} GB/s "
                   f"measured here, and a read of {fmt_bytes(model.nbytes())} ran at {probe:,.1f} GB/s: the "
                   "bandwidth was measured on a busier machine (`minillm hardware --remeasure` when quiet)")
    if not L.fast and L.model_name is None and not residency.outran(fastest, hw):
        small = minillm.load(quiet=True)
        with L.status(f"the same on the default model ({small.name})…"):
            s_steps = decode_run(small, ids, n_steps)
        s_sec = statistics.median(s.seconds for s in s_steps)
        s_gbs = statistics.median(s.total_bytes for s in s_steps) / s_sec / 1e9
        if residency.outran(s_gbs, hw):
            why = ("Its steps read faster than DRAM: they read the weights from a cache, so DRAM is not their "
                   "limit.")
        else:   # slower than DRAM's figure, though its bytes are few: per-call overhead can outweigh them
            why = ("Its steps did not read faster than DRAM: with so few bytes, a step's few dozen NumPy "
                   "calls cost microseconds each, which can outweigh the reading.")
        L.say(f"""
            The default model `{escape(small.name)}` ({fmt_bytes(small.nbytes())} of weights) reached
            **{s_gbs:,.1f} GB/s** ({s_gbs / hw.bandwidth_gbs:.0%} of DRAM's). {why} On a GPU a small
            model's step is many short kernel launches: lesson 17's CUDA graphs.
        """)
    L.busy_note()
    return hw


def a_big_model_on_a_gpu(L: Lesson, model, hw, r) -> None:
    L.section("The same arithmetic for a big model on a GPU")
    b = np.dtype(model.dtype).itemsize
    seed = decode_ceiling(7e9, "fp16", "a100-80gb")
    L.say(f"""
        The article's example: a 7B model in fp16 is **{seed['gb_per_token']:.0f} GB** of weights; an
        A100 80 GB ({seed['bandwidth_gbs']:,.0f} GB/s) reads them in **{seed['ms_per_token']:.1f} ms**:
        at most about {seed['tokens_per_s']:.0f} tokens/s at batch 1 (the arithmetic would take
        {seed['compute_ms_per_token']:.3f} ms), or {0.8 * seed['tokens_per_s']:.0f}-{0.9 * seed['tokens_per_s']:.0f}
        at the 80-90% of datasheet bandwidth memory delivers. `decode_ceiling(7e9, "fp16", "a100-80gb")`
        (`minillm.measure.chips`) computes it:
    """)
    weights_read = r.bytes["weights"]
    all_weights = model.n_params() * b
    L.claim(abs(weights_read - all_weights) < 0.05 * all_weights,
            f"the ceiling's premise holds in this run: a decode step read {fmt_bytes(weights_read)} of weights, "
            f"within 5% of all {model.n_params():,} parameters × {b} bytes ({fmt_bytes(all_weights)}; a "
            "step reads one row of the position table)")
    ct = Table(header_style="bold")
    for col in ("chip", "bandwidth", "7B, fp16", "7B, int4"):      # this model's ceiling here: the text above
        ct.add_column(col, justify="right" if col != "chip" else "left")
    for chip in (hw, CHIPS["a100-80gb"], CHIPS["h100-sxm"], CHIPS["rtx-4090"], CHIPS["m1-pro"]):
        big = decode_ceiling(7e9, "fp16", chip)
        q4 = decode_ceiling(7e9, "int4", chip)
        ct.add_row(chip.name, f"{chip.bandwidth_gbs:,.0f} GB/s", f"{big['tokens_per_s']:,.1f} tok/s",
                   f"{q4['tokens_per_s']:,.1f} tok/s")
    L.show("[bold]Decode ceilings, batch 1: bandwidth ÷ weight bytes (int4: the ideal; lesson 14)[/]", ct)
    L.pause()
    long_context(L, model, r)
    L.takeaway(f"""
        A decode step reads every weight for one token, about {2 / b:.2g} FLOP per byte: decode is
        **memory-bound**. Its speed is **bandwidth ÷ bytes per token**: fewer bytes a token
        (quantization, batching, speculative decoding) speed it up, not FLOP/s.
    """)
    L.try_it("""
        `minillm hardware --params 7B --dtype int4`: a 7B model's 4-bit decode ceiling on every
        known chip. `minillm traffic --model large --steps 8`: this lesson's counters, every step
        (`--model random-124m` for GPT-2 small).
    """)


def long_context(L: Lesson, model, r) -> None:
    """X2: at long contexts and big batches a decode step reads more KV cache than weights."""
    L.section("At long contexts, the KV cache overtakes the weights")
    c = model.config
    per_token = 2 * c.n_layer * c.n_kv_head * c.head_dim * np.dtype(model.dtype).itemsize
    t_here = r.bytes["weights"] / per_token
    kv7, w7 = 2 * 32 * 32 * 128 * 2, 2 * 6.74e9      # Llama-2-7B in fp16: MHA, 32 layers, 32 KV heads of 128
    L.say(f"""
        At position t a step reads 2·L·H_kv·hd·b·t bytes of keys and values: here
        {fmt_bytes(r.bytes['kv_read'])} against {fmt_bytes(r.bytes['weights'])} of weights (t = {r.attended}).
        They are equal at t ≈ weights ÷ KV bytes per token = **{t_here:,.0f} positions** for
        `{escape(model.name)}` (context {c.n_ctx:,}).

        Llama-2-7B in fp16 keeps {fmt_kib(kv7)} a token: 32 sequences of 4,096 read
        {fmt_bytes(32 * 4096 * kv7)} of KV a step against {fmt_bytes(w7)} of weights
        ({fmt_x(32 * 4096 * kv7 / w7)}). Batching shares the weight read, never the KV read.
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
