"""Lesson 16: Attention without the scores. A long prefill's attention, counted by the meter: NumPy
writes and reads a score for every query-key pair, the fused kernel (FlashAttention's tiles and online
softmax) never stores one; then the online softmax itself, block by block on a small example, checked
against the softmax it replaces and against the kernel.

Run:  python lessons/16_flash_attention.py        (or: minillm learn 16)
"""

from __future__ import annotations

import math

import numpy as np
from rich import box
from rich.table import Table

import minillm
from minillm import kernels
from minillm.lessons._common import Lesson, fmt_x, priced_words, roofline_clock, run_lesson, time_interleaved
from minillm.measure.chips import CHIPS, roofline
from minillm.models import ops
from minillm.ui.report import fmt_bytes, fmt_flops, fmt_mib, fmt_time

TITLE = "Attention without the scores"
MINUTES = 7  # 1,430 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "the score bytes of a long prefill counted, then gone; the online softmax, block by block"


def share_text(x: float) -> str:
    """A share, with a decimal below 10% (W33: 20.7 ms of 4.83 s printed "0%")."""
    return f"{x:.1%}" if x < 0.1 else f"{x:.0%}"


def lesson(L: Lesson) -> None:
    seen = None
    if not kernels.available():
        L.note(f"the fused kernels cannot run here ({kernels.status().reason}): this lesson needs numba")
    else:
        seen = score_bytes(L)
    block_by_block(L)
    here = "" if seen is None else (f" (here, at {seen[0]:,} tokens, NumPy's attention moved {fmt_x(seen[1])} "
                                    "the bytes of the weights)")
    L.takeaway(f"""
        Attention's softmax needs every score of a row before it can weigh the values, so a plain
        implementation writes the whole score matrix and reads it back, and those bytes grow with the
        prompt's square{here}. The online softmax keeps a running maximum and a running sum per query and
        rescales what it has so far when the maximum grows, so a tile of scores lives in registers and
        cache and is gone: the same result, to rounding, with only Q, K, V and the output moving (Milakov and
        Gimelshein, 2018; FlashAttention, Dao et al., 2022). What that saves depends on where the scores
        would have gone: through a GPU's HBM, a share of a long prefill's time; here, into a cache.
    """)
    L.try_it("""
        `minillm bench --batch 1,2,4,8 --kernels numpy,fused` compares both kernels in decode, where the
        paged kernel reads each sequence's keys in place. `python -c "from minillm.models import ops;
        help(ops.attention)"` shows the NumPy attention this lesson counts, `minillm/kernels/_numba.py`
        the fused one (`flash_attention`).
    """)


# -- 1. the score bytes, counted --------------------------------------------------------------------

def scored_pairs(T: int) -> int:
    """Query-key pairs ops.attention computes in a T-token prefill, per head: blocks of QUERY_BLOCK
    queries, each against the keys its last query may see (the masked triangle of a block included)."""
    return sum((min(r0 + ops.QUERY_BLOCK, T) - r0) * min(r0 + ops.QUERY_BLOCK, T)
               for r0 in range(0, T, ops.QUERY_BLOCK))


