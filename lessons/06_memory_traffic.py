"""Lesson 6: Memory traffic. A decode step reads every weight to produce one token: memory sets the pace.

Run:  python lessons/06_memory_traffic.py        (or: minillm learn 6)
"""

from __future__ import annotations

try:
    from minillm.lessons._common import (Lesson, Timing, bar, bar_chart, fmt_bytes, fmt_time, run_lesson,
                                         stacked_bar)
except ModuleNotFoundError as e:  # run from a checkout in which minillm is not installed
    raise SystemExit(f"{e}: install minillm first (pip install -e . in the checkout), then run this again")

import statistics

import numpy as np
from rich.markup import escape
from rich.table import Table

import minillm
from minillm.config import PRESETS as GPT2_SIZES
from minillm.measure import hardware
from minillm.measure.chips import PRESETS, decode_ceiling
from minillm.measure.probe import MB

TITLE = "Memory traffic: why decode waits on memory"
MINUTES = 8
WHAT_YOU_WILL_SEE = "a decode step's bytes, this machine's bandwidth, the decode ceiling, 7B on an A100"

PROMPT = "ROMEO: But soft, what light through yonder window breaks?"
KIND_STYLE = {"weights": "blue", "kv_read": "magenta", "kv_write": "red", "activations": "yellow"}


def decode_run(model, ids, steps: int) -> list:
    """`steps` cached decode steps after a prefill, under a Meter (after a short warm-up)."""
    minillm.generate(model, ids, 3)  # warm-up: first touches of the weights and cache pages
    with minillm.Meter() as m:
        minillm.generate(model, ids, steps + 1)
    return m.of_kind("decode")


def first_steps(L: Lesson):
    """Section: the opening."""
    model = L.load_model(default="large", fast="random-tiny")   # real text, weights beyond the CPU's cache
    c = model.config
    L_, d, V = c.n_layer, c.n_embd, c.vocab_size
    b = np.dtype(model.dtype).itemsize
    enc = minillm.tokenizer()
    ids = enc.encode(PROMPT)
    n_steps = L.pick(12, 8)
    L.say(f"""
        Lesson 5 made decode do one token's worth of arithmetic per step. But one token's worth of
        arithmetic still needs **all** the weights: every matrix of every block, and the whole LM head,
        is read from memory to produce a single token. This lesson counts those bytes on
        `{escape(model.name)}` ({model.n_params():,} parameters, {fmt_bytes(model.nbytes())} in
        {np.dtype(model.dtype).name}) and sets them against this machine's measured bandwidth.
    """)
    with L.status(f"{n_steps} decode steps on {model.name}…"):
        steps = decode_run(model, ids, n_steps)
    r = steps[-1]
    t = r.attended
    return L_, V, b, d, ids, model, n_steps, r, steps, t


def what_one_decode_step_moves(L: Lesson, V, model, r, t):
    """Section: What one decode step moves."""
    L.section("What one decode step moves")
    total = r.total_bytes
    kinds = Table(header_style="bold")
    for col in ("kind", "bytes", "share", ""):
        kinds.add_column(col, justify="left" if col in ("kind", "") else "right")
    for kind, n in r.bytes.items():
        kinds.add_row(f"[{KIND_STYLE[kind]}]{kind}[/]", fmt_bytes(n), f"{n / total:.1%}",
                      f"[{KIND_STYLE[kind]}]{bar(n, total, 40)}[/]")
    kinds.add_row("[bold]total[/]", fmt_bytes(total), "", stacked_bar([(n, KIND_STYLE[k]) for k, n in r.bytes.items()], total, 40))
    L.show(f"[bold]Decode step at position {r.position} (attending over {t} positions), from the meter[/]", kinds)
    ops = sorted(r.ops.items(), key=lambda kv: -kv[1]["bytes"])
    L.show(bar_chart("The same bytes by operation:",
                     [(f"{name} ×{o['calls']}", o["bytes"], f"{fmt_bytes(o['bytes'])}  {o['bytes'] / total:.0%}") for name, o in ops],
                     style="blue"))
    L.claim(r.bytes["weights"] > total / 2, f"weights are most of what a decode step moves: {r.bytes['weights'] / total:.0%}")
    head = r.ops["lm_head"]["bytes"] / total
    L.say(f"""
        The biggest single read is the **LM head**: all of `wte` ({fmt_bytes(model.wte.nbytes)}) to score
        {V:,} candidates for one position ({head:.0%} of the step). The blocks' matrices are the rest of
        the weights. The KV cache read grows with the position; the activations are tiny, because there
        is only one token.
    """)


