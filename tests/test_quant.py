"""Quantized weights (models/quant.py): the formats as GGUF defines them, the tiled product, the
meter's closed forms, and the model's invariants with quantized weights.

References: the `gguf` package (llama.cpp's own Python library) quantizes and dequantizes Q8_0,
Q4_0 and Q4_1 in NumPy, bit-exact with ggml's C reference for Q8_0; ours must give the same bytes
and the same floats.

Tolerances. The product `x @ dequantize(W)^T` is the same sum in another order (tile by tile,
block sums first on the decode path): float32 rounding, bounded by 1e-5 times |x| @ the absolute
terms the kernel sums (|W|, and for Q4 the stored d·q and m before the -8 and minimum are folded
in; a sum of up to a few hundred terms, each off by 2^-24 relative: ~1e-6 at most). The model properties use
float64 compute on quantized weights, so they keep test_properties' 1e-9 of the logit scale.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.models.target import Target
from minillm import meter
from minillm.models.gpt2 import GPT2Config
from minillm.errors import MiniLLMError, WeightsError
from minillm.models import quant
from minillm.models.quant import QK, QuantMatrix, f16_to_f32

from test_properties import REL_TOL, random_model

GG = {"q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0, "q4_1": GGMLQuantizationType.Q4_1}
FMTS = tuple(GG)


@st.composite
def matrices(draw, max_rows: int = 9, max_blocks: int = 5):
    """A float32 [R, C] matrix with C a multiple of 32: rough values, whole zero blocks, one
    block with a single large value, values of one sign only."""
    R = draw(st.integers(1, max_rows))
    nb = draw(st.integers(1, max_blocks))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-3, 0.02, 1.0, 30.0]))
    w = (rng.standard_normal((R, nb * QK)) * scale).astype(np.float32)
    kind = draw(st.sampled_from(["plain", "zeros", "spike", "positive"]))
    if kind == "zeros":
        w[rng.integers(R), :QK] = 0
    elif kind == "spike":
        w[rng.integers(R), rng.integers(nb * QK)] = 50 * scale
    elif kind == "positive":
        w = np.abs(w)
    return w


# -- the formats --------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(matrices(), st.sampled_from(FMTS))
def test_quantize_gives_gguf_bytes_and_dequantize_its_floats(w, fmt):
    ref = quants.quantize(w, GG[fmt])                        # uint8 [R, nb * block bytes]
    qm = QuantMatrix.quantize(w, fmt)
    assert np.array_equal(qm.to_gguf_blocks(), ref)
    assert qm.nbytes == ref.nbytes == w.size // QK * GGML_QUANT_SIZES[GG[fmt]][1]
    deq = quants.dequantize(ref, GG[fmt])
    assert np.array_equal(qm.dequantize(), deq)
    back = QuantMatrix.from_gguf_blocks(ref, fmt, w.shape)
    assert np.array_equal(back.to_gguf_blocks(), ref) and np.array_equal(back.dequantize(), deq)
    ids = np.array([w.shape[0] - 1, 0, w.shape[0] - 1])
    assert np.array_equal(qm.rows(ids), deq[ids])


def round_trip_bound(w: np.ndarray, fmt: str) -> np.ndarray:
    """Per value, the most a quantize -> dequantize round trip may move it, from the format's
    definition (d and m are stored in float16: relative rounding 2^-11, plus 2^-24 absolute for
    float16's subnormals; then float32 arithmetic)."""
    b = w.reshape(-1, QK).astype(np.float64)
    amax = np.abs(b).max(axis=1, keepdims=True)
    h = 2.0 ** -11
    if fmt == "q8_0":        # q = round(w/d), d = amax/127: half a step, + |q| ≤ 127 times d's rounding
        d = amax / 127
        bound = d / 2 + 127 * (d * h + 2.0 ** -24)
    elif fmt == "q4_0":      # d = -max/8: q - 8 covers -8..7; the value opposite the max loses one step
        d = amax / 8
        bound = d + 8 * (d * h + 2.0 ** -24)
    else:                    # d = (max - min)/15, q = round((w - min)/d): half a step, + m's rounding
        lo, hi = b.min(axis=1, keepdims=True), b.max(axis=1, keepdims=True)
        d = (hi - lo) / 15
        bound = d / 2 + 15 * (d * h + 2.0 ** -24) + np.abs(lo) * h + 2.0 ** -24
    return np.broadcast_to(bound * (1 + 1e-5) + 1e-30, b.shape).reshape(w.shape)


@settings(max_examples=60, deadline=None)
@given(matrices(), st.sampled_from(FMTS))
def test_round_trip_within_the_formats_bound(w, fmt):
    err = np.abs(QuantMatrix.quantize(w, fmt).dequantize().astype(np.float64) - w)
    bound = round_trip_bound(w, fmt)
    assert (err <= bound).all(), f"worst excess {(err - bound).max()} at {np.unravel_index((err - bound).argmax(), w.shape)}"


def test_round_trip_bound_is_tight_enough_to_catch_a_wrong_scale():
    """The bound is no blanket: a Q8_0 scale one step off (amax/126) breaks it."""
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    qm = QuantMatrix.quantize(w, "q8_0")
    qm.d = (f16_to_f32(qm.d) * np.float32(127 / 126)).astype(np.float16)
    assert (np.abs(qm.dequantize() - w) > round_trip_bound(w, "q8_0")).any()


def test_f16_to_f32_is_exact_for_every_finite_half():
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h = h[np.isfinite(h)]
    assert np.array_equal(f16_to_f32(h).view(np.uint32), h.astype(np.float32).view(np.uint32))


def test_bad_shapes_and_names_say_what_to_do():
    with pytest.raises(WeightsError, match="multiple of 32"):
        QuantMatrix.quantize(np.zeros((3, 40), np.float32), "q8_0")
    with pytest.raises(WeightsError, match="q8_0, q4_0, q4_1"):
        QuantMatrix.quantize(np.zeros((3, 32), np.float32), "q3_k")
    with pytest.raises(MiniLLMError, match="weights="):
        minillm.load("random-tiny", weights="int3")


# -- the product ----------------------------------------------------------------------------------

@settings(max_examples=80, deadline=None)
@given(matrices(max_rows=40), st.sampled_from(FMTS), st.integers(1, 20), st.integers(32, 2048),
       st.sampled_from([np.float32, np.float64]), st.integers(0, 2**16))
def test_the_tiled_product_is_x_times_the_dequantized_matrix(w, fmt, T, tile_bytes, dtype, seed):
    """Random shapes, decode (T ≤ DECODE_ROWS) and prefill rows, tiles from one row to all rows
    (the last tile partial), float32 and float64."""
    qm = QuantMatrix.quantize(w, fmt)
    x = np.random.default_rng(seed).standard_normal((T, w.shape[1])).astype(dtype)
    old = quant.TILE_BYTES
    quant.TILE_BYTES = tile_bytes
    try:
        got = qm.matmul(x)
    finally:
        quant.TILE_BYTES = old
    deq = qm.dequantize(np.float64)
    want = x.astype(np.float64) @ deq.T
    # The terms the kernel rounds: d·q (q up to 15 for Q4: the sum before the -8 and the
    # minimum) and m, not only d·(q - 8): the same sum, grouped as the format stores it.
    stored = np.repeat(np.abs(f16_to_f32(qm.d)).astype(np.float64), QK, axis=1) * (16 if fmt != "q8_0" else 0)
    if qm.m is not None:
        stored += np.repeat(np.abs(f16_to_f32(qm.m)).astype(np.float64), QK, axis=1)
    scale = np.abs(x).astype(np.float64) @ (np.abs(deq) + stored).T
    eps = 1e-5 if dtype == np.float32 else 1e-13
    assert got.dtype == dtype and got.shape == (T, w.shape[0])
    assert (np.abs(got - want) <= eps * scale + 1e-30).all()


def test_the_product_check_catches_a_swapped_nibble_order():
    """Break the Q4 planes on purpose (high and low nibbles swapped): the product must notice."""
    w = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    qm = QuantMatrix.quantize(w, "q4_0")
    x = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)
    good = qm.matmul(x)
    qm.q = (qm.q >> 4) | (qm.q << 4)
    assert np.abs(qm.matmul(x) - good).max() > 1e-2