def score_bytes(L: Lesson) -> tuple[int, float]:
    L.section("A long prefill: the score matrix, counted")
    name = L.model_name or L.pick("random-124m", "random-tiny")
    ref = minillm.load(name, kernels="numpy", quiet=True)
    fused = minillm.load(name, kernels="fused", quiet=True)
    c = ref.config
    lengths = [T for T in L.pick((512, 1024), (128, 256)) if T <= c.n_ctx]
    share = {T: scored_pairs(T) / T ** 2 for T in lengths}
    L.say(f"""
        Attention compares each query with every key before it: a T-token prefill needs about T²/2 scores
        per head and layer. NumPy's attention (`ops.attention`) takes the queries in blocks of
        {ops.QUERY_BLOCK} and scores each block against every key its last query may see, so it computes
        more: {', '.join(f"{share[T]:.0%} of T² at {T:,} tokens" for T in lengths)}. It writes the scores
        as a matrix, adds the mask and takes the softmax in place (a maximum, a subtraction, an exp, a sum
        and a scaling: five to seven passes over each block), and reads them again to weigh the values.
        The meter counts **at least** 4 bytes written and 4 read per score: the unfused kernel's lower
        bound (lesson 7's view), not every pass. Below, prefills of `{name}` ({c.n_layer} layers,
        {c.n_head} heads) metered with both kernels (`minillm.load(..., kernels="numpy")` and `"fused"`):
        the bytes attention moves, beside the weights the same prefill reads.
    """)
    rng = np.random.default_rng(0)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("tokens", "kernels", "attention", "of which scores", "weights", "attention ÷ weights"):
        t.add_column(col, justify="right", no_wrap=True)
    got = {}
    for T in lengths:
        ids = rng.integers(0, c.vocab_size, T)
        for label, model in (("numpy", ref), ("fused", fused)):
            with minillm.Meter() as m:
                model.prefill(ids)
            r = m.steps[0]
            got[T, label] = (r.ops["attention"]["bytes"], r.bytes["weights"])
            got[T, label, "step"] = (r.total_bytes, r.total_flops)          # the whole prefill, counted
        d, H, L_ = c.n_embd, c.n_head, c.n_layer
        qkvo = L_ * 2 * T * d * 4                                     # q and the output, float32
        scores = L_ * 2 * H * scored_pairs(T) * 4                     # written, then read
        for label in ("numpy", "fused"):
            att, w = got[T, label]
            t.add_row(f"{T:,}", label, fmt_bytes(att), fmt_bytes(scores) if label == "numpy" else "0",
                      fmt_bytes(w), fmt_x(att / w))
        got[T, "forms"] = (qkvo, scores, L_ * T * d * 4)              # NumPy also writes q scaled: one more q
    L.show(t, "[dim]attention: the bytes the meter counted for attention's own reads and writes in one prefill "
              "(k and v are counted as the KV cache's read); scores: 2·L·H·pairs·4 bytes by the closed form, "
              "at least[/]")
    L.pause()
    for T in lengths:
        qkvo, scores, q_scaled = got[T, "forms"]
        L.claim(got[T, "fused"][0] == qkvo,
                f"the fused prefill of {T:,} tokens moved {fmt_bytes(qkvo)} through attention: q read and the "
                "output written once each (2·L·T·d·4 bytes; k and v are the KV cache's read), no score")
        L.claim(got[T, "numpy"][0] == qkvo + q_scaled + scores,
                f"NumPy's moved {fmt_bytes(got[T, 'numpy'][0])}: the same, plus the scaled copy of q and "
                f"{fmt_bytes(scores)} of scores, written and read")
    T = lengths[-1]
    ratio = got[T, "numpy"][0] / got[T, "numpy"][1]
    from minillm.kernels import products as tiles                   # needs numba, as this section does
    L.say(f"""
        At {T:,} tokens NumPy's attention moves {fmt_x(ratio)} the bytes of all the weights the prefill reads
        ({'more' if ratio > 1 else 'less'} than the weights), and the scores grow with T² while the rest grows
        with T. The fused kernel (`minillm/kernels/`, FlashAttention's scheme) takes {tiles.QUERY_TILE} queries
        and {tiles.KEY_TILE} keys at a time: the tile's scores stay in the CPU's cache and are gone when the
        tile is done.
    """)
    ids = rng.integers(0, c.vocab_size, T)
    times = time_interleaved({"numpy": lambda: ref.prefill(ids), "fused": lambda: fused.prefill(ids)}, L.rounds(),
                             settle=False)          # the verdict below is priced: no rounds added for it
    # The verdict on the two prefills' prices (their counted bytes and FLOPs on this machine's roofline:
    # the same every run), the measured ratio beside it: timed, the two sat at the verdict rule's edge.
    hw = roofline_clock(L).hw
    price = {k: hw.roofline(*got[T, k, "step"]).seconds for k in ("numpy", "fused")}
    L.say(f"The whole prefill of {T:,} tokens: "
          f"{priced_words(price['fused'], price['numpy'], 'the fused one', 'NumPy' + chr(39) + 's', times['fused'], times['numpy'])} "
          "The products run on the same BLAS in both for a prompt this long.")
    L.timing_note()
    why_so_little(L, ref, c, T, got[T, "forms"][1], times["numpy"].median)
    L.pause()
    return T, ratio