def counters_equal_closed_forms(L: Lesson, L_, V, b, d, r, t):
    """Section: The counters agree with the closed forms."""
    L.section("The counters agree with the closed forms")
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
           "[dim](the 2·d·b: one row each of wte and wpe for the embedding)[/]", ft)
    for name, _, counted, expected in forms:
        L.claim(counted == expected, f"{name}: the meter's count equals the formula")
    L.say(f"""
        So a decode step does about **2 FLOPs per weight** (one multiply, one add) and reads **{b} bytes
        per weight**: an arithmetic intensity of about 2/{b} = {2 / b:.2g} FLOP/byte, whatever the model
        size. The meter says {r.intensity:.3g}.
    """)


def can_memory_keep_up(L: Lesson, ids, model, n_steps, r, steps):
    """Section: This machine: can memory keep up?."""
    L.section("This machine: can memory keep up?")
    with L.status("measuring this machine's memory bandwidth and matmul peak (once; then cached)…"):
        hw = L.machine()
    ht = Table(show_header=False, box=None)
    ht.add_column(style="bold")
    ht.add_column()
    ht.add_row("CPU", f"{escape(str(hw.cpu))}, {hw.threads} threads")
    ht.add_row("memory read bandwidth", f"{hw.bandwidth_gbs:,.1f} GB/s  [dim](best of {', '.join(hw.methods)}; "
                                        f"{hw.buffer_mb} MB buffer)[/]")
    ht.add_row("float32 matmul peak", f"{hw.peak_gflops:,.1f} GFLOP/s")
    ht.add_row("ridge point", f"{hw.ridge:,.1f} FLOP/byte  [dim](peak ÷ bandwidth)[/]")
    if hw.llc_bytes:
        ht.add_row("last-level cache", f"{hw.llc_bytes / MB:g} MiB")
    if hw.fast:
        ht.add_row("[yellow]note[/]", "fast mode: a small buffer, rough figures")
    L.show("[bold]minillm.hardware.machine()[/]", ht)
    L.claim(r.intensity < hw.ridge,
            f"decode's {r.intensity:.3g} FLOP/byte is below this machine's ridge of {hw.ridge:.3g}: "
            "decode is memory-bound here")
    sec = statistics.median(s.seconds for s in steps)
    spread = Timing(tuple(s.seconds for s in steps))
    step_bytes = statistics.median(s.total_bytes for s in steps)
    achieved = step_bytes / sec / 1e9
    ceiling = hw.bandwidth_gbs * 1e9 / step_bytes
    measured = 1.0 / sec
    L.show(bar_chart("Decode speed, tokens per second:", [
        ("ceiling: bandwidth ÷ bytes", ceiling, f"{ceiling:,.1f} tok/s"),
        ("measured (median step)", measured, f"{measured:,.1f} tok/s"),
    ], style="green"))
    L.say(f"""
        A step moves {fmt_bytes(step_bytes)}; at {hw.bandwidth_gbs:,.1f} GB/s that takes at least
        {fmt_time(step_bytes / (hw.bandwidth_gbs * 1e9))}, so **{ceiling:,.1f} tokens/s is the ceiling**
        however fast the arithmetic. minillm's {len(steps)} decode steps took {spread.text()}: at the median,
        {achieved:,.1f} GB/s achieved, {achieved / hw.bandwidth_gbs:.0%} of the measured bandwidth. Arithmetic at
        the matmul peak would take only {fmt_time(r.total_flops / (hw.peak_gflops * 1e9))}.
    """)
    L.console.print(f"[dim]bandwidth: {escape(hardware.provenance(hw))}; steps timed under {L.conditions()}[/]")
    L.console.print()
    fastest = max(s.gbps for s in steps)
    if not (hw.llc_bytes and model.nbytes() <= hw.llc_bytes):
        L.claim(fastest <= hw.bandwidth_gbs,
                f"no decode step read faster than the measured bandwidth: the fastest reached {fastest:,.1f} GB/s "
                f"of {hw.bandwidth_gbs:,.1f}")
    if hw.llc_bytes and model.nbytes() <= hw.llc_bytes:
        L.note(f"this model's weights ({fmt_bytes(model.nbytes())}) fit in the {hw.llc_bytes / MB:g} MiB last-level "
               "cache, so after the first step they can be read from the cache, not from DRAM, and a step may beat "
               "the DRAM ceiling (or, this small, be held back by per-call overhead instead). "
               f"Run with --model large, or random-124m ({fmt_bytes(GPT2_SIZES['124m'].n_params() * 4)}), to measure DRAM.")
    elif not L.fast and L.model_name is None:
        small = minillm.load(quiet=True)
        with L.status(f"the same on the default model ({small.name})…"):
            s_steps = decode_run(small, ids, n_steps)
        s_sec = statistics.median(s.seconds for s in s_steps)
        s_gbs = statistics.median(s.total_bytes for s in s_steps) / s_sec / 1e9
        fits = hw.llc_bytes is not None and small.nbytes() <= hw.llc_bytes
        if not fits:
            why = "Its weights do not fit in the cache either, so it too streams from DRAM."
        else:   # one sentence whichever way the timing fell: the conclusion rests on the sizes, not on one time
            why = ("Its weights fit in the cache, so DRAM is not its limit: a step may read faster than the DRAM "
                   "figure (from the cache), or slower (a step is a few dozen small NumPy calls, and with so few "
                   "bytes per call their fixed overhead of microseconds each can outweigh the reading).")
        L.say(f"""
            Compare the default model `{escape(small.name)}` (what `minillm.load()` gives): {fmt_bytes(small.nbytes())}
            of weights against a {hw.llc_bytes / MB:g} MiB last-level cache. Its decode steps achieved
            **{s_gbs:,.1f} GB/s** ({s_gbs / hw.bandwidth_gbs:.0%} of this machine's DRAM bandwidth). {why}
        """)
    L.busy_note()
    return hw