# -- the meter ----------------------------------------------------------------------------------

def block_bytes(fmt: str) -> int:
    return GGML_QUANT_SIZES[GG[fmt]][1]          # from the gguf package: Q8_0 34, Q4_0 18, Q4_1 20


def quant_closed_forms(c: GPT2Config, fmt: str, b: int, tokens: int, lm_rows: int = 1) -> dict:
    """Weights and scratch of one step on a quantized GPT-2 (float compute of b bytes):

        weights  = (12·L·d² + V·d)/32 · block bytes        the quantized matrices, scales included
                 + (13·L·d + 2·d)·b                         biases and layer norms, float
                 + tokens·(d/32·block bytes + d·b)          the gathered rows of wte and wpe
        scratch  = 2·b·(12·L·d² + V·d)·(1 + s/32)           each widened value and each of its s
                                                            float16 numbers (Q4_1: 2) written, read
    """
    L, d, V = c.n_layer, c.n_embd, c.vocab_size
    bb, s = block_bytes(fmt), 2 if fmt == "q4_1" else 1
    mats = 12 * L * d * d + V * d
    return {"weights": mats // QK * bb + (13 * L * d + 2 * d) * b + tokens * (d // QK * bb + d * b),
            "scratch": 2 * b * (mats + s * mats // QK),
            "matmul": tokens * 24 * L * d * d + lm_rows * 2 * d * V}


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.sampled_from([32, 64]), st.integers(40, 200),
       st.sampled_from(FMTS), st.sampled_from([np.float32, np.float64]), st.integers(1, 12), st.integers(0, 99))
