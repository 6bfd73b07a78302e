"""The fused kernels through the whole model (kernels="fused"): the engine's invariants hold with them
(cached == naive, batched == alone, paged == contiguous), each against the NumPy reference model of
the same weights, for GPT-2 and a Llama (grouped queries), float32 and quantized; and a fused step's
meter record equals its closed forms (no scratch, no score bytes, only the keys each query may see).

Tolerance: the fused and NumPy paths sum the same float32 products in different orders, so logits
differ by float32 rounding through a few layers: a few 1e-6 of the logits' scale. TOL = 1e-4 of that
scale leaves room for it; a kernel wired to the wrong keys, positions, head or block moves logits by
their own scale (checked: attending over one key too few, or skipping the RoPE'd keys of the cache, fails).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.models.target import Target
from minillm import kernels, meter
from minillm.cache.contiguous import KVCache
from minillm.cache.paged import PagedKVPool
from minillm.models.gpt2 import GPT2Config
from minillm.models.llama import LlamaConfig
from minillm.models import gpt2, llama

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"fused kernels: {kernels.status().reason}")

TOL = 1e-4
GPT2_CFG = GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=160, vocab_size=96)
LLAMA_CFG = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, head_dim=16, n_embd=64, n_ctx=160, vocab_size=96, ffn=64)


def build(family: str, weights: str, kernels_: str, seed: int = 0):
    if family == "gpt2":
        return minillm.GPT2(GPT2_CFG, gpt2.random_params(GPT2_CFG, seed, std=0.1), Target.resolve(weights=weights, kernels=kernels_))
    return llama.Llama(LLAMA_CFG, llama.random_params(LLAMA_CFG, seed, std=0.1), Target.resolve(weights=weights, kernels=kernels_))


def pair(family: str, weights: str, seed: int = 0):
    """The same weights twice: the NumPy reference and the fused model."""
    ref, fused = build(family, weights, "numpy", seed), build(family, weights, "fused", seed)
    assert ref.kernels == "numpy" and fused.kernels == "fused"
    return ref, fused


def assert_close(got: np.ndarray, want: np.ndarray, where: str) -> None:
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    assert err <= TOL * scale, f"{where}: max |fused - numpy| = {err:.3g}, over {TOL} x the logits' scale {scale:.3g}"


FAMILIES = st.sampled_from(["gpt2", "llama"])
WEIGHTS = st.sampled_from(["float32", "q8_0", "q4_0"])


def test_fused_models_hold_fused_weights_and_numpy_stays_numpy():
    from minillm.models.fused import FusedDense, FusedQuant
    ref, fused = pair("llama", "q8_0")
    assert all(isinstance(w, FusedQuant) for w in fused.matrices())
    assert not any(isinstance(w, FusedQuant) for w in ref.matrices())
    f32 = build("gpt2", "float32", "fused")
    assert all(isinstance(w, FusedDense) for w in f32.matrices())
    assert f32.embed_w is f32.head_w                                  # the tied table stays one array
    assert build("gpt2", "float32", "numpy").nbytes() == f32.nbytes()
    assert minillm.load("random-tiny", dtype=np.float64).kernels == "numpy"    # float64: NumPy's by default
    with pytest.raises(minillm.MiniLLMError, match="--kernels fused computes in float32, not float64"):
        minillm.load("random-tiny", dtype=np.float64, kernels="fused")  # asked for: one line saying why not


@settings(max_examples=12, deadline=None)
@given(FAMILIES, WEIGHTS, st.integers(1, 40), st.integers(1, 6), st.integers(0, 2**16))
def test_cached_equals_naive_with_fused_kernels(family, weights, P, n, seed):
    """Prefill P tokens, then n decode steps, fused: every position's logits equal the NumPy model's
    full forward over the same tokens (naive), and the fused full forward equals it too."""
    ref, fused = pair(family, weights, seed % 3)
    ids = np.random.default_rng(seed).integers(0, 96, P + n)
    want = ref.forward(ids)                                            # [P+n, V]
    assert_close(fused.forward(ids), want, "fused forward")
    logits, cache = fused.prefill(ids[:P])
    assert_close(logits, want[P - 1], "fused prefill")
    for i in range(P, P + n):
        assert_close(fused.decode_step(int(ids[i]), cache), want[i], f"decode at {i}")


@settings(max_examples=10, deadline=None)
@given(FAMILIES, WEIGHTS, st.lists(st.integers(1, 150), min_size=2, max_size=5), st.sampled_from([1, 4, 16]),
       st.integers(0, 2**16))
def test_batched_equals_alone_with_fused_kernels(family, weights, lengths, bs, seed):
    """B sequences of one paged pool decode one token each in one fused step (the paged kernel over
    every table, any lengths: past BATCHED_DECODE_KEYS too); each equals that sequence decoded
    alone by the NumPy model over a contiguous cache."""
    ref, fused = pair(family, weights, seed % 3)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 96, p) for p in lengths]
    nxt = [int(t) for t in rng.integers(0, 96, len(lengths))]
    pool = PagedKVPool(fused.config, sum(-(-(p + 1) // bs) for p in lengths) + 3, bs)
    caches = []
    for p in prompts:
        c = pool.sequence()
        fused.prefill(p, c)
        c.reserve(1)
        caches.append(c)
    batched = fused.step([(np.array([t]), c) for t, c in zip(nxt, caches)])
    for p, t, got in zip(prompts, nxt, batched):
        _, alone = ref.prefill(p)
        assert_close(got, ref.decode_step(t, alone), f"batched sequence of {len(p)}")


@settings(max_examples=10, deadline=None)
@given(FAMILIES, WEIGHTS, st.integers(1, 60), st.sampled_from([1, 3, 16]), st.integers(0, 2**16))
def test_paged_equals_contiguous_with_fused_kernels(family, weights, P, bs, seed):
    """One sequence in a paged pool whose blocks are scattered (another sequence takes every other
    block), prefilled in two chunks, then decoded, fused: the logits of the NumPy model over a
    contiguous cache."""
    ref, fused = pair(family, weights, seed % 3)
    ids = np.random.default_rng(seed).integers(0, 96, P + 4)
    pool = PagedKVPool(fused.config, 2 * (-(-(P + 4) // bs)) + 2, bs)
    mine, other = pool.sequence(), pool.sequence()
    for k in range(1, -(-(P + 4) // bs) + 1):                       # interleaved blocks: a gathered table
        mine.reserve(k * bs)
        other.reserve(k * bs)
    half = max(1, P // 2)
    fused.prefill(ids[:half], mine)
    got = [fused.prefill(ids[half:P], mine)[0]] if P > half else []
    got += [fused.decode_step(int(t), mine) for t in ids[P:]]
    contiguous = ref.new_cache()
    ref.prefill(ids[:half], contiguous)
    want = [ref.prefill(ids[half:P], contiguous)[0]] if P > half else []
    want += [ref.decode_step(int(t), contiguous) for t in ids[P:]]
    assert isinstance(contiguous, KVCache) and (len(mine.table) == 1 or not mine.contiguous(len(mine.table)))
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"paged step {i}")


# -- the meter's closed forms for fused steps ---------------------------------------------------

def fused_forms(model, keys: list[int], tokens: list[int], scored: int) -> dict:
    """A fused step's counts, by closed form. Sequences (keys_i after the step, tokens_i new): each
    query sees only the keys up to its own position, pairs_i = n·(t - n) + n(n+1)/2; per layer
    attention FLOPs 4·H·hd per pair, kv_read (cached) 2·Hkv·hd·b per key read, kv_write per new
    token; activations of attention: q and the output only (no scores); weights: every product's
    stored bytes (the fused kernel reads them once, no scratch) plus the gathered rows."""
    c = model.config
    L, H, hd = c.n_layer, c.n_head, c.head_dim
    Hkv = getattr(c, "n_kv_head", H)
    pairs = sum(n * (t - n) + n * (n + 1) // 2 for t, n in zip(keys, tokens))
    N = sum(tokens)
    return {"attention": 4 * L * H * hd * pairs, "kv_read": 2 * L * Hkv * hd * 4 * sum(keys),
            "kv_write": 2 * L * Hkv * hd * 4 * N, "scratch": 0,
            "attention_activations": L * 2 * H * N * hd * 4}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("weights", ["float32", "q8_0", "q4_1"])
@pytest.mark.parametrize("paged", [False, True])
def test_a_fused_step_matches_its_closed_forms(family, weights, paged):
    model = build(family, weights, "fused")
    rng = np.random.default_rng(1)
    P = 37
    if paged:
        pool = PagedKVPool(model.config, 40, 4)
        caches = [pool.sequence() for _ in range(3)]
    else:
        caches = [model.new_cache()]
    lengths = [P, 5, 20][:len(caches)]
    for c, p in zip(caches, lengths):
        model.prefill(rng.integers(0, 96, p), c)
        c.reserve(1)
    with meter.Meter() as m:
        model.step([(np.array([3]), c) for c in caches])
    (r,) = m.steps
    want = fused_forms(model, [p + 1 for p in lengths], [1] * len(lengths), len(lengths))
    assert r.flops["attention"] == want["attention"]
    assert r.bytes["kv_read"] == want["kv_read"] and r.bytes["kv_write"] == want["kv_write"]
    assert r.scratch == want["scratch"]
    assert r.bytes["weights"] == model.step_weight_bytes() + (len(lengths) - 1) * (
        model.embed_w.rows_counts(1)["weights"] + (model.wpe[0].nbytes if family == "gpt2" else 0))
    # attention's own bytes: q and the output (and, paged, the keys and values it reads in the pool)
    assert r.ops["attention"]["bytes"] == want["attention_activations"] + (want["kv_read"] if paged else 0)
    # the fused prefill: only the causal pairs, and attention moves q and the output, no scores (k and
    # v are the cache's read, in place; its products: 37 rows are past FUSED_ROWS, so quantized ones
    # widen tiles for BLAS, as NumPy's do)
    with meter.Meter() as m2:
        model.prefill(rng.integers(0, 96, P))
    (f,) = m2.steps
    c = model.config
    assert f.flops["attention"] == fused_forms(model, [P], [P], P)["attention"]
    assert f.ops["attention"]["bytes"] == c.n_layer * P * c.head_dim * 4 * 2 * c.n_head
    assert f.bytes["kv_read"] == fused_forms(model, [P], [P], P)["kv_read"]


def test_a_fused_llama_uses_the_one_pass_norm_rotation_and_swiglu_but_not_the_batch_invariant_set():
    """The kernel set decides, once: the fused set hands ops its one-pass kernels, the reference and
    the batch-invariant sets none (ops' own, the values the batch-invariant set promises)."""
    from minillm.kernels import elementwise
    ref, fused = pair("llama", "float32")
    inv = build("llama", "float32", "batch-invariant")
    K = fused.kernel_set
    assert (K.norm_kernel, K.rope_kernel, K.swiglu_kernel) == (elementwise.rms_norm, elementwise.rope, elementwise.swiglu)
    for m in (ref, inv):
        assert (m.kernel_set.norm_kernel, m.kernel_set.rope_kernel, m.kernel_set.swiglu_kernel) == (None, None, None)
    calls = []
    real = elementwise.rms_norm
    try:                                                     # the fused model's step really calls the kernel
        elementwise.rms_norm = lambda *a: calls.append(1) or real(*a)
        object.__setattr__(K, "norm_kernel", elementwise.rms_norm)
        fused.prefill([1, 2, 3])
    finally:
        object.__setattr__(K, "norm_kernel", real)
        elementwise.rms_norm = real
    assert len(calls) == 2 * LLAMA_CFG.n_layer + 1             # two norms a block, and the final one


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_decode_past_the_one_thread_kernels_keys_equals_numpy(family):
    """Decode steps at 250-270 keys: the one-thread kernel up to SHORT_DECODE, then the split one over
    the cache's rows as pages, each step's logits the NumPy model's."""
    from minillm.kernels import products
    cfg = (GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=300, vocab_size=96) if family == "gpt2" else
           LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, head_dim=16, n_embd=64, n_ctx=300, vocab_size=96, ffn=64))
    make = (lambda k: minillm.GPT2(cfg, gpt2.random_params(cfg, 0, std=0.1), Target.resolve(kernels=k))) if family == "gpt2" \
        else (lambda k: llama.Llama(cfg, llama.random_params(cfg, 0, std=0.1), Target.resolve(kernels=k)))
    ref, fused = make("numpy"), make("fused")
    ids = np.random.default_rng(1).integers(0, 96, 270)
    start = products.SHORT_DECODE - 6
    _, c_ref = ref.prefill(ids[:start])
    _, c_fused = fused.prefill(ids[:start])
    for t in ids[start:]:
        assert_close(fused.decode_step(int(t), c_fused), ref.decode_step(int(t), c_ref), f"{family} at {c_ref.length}")


