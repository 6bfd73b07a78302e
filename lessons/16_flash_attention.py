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
from minillm.lessons._common import Lesson, faster_words, fmt_x, ratio_range, run_lesson, time_interleaved
from minillm.models import ops
from minillm.ui.report import fmt_bytes

TITLE = "Attention without the scores"
MINUTES = 6
WHAT_YOU_WILL_SEE = "the score bytes of a long prefill counted, then gone; the online softmax, block by block"


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
        cache and is gone: the same result, to rounding, with only Q, K, V and the output moving.
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
    L.say(f"""
        Attention compares each query with every key before it: a T-token prefill computes about T²/2
        scores per head and layer. NumPy's attention (`ops.attention`) writes them as a matrix, takes the
        softmax of each row in place, and reads them again to weigh the values: 4 bytes written and 4 read
        per score. Below, prefills of `{name}` ({c.n_layer} layers, {c.n_head} heads) metered with both
        kernels (`minillm.load(..., kernels="numpy")` and `"fused"`): the bytes attention moves, beside the
        weights the same prefill reads.
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
        d, H, L_ = c.n_embd, c.n_head, c.n_layer
        qkvo = L_ * 2 * T * d * 4                                     # q and the output, float32
        scores = L_ * 2 * H * scored_pairs(T) * 4                     # written, then read
        for label in ("numpy", "fused"):
            att, w = got[T, label]
            t.add_row(f"{T:,}", label, fmt_bytes(att), fmt_bytes(scores) if label == "numpy" else "0",
                      fmt_bytes(w), fmt_x(att / w))
        got[T, "forms"] = (qkvo, scores, L_ * T * d * 4)              # NumPy also writes q scaled: one more q
    L.show(t, "[dim]attention: the bytes the meter counted for attention's own reads and writes in one prefill "
              "(k and v are counted as the KV cache's read); scores: 2·L·H·pairs·4 bytes by the closed form[/]")
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
    L.say(f"""
        At {T:,} tokens NumPy's attention moves {fmt_x(ratio)} the bytes of all the weights the prefill reads
        ({'more' if ratio > 1 else 'less'} than the weights), and the scores grow with T² while the rest grows
        with T. The fused kernel (`minillm/kernels/`, FlashAttention's scheme) takes 32 queries and 64 keys at
        a time: the tile's scores stay in the CPU's cache and are gone when the tile is done.
    """)
    ids = rng.integers(0, c.vocab_size, T)
    times = time_interleaved({"numpy": lambda: ref.prefill(ids), "fused": lambda: fused.prefill(ids)}, L.rounds())
    r = ratio_range(times["fused"], times["numpy"])
    L.say(f"Measured, the whole prefill of {T:,} tokens: "
          f"{faster_words(r, 'the fused one', 'NumPy' + chr(39) + 's')} (the products run on the same BLAS "
          "in both for a prompt this long).")
    L.timing_note()
    L.pause()
    return T, ratio


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