def test_the_meter_counts_quantized_bytes_exactly(L, H, d, V, fmt, dtype, P, seed):
    config = GPT2Config(n_layer=L, n_head=H, n_embd=d, n_ctx=32, vocab_size=V)
    float_model = random_model(config, seed, dtype=dtype)
    model = minillm.GPT2(config, float_model.params, Target.numpy(dtype, fmt))
    b = np.dtype(dtype).itemsize
    prompt = np.arange(P) % V
    with meter.Meter() as m:
        _, cache = model.prefill(prompt)
        model.decode_step(1, cache)
    prefill, decode = m.steps
    for r, tokens in ((prefill, P), (decode, 1)):
        want = quant_closed_forms(config, fmt, b, tokens)
        got = {"weights": r.bytes["weights"], "scratch": r.scratch, "matmul": r.flops["matmul"]}
        assert got == want, (r.kind, got, want)
        assert r.flops["dequant"] > 0 and r.bytes["kv_read"] > 0
    with meter.Meter() as m:                                   # float weights: no scratch, no dequant
        float_model.decode_step(1, float_model.prefill(prompt)[1])
    assert m.steps[0].scratch == 0 and m.steps[0].flops["dequant"] == 0


# -- the model's invariants, quantized ----------------------------------------------------------

@settings(max_examples=12, deadline=None)
@given(st.sampled_from([(32, 1), (64, 2)]), st.sampled_from(FMTS), st.integers(1, 20), st.integers(1, 8),
       st.integers(0, 999))
