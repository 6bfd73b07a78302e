"""Lesson 14: Quantization: fewer bytes — is it faster? GGUF's Q8_0 and Q4_0 blocks, the bytes a decode
step reads in each format (counted), the tokens/s they allow and what NumPy reaches, where the rest of the
time goes (widening the integers to floats), prefill against decode (W4A16 against W8A8), the quality cost
on held-out text, and what a fused kernel does differently.

Run:  python lessons/14_quantization.py        (or: minillm learn 14)
"""

from __future__ import annotations

import math

from minillm.lessons._common import Lesson, Timing, faster_words, fmt_x, gpu_ridge_range, run_lesson

import numpy as np
from rich import box
from rich.table import Table

import minillm
from minillm import kernels as minillm_kernels
from minillm.measure.quantization import run_quant_bench
from minillm.models.gpt2 import dequantize_params
from minillm.models.quant import FORMATS, QK, QuantMatrix
from minillm.ui.report import fmt_bytes, fmt_time

TITLE = "Quantization: fewer bytes — is it faster?"
MINUTES = 17  # 3,385 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "Q8_0 and Q4_0 blocks, bytes per step, the widening's cost, the quality"

SHOWN = ("float32", "q8_0", "q4_0")
NVFP4_BLOCK = 16          # NVFP4: 16 E2M1 values share one E4M3 scale (and a float32 scale per tensor)


def lesson(L: Lesson) -> None:
    blocks(L)
    rows, fused_rows, int_rows = bytes_and_speed(L)
    prefill_against_decode(L, rows)
    ridge_and_format(L)
    quality(L)
    fused(L, rows, fused_rows)
    integers(L, fused_rows, int_rows)
    L.try_it("""
        `minillm bench --weights float32,q8_0,q4_0 --kernels numpy,fused --model random-124m` is this lesson's
        two tables as a command, in one interleaved run.
        `minillm quantize large --format q8_0 --out large-q8_0.gguf` writes a GGUF file; if you have
        llama.cpp, `llama-bench -m large-q8_0.gguf -t 2` runs the same bytes through its fused kernels. After
        `minillm download smollm2-135m`, `--weights native` keeps that model's own Q4_1 blocks
        (`minillm bench --model smollm2-135m --weights float32,native`).
    """)


# -- 1. the formats -------------------------------------------------------------------------------

