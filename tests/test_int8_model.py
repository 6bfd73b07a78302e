"""The integer kernel set through whole models (kernels="int8"), GPT-2 and a Llama (grouped queries),
Q8_0, Q4_0 and Q4_1: it holds integer weights; its logits, prefill and decode, are bit for bit those
of the same model with every product computed by the NumPy reference (kernels/int8.py); batched ==
alone bit for bit in a decode step (the products are row by row, and the set's paged decode splits
keys in fixed chunks); cached == naive and paged == contiguous within ROUND_TOL; a step's meter
record equals the closed forms of its integer products; the default per weight format and CPU.

Why not float32 rounding's bound for cached == naive: the cached and naive paths attend in different
orders (as the fused set's do), and a product rounds its input to int8, so an input that moves by one
rounding and sits within it of a half step lands on the other integer: the product then moves by
d_x·Σ|w| of that block, a step of the rounding, not of float32. ROUND_TOL = 5% of the logits' scale
leaves room for a few such steps through two layers; a wrongly wired cache (one key too few, the
wrong position) moves logits by their own scale.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm import kernels, meter
from minillm.cache.paged import PagedKVPool
from minillm.kernels import int8
from minillm.models import gpt2, kernel_sets, llama
from minillm.models.gpt2 import GPT2Config
from minillm.models.int8 import Int8Quant
from minillm.models.llama import LlamaConfig
from minillm.models.quant import QK, QuantMatrix
from minillm.models.target import Target

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"numba kernels: {kernels.status().reason}")

ROUND_TOL = 0.05     # of the logits' scale (see above)
GPT2_CFG = GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=400, vocab_size=96)
LLAMA_CFG = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, head_dim=16, n_embd=64, n_ctx=400, vocab_size=96, ffn=64)
FAMILIES = st.sampled_from(["gpt2", "llama"])
WEIGHTS = st.sampled_from(["q8_0", "q4_0", "q4_1"])


def build(family: str, weights: str, kernels_: str, seed: int = 0):
    t = Target.resolve(weights=weights, kernels=kernels_)
    if family == "gpt2":
        return minillm.GPT2(GPT2_CFG, gpt2.random_params(GPT2_CFG, seed, std=0.1), t)
    return llama.Llama(LLAMA_CFG, llama.random_params(LLAMA_CFG, seed, std=0.1), t)


class ReferenceInt8(Int8Quant):
    """An integer weight whose product is the NumPy reference (kernels/int8.py)."""

    def matmul(self, x):
        return int8.matmul_ref(self.planes, x)


def reference(family: str, weights: str, seed: int = 0):
    """The same int8 model (same weights, same attention and elementwise kernels), every product
    computed by the integer reference."""
    model = build(family, weights, "int8", seed)
    mats = list(model.matrices(head=True))
    for w in mats:
        w.__class__ = ReferenceInt8
    assert mats
    return model


def assert_close(got, want, where, tol=ROUND_TOL):
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    assert err <= tol * scale, f"{where}: max |difference| = {err:.3g}, over {tol} x the logits' scale {scale:.3g}"


def test_int8_models_hold_integer_weights_and_say_so():
    model = build("llama", "q4_1", "int8")
    mats = list(model.matrices(head=True))
    assert mats and all(isinstance(w, Int8Quant) for w in mats)
    assert model.kernels == "int8" and int8.describe() in model.kernel_set.about
    floats = build("gpt2", "float32", "int8")                       # float weights: the fused set's
    from minillm.models.fused import FusedDense
    assert all(isinstance(w, FusedDense) for w in floats.matrices(head=False))


@settings(max_examples=10, deadline=None)
@given(FAMILIES, WEIGHTS, st.integers(1, 40), st.integers(1, 5), st.integers(0, 2**16))
def test_every_product_is_the_integer_reference_bit_for_bit(family, weights, P, n, seed):
    ref, model = reference(family, weights, seed % 3), build(family, weights, "int8", seed % 3)
    ids = np.random.default_rng(seed).integers(0, 96, P + n)
    assert np.array_equal(model.forward(ids), ref.forward(ids))
    (got, cache), (want, rcache) = model.prefill(ids[:P]), ref.prefill(ids[:P])
    assert np.array_equal(got, want)
    for i in range(P, P + n):
        assert np.array_equal(model.decode_step(int(ids[i]), cache), ref.decode_step(int(ids[i]), rcache))


@settings(max_examples=10, deadline=None)
@given(FAMILIES, WEIGHTS, st.integers(1, 40), st.integers(1, 5), st.integers(0, 2**16))
def test_cached_equals_naive(family, weights, P, n, seed):
    model = build(family, weights, "int8", seed % 3)
    ids = np.random.default_rng(seed).integers(0, 96, P + n)
    want = model.forward(ids)                                         # [P+n, V], naive
    logits, cache = model.prefill(ids[:P])
    assert_close(logits, want[P - 1], "prefill")
    for i in range(P, P + n):
        assert_close(model.decode_step(int(ids[i]), cache), want[i], f"decode at {i}")


def prefilled(model, pool, prompt):
    """A new sequence of `pool` holding `prompt`, with room for one more token."""
    c = pool.sequence()
    model.prefill(prompt, c)
    c.reserve(1)
    return c


@settings(max_examples=10, deadline=None)
@given(FAMILIES, WEIGHTS, st.lists(st.integers(1, 390), min_size=2, max_size=5), st.sampled_from([1, 4, 16]),
       st.integers(0, 2**16))
def test_batched_equals_alone_bit_for_bit(family, weights, lengths, bs, seed):
    """B sequences of a paged pool decode one token each in one step; each gives the bits it gives
    decoded alone in a pool of its own (any lengths: past the 256 keys where the fused set's split
    would follow the batch)."""
    model = build(family, weights, "int8", seed % 3)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 96, p) for p in lengths]
    nxt = [int(t) for t in rng.integers(0, 96, len(lengths))]
    pool = PagedKVPool(model.config, sum(-(-(p + 1) // bs) for p in lengths) + 3, bs)
    caches = [prefilled(model, pool, p) for p in prompts]
    batched = model.step([(np.array([t]), c) for t, c in zip(nxt, caches)])
    for p, t, got in zip(prompts, nxt, batched):
        own = PagedKVPool(model.config, -(-(p.size + 1) // bs) + 1, bs)
        (alone,) = model.step([(np.array([t]), prefilled(model, own, p))])
        assert np.array_equal(got, alone), f"sequence of {p.size}"


@settings(max_examples=8, deadline=None)
@given(FAMILIES, WEIGHTS, st.integers(2, 60), st.sampled_from([1, 3, 16]), st.integers(0, 2**16))
def test_paged_equals_contiguous(family, weights, P, bs, seed):
    """One sequence whose blocks are scattered in a pool, prefilled in two chunks and decoded: the
    logits of the same model over a contiguous cache."""
    model = build(family, weights, "int8", seed % 3)
    ids = np.random.default_rng(seed).integers(0, 96, P + 4)
    pool = PagedKVPool(model.config, 2 * (-(-(P + 4) // bs)) + 2, bs)
    mine, other = pool.sequence(), pool.sequence()
    for k in range(1, -(-(P + 4) // bs) + 1):
        mine.reserve(k * bs)
        other.reserve(k * bs)
    half = P // 2
    contiguous = model.new_cache()
    for part in (ids[:half], ids[half:P]):
        assert_close(model.prefill(part, mine)[0], model.prefill(part, contiguous)[0], "paged prefill")
    for t in ids[P:]:
        assert_close(model.decode_step(int(t), mine), model.decode_step(int(t), contiguous), "paged decode")


def _counted_blocks(monkeypatch) -> list:
    """Steps whose blocks ran in one compiled call (kernels/_block.py's decode_layers), counted."""
    from minillm.kernels import _block
    calls, real = [], _block.decode_layers
    monkeypatch.setattr(_block, "decode_layers", lambda *a: (calls.append(1), real(*a))[1])
    return calls


@settings(max_examples=10, deadline=None)
@given(WEIGHTS, st.integers(1, 300), st.integers(1, 4), st.integers(0, 2**16))
def test_a_compiled_block_is_its_operations_bit_for_bit(weights, P, n, seed):
    """One sequence's decode over a contiguous cache runs its blocks in one compiled call (models/int8.py's
    compiled_blocks); under a meter the step runs the operations one by one. The same logits and the
    same cache rows, bit for bit, before and past the attention's 256-key chunk."""
    with pytest.MonkeyPatch.context() as mp:
        calls = _counted_blocks(mp)
        model = build("llama", weights, "int8", seed % 3)
        ids = np.random.default_rng(seed).integers(0, 96, P + n)
        (_, fast), (_, slow) = model.prefill(ids[:P]), model.prefill(ids[:P])
        calls.clear()                                   # (a one-token prompt is such a step too)
        for t in ids[P:]:
            got = model.decode_step(int(t), fast)
            with meter.Meter():
                want = model.decode_step(int(t), slow)
            assert np.array_equal(got, want)
        assert len(calls) == n, "each decode step ran its blocks in one call"
        for a, b in ((fast.k, slow.k), (fast.v, slow.v)):
            assert np.array_equal(a[:, :, :P + n], b[:, :, :P + n])


@settings(max_examples=8, deadline=None)
@given(WEIGHTS, st.lists(st.integers(1, 300), min_size=1, max_size=4), st.sampled_from([1, 16]),
       st.integers(0, 2**16))
def test_a_compiled_batch_step_is_its_operations_bit_for_bit(weights, lengths, bs, seed):
    """B sequences of a paged pool decoding together (B = 1: one sequence read in place through its
    table): the compiled blocks and the operations (under a meter) give the same logits and write the
    same pool, bit for bit."""
    with pytest.MonkeyPatch.context() as mp:
        calls = _counted_blocks(mp)
        model = build("llama", weights, "int8", seed % 3)
        rng = np.random.default_rng(seed)
        prompts = [rng.integers(0, 96, p) for p in lengths]
        nxt = [np.array([t]) for t in rng.integers(0, 96, len(lengths))]
        pools, steps = [], []
        for metered in (False, True):
            pool = PagedKVPool(model.config, sum(-(-(p + 2) // bs) for p in lengths) + 2, bs)
            caches = [prefilled(model, pool, p) for p in prompts]
            calls.clear()
            with meter.Meter() if metered else contextlib.nullcontext():
                steps.append(model.step(list(zip(nxt, caches))))
            assert len(calls) == (0 if metered else 1)
            pools.append(pool)
        for got, want in zip(*steps):
            assert np.array_equal(got, want)
        assert np.array_equal(pools[0].k, pools[1].k) and np.array_equal(pools[0].v, pools[1].v)


def test_a_block_runs_its_operations_where_the_compiled_block_is_not_that_block(monkeypatch):
    """Not taken under a meter, for a prompt, with per-head norms (Qwen3), or with a product that is not
    the integer kernel's own (the reference's): the operations run, as written."""
    calls = _counted_blocks(monkeypatch)
    model = build("llama", "q4_1", "int8")
    _, cache = model.prefill(np.arange(5))                          # a prompt: the operations
    with meter.Meter():
        model.decode_step(3, cache)
    qwen3 = llama.Llama(LlamaConfig(**{**LLAMA_CFG.__dict__, "arch": "qwen3", "qk_norm": True}),
                        llama.random_params(LlamaConfig(**{**LLAMA_CFG.__dict__, "arch": "qwen3", "qk_norm": True}),
                                            0, std=0.1), Target.resolve(weights="q4_1", kernels="int8"))
    qwen3.decode_step(3, qwen3.prefill(np.arange(5))[1])
    ref = reference("llama", "q8_0")
    ref.decode_step(3, ref.prefill(np.arange(5))[1])
    assert calls == []
    model.decode_step(3, cache)                                      # and the plain case takes it
    assert len(calls) == 1
    from minillm.models.int8 import runs_compiled_blocks             # what `bench` says of its meter line
    assert runs_compiled_blocks(model) and not runs_compiled_blocks(qwen3) and not runs_compiled_blocks(ref)
    assert not runs_compiled_blocks(build("llama", "float32", "int8")) and not runs_compiled_blocks(
        build("llama", "q4_1", "fused")) and not runs_compiled_blocks(build("gpt2", "q4_1", "int8"))


@pytest.mark.parametrize("weights", ["q8_0", "q4_0", "q4_1"])
def test_the_compiled_step_keeps_each_products_bytes_once(weights):
    """The compiled step stacks the blocks' products, a layer a row; each weight's planes (its values,
    scales and minimums) become its row of the stack (views, no second copy, no other array kept),
    its values and products unchanged."""
    from minillm.models.int8 import _PRODUCTS
    model = build("llama", weights, "int8")
    rng = np.random.default_rng(0)
    weights_of = [[p[n] for n in _PRODUCTS] for p in model.blocks]
    xs = {w.shape[1]: rng.standard_normal((3, w.shape[1])).astype(np.float32) for ws in weights_of for w in ws}
    before = [[(w.dequantize(), w.matmul(xs[w.shape[1]])) for w in ws] for ws in weights_of]
    model.decode_step(3, model.prefill(np.arange(4))[1])
    ((first, n, _, stacked),) = model._compiled_params
    assert (first, n) == (0, LLAMA_CFG.n_layer)
    for layer, ws in enumerate(weights_of):
        for w, planes, (values, y) in zip(ws, stacked[2:], before[layer]):
            assert all(np.shares_memory(a, s) for a, s in zip(w.planes, planes) if a.size)   # (Q4_0: no minimums)
            assert not any(isinstance(a, np.ndarray) for a in vars(w).values())   # no other copy of d, m, q
            assert np.array_equal(w.dequantize(), values) and np.array_equal(w.matmul(xs[w.shape[1]]), y)


def test_the_compiled_block_leaves_other_steps_to_their_operations():
    """Steps the compiled block does not take run as before: a one-token forward (its pass-through
    cache), a static decode step (its plan has no sequences), and a cache of another model's shape,
    which the operations refuse in one line where the block would have written past its rows."""
    from minillm.engine.static import StaticDecode
    model = build("llama", "q4_1", "int8")
    assert np.array_equal(model.forward(np.array([5])), reference("llama", "q4_1").forward(np.array([5])))
    sd = StaticDecode(model, batch=2, context=16, block_size=4)
    first = sd.start([[1, 2, 3], [4, 5]])
    got = [[t] for t in first]
    for _ in range(3):
        for row, t in zip(got, sd.step()):
            row.append(t)
    assert got == [minillm.generate(model, p, 4) for p in ([1, 2, 3], [4, 5])]
    sd.close()
    narrow = llama.Llama(LlamaConfig(**{**LLAMA_CFG.__dict__, "n_kv_head": 1}),
                         llama.random_params(LlamaConfig(**{**LLAMA_CFG.__dict__, "n_kv_head": 1}), 0, std=0.1),
                         Target.resolve(weights="q4_1", kernels="int8"))
    _, other = narrow.prefill(np.arange(4))                         # 1 KV head where the model has 2
    other.reserve(1)
    with pytest.raises(ValueError):
        model.step([(np.array([3]), other)])


def test_the_compiled_halves_are_typed_by_the_kernels_they_link():
    """numba keeps a compiled function on disk until its own file changes: the halves' first argument
    is typed with a hash of the files whose kernels they link in, so a new version of those compiles
    them again."""
    import hashlib
    from pathlib import Path

    import numba

    from minillm.kernels import _block, _exact, _int8, _numba
    want = hashlib.sha1(b"".join(Path(m.__file__).read_bytes() for m in (_int8, _numba, _exact))).hexdigest()[:16]
    assert _block.SOURCES == want and want in numba.typeof(_block.isa("generic")).name


def product_forms(w, T: int) -> dict:
    """One integer product's closed forms over T rows, a weight of R rows of nb blocks: weights its
    stored bytes; scratch x's rounded copy, 2·T·(C + 12·nb) bytes; FLOPs 2·T·R·C multiply-adds plus
    7·T·C + 2·T·nb + ceil(T/32)·(R·nb·(1 + Q4_1) + Q4·R·C) + T·R·nb·(4 + Q4_0 + 2·Q4_1)."""
    R, C = w.shape
    nb = C // QK
    q41, q40, q4 = w.fmt.name == "q4_1", w.fmt.name == "q4_0", w.fmt.bits == 4
    flops = (2 * T * R * C + 7 * T * C + 2 * T * nb + -(-T // 32) * (R * nb * (1 + q41) + q4 * R * C)
             + T * R * nb * (4 + q40 + 2 * q41))
    return {"weights": w.q.nbytes + w.d.nbytes + (w.m.nbytes if w.m is not None else 0),
            "scratch": 2 * T * (C + 12 * nb), "flops": flops}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("weights", ["q8_0", "q4_0", "q4_1"])
@pytest.mark.parametrize("T", [1, 37])
def test_a_steps_integer_products_match_their_closed_forms(family, weights, T):
    """A prefill of T tokens: the blocks' products over T rows, the LM head over the last row."""
    model = build(family, weights, "int8")
    with meter.Meter() as m:
        model.prefill(np.random.default_rng(2).integers(0, 96, T))
    (r,) = m.steps
    blocks = [product_forms(w, T) for w in model.matrices(head=False)]
    head = product_forms(model.head_w, 1)
    biases = T * sum(w.shape[0] for w in model.matrices(head=False)) if family == "gpt2" else 0
    lin, lm = r.ops["linear"], r.ops["lm_head"]
    assert lin["flops"] == sum(b["flops"] for b in blocks) + biases
    assert lin["scratch"] == sum(b["scratch"] for b in blocks)
    assert lm["flops"] == head["flops"] and lm["scratch"] == head["scratch"]
    assert r.scratch == lin["scratch"] + lm["scratch"]
    assert r.bytes["weights"] >= sum(b["weights"] for b in blocks) + head["weights"]


def test_the_default_is_int8_for_quantized_weights_where_it_measured_faster(monkeypatch):
    monkeypatch.delenv(kernel_sets.ENV, raising=False)
    for fmt in ("q8_0", "q4_0", "q4_1"):
        want = "int8" if int8.faster_than_fused(fmt) else "fused"
        assert kernel_sets.default(True, "float32", fmt) == want
    assert kernel_sets.default(True, "float32", "float32") == "fused"
    assert kernel_sets.default(False, "float16", "float32") == "numpy"
    assert int8.faster_than_fused("q8_0", "avx512-vnni") and int8.faster_than_fused("q4_1", "avx2")
    assert not int8.faster_than_fused("q8_0", "avx2") and not int8.faster_than_fused("q4_0", "generic")