def test_cached_equals_naive_with_quantized_weights(shape, fmt, P, n, seed):
    d, H = shape
    config = GPT2Config(n_layer=2, n_head=H, n_embd=d, n_ctx=32, vocab_size=97)
    model = minillm.GPT2(config, random_model(config, seed, std=0.3).params, Target.numpy(np.float64, fmt))
    prompt = list(np.random.default_rng(seed).integers(0, 97, P))
    assert minillm.generate(model, prompt, n) == minillm.generate(model, prompt, n, kv_cache=False)
    ids = np.array(prompt)
    full = model.forward(ids)
    logits, cache = model.prefill(ids[:1])
    for t, tok in enumerate(ids[1:], 1):
        logits = model.decode_step(int(tok), cache)
        np.testing.assert_allclose(logits, full[t], rtol=0, atol=REL_TOL * max(1.0, np.abs(full[t]).max()))


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(FMTS), st.lists(st.tuples(st.integers(1, 12), st.integers(1, 6)), min_size=2, max_size=5),
       st.sampled_from(["contiguous", "paged"]), st.integers(0, 999))
def test_batched_equals_alone_with_quantized_weights(fmt, seqs, cache, seed):
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=32, vocab_size=97)
    model = minillm.GPT2(config, random_model(config, seed, std=0.3).params, Target.numpy(np.float64, fmt))
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(0, 97, P)) for P, _ in seqs]
    limits = [n for _, n in seqs]
    got = minillm.generate_batch(model, prompts, limits, cache=cache)
    assert got == [minillm.generate(model, p, n) for p, n in zip(prompts, limits)]


@pytest.mark.parametrize("source", ["small", "large"])
@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_bundled_models_quantized_cached_naive_batched(source, fmt):
    """The bundled GPT-2s, float32 compute on quantized weights: the same greedy tokens cached and
    naive, batched and alone; the weights really are the quantized bytes."""
    model = minillm.load(source, weights=fmt)
    full = minillm.load(source)
    assert model.weights == fmt and model.nbytes() < full.nbytes() / (3.5 if fmt == "q8_0" else 6)
    enc = minillm.tokenizer()
    prompts = [enc.encode("ROMEO:"), enc.encode("First Citizen:\nWe are"), enc.encode("O")]
    alone = [minillm.generate(model, p, 12) for p in prompts]
    assert alone[0] == minillm.generate(model, prompts[0], 12, kv_cache=False)
    assert minillm.generate_batch(model, prompts, [12] * 3) == alone


# -- the Llama family, quantized ------------------------------------------------------------------