def blocks(L: Lesson) -> None:
    L.say("""
        Decode reads every weight once per token (lesson 6), so a weight stored in fewer bytes should give
        more tokens per second. That is why nearly every model people run on their own machine is
        **quantized**. GGUF, llama.cpp's file format, cuts each row of a matrix into blocks of 32 values:

        - **Q8_0**: 32 signed 8-bit integers and one float16 scale `d` (34 bytes): `w ≈ d·q`.
        - **Q4_0**: 32 4-bit integers, two to a byte, and one scale (18 bytes): `w ≈ d·(q − 8)`.
        - **Q4_1**: 4-bit integers, a scale and a minimum `m` (20 bytes): `w ≈ d·q + m`.

        Below, one of the model's weight matrices in each format, with `QuantMatrix.quantize`, the function
        `minillm.load(..., weights="q8_0")` uses.
    """)
    model = minillm.load(L.pick("large", "small"), quiet=True)
    name, w = _a_matrix(model)
    R, C = w.shape
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("format", "bytes/block", "bits/weight", "matrix", "mean |error|", "largest |error|"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_row("float32", "128", "32", fmt_bytes(w.nbytes), "0", "0")
    err, size = {}, {}
    for fmt in FORMATS:
        qm = QuantMatrix.quantize(w, fmt)
        e = np.abs(qm.dequantize().astype(np.float64) - w)
        err[fmt], size[fmt] = e, qm.nbytes
        b = FORMATS[fmt].block_bytes
        t.add_row(fmt, str(b), f"{8 * b / QK:g}", fmt_bytes(qm.nbytes), f"{e.mean():.2g}", f"{e.max():.2g}")
    scale = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
    L.show(t, f"[dim]{name} of {model.name}, {R} × {C} as GGUF stores it (out × in); its weights' "
              f"root-mean-square is {scale:.2g}[/]")
    L.claim(all(size[f] == R * C // QK * FORMATS[f].block_bytes for f in FORMATS),
            "each quantized matrix is exactly its blocks: rows × columns ÷ 32 × bytes per block, scales "
            "included (" + ", ".join(f"{f} {size[f]:,}" for f in FORMATS) + " bytes)")
    # Q8_0's step is max|x|/127, Q4_0's max|x|/8: the mean errors should be about 127/8 ≈ 16 apart
    ratio = err["q4_0"].mean() / err["q8_0"].mean()
    L.claim(8 <= ratio <= 32,
            f"Q4_0's mean error is {fmt_x(ratio)} Q8_0's on this matrix, near the ratio of their steps "
            "(max|x|/8 against max|x|/127, about 16×): each quantizer uses its levels")
    L.pause()
    formats_people_download(L)
    L.pause()


def formats_people_download(L: Lesson) -> None:
    """The formats in the files people download, bits per weight from their block layouts."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    L.say("""
        The files people download mostly use richer layouts. llama.cpp's **K-quants** group 8 (or 16)
        small blocks into a *super-block* of 256 weights whose per-block scales are themselves quantized
        (6 bits in Q4_K), so the scales cost less; a file named `Q4_K_M` mixes Q4_K with Q6_K for the
        most sensitive matrices, about 4.8-4.9 bits a weight in all, and an *importance matrix* (imatrix)
        can weight the rounding by which weights matter most. GPUs have their own: **FP8** (E4M3: one
        sign, four exponent and three mantissa bits) with a scale per tensor or per 128×128 tile, and
        **MXFP4** (gpt-oss), 32 4-bit floats (E2M1) sharing one power-of-two scale; **NVFP4**
        (NVIDIA's Blackwell), 16 of them sharing an FP8 (E4M3) scale, with one float32 scale per tensor.
    """)
    rows = [(n, *GGML_QUANT_SIZES[getattr(GGMLQuantizationType, n)]) for n in ("Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K")
            if hasattr(GGMLQuantizationType, n)]
    if not hasattr(GGMLQuantizationType, "MXFP4"):
        rows.append(("MXFP4", 32, 32 // 2 + 1))        # 32 E2M1 values, one E8M0 scale byte
    else:
        rows.append(("MXFP4", *GGML_QUANT_SIZES[GGMLQuantizationType.MXFP4]))
    rows.append(("NVFP4", NVFP4_BLOCK, NVFP4_BLOCK // 2 + 1))     # 16 E2M1 values, one E4M3 scale byte
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("format", "weights/block", "bytes/block", "bits/weight"):
        t.add_column(col, justify="right", no_wrap=True)
    for name, n, b in rows:
        t.add_row(name, str(n), str(b), f"{8 * b / n:.4g}")
    tile = 128 * 128                                          # one float32 scale per 128×128 tile
    t.add_row("FP8 E4M3", "128×128", f"{tile + 4:,}", f"{8 * (tile + 4) / tile:.4g}")
    L.show(t, "[dim]block sizes from the gguf package's GGML_QUANT_SIZES; NVFP4 by its layout (its per-tensor "
              "float32 scale aside); FP8 with one float32 scale per 128×128 tile, as DeepSeek-V3 ships it[/]")
    L.say("""
        Which kind of product each one implies matters for prefill (next part): GPTQ and AWQ files on
        Marlin-style GPU kernels are **W4A16** (weights widened to fp16 in registers, fp16 products);
        llama.cpp's kernels quantize the activations to 8 bits per block too and multiply integers,
        **W4A8** in effect; FP8 and INT8 **W8A8** use the 8-bit tensor cores.
    """)


def _a_matrix(model) -> tuple[str, np.ndarray]:
    """The first layer's MLP up-projection as [out, in] rows (GPT-2 stores it [in, out])."""
    return "h.0.mlp.c_fc.weight", np.ascontiguousarray(model.params["h.0.mlp.c_fc.weight"].T)


# -- 2. bytes and speed ---------------------------------------------------------------------------

def bytes_and_speed(L: Lesson) -> dict:
    L.section("Fewer bytes per step: the ceiling and the measurement")
    source = L.model_name or L.pick("random-124m", "small")
    L.say(f"""
        Now a whole model, `{source}`, loaded three times: float32, Q8_0 and Q4_0. Every matrix stays
        quantized in memory. NumPy cannot multiply integers with BLAS (its integer products are plain
        loops, far slower), so the kernel turns each tile of integers into floats in a
        small reused buffer that stays in the cache, and multiplies there: the bytes read from memory
        are the quantized ones. This is the function `minillm bench --weights` runs: decode steps and
        prefills, each format once per round.
    """)
    hw = L.machine()
    # every kernel set in the same rounds: the fused half is section 5's, the integer half section 6's,
    # so a fused figure is one measurement wherever it is shown (issue 53: 110.7 then 50.7 tok/s)
    kernels = ["numpy", "fused", "int8"] if minillm_kernels.available() else ["numpy"]
    with L.progress("decode and prefill, by format", L.rounds() * len(SHOWN) * len(kernels)) as advance:
        res = run_quant_bench(source, list(SHOWN), context=16, prefill=L.pick(128, 32), repeats=L.rounds(),
                              progress=advance, bandwidth_gbs=hw.bandwidth_gbs, kernels=kernels)
    bw = hw.bandwidth_gbs * 1e9
    rows = {r["weights"]: r for r in res["rows"] if r["kernels"] == "numpy"}
    fused_rows = {r["weights"]: r for r in res["rows"] if r["kernels"] == "fused"}
    int_rows = {r["weights"]: r for r in res["rows"] if r["kernels"] == "int8"}
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("weights", "bytes/step", "ceiling", "tok/s", "% ceil", "widening"):
        t.add_column(col, justify="right", no_wrap=True)
    for w, r in rows.items():
        t.add_row(w, fmt_bytes(r["step_bytes"]), f"{r['ceiling_tok_s']:,.0f}/s", f"{r['tok_s']:,.1f}",
                  f"{100 * r['of_ceiling']:.0f}%",
                  fmt_time(r["widen_ms"] / 1e3) if r["widen_ms"] else "-")
    L.show(t, f"[dim]bytes/step: counted by the meter; ceiling: those bytes at {hw.bandwidth_gbs:.1f} GB/s; "
              "tok/s: decode at context 16, batch 1; widening: every quantized weight turned into floats as "
              "a step does it, timed alone[/]")
    L.timing_note()
    L.roofline(hw, [(f"{r['weights']} {r['kernels']}", r["step_flops"] / r["step_bytes"],
                     r["step_flops"] / r["decode_ms"] / 1e6) for r in res["rows"]])
    f32, q8, q4 = rows["float32"], rows["q8_0"], rows["q4_0"]
    L.say(cache_words(f32, hw, L.model_name or source))
    L.claim(all(r["weight_bytes"] == r["weights_read"] for r in rows.values()),
            "in every format a decode step reads each weight once: the meter's weight bytes ("
            + ", ".join(fmt_bytes(r["weight_bytes"]) for r in rows.values()) + ") equal the model's bytes, "
            "the head included, plus the one embedding row the token needs")
    L.fact(f"each format's ceiling is its own bytes at this machine's bandwidth: Q8_0's is "
           f"{fmt_x(f32['step_bytes'] / q8['step_bytes'])} float32's, Q4_0's "
           f"{fmt_x(f32['step_bytes'] / q4['step_bytes'])}")
    L.say(f"Measured: {faster_words(Timing(tuple(q8['decode_rounds_s'])), Timing(tuple(f32['decode_rounds_s'])), 'a Q8_0 decode step', 'a float32 one')}.")
    saved_s = (f32["step_bytes"] - q8["step_bytes"]) / bw
    widen_s = q8["widen_ms"] / 1e3
    more = "more than" if widen_s > 1.1 * saved_s else "less than" if widen_s < saved_s / 1.1 else "about what"
    L.say(f"""
        Where the time goes: reading the bytes Q8_0 saves would take {fmt_time(saved_s)} at
        {hw.bandwidth_gbs:.1f} GB/s. Widening its integers to floats, alone, took {fmt_time(widen_s)},
        {more} the read it saves, and the products and the scales come on top. The meter counts that work
        too: a Q8_0 step wrote and read {fmt_bytes(q8['scratch_bytes'])} of floats in the cache
        (`scratch`) and did {q8['dequant_flops'] / 1e6:,.0f} million widening operations (`dequant`), beside
        {fmt_bytes(q8['weight_bytes'])} of weights from memory.
    """)
    L.pause()
    return rows, fused_rows, int_rows


# -- 3. prefill -----------------------------------------------------------------------------------

def prefill_against_decode(L: Lesson, rows: dict) -> None:
    L.section("Prefill: fewer bytes do not mean fewer FLOPs")
    f32, q8 = rows["float32"], rows["q8_0"]
    L.say(f"""
        A prefill multiplies every prompt token by each weight it reads: compute-bound once the prompt is
        longer than about the machine's ridge in tokens (lesson 7; on a GPU in fp16 that is {gpu_ridge_range()}
        tokens, so a short prompt there still waits on memory). Quantized weights shrink the bytes, not
        the multiplications: here the integers are widened once per prefill step and all the prompt's
        rows are multiplied in float32. GPUs name the cases: **W4A16** (4-bit weights, 16-bit
        activations, float products: helps decode's bytes, and a prefill only while it is shorter than
        the ridge) and **W8A8** (int8 weights and activations multiplied on int8 tensor cores, which do
        more operations per second than float16 ones: helps long prefills too); llama.cpp's W4A8 sits
        between.
    """)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("weights", "prefill tok/s", "decode tok/s", "prefill ÷ decode"):
        t.add_column(col, justify="right", no_wrap=True)
    for w, r in rows.items():
        t.add_row(w, f"{r['prefill_tok_s']:,.0f}", f"{r['tok_s']:,.1f}", fmt_x(r["prefill_tok_s"] / r["tok_s"]))
    L.show(t)
    n = round(f32["prefill_tok_s"] * f32["prefill_s"])
    L.say(f"Measured on {n} prompt tokens: {faster_words(Timing(tuple(q8['prefill_rounds_s'])), Timing(tuple(f32['prefill_rounds_s'])), 'a Q8_0 prefill', 'a float32 one')}. A prefill "
          f"widens each tile once for all its rows: the cast alone, {fmt_time(q8['widen_ms'] / 1e3)} a pass, is "
          f"{fmt_time(q8['widen_ms'] / 1e3 / n)} per prompt token (the scales come on top), against "
          f"{fmt_time(q8['widen_ms'] / 1e3)} per decoded one.")
    L.pause()


# -- 3b. the math's precision moves the ridge ----------------------------------------------------------

def format_rows(chip_name: str) -> list[dict]:
    """Each way of storing weights and doing the math on one chip, by its published figures: the dense
    tensor peak of the math's precision, the ridge (peak ÷ bandwidth), the bytes a weight, and the critical
    batch of decode from the weights alone, B* ≈ ridge · bytes a weight ÷ 2 (lesson 8)."""
    from minillm.measure.chips import get_chip, peak_for
    chip = get_chip(chip_name)
    kinds = (("bf16 (W16A16)", "bf16", 2.0), ("FP8 (W8A8)", "fp8", 1.0 + 4 / 16384),
             ("4-bit weight-only (W4A16)", "bf16", 18 / 32), ("NVFP4 (W4A4)", "fp4", (NVFP4_BLOCK // 2 + 1) / NVFP4_BLOCK))
    out = []
    for name, math, b in kinds:
        peak = peak_for(chip, math)
        if peak is None:
            continue
        ridge = peak / chip.bandwidth_gbs
        out.append({"format": name, "math": math, "peak_tflops": peak / 1e3, "ridge": ridge, "bytes": b,
                    "b_star": ridge * b / 2})
    return out


def ridge_and_format(L: Lesson) -> None:
    L.section("The math's precision moves the ridge")
    chips = ("h100-sxm", "b200")
    L.say("""
        A chip's tensor cores do about twice the operations a second at half the precision, by their
        datasheets (the H100's FP8 twice its bf16, the B200's FP4 twice its FP8), not by a law. The
        ridge, peak ÷ bandwidth, doubles with it. Where the weights are stored in the
        same precision as the math, their bytes halve too, and decode's critical batch from the weights,
        **B\\* ≈ ridge · b ÷ 2** (lesson 8), stays put. Weight-only formats shrink b on the old ridge, so
        they *lower* the critical batch (decode turns compute-bound sooner), and they give a prefill no
        more FLOPs; W8A8 and W4A4 give it more.
    """)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("chip", "weights, math", "peak", "ridge", "bytes/w", "B*"):
        t.add_column(col, justify="left" if col in ("chip", "weights, math") else "right", no_wrap=True)
    table = {}
    for name in chips:
        table[name] = format_rows(name)
        for r in table[name]:
            t.add_row(name, r["format"], f"{r['peak_tflops']:,.0f} TF", f"{r['ridge']:,.0f}", f"{r['bytes']:.3g}",
                      f"{r['b_star']:,.0f}")
    L.show(t, "[dim]peak: dense tensor TFLOP/s in the math's precision (datasheets, measure/chips.py); "
              "bytes/w: bytes a weight with its scales (FP8 with 128×128 tiles, 4-bit with a scale per 32, "
              "NVFP4 per 16); B*: ridge × bytes/w ÷ 2, from the weights alone[/]")
    for name, rows in table.items():
        bf16, fp8 = rows[0], rows[1]
        wo = next(r for r in rows if r["format"].startswith("4-bit"))
        L.fact(f"{name}: FP8 math has {fmt_x(fp8['ridge'] / bf16['ridge'])} bf16's ridge, and with FP8 weights "
               f"B* {fp8['b_star']:,.0f} against bf16's {bf16['b_star']:,.0f}; 4-bit weights on bf16 math bring B* to "
               f"{wo['b_star']:,.0f}, {fmt_x(bf16['b_star'] / wo['b_star'])} lower")
    nv = next((r for r in table.get("b200", []) if r["format"].startswith("NVFP4")), None)
    if nv is not None:                  # W32: why NVFP4's B* sits above bf16's on the same chip
        L.say(f"On the B200 NVFP4's B* is {nv['b_star']:,.0f} against bf16's {table['b200'][0]['b_star']:,.0f}: "
              f"its scales add a sixteenth of a byte a weight (a byte per 16), an eighth more than the half "
              "byte, while the math runs at the full FP4 rate.")
    L.pause()


# -- 4. quality -----------------------------------------------------------------------------------

def quality(L: Lesson) -> None:
    from minillm.data import BundledText
    from minillm.training.data import DEFAULT_DATA_SPLIT, evaluate, load_tokens
    L.section("What it costs in quality")
    name = L.pick("large", "small")
    n_tokens = L.pick(8192, 1024)
    tokens = load_tokens(BundledText())
    every = tokens[int(len(tokens) * DEFAULT_DATA_SPLIT):]
    held = every[:n_tokens]
    L.say(f"""
        The loss on text the model never trained on (the last 10% of the bundled Shakespeare, its first
        {len(held):,} of {len(every):,} tokens here), in nats per token: lower is better. `minillm eval
        --weights W` scores all {len(every):,}, so its figure (the README's) is another slice's mean and
        differs from this one; what to compare is the change between formats on the same tokens. Then the
        greedy text each format writes.
    """)
    loss, text = {}, {}
    enc = minillm.tokenizer()
    prompt = enc.encode("ROMEO:")
    for w in SHOWN:
        m = minillm.load(name, weights=w, quiet=True)
        loss[w] = evaluate(dequantize_params(m.params), m.config, held)
        text[w] = minillm.generate(m, prompt, 24)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("weights", "held-out loss", "change", "greedy tokens as float32's"):
        t.add_column(col, justify="right", no_wrap=True)
    same = {w: _common_prefix(text[w], text["float32"]) for w in SHOWN}
    for w in SHOWN:
        t.add_row(w, f"{loss[w]:.4f}", f"{loss[w] - loss['float32']:+.4f}", f"first {same[w]} of 24")
    L.show(t, f"[dim]{name}; greedy from \"ROMEO:\"[/]")
    for w in SHOWN:
        L.console.print(f"[bold]{w}:[/] ROMEO:{_one_line(enc.decode(text[w]))}")
    L.console.print()
    d8, d4 = loss["q8_0"] - loss["float32"], loss["q4_0"] - loss["float32"]
    L.claim(abs(d8) < 0.005 * loss["float32"],
            f"Q8_0 moved the loss by {d8:+.4f} nats, under 0.5% of {loss['float32']:.4f}")
    if abs(d4) <= abs(d8):
        how = "no more than Q8_0"
    elif d8 * d4 <= 0 or abs(d8) < 0.1 * abs(d4):     # a ratio to a change near zero means nothing
        how = "more than Q8_0, which hardly moved it"
    else:
        how = f"{fmt_x(abs(d4) / abs(d8))} Q8_0's change"
    L.say(f"Q4_0 moved it by {d4:+.4f}: {how}.")
    L.pause()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _one_line(s: str, width: int = 60) -> str:
    s = s.replace("\n", " ↵ ")
    return s if len(s) <= width else s[: width - 3] + "..."


# -- 5. fused kernels -----------------------------------------------------------------------------

def default_words() -> str:
    """E24: which kernel set quantized weights get by default on this CPU (models/target.default)."""
    import os

    from minillm.models import target
    from minillm.models.kernel_sets import ENV
    old = os.environ.pop(ENV, None)          # the lesson computes with NumPy; a learner's command does not
    try:
        got = {w: target.default(True, np.float32, w) for w in ("q8_0", "q4_0")}
    finally:
        if old is not None:
            os.environ[ENV] = old
    if set(got.values()) == {"fused"}:
        return "quantized weights get it by default here too"
    return ("on this CPU quantized weights get " + ", ".join(f"{w.upper()} --kernels {k}" for w, k in got.items())
            + " by default: the integer set of section 6, where it measured faster")


def fused(L: Lesson, rows: dict, fused_rows: dict) -> None:
    L.section("What a fused kernel does differently")
    quant_default = default_words()
    L.say(f"""
        NumPy runs one operation at a time over whole arrays, so the floats the widening makes must be
        written somewhere (here, a buffer in the cache) and read again by the product. A **fused** kernel
        does both in one loop: llama.cpp's CPU kernels load a block of integers into registers, multiply
        them by an int8 copy of the activations with integer dot-product instructions (AVX2, AVX-512 VNNI,
        ARM dotprod), and apply the two scales once per block. No float weight is ever stored. GPU int4
        kernels (Marlin, AWQ, gpt-fast's) unpack the 4-bit weights inside the matrix-multiply tile, in
        registers.

        minillm has fused kernels of its own (`minillm/kernels/`, compiled by numba; `--kernels fused`, the
        default for float32 weights where numba works; {quant_default}): for each row of a weight, one loop widens each stored integer in a
        register, multiplies it by its block's scale and by x, and adds it into a vector of sums, with no
        buffer of floats (weight-only: 4-bit weights, float32 activations and products, W4A32). The same
        rounds above ran them:
        the same bytes, the same blocks.
    """)
    f32, q8, q4 = rows["float32"], rows["q8_0"], rows["q4_0"]
    if not fused_rows:
        L.note(f"the fused kernels cannot run here ({minillm_kernels.status().reason}): only NumPy's half was measured")
        L.takeaway(f"""
            Quantized weights cut a decode step's bytes (here Q8_0 by {fmt_x(f32['step_bytes'] / q8['step_bytes'])},
            Q4_0 by {fmt_x(f32['step_bytes'] / q4['step_bytes'])}) and so raise its ceiling; NumPy reached
            {q8['of_ceiling']:.0%} of Q8_0's, widening in a pass of its own.
        """)
        return
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("weights", "kernels", "bytes/step", "scratch", "tok/s", "× NumPy float32", "bytes ÷"):
        t.add_column(col, justify="right", no_wrap=True)
    for w in SHOWN:
        for r in (rows[w], fused_rows[w]):
            t.add_row(w, r["kernels"], fmt_bytes(r["step_bytes"]), fmt_bytes(r["scratch_bytes"]), f"{r['tok_s']:,.1f}",
                      fmt_x(r["tok_s"] / f32["tok_s"]), fmt_x(f32["step_bytes"] / r["step_bytes"]))
    L.show(t, "[dim]× NumPy float32: tokens/s against NumPy's float32 decode in the same rounds; bytes ÷: how many "
              "times fewer bytes than float32 a step reads (what the tokens/s could gain if bytes were all)[/]")
    L.timing_note()
    L.claim(all(r["scratch_bytes"] == 0 and r["weight_bytes"] == r["weights_read"] for w, r in fused_rows.items()
                if w != "float32"),
            "the meter counts what a fused decode step reads: each quantized weight's blocks once, scales included, "
            "and no scratch (" + ", ".join(f"{w} {fmt_bytes(fused_rows[w]['weight_bytes'])}" for w in SHOWN if w != "float32")
            + " of weights)")
    base = Timing(tuple(f32["decode_rounds_s"]))
    for w, name in (("q8_0", "Q8_0"), ("q4_0", "Q4_0")):
        r = fused_rows[w]
        L.say(f"Measured: {faster_words(Timing(tuple(r['decode_rounds_s'])), base, f'a fused {name} decode step', 'a NumPy float32 one')}.")
    speed8, bytes8 = fused_rows["q8_0"]["tok_s"] / f32["tok_s"], f32["step_bytes"] / fused_rows["q8_0"]["step_bytes"]
    speed4, bytes4 = fused_rows["q4_0"]["tok_s"] / f32["tok_s"], f32["step_bytes"] / fused_rows["q4_0"]["step_bytes"]
    L.say(f"""
        Against their byte ratios: fused Q8_0 ran {fmt_x(speed8)} NumPy float32's tokens/s for
        {fmt_x(bytes8)} fewer bytes, {reach_words(speed8, bytes8)}; fused Q4_0 {fmt_x(speed4)} for
        {fmt_x(bytes4)}, {reach_words(speed4, bytes4)}. What is left between the two: the step's other work
        (attention, the norms, Python), the same in every format, and the widening's arithmetic, which
        does not shrink with the bytes (a Q4 value takes more operations to unpack than a Q8 one){
        "; and, on this busy machine, other processes, which slow every round" if L.busy else ""}.
    """)
    L.takeaway(f"""
        Quantized weights cut a decode step's bytes (here Q8_0 by {fmt_x(bytes8)}, Q4_0 by {fmt_x(bytes4)}). NumPy
        widens them in a pass of its own and decodes at {fmt_x(q8['tok_s'] / f32['tok_s'])} float32's speed (Q8_0);
        a fused kernel widens in registers and reached {fmt_x(speed8)}: {reach_words(speed8, bytes8)}. A prefill
        past the ridge in tokens is bound by FLOPs, which 4-bit weights alone do not reduce.
    """)


def cache_words(f32: dict, hw, name: str) -> str:
    """Where float32's weights came from, as the measurement says (measure/residency.py): faster than its
    DRAM ceiling is a cache; otherwise only what the operating system reports, no conclusion."""
    from minillm.measure import residency
    share = f32["of_ceiling"]
    if share * hw.bandwidth_gbs > residency.OUTRAN * hw.bandwidth_gbs:
        bigger = residency.larger_model(name, f32["model_bytes"])
        return (f"Float32 decoded at {share:.0%} of its DRAM ceiling: this run read its "
                f"{fmt_bytes(f32['model_bytes'])} of weights faster than DRAM can, from a cache, so saving bytes "
                f"buys less here ({residency.os_reports(hw)})."
                + (f" --model {bigger} reads more than a cache holds." if bigger else ""))
    return (f"Float32 decoded at {share:.0%} of its DRAM ceiling ({residency.os_reports(hw)}; the run's speeds, "
            "not that size, say where the weights came from).")


def reach_words(speed: float, byte_ratio: float) -> str:
    """How a measured speed-up compares with the byte ratio that bounds it (its ceiling if bytes were all)."""
    share = speed / byte_ratio
    if share > 1.1:          # C24: past the ceiling bytes set: the baseline lost time to something else
        return (f"{share:.0%} of the byte ratio, past it: the float32 side was slowed by something other "
                "than its bytes")
    if share >= 0.9:
        return "the byte ratio reached (within 10%)"
    if speed <= 1.0:
        return f"no gain at all from the bytes, {share:.0%} of the byte ratio"
    return f"{share:.0%} of the byte ratio"


# -- 6. integers: W4A32, then W4A8 on the same weights ---------------------------------------------
#

def integers(L: Lesson, fused_rows: dict, int_rows: dict) -> None:
    """W4A32 against W4A8 from the rounds of section 2's measurement (every kernel set in the same
    rounds): the fused rows here are the figures section 5 showed."""
    from minillm.kernels import int8
    L.section("Integers: the same weights, W4A32 then W4A8")
    if not minillm_kernels.available():
        L.note(f"the integer kernels need numba, which cannot run here ({minillm_kernels.status().reason})")
        return
    isa = int8.isa()
    counts = _multiply_adds(isa)
    one = (f"one instruction does {counts[0]} 8-bit multiply-adds where a float32 FMA on the same "
           f"register does {counts[1]}" if counts else "no single instruction multiplies and adds 8-bit "
           "integers here (it takes two, or plain vector code)")
    L.say(f"""
        The fused kernels above still multiply floats: each 4-bit weight is widened, scaled and
        multiplied by a float32 activation, **W4A32**. llama.cpp does what the integer kernel set here
        does (`--kernels int8`, minillm/kernels/int8.py): it rounds each product's input, once per
        product, to int8 per block of 32 values with one float scale (`d_x = max|x| / 127`), and then a
        block's 32 products are integers, summed in integers: `y = Σ_blocks d_w·d_x·Σ q_w·q_x`. Floats
        appear once per block, not once per weight. **W4A8**. On this CPU the integer sums run on
        {int8.describe().removeprefix("int8 dot: ")}: {one}.

        Below, the same Q8_0 and Q4_0 blocks multiplied both ways, in the interleaved rounds of the
        measurement above (the W·A32 rows are the fused rows of the last section): the bytes are
        equal, the arithmetic is not.
    """)
    source = L.model_name or L.pick("random-124m", "small")
    got = {**{(w, "fused"): r for w, r in fused_rows.items()}, **{(w, "int8"): r for w, r in int_rows.items()}}
    base = got["float32", "fused"]
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("weights", "product", "bytes/step", "tok/s", "× f32", "bytes ÷", "prefill/s"):
        t.add_column(col, justify="right", no_wrap=True)
    for w in ("float32", "q8_0", "q4_0"):
        for k in (("fused",) if w == "float32" else ("fused", "int8")):
            r = got[w, k]
            t.add_row(w, "W·A32" if k == "fused" else "W·A8", fmt_bytes(r["step_bytes"]), f"{r['tok_s']:,.1f}",
                      fmt_x(r["tok_s"] / base["tok_s"]), fmt_x(base["step_bytes"] / r["step_bytes"]),
                      f"{r['prefill_tok_s']:,.0f}")
    L.show(t, "[dim]W·A32: --kernels fused; W·A8: --kernels int8; × f32: tokens/s against the fused float32 "
              "decode in the same rounds; bytes ÷: how many times fewer bytes than float32 a step reads; decode at "
              "context 16, batch 1; prefill/s: prompt tokens a second[/]")
    L.timing_note()
    for w in ("q8_0", "q4_0"):
        a, b = got[w, "fused"], got[w, "int8"]
        L.claim(a["weight_bytes"] == b["weight_bytes"] == b["weights_read"],
                f"{w}: both kernel sets read the same {fmt_bytes(b['weight_bytes'])} of weights a step (the meter's "
                "count, each block once); the integer set also writes x's int8 copy, "
                f"{fmt_bytes(b['scratch_bytes'])} in the cache")
    for w, name in (("q8_0", "Q8_0"), ("q4_0", "Q4_0")):
        a, b = got[w, "fused"], got[w, "int8"]
        dec = faster_words(Timing(tuple(b["decode_rounds_s"])), Timing(tuple(a["decode_rounds_s"])),
                           "a W·A8 decode step", "the W·A32 one")
        pre = faster_words(Timing(tuple(b["prefill_rounds_s"])), Timing(tuple(a["prefill_rounds_s"])),
                           "a W·A8 prefill", "the W·A32 one")
        L.say(f"Measured, {name}: {dec}; {pre}.")
    q4f, q4i = got["q4_0", "fused"], got["q4_0", "int8"]
    bytes4 = base["step_bytes"] / q4i["step_bytes"]
    s_f, s_i = q4f["tok_s"] / base["tok_s"], q4i["tok_s"] / base["tok_s"]
    n = round(q4i["prefill_tok_s"] * q4i["prefill_s"])
    L.say(f"""
        Against the byte ratio that bounds a decode step: Q4_0 reads {fmt_x(bytes4)} fewer bytes than
        float32; W4A32 reached {fmt_x(s_f)} float32's tokens/s, {reach_words(s_f, bytes4)}, and W4A8
        {fmt_x(s_i)}, {reach_words(s_i, bytes4)}. A prefill multiplies each of its {n} rows by every weight
        it reads, so the arithmetic weighs more there than in decode; on this run
        {faster_words(Timing(tuple(q4i["prefill_rounds_s"])), Timing(tuple(q4f["prefill_rounds_s"])),
                      "the W4A8 prefill", "the W4A32 one")} (each product also pays a fixed cost for
        rounding its input, which small matrices feel most).
    """)
    # what the rounding of x costs: the held-out loss, both ways, on the same Q4_0 weights
    n_tokens = L.pick(4096, 512)
    loss = {k: _heldout_loss(minillm.load(source if source != "random-124m" else L.pick("large", "small"),
                                          weights="q4_0", kernels=k, quiet=True), n_tokens)
            for k in ("fused", "int8")}
    scored = L.pick("large", "small") if source == "random-124m" else source
    ppl = math.exp(loss["int8"] - loss["fused"]) - 1          # the relative change of the perplexity
    L.fact(f"held-out loss of {scored} with Q4_0 weights on {n_tokens:,} tokens of the bundled Shakespeare's last "
           f"10%: W4A32 {loss['fused']:.4f}, W4A8 {loss['int8']:.4f} nats per token")
    L.claim(abs(ppl) <= int8.ERROR_BOUND,
            f"rounding the activations to int8 moved the held-out perplexity (exp of the loss) by {ppl:+.3%}, "
            f"within the {int8.ERROR_BOUND:.1%} this project holds the integer set to")
    where_the_scale_sits(L, ppl)
    L.say(f"""
        So the integer set changes the arithmetic, not the bytes: the same blocks, multiplied in 8-bit
        integers, and a rounding of the activations whose cost in accuracy
        is measured above. `minillm bench
        --weights q8_0,q4_0 --kernels numpy,fused,int8` runs this comparison, and `benchmarks/int8_error.py`
        measures the accuracy on SmolLM2 too.
        Its products are also batch-invariant by construction: a block's integer sum is exact in any
        order, each row is rounded with its own scales, and a row's blocks are added in one order, so a
        row's result does not depend on the rows beside it; lesson 8's batch-invariant floats pay to
        fix the order for the same property.
    """)


OUTLIER, OUTLIER_WIDTH = 50.0, 4096     # X33: one channel this large among N(0, 1) ones (this lesson's choice)


def scale_errors(width: int = OUTLIER_WIDTH, outlier: float = OUTLIER, seed: int = 0) -> dict:
    """X33: one activation row of `width` N(0, 1) values with one channel set to `outlier`, rounded to
    int8 two ways: per block of 32 with its own scale (the integer set's own `int8.quantize_x_ref`, as
    llama.cpp does), and with one scale for the whole row (a per-token scale, as GPU W8A8 commonly
    keeps). -> the relative RMS error of the other channels under each."""
    from minillm.kernels import int8
    x = np.random.default_rng(seed).standard_normal((1, width)).astype(np.float32)   # [1, C]
    x[0, width // 3] = outlier
    q, d, _, _ = int8.quantize_x_ref(x)
    block = (q.astype(np.float32) * d[..., None]).reshape(1, width)                 # q·d per block of 32
    d_row = np.abs(x).max() / 127
    row = np.clip(np.rint(x / d_row), -127, 127) * d_row                             # one scale a row
    rest = np.arange(width) != width // 3
    rms = lambda y: float(np.sqrt(np.mean((y[0, rest] - x[0, rest]) ** 2)) / np.sqrt(np.mean(x[0, rest] ** 2)))
    return {"block": rms(block), "row": rms(row), "block_size": int8.QK}


def where_the_scale_sits(L: Lesson, ppl: float) -> None:
    """X33: why W4A8 with a scale per block of 32 costs so little, tied to the formats table."""
    from minillm.kernels.int8 import ERROR_BOUND as bound
    e = scale_errors()
    L.say(f"""
        **Where the activation scale sits** decides what an outlier costs. Activations have a few
        channels far larger than the rest; a scale must fit the largest value it covers, so every value
        under the same scale is rounded in steps of that value ÷ 127. Here each block of {e['block_size']}
        activations has its own scale, the layout of the formats table's Q8_0 row (32 values, one
        scale), so an outlier coarsens only its own block. One row of {OUTLIER_WIDTH:,} values with one channel at
        {OUTLIER:g} (the others N(0, 1); the size is this lesson's choice), rounded both ways: the other
        channels' error is {e['block']:.2%} with a scale per block, {e['row']:.1%} with one scale for
        the row, {fmt_x(e['row'] / e['block'])} more: one reason the perplexity above moved by
        {ppl:+.3%} (the bound: {bound:.1%}). GPU W8A8 usually keeps
        one scale per token (a row), so it first moves the outliers' size into the weights
        (SmoothQuant, Xiao et al. 2023: each channel divided by a factor, the weights' matching row
        multiplied by it); NVFP4 goes to blocks of {NVFP4_BLOCK} (its row in the table) for the same
        reason, with only 4 bits a value to spend.
    """)


def _multiply_adds(isa: str) -> tuple[int, int] | None:
    """8-bit multiply-adds one integer-dot instruction (VNNI's vpdpbusd) does, and float32 FMAs one
    instruction does on a register of the same width (bits of the register / bits of a value); None
    where there is no such instruction (W26: AVX2 needs vpmaddubsw then vpmaddwd, portable vectors none)."""
    bits = {"avx512-vnni": 512, "avx-vnni": 256}.get(isa)
    return (bits // 8, bits // 32) if bits else None


def _heldout_loss(model, n_tokens: int) -> float:
    """Mean cross-entropy (nats/token) of the model's own forward (its kernels) over the first n_tokens
    of the held-out text, in windows of its context."""
    from minillm.data import BundledText
    from minillm.training.data import DEFAULT_DATA_SPLIT, load_tokens
    tokens = load_tokens(BundledText())
    held = np.asarray(tokens[int(len(tokens) * DEFAULT_DATA_SPLIT):][:n_tokens + 1], np.int64)
    T = model.config.n_ctx
    total, count = 0.0, 0
    for s in range(0, len(held) - 1, T):
        x, y = held[s:s + T], held[s + 1:s + T + 1]
        x = x[:len(y)]
        z = model.forward(x).astype(np.float64)
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        total -= float(logp[np.arange(len(y)), y].sum())
        count += len(y)
    return total / count


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