def test_an_int8_kv_cache_with_fused_kernels_reads_through_read():
    """The int8 cache widens on read: fused attention takes `read`'s arrays (read_rows falls back) and
    gives the NumPy model's logits over the same int8 cache."""
    from minillm.cache.contiguous import KVCache
    ref, fused = pair("llama", "float32")
    ids = np.random.default_rng(2).integers(0, 96, 12)
    c_ref, c_fused = KVCache(ref.config, kv_dtype="int8"), KVCache(fused.config, kv_dtype="int8")
    assert_close(fused.prefill(ids[:8], c_fused)[0], ref.prefill(ids[:8], c_ref)[0], "int8 prefill")
    for t in ids[8:]:
        assert_close(fused.decode_step(int(t), c_fused), ref.decode_step(int(t), c_ref), "int8 decode")


def test_a_fused_gpt2_uses_the_one_pass_layer_norm_and_gelu_but_not_the_batch_invariant_set():
    """GPT-2's block asks its kernel set for its norm and activation, as Llama's does: the fused set's
    kernels run in its step; the reference and the batch-invariant sets use ops' own."""
    from minillm.kernels import elementwise
    ref, fused = pair("gpt2", "float32")
    inv = build("gpt2", "float32", "batch-invariant")
    K = fused.kernel_set
    assert (K.layer_norm_kernel, K.gelu_kernel) == (elementwise.layer_norm, elementwise.gelu)
    for m in (ref, inv):
        assert (m.kernel_set.layer_norm_kernel, m.kernel_set.gelu_kernel) == (None, None)
    calls = {"norm": 0, "gelu": 0}
    real_norm, real_gelu = K.layer_norm_kernel, K.gelu_kernel

    def norm(*a):
        calls["norm"] += 1
        return real_norm(*a)

    def gelu(*a):
        calls["gelu"] += 1
        return real_gelu(*a)
    try:
        object.__setattr__(K, "layer_norm_kernel", norm)
        object.__setattr__(K, "gelu_kernel", gelu)
        fused.prefill([1, 2, 3])
    finally:
        object.__setattr__(K, "layer_norm_kernel", real_norm)
        object.__setattr__(K, "gelu_kernel", real_gelu)
    assert calls == {"norm": 2 * GPT2_CFG.n_layer + 1, "gelu": GPT2_CFG.n_layer}