def why_so_little(L: Lesson, ref, c, T: int, scores: int, numpy_s: float) -> None:
    """E20: what the removed score bytes could save here (their time at the measured bandwidth against the
    prefill's measured time and its FLOPs at the measured peak), and where FlashAttention's win is."""
    hw = L.machine()
    with minillm.Meter() as m:
        ref.prefill(np.arange(T) % c.vocab_size)
    flops = m.steps[0].total_flops
    bound = roofline(m.steps[0].total_bytes, flops, hw).bound
    score_s = scores / (hw.bandwidth_gbs * 1e9)
    flop_s = flops / (hw.peak_gflops * 1e9)
    block = c.n_head * ops.QUERY_BLOCK * T * 4
    llc = f"the operating system reports a last-level cache of {fmt_mib(hw.llc_bytes)}" if hw.llc_bytes else \
        "the operating system reports no cache size"
    L.say(f"""
        Why so little changes here: by its counts this prefill is {bound}-bound on this machine. The meter counts {fmt_flops(flops)}, which take
        {fmt_time(flop_s)} at this machine's measured {hw.peak_gflops:,.0f} GFLOP/s; the score bytes the fused
        kernel removes, {fmt_bytes(scores)}, take {fmt_time(score_s)} at its measured {hw.bandwidth_gbs:.1f} GB/s:
        **{share_text(score_s / numpy_s)} of NumPy's measured prefill** ({fmt_time(numpy_s)}), at most what removing them
        can save. And NumPy's scores are never one large matrix: {c.n_head} heads × {ops.QUERY_BLOCK} queries ×
        {T:,} keys × 4 bytes = {fmt_bytes(block)} at a time, written and read back while it is fresh
        ({llc}).
    """)
    rows = gpu_rows()
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("prompt", "FLOPs", "at peak", "attention", "scores", "at HBM", "÷ FLOP time"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        t.add_row(f"{r['T']:,}", fmt_flops(r["flops"]), fmt_time(r["flop_s"]), f"{r['attention_share']:.0%}",
                  fmt_bytes(r["score_bytes"]), fmt_time(r["score_s"]), f"{r['score_s'] / r['flop_s']:.0%}")
    L.show(t, f"[dim]{GPU_SHAPE} in fp16 on an {GPU_CHIP.upper()} ({CHIPS[GPU_CHIP].bandwidth_gbs:,.0f} GB/s, "
              f"{CHIPS[GPU_CHIP].peak_gflops / 1e3:,.0f} TFLOP/s), by the arithmetic: FLOPs 2·params·T plus "
              "attention's 2·L·T²·d (causal half); attention: its share of them; scores: the causal half "
              "written and read once in fp16, at least (an unfused softmax passes over them more)[/]")
    L.say(f"""
        On a GPU it is another story. A prefill there takes milliseconds, and an unfused softmax sends its
        scores through HBM: at {rows[-1]['T']:,} tokens, written and read once each they would take
        {fmt_time(rows[-1]['score_s'])}, {rows[-1]['score_s'] / rows[-1]['flop_s']:.0%} of the prefill's
        arithmetic at the peak, with attention {rows[-1]['attention_share']:.0%} of its FLOPs. That is where
        FlashAttention (Dao et al., 2022) wins: the scores of a tile live in on-chip memory and are gone, on
        the online softmax Milakov and Gimelshein (2018) wrote down for the normaliser. Flash-Decoding (Dao,
        Haziza, Massa and Sizov, 2023) splits one long sequence's keys over the chip's cores in decode, where
        a single query would leave most of them idle.
    """)


GPU_SHAPE, GPU_CHIP = "llama-3-8b", "h100-sxm"


def gpu_rows(lengths=(2048, 8192, 32768)) -> list[dict]:
    """A long prefill of GPU_SHAPE on GPU_CHIP in fp16, by the arithmetic: its FLOPs at the peak, and the
    causal half of its T×T scores written and read once in fp16 at the HBM bandwidth."""
    from minillm.measure.shapes import shape
    s, chip = shape(GPU_SHAPE), CHIPS[GPU_CHIP]
    d = s["n_head"] * s["head_dim"]
    out = []
    for T in lengths:
        attn = 2 * s["n_layer"] * T * T * d                     # q·k and p·v, causal half: 4·L·T²·d ÷ 2
        flops = 2 * s["n_params"] * T + attn
        score_bytes = s["n_layer"] * s["n_head"] * T * T // 2 * 2 * 2     # causal half, fp16, written and read
        out.append({"T": T, "flops": flops, "flop_s": flops / (chip.peak_gflops * 1e9), "attention_share": attn / flops,
                    "score_bytes": score_bytes, "score_s": score_bytes / (chip.bandwidth_gbs * 1e9)})
    return out


# -- 2. the online softmax, block by block ----------------------------------------------------------

def online_softmax(s: np.ndarray, v: np.ndarray, block: int) -> tuple[np.ndarray, list[tuple]]:
    """softmax(s) @ v one block of keys at a time, keeping only a running max m, a running sum l and
    an unnormalised output acc: a block's scores raise m to m' = max(m, max of the block), l and acc
    are rescaled by exp(m - m') before the block's exp(s - m') are added. The fused kernels run this
    recurrence per query (`flash_attention`, `paged_decode_attention` in minillm/kernels/_numba.py).
    Returns (acc / l, one (first key, block max, m', exp(m - m'), l) per block)."""
    m, l, acc = -math.inf, 0.0, np.zeros(v.shape[1])
    steps = []
    for j0 in range(0, len(s), block):
        sb = s[j0:j0 + block]
        m_new = max(m, float(sb.max()))
        corr = math.exp(m - m_new)                  # exp(-inf) = 0 for the first block: nothing to rescale
        p = np.exp(sb - m_new)
        l = l * corr + float(p.sum())
        acc = acc * corr + p @ v[j0:j0 + block]
        steps.append((j0, float(sb.max()), m_new, corr, l))
        m = m_new
    return acc / l, steps


def block_by_block(L: Lesson) -> None:
    L.section("The online softmax, block by block")
    L.say("""
        How can a softmax run before all of its row is known? softmax(s)ᵢ = exp(sᵢ − M) ÷ Σⱼ exp(sⱼ − M),
        where M is the row's maximum (subtracted so no exp overflows). Take the keys in blocks and keep three
        things per query: the largest score seen so far `m`, the sum `l` of exp(s − m) so far, and the sum
        `acc` of those weights times the values. When a block brings a larger maximum m′, everything kept so
        far was computed against the old m: multiplying `l` and `acc` by exp(m − m′) puts it on the new one.
        At the end, acc ÷ l is the softmax-weighted sum of the values. Below, one query's 12 scores in
        blocks of 4, with 3 values per key; the maximum arrives in the second block.
    """)
    rng = np.random.default_rng(16)
    s = np.round(rng.normal(0, 2, 12), 2)
    s[5] = s.max() + 3.0                            # the row's maximum, in the second block
    v = np.round(rng.normal(0, 1, (12, 3)), 2)
    out, steps = online_softmax(s, v, 4)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("keys", "scores", "block max", "m", "exp(m − m′)", "l"):
        t.add_column(col, justify="right", no_wrap=True)
    for j0, bmax, m, corr, l in steps:
        t.add_row(f"{j0}–{j0 + 3}", " ".join(f"{x:.1f}" for x in s[j0:j0 + 4]), f"{bmax:.2f}", f"{m:.2f}",
                  f"{corr:.4f}", f"{l:.4f}")
    L.show(t, "[dim]m, l: the running max and sum after the block; exp(m − m′): what l and the output kept so "
              "far are multiplied by when the block arrives (0 for the first: there is nothing yet)[/]")
    p = np.exp(s - s.max())
    exact = (p / p.sum()) @ v                       # the softmax of the whole row, then the weighted sum
    err = float(np.abs(out - exact).max())
    L.claim(err <= 1e-12 * float(np.abs(v).max()) and abs(steps[-1][4] - float(p.sum())) <= 1e-12 * float(p.sum()),
            f"block by block gives softmax(s) @ v of the whole row (largest difference {err:.1e}, float64) and "
            f"the running sum ends at Σ exp(s − max s) = {float(p.sum()):.4f}")
    if kernels.available():
        hd = 4                                      # the fused kernel on the same row: q·kⱼ/√hd = sⱼ
        q = np.zeros((1, 1, hd), np.float32)
        q[0, 0, 0] = math.sqrt(hd)
        k = np.zeros((1, len(s), hd), np.float32)
        k[0, :, 0] = s
        vv = np.zeros((1, len(s), hd), np.float32)
        vv[0, :, :3] = v
        got = kernels.attention(q, k, vv)[0][0, 0, :3]           # (out, bytes copied)
        kerr = float(np.abs(got - exact).max())
        L.claim(kerr <= 1e-5 * float(np.abs(v).max()),
                f"minillm's fused attention kernel, given these scores and values, gives the same output "
                f"(largest difference {kerr:.1e}: float32 rounding)")
    L.pause()


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
