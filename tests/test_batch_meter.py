"""The meter on batched steps, against closed forms, exactly: every byte kind (activations too)
and every FLOP kind, for B sequences at random positions with random numbers of new tokens and
random choices of which positions are scored.

With L layers, width d, H heads, vocab V, b bytes per number, sequence i holding p_i positions
and bringing n_i new ones (t_i = p_i + n_i keys), N = Σ n_i rows, S scored rows:

    weights      2·N·d·b  +  L·(12d² + 13d)·b  +  [S > 0]·(2d + V·d)·b
    kv_write     L · Σ 2·n_i·d·b
    kv_read      L · Σ 2·t_i·d·b                       (contiguous caches: views, no copy)
    activations  N·d·b + L·(34·N·d + Σ (3·n_i·d + 2·H·q_i))·b + (3·S·d + S·V)·b
    matmul       L·24·N·d² + 2·S·d·V
    attention    L · Σ 4·q_i·d
    other        N·d + L·(57·N·d + Σ (n_i·d + c_i·H·q_i)) + 7·S·d

where q_i is the number of query-key pairs sequence i scores (n_i·t_i up to 128 new tokens; in
query blocks of 128 beyond), and c_i = 6 with a causal mask (n_i > 1), else 5. The weights are
read once per step whatever B is: that is the whole point of batching. The 34·N·d per layer is
each operation's input and output: layer norms 2+2, c_attn 1+3, c_proj 1+1, c_fc 1+4, GELU 4+4,
mlp.c_proj 4+1, two residual adds 3+3.

A decode batch in one paged pool (one gather per layer) reads whole blocks and moves the gathered
copy: kv_read L·Σ 2·⌈t_i/bs⌉·bs·d·b, and 4·B·T·d·b more activations per layer (T: the longest,
in whole blocks).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.cache.paged import PagedKVPool
from minillm.models.gpt2 import random_params
from minillm.models import ops


def pairs(n: int, t: int) -> int:
    """Query-key pairs scored for n new queries over t keys, in query blocks of ops.QUERY_BLOCK."""
    total = 0
    for r0 in range(0, n, ops.QUERY_BLOCK):
        r1 = min(r0 + ops.QUERY_BLOCK, n)
        total += (r1 - r0) * (t - n + r1)
    return total


def forms(config, b, seqs, scored_rows):
    L, d, V, H = config.n_layer, config.n_embd, config.vocab_size, config.n_head
    N = sum(n for _, n in seqs)
    S = scored_rows
    q = [pairs(n, p + n) for p, n in seqs]
    return {
        "weights": 2 * N * d * b + L * (12 * d * d + 13 * d) * b + (2 * d + V * d) * b * (S > 0),
        "kv_write": L * sum(2 * n * d * b for _, n in seqs),
        "kv_read": L * sum(2 * (p + n) * d * b for p, n in seqs),
        "activations": N * d * b + L * (34 * N * d + sum(3 * n * d + 2 * H * qi for (_, n), qi in zip(seqs, q))) * b
        + (3 * S * d + S * V) * b,
        "matmul": L * 24 * N * d * d + 2 * S * d * V,
        "attention": L * sum(4 * qi * d for qi in q),
        "other": N * d + L * (57 * N * d + sum(n * d + (6 if n > 1 else 5) * H * qi for (_, n), qi in zip(seqs, q)))
        + 7 * S * d,
    }


def counted(r):
    return {**{k: r.bytes[k] for k in ("weights", "kv_write", "kv_read", "activations")},
            **{k: r.flops[k] for k in ("matmul", "attention", "other")}}


@st.composite
def batches(draw):
    n_head = draw(st.integers(1, 4))
    config = minillm.GPT2Config(n_layer=draw(st.integers(1, 3)), n_head=n_head,
                                n_embd=n_head * draw(st.integers(2, 8)), n_ctx=draw(st.integers(8, 160)),
                                vocab_size=draw(st.integers(20, 200)))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    seqs = []
    for _ in range(draw(st.integers(1, 6))):
        p = draw(st.integers(0, config.n_ctx - 1))
        n = draw(st.integers(1, min(config.n_ctx - p, 140)))
        seqs.append((p, n))
    wants = [draw(st.sampled_from(["last", "all", None])) for _ in seqs]
    return config, dtype, seqs, wants, draw(st.integers(0, 2**16))


@settings(max_examples=60, deadline=None)
@given(batches())
def test_a_batched_step_matches_the_closed_forms(case):
    config, dtype, seqs, wants, seed = case
    model = minillm.GPT2(config, random_params(config, seed, dtype=dtype))
    rng = np.random.default_rng(seed)
    batch = []
    for p, n in seqs:
        cache = model.new_cache()
        if p:
            model.prefill(rng.integers(0, config.vocab_size, p), cache)
        batch.append((rng.integers(0, config.vocab_size, n), cache))
    with minillm.Meter() as m:
        model.step(batch, scores=wants)
    (r,) = m.steps
    S = sum(1 if w == "last" else n if w == "all" else 0 for (_, n), w in zip(seqs, wants))
    expected = forms(config, np.dtype(dtype).itemsize, seqs, S)
    got = counted(r)
    assert all(type(v) is int for v in got.values())
    assert got == expected, {k: (got[k], expected[k]) for k in got if got[k] != expected[k]}
    assert (r.n_seqs, r.seqs, r.n_tokens) == (len(seqs), seqs, sum(n for _, n in seqs))


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(1, 8), st.integers(0, 2**16), st.sampled_from([np.float32, np.float64]))
def test_a_paged_decode_batch_matches_the_closed_forms(B, bs, seed, dtype):
    config = minillm.GPT2Config(n_layer=2, n_head=2, n_embd=8, n_ctx=100, vocab_size=50)
    model = minillm.GPT2(config, random_params(config, seed, dtype=dtype))
    rng = np.random.default_rng(seed)
    pool = PagedKVPool(config, B * 100, bs, dtype)
    lengths = [int(x) for x in rng.integers(1, 90, B)]
    caches = []
    for p in lengths:
        c = pool.sequence()
        model.prefill(rng.integers(0, 50, p), c)
        caches.append(c)
    for c in caches:
        c.reserve(1)
    with minillm.Meter() as m:
        model.step([([int(rng.integers(0, 50))], c) for c in caches])
    (r,) = m.steps
    b, L, d = np.dtype(dtype).itemsize, config.n_layer, config.n_embd
    seqs = [(p, 1) for p in lengths]
    expected = forms(config, b, seqs, B)
    held = sum(-(-(p + 1) // bs) * bs for p in lengths)
    T = -(-max(p + 1 for p in lengths) // bs) * bs
    expected["kv_read"] = L * 2 * held * d * b
    expected["activations"] += L * 4 * B * T * d * b
    assert counted(r) == expected
    assert r.kind == "decode" and r.n_seqs == B