@st.composite
def llama_configs(draw):
    """Llama/Qwen shapes whose every product is whole blocks of 32 (d, H·hd and F multiples of 32)."""
    from minillm.models.llama import LlamaConfig
    n_kv = draw(st.sampled_from([1, 2]))
    g = draw(st.sampled_from([1, 2]))
    arch = draw(st.sampled_from(["llama", "qwen2", "qwen3"]))
    return LlamaConfig(n_layer=draw(st.integers(1, 2)), n_head=n_kv * g, n_kv_head=n_kv, head_dim=32,
                       n_embd=draw(st.sampled_from([32, 64])), n_ctx=48, vocab_size=97,
                       ffn=draw(st.sampled_from([32, 64])), eps=1e-6, theta=1e4, arch=arch,
                       qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3", tied=draw(st.booleans()))


@settings(max_examples=12, deadline=None)
@given(llama_configs(), st.sampled_from(FMTS), st.integers(0, 999))
def test_llama_quantized_cached_equals_naive_and_batched_equals_alone(c, fmt, seed):
    """Every product and the embedding/head quantized (models/llama.py): the model's float32
    invariants still hold, and the weights it reads are the quantized bytes."""
    from minillm.models.llama import Llama, random_params
    t = random_params(c, seed=seed, std=0.3)
    model, full = Llama(c, t, Target.numpy(weights=fmt)), Llama(c, t)
    assert model.weights == fmt and isinstance(model.wte, QuantMatrix)
    assert all(isinstance(p[k], QuantMatrix) for p in model.blocks for k in Llama.MATRICES)
    assert model.nbytes() < full.nbytes() / 3
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 97, 10)
    logits = model.forward(ids)
    _, cache = model.prefill(ids[:4])
    for i in range(4, 10):
        # float32 compute, as users run it: test_llama's float32 tolerance
        np.testing.assert_allclose(model.decode_step(int(ids[i]), cache), logits[i], rtol=0,
                                   atol=2e-4 * max(1.0, np.abs(logits[i]).max()))
    prompts = [rng.integers(0, 97, n).tolist() for n in (3, 7, 1)]
    alone = [minillm.generate(model, p, 5) for p in prompts]
    assert minillm.generate_batch(model, prompts, 5, cache="paged", block_size=4) == alone
    with meter.Meter() as m:
        model.decode_step(1, cache)
    from minillm.measure.quantization import weights_read_per_step
    assert m.steps[0].bytes["weights"] == weights_read_per_step(model)      # each weight once, one embedding row
    assert m.steps[0].scratch > 0 and m.steps[0].flops["dequant"] > 0


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(FMTS), st.sampled_from([1, 2, 3]), st.integers(1, 3), st.integers(0, 999))
def test_reordering_and_stacking_quantized_rows_is_exact(fmt, heads, hd_halves, seed):
    """llama.cpp's q/k row permutation undone on the blocks, and q|k|v stacked by rows, give the
    same floats as doing it to the dequantized matrices."""
    from minillm.checkpoints.gguf_file import unpermute
    rng = np.random.default_rng(seed)
    w = QuantMatrix.quantize(rng.standard_normal((heads * 2 * hd_halves, 64)).astype(np.float32), fmt)
    np.testing.assert_array_equal(unpermute(w, heads).dequantize(), unpermute(w.dequantize(), heads))
    v = QuantMatrix.quantize(rng.standard_normal((5, 64)).astype(np.float32), fmt)
    np.testing.assert_array_equal(QuantMatrix.stack([w, v]).dequantize(),
                                  np.concatenate([w.dequantize(), v.dequantize()]))
    with pytest.raises(WeightsError, match="different formats"):
        QuantMatrix.stack([w, QuantMatrix.quantize(v.dequantize(), "q8_0" if fmt != "q8_0" else "q4_0")])


# -- the commands ---------------------------------------------------------------------------------

