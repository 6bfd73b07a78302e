"""One key order for decode attention over a contiguous cache and a paged pool (issue 51's item 4).

The int8 set rounds each product's input to int8, so a last-bit difference in attention's output can
move a product by a quantum of its block's scale and change a greedy token. Its decode attention
therefore splits a sequence's keys in fixed chunks (products.DECODE_CHUNK), each chunk's scores kept
whole, whatever the blocks: over a contiguous cache's rows (products.attention(..., chunk)) and over
a pool of any block size, in any batch (products.paged_decode_attention(..., chunk)), the bits are
the same. Then `generate_batch`
gives `generate`'s tokens with the int8 set, as it does with the sets that claim it already.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm import kernels
from minillm.models import gpt2, llama
from minillm.models.gpt2 import GPT2Config
from minillm.models.llama import LlamaConfig
from minillm.models.target import Target

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"numba kernels: {kernels.status().reason}")


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.sampled_from([1, 2, 3]), st.sampled_from([4, 16, 24]),
       st.lists(st.integers(1, 600), min_size=1, max_size=4), st.sampled_from([1, 3, 16, 32]),
       st.integers(0, 2**16))
def test_decode_over_a_pool_is_the_contiguous_bits(Hkv, g, hd, lengths, bs, seed):
    """Each sequence of a batch over blocks scattered in a pool == alone over a contiguous cache's
    rows (more rows than keys, as a cache's whole arrays), bit for bit, at the fixed chunk."""
    from minillm.kernels import products
    rng = np.random.default_rng(seed)
    H, B = Hkv * g, len(lengths)
    nb = [-(-n // bs) for n in lengths]
    blocks = sum(nb) + 2
    k_pool = rng.standard_normal((Hkv, blocks, bs, hd), dtype=np.float32) * 3
    v_pool = rng.standard_normal((Hkv, blocks, bs, hd), dtype=np.float32)
    order = rng.permutation(blocks)                               # each sequence's blocks, scattered
    table = np.zeros((B, max(nb)), np.intp)
    at = 0
    for b, n in enumerate(nb):
        table[b, :n] = order[at:at + n]
        at += n
    q = rng.standard_normal((H, B, hd), dtype=np.float32)
    got = products.paged_decode_attention(q, k_pool, v_pool, table, np.array(lengths), chunk=products.DECODE_CHUNK)
    for b, n in enumerate(lengths):
        rows = n + int(rng.integers(0, 40))                       # a cache's arrays: rows past the keys
        k = np.zeros((Hkv, rows, hd), np.float32)
        v = np.zeros((Hkv, rows, hd), np.float32)
        k[:, :n] = k_pool[:, table[b, :nb[b]]].reshape(Hkv, -1, hd)[:, :n]
        v[:, :n] = v_pool[:, table[b, :nb[b]]].reshape(Hkv, -1, hd)[:, :n]
        alone, copied = products.attention(q[:, b:b + 1], k, v, n, chunk=products.DECODE_CHUNK)
        assert copied == 0
        assert np.array_equal(got[:, b:b + 1], alone), f"sequence {b} of {n} keys, block size {bs}"


def test_a_chunk_of_no_keys_is_refused_in_one_line():
    from minillm.kernels import products
    q = np.zeros((2, 1, 4), np.float32)
    k = np.zeros((2, 8, 4), np.float32)
    with pytest.raises(ValueError, match="a positive number of keys"):
        products.attention(q, k, k, 8, chunk=0)


GPT2_CFG = GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=400, vocab_size=96)
LLAMA_CFG = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, head_dim=16, n_embd=64, n_ctx=400, vocab_size=96, ffn=64)


def build(family: str, weights: str, kernel_set: str, seed: int):
    t = Target.resolve(weights=weights, kernels=kernel_set)
    if family == "gpt2":
        return minillm.GPT2(GPT2_CFG, gpt2.random_params(GPT2_CFG, seed, std=0.1), t)
    return llama.Llama(LLAMA_CFG, llama.random_params(LLAMA_CFG, seed, std=0.1), t)


@settings(max_examples=10, deadline=None)
@given(st.sampled_from(["gpt2", "llama"]), st.sampled_from(["q8_0", "q4_0", "q4_1"]),
       st.lists(st.integers(1, 300), min_size=1, max_size=3), st.sampled_from([1, 3, 16]), st.integers(0, 2**16))
def test_int8_decode_in_a_batched_pool_is_alone_in_a_contiguous_cache(family, weights, lengths, bs, seed):
    """The int8 set: sequences prefilled into one pool and decoded together for a few steps give, bit
    for bit, the logits each gives alone over a contiguous cache (`generate`'s path)."""
    from minillm.cache.paged import PagedKVPool
    model = build(family, weights, "int8", seed % 3)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 96, n) for n in lengths]
    steps = rng.integers(0, 96, (4, len(prompts)))
    pool = PagedKVPool(model.config, sum(-(-(n + 4) // bs) for n in lengths) + 2, bs)
    caches = []
    for p in prompts:
        c = pool.sequence()
        model.prefill(p, c)
        caches.append(c)
    batched = []
    for t in range(len(steps)):                              # the batch's steps, every sequence at once
        for c in caches:
            c.reserve(1)
        batched.append(model.step([(np.array([int(steps[t, j])]), c) for j, c in enumerate(caches)]))
    for i, p in enumerate(prompts):
        alone = model.new_cache()
        model.prefill(p, alone)
        for t in range(len(steps)):
            want = model.decode_step(int(steps[t, i]), alone)
            assert np.array_equal(batched[t][i], want), f"step {t}, sequence of {p.size}, block size {bs}"


def test_alone_and_batched_the_decode_runs_one_compiled_kernel(monkeypatch):
    """The int8 set's decode alone over a contiguous cache and batched over a pool give each fused
    kernel the same argument types: numba compiles (and caches on disk) one machine code per type
    signature, a read-only array being another type, and two copies of a kernel with reassociated
    sums agree only while LLVM compiles them alike (not under other CPU features: a disk cache
    written with another vector width). One copy for both: the same bits by construction. (Its
    attention, kernels/_exact.py's, sums in IEEE order: every copy gives the same bits.)"""
    import numba
    from minillm.cache.paged import PagedKVPool
    from minillm.kernels import _numba as K
    seen = {}

    def record(phase, name, kernel):
        def call(*args):
            seen.setdefault((phase[0], name), set()).add(tuple(numba.typeof(a) for a in args))
            return kernel(*args)
        return call

    phase = ["batched"]
    for name, kernel in list(vars(K).items()):
        if isinstance(kernel, numba.core.dispatcher.Dispatcher):
            monkeypatch.setattr(K, name, record(phase, name, kernel))
    for family in ("gpt2", "llama"):
        model = build(family, "q8_0", "int8", 0)
        prompts = [np.arange(n) % 96 for n in (3, 300)]                 # one chunk of keys, and two
        pool = PagedKVPool(model.config, 40, 16)
        caches = [pool.sequence() for _ in prompts]
        for p, c in zip(prompts, caches):
            model.prefill(p, c)
        phase[0] = "batched"
        for c in caches:
            c.reserve(1)
        model.step([(np.array([5]), c) for c in caches])
        phase[0] = "alone"
        for p in prompts:
            alone = model.new_cache()
            model.prefill(p, alone)
            model.decode_step(5, alone)
    # the fixed-chunk attention is _exact.py's, in IEEE order (any copy of it gives its bits): never
    # the fastmath kernel, whose copies may differ
    assert ("alone", "paged_decode_attention") not in seen and ("batched", "paged_decode_attention") not in seen
    assert seen, "the fastmath kernels the steps ran were recorded"
    for (where, name), sigs in seen.items():
        if where == "alone" and ("batched", name) in seen and name not in ELEMENTWISE:
            both = sigs | seen["batched", name]
            assert len(both) == 1, f"{name}: {len(both)} compiled copies for one step, alone and batched: {both}"
    # rope: q and k, one row alone, are C-contiguous; a batch's are a view of the qkv product. No sum
    # to reorder (each output its own two products): its two copies compared bit for bit here.
    rng = np.random.default_rng(0)
    base = rng.standard_normal((5, 9, 64), dtype=np.float32) * 10
    strided = base[:, :6].transpose(1, 0, 2)                            # [6, 5, 64], a view
    angle = rng.standard_normal((5, 32)).astype(np.float32) * 100
    cos, sin = np.cos(angle), np.sin(angle)
    y_view, y_rows = np.empty((6, 5, 64), np.float32), np.empty((6, 5, 64), np.float32)
    K.rope(strided, cos, sin, y_view)
    K.rope(np.ascontiguousarray(strided), cos, sin, y_rows)
    assert np.array_equal(y_view, y_rows)


ELEMENTWISE = {"rope"}      # kernels whose outputs are each computed alone, no sum (checked above)


# the sets whose tokens in a batch are their tokens alone (numpy: tests/test_batch.py's random models)
CLAIMS = ["int8", "batch-invariant"]


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(CLAIMS), st.sampled_from(["gpt2", "llama"]), st.sampled_from(["q8_0", "q4_1"]),
       st.lists(st.integers(1, 300), min_size=2, max_size=4), st.sampled_from([1, 4, 16]),
       st.sampled_from([0.0, 0.8]), st.integers(0, 2**16))
def test_generate_batch_gives_generates_tokens(kernel_set, family, weights, lengths, bs, temperature, seed):
    """Random prompts (some past a chunk of 256 keys), greedy and sampled: token for token."""
    model = build(family, weights, kernel_set, seed % 3)
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(0, 96, n)] for n in lengths]
    limits = [int(n) for n in rng.integers(1, 12, len(prompts))]
    got = minillm.generate_batch(model, prompts, limits, temperature=temperature, seed=seed, block_size=bs)
    want = [minillm.generate(model, p, n, temperature=temperature, seed=seed) for p, n in zip(prompts, limits)]
    assert got == want