def a_big_model_on_a_gpu(L: Lesson, b, hw, model, r):
    """Section: The same arithmetic for a big model on a GPU."""
    L.section("The same arithmetic for a big model on a GPU")
    seed = decode_ceiling(7e9, "fp16", "a100-80gb")
    L.say(f"""
        The article's example: a 7B-parameter model in fp16 is **{seed['gb_per_token']:.0f} GB** of weights.
        On an A100 80 GB ({seed['bandwidth_gbs']:,.0f} GB/s) reading them once takes
        **{seed['ms_per_token']:.1f} ms**, so batch-1 decode tops out near **{seed['tokens_per_s']:.0f} tokens/s**;
        the arithmetic (2 FLOPs per weight at 312 TFLOP/s) would take only {seed['compute_ms_per_token']:.3f} ms.
        `minillm.hardware.decode_ceiling(7e9, "fp16", "a100-80gb")` computes it:
    """)
    weights_read = r.bytes["weights"]
    all_weights = model.n_params() * b
    L.claim(abs(weights_read - all_weights) < 0.05 * all_weights,
            f"the ceiling's premise holds in this run: a decode step read {fmt_bytes(weights_read)} of weights, "
            f"within 5% of all {model.n_params():,} parameters × {b} bytes ({fmt_bytes(all_weights)}; the "
            "difference is the position table, of which a step reads one row)")
    ct = Table(header_style="bold")
    for col in ("chip", "bandwidth", f"{model.name} ({model.n_params() / 1e6:.0f}M, fp32)", "7B, fp16", "7B, int4"):
        ct.add_column(col, justify="right" if col != "chip" else "left")
    for chip in (hw, PRESETS["a100-80gb"], PRESETS["h100-sxm"], PRESETS["rtx-4090"], PRESETS["m1-pro"]):
        mine = decode_ceiling(model.n_params(), "fp32", chip)
        big = decode_ceiling(7e9, "fp16", chip)
        q4 = decode_ceiling(7e9, "int4", chip)
        ct.add_row(chip.name, f"{chip.bandwidth_gbs:,.0f} GB/s", f"{mine['tokens_per_s']:,.0f} tok/s",
                   f"{big['tokens_per_s']:,.1f} tok/s", f"{q4['tokens_per_s']:,.1f} tok/s")
    L.show("[bold]Decode ceilings, batch 1 (bandwidth ÷ weight bytes; the KV cache would add to the bytes)[/]", ct)
    L.takeaway(f"""
        A decode step reads every weight once to make one token: about {2 / b:.2g} FLOP per byte here, far below
        any chip's ridge. Its speed is **bandwidth ÷ bytes per token**, so what speeds it up is more bandwidth
        or fewer bytes (smaller weights: quantization; several sequences sharing one read: batching), not
        more FLOP/s. This is why decode is called **memory-bound**.
    """)
    L.try_it("""
        `minillm hardware --params 7B --dtype int4` prints the decode ceiling of a 7B model in 4-bit
        weights for every known chip: 4× the fp16 tokens/s, because it is 4× fewer bytes.
        `minillm traffic --model large --steps 8` prints this lesson's counters for every step
        (`--model random-124m` for GPT-2 small's size).
    """)


def lesson(L: Lesson) -> None:
    L_, V, b, d, ids, model, n_steps, r, steps, t = first_steps(L)
    what_one_decode_step_moves(L, V, model, r, t)
    L.pause()
    counters_equal_closed_forms(L, L_, V, b, d, r, t)
    L.pause()
    hw = can_memory_keep_up(L, ids, model, n_steps, r, steps)
    L.pause()
    a_big_model_on_a_gpu(L, b, hw, model, r)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv, number=6, title=TITLE, minutes=MINUTES, what=WHAT_YOU_WILL_SEE,
                      prog="python lessons/06_memory_traffic.py")


if __name__ == "__main__":
    raise SystemExit(main())