def test_quantize_writes_a_gguf_that_reads_back_as_the_model(tmp_path):
    """`minillm quantize` for real: the file's GPT-2 metadata, tokenizer and tensors, read back with
    the gguf package, are the model's (each quantized matrix the same blocks, dequantized the same)."""
    import gguf
    from test_cli import ok, run, user_error

    out = tmp_path / "small-q4_0.gguf"
    r = ok(run(tmp_path, "quantize", "small", "--format", "q4_0", "--out", out))
    assert "q4_0" in r.stdout and out.is_file() and not list(tmp_path.glob("*.partial"))
    reader = gguf.GGUFReader(str(out))
    field = lambda k: reader.fields[k].contents()                       # noqa: E731
    model = minillm.load("small", weights="q4_0")
    c = model.config
    assert field("general.architecture") == "gpt2" and field("general.file_type") == 2
    assert (field("gpt2.block_count"), field("gpt2.embedding_length"), field("gpt2.attention.head_count"),
            field("gpt2.context_length"), field("gpt2.feed_forward_length")) == (
            c.n_layer, c.n_embd, c.n_head, c.n_ctx, 4 * c.n_embd)
    tokens = field("tokenizer.ggml.tokens")
    assert len(tokens) == 50257 and tokens[50256] == "<|endoftext|>" and tokens[262] == "Ġthe"
    assert len(field("tokenizer.ggml.merges")) == 50000 and field("tokenizer.ggml.merges")[0] == "Ġ t"
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == len(model.params)
    qkv = tensors["blk.1.attn_qkv.weight"]
    assert qkv.tensor_type == gguf.GGMLQuantizationType.Q4_0
    mine = model.params["h.1.attn.c_attn.weight"]
    assert np.array_equal(np.asarray(qkv.data).reshape(mine.shape[0], -1), mine.to_gguf_blocks())
    emb = tensors["token_embd.weight"]
    assert np.array_equal(gguf.quants.dequantize(emb.data, emb.tensor_type), model.wte.dequantize())
    assert tensors["position_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    native = minillm.load(out, weights="native")                        # the file's own Q4_0 blocks
    assert native.weights == "q4_0" and native.nbytes() == model.nbytes()
    ids = np.arange(3, 30)
    assert np.array_equal(native.forward(ids), model.forward(ids))
    assert minillm.load(out).weights == "float32"
    user_error(run(tmp_path, "quantize", "small", "--format", "q4_0", "--out", tmp_path), "directory")
    user_error(run(tmp_path, "quantize", "small", "--out", tmp_path / "no" / "x.gguf"), "does not exist")


def test_weights_option_reaches_generate_and_eval(tmp_path):
    from test_cli import ok, run, user_error

    r = ok(run(tmp_path, "generate", "ROMEO:", "--max-new-tokens", "5", "--weights", "q8_0"))
    assert r.stdout.strip()
    user_error(run(tmp_path, "generate", "ROMEO:", "--weights", "q2"), "weights=")


def test_bench_weights_measures_each_format(tmp_path):
    import json

    from test_cli import ok, run, user_error

    r = ok(run(tmp_path, "bench", "--model", "random-tiny", "--weights", "float32,q8_0,q4_0", "--repeats", "1",
               "--json", timeout=300))
    res = json.loads(r.stdout)
    rows = {row["weights"]: row for row in res["rows"]}
    assert list(rows) == ["float32", "q8_0", "q4_0"]
    f, q8, q4 = rows["float32"], rows["q8_0"], rows["q4_0"]
    assert q4["weight_bytes"] < q8["weight_bytes"] < f["weight_bytes"]
    assert f["scratch_bytes"] == 0 and f["widen_ms"] == 0 and q8["scratch_bytes"] > 0 and q8["widen_ms"] > 0
    for row in rows.values():
        assert row["tok_s"] > 0 and 0 < row["of_ceiling"] and row["ceiling_tok_s"] > 0
    assert res["threads"] and res["blas_kernel"]
    user_error(run(tmp_path, "bench", "--weights", "float32,int3"), "--weights")


def test_a_llama_whose_widths_are_not_whole_blocks_is_one_clear_error():
    from minillm.models.llama import LlamaConfig
    from minillm.errors import WeightsError
    from minillm.models.llama import Llama, random_params
    c = LlamaConfig(n_layer=1, n_head=2, n_kv_head=1, head_dim=24, n_embd=48, n_ctx=16, vocab_size=50, ffn=64,
                    eps=1e-6, theta=1e4, arch="llama", qkv_bias=False, qk_norm=False, tied=True)
    with pytest.raises(WeightsError, match=r"width 48, attention width H·hd 48 not a multiple of 32.*--weights float32"):
        Llama(c, random_params(c), Target.numpy(weights="q8_0"), name="odd")


def test_a_quantized_draft_is_refused_only_when_it_is_the_same_checkpoint():
    """Two loads of one checkpoint are the model itself; another checkpoint of the same shape and format
    may draft (their quantized embeddings differ)."""
    from minillm.models.llama import LlamaConfig
    from minillm.engine.speculative import check_draft_model
    from minillm.errors import MiniLLMError
    from minillm.models.llama import Llama, random_params
    c = LlamaConfig(n_layer=1, n_head=2, n_kv_head=1, head_dim=32, n_embd=64, n_ctx=16, vocab_size=50, ffn=64,
                    eps=1e-6, theta=1e4, arch="llama", qkv_bias=False, qk_norm=False, tied=True)
    q8 = Target.numpy(weights="q8_0")
    a, again = Llama(c, random_params(c, seed=1), q8), Llama(c, random_params(c, seed=1), q8)
    other = Llama(c, random_params(c, seed=2), q8)
    check_draft_model(other, a)
    with pytest.raises(MiniLLMError, match="is the model itself"):
        check_draft_model(again, a)
