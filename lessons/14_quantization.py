"""Lesson 14: Quantization: fewer bytes — is it faster? GGUF's Q8_0 and Q4_0 blocks, the bytes a decode
step reads in each format (counted), the tokens/s they allow and what NumPy reaches, where the rest of the
time goes (widening the integers to floats), prefill against decode (W4A16 against W8A8), and the quality
cost on held-out text. Lesson 20 takes the kernels: fused, integer, and the math's precision.

Run:  python lessons/14_quantization.py        (or: minillm learn 14)
"""

from __future__ import annotations

from minillm.lessons._common import (NVFP4_BLOCK, QUANT_SHOWN as SHOWN, Lesson, Timing, fmt_x, gpu_ridge_range,
                                     run_lesson, timed_words)

import numpy as np
from rich import box
from rich.table import Table

import minillm
from minillm.measure.quantization import run_quant_bench
from minillm.models.gpt2 import dequantize_params
from minillm.models.quant import FORMATS, QK, QuantMatrix
from minillm.ui.report import fmt_bytes, fmt_time

TITLE = "Quantization: fewer bytes — is it faster?"
MINUTES = 8  # 1,656 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "Q8_0 and Q4_0 blocks, bytes per step, the widening's cost, the quality"


def lesson(L: Lesson) -> None:
    blocks(L)
    rows = bytes_and_speed(L)
    prefill_against_decode(L, rows)
    quality(L)
    f32, q8, q4 = rows["float32"], rows["q8_0"], rows["q4_0"]
    L.say("""
        Lesson 20 builds on this one: what a **fused kernel** does differently (no buffer of floats,
        W4A32), integer products on the same blocks (W4A8, on an integer dot product such as VNNI's),
        and how the math's precision moves the ridge.
    """)
    L.takeaway(f"""
        Quantized weights cut a decode step's bytes (here Q8_0 by {fmt_x(f32['step_bytes'] / q8['step_bytes'])},
        Q4_0 by {fmt_x(f32['step_bytes'] / q4['step_bytes'])}) and so raise its ceiling; NumPy reached
        {q8['of_ceiling']:.0%} of Q8_0's, widening in a pass of its own. A prefill past the ridge in tokens
        is bound by FLOPs, which 4-bit weights alone do not reduce.
    """)
    L.try_it("""
        `minillm bench --weights float32,q8_0,q4_0 --kernels numpy --model random-124m` is this lesson's
        measurement as a command, in one interleaved run.
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
    kernels = ["numpy"]                   # the fused and integer kernels: lesson 20
    with L.progress("decode and prefill, by format", L.rounds() * len(SHOWN) * len(kernels)) as advance:
        res = run_quant_bench(source, list(SHOWN), context=16, prefill=L.pick(128, 32), repeats=L.rounds(),
                              progress=advance, bandwidth_gbs=hw.bandwidth_gbs, kernels=kernels)
    bw = hw.bandwidth_gbs * 1e9
    rows = {r["weights"]: r for r in res["rows"] if r["kernels"] == "numpy"}
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
    # the time stated, no verdict drawn: NumPy's widening pass made Q8_0's step slower than float32's on 2
    # threads (2.16× idle) and close to it on 1 beside a busy process, so the verdict followed the threads
    L.say(f"Measured: {timed_words(Timing(tuple(q8['decode_rounds_s'])), Timing(tuple(f32['decode_rounds_s'])), 'a Q8_0 decode step', 'a float32 one')}.")
    saved_s = (f32["step_bytes"] - q8["step_bytes"]) / bw
    widen_s = q8["widen_ms"] / 1e3
    L.say(f"""
        Where the time goes: reading the bytes Q8_0 saves would take {fmt_time(saved_s)} at
        {hw.bandwidth_gbs:.1f} GB/s. {widen_words(widen_s, saved_s)}, and the products and the scales come on top. The meter counts that work
        too: a Q8_0 step wrote and read {fmt_bytes(q8['scratch_bytes'])} of floats in the cache
        (`scratch`) and did {q8['dequant_flops'] / 1e6:,.0f} million widening operations (`dequant`), beside
        {fmt_bytes(q8['weight_bytes'])} of weights from memory.
    """)
    L.pause()
    return rows


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
    L.say(f"Measured on {n} prompt tokens: {timed_words(Timing(tuple(q8['prefill_rounds_s'])), Timing(tuple(f32['prefill_rounds_s'])), 'a Q8_0 prefill', 'a float32 one')}. A prefill "
          f"widens each tile once for all its rows: the cast alone, {fmt_time(q8['widen_ms'] / 1e3)} a pass, is "
          f"{fmt_time(q8['widen_ms'] / 1e3 / n)} per prompt token (the scales come on top), against "
          f"{fmt_time(q8['widen_ms'] / 1e3)} per decoded one.")
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
    L.say(loss_words(d4, d8))
    L.pause()


def loss_words(d4: float, d8: float) -> str:
    """What Q4_0 did to the loss against what Q8_0 did (both counted: the same every run)."""
    if abs(d4) <= abs(d8):
        how = "no more than Q8_0"
    elif d8 * d4 <= 0 or abs(d8) < 0.1 * abs(d4):     # a ratio to a change near zero means nothing
        how = "more than Q8_0, which hardly moved it"
    else:
        how = f"{fmt_x(abs(d4) / abs(d8))} Q8_0's change"
    return f"Q4_0 moved it by {d4:+.4f}: {how}."


def widen_words(widen_s: float, saved_s: float) -> str:
    """The time a Q8_0 step spent widening its integers against the time its saved bytes would take: a
    ratio stated, no verdict. Bands ("more than", "about what") moved with the load at their edge, a
    timed median against a figure (issue 53)."""
    return (f"Widening its integers to floats, alone, took {fmt_time(widen_s)}, {fmt_x(widen_s / saved_s)} "
            "the time of the read it saves")


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


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
