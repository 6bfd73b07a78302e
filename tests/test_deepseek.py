"""The DeepSeek-V3 family (models/deepseek.py) against transformers' checkpoints, and its invariants on
random configs (the query low rank or direct, groups, shared experts or none, the router bias, the
rotary layout, biases, a tied head): the two ways to attend (absorbed, decompressed) equal, cached ==
naive, batched == alone, paged == contiguous, chunked prefill == whole prefill, prefix caching; the
router against the paper's rule row by row; the meter's KV bytes, weight bytes and attention FLOPs
against their closed forms; the parameter counts against the published shape."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.checkpoints.llama_load import read_tensors
from minillm.errors import ConfigError
from minillm.measure.experts import PUBLISHED, published_params
from minillm.measure.shapes import kv_bytes_per_token, shape
from minillm.models import deepseek, mla, ops
from minillm.models.deepseek import DeepSeekConfig, DeepSeekV3, random_params
from minillm.models.moe import routes
from minillm.models.target import Target

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = ("w5/deepseekv3-tiny", "deepseekv3-direct-bf16")
ATOL = 1e-4


def load(path, mla_decode="absorbed", kernels="numpy"):
    return minillm.load(path, kernels=kernels, options={"mla_decode": mla_decode})


@pytest.fixture(scope="module", params=NAMES)
def fixture(request):
    path = FIXTURES / request.param
    return path, np.load(path / "expected.npz")


def test_fixture_logits_match_transformers(fixture):
    path, e = fixture
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(load(path).forward(ids), e["logits"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("how", ["no cache", *deepseek.MLA_DECODE, "fused"])
def test_fixture_greedy_matches_transformers(fixture, how):
    """Greedy ids as transformers': without the cache, with it decoding either way, and with the fused
    kernel set's products (its attention stays NumPy's)."""
    path, e = fixture
    model = load(path, "absorbed" if how in ("no cache", "fused") else how, "fused" if how == "fused" else "numpy")
    got = minillm.generate(model, e["input_ids"], len(e["greedy_ids"]), kv_cache=how != "no cache")
    assert got == e["greedy_ids"].tolist()


@pytest.mark.parametrize("mla_decode", deepseek.MLA_DECODE)
def test_fixture_prefill_and_decode_rows(fixture, mla_decode):
    path, e = fixture
    model, P = load(path, mla_decode), len(e["input_ids"])
    logits, cache = model.prefill(e["input_ids"])
    np.testing.assert_allclose(logits, e["logits"][P - 1], rtol=0, atol=ATOL)
    for i, t in enumerate(e["greedy_ids"]):
        np.testing.assert_allclose(model.decode_step(int(t), cache), e["logits"][P + i], rtol=0, atol=ATOL)


def test_fixture_configs_read_as_written():
    a = load(FIXTURES / NAMES[0])
    c = a.config
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == (48, 32, 16, 8, 16)
    assert (c.n_expert, c.top_k, c.n_group, c.topk_group, c.n_shared, c.first_k_dense) == (8, 2, 2, 1, 1, 1)
    assert (c.routed_scale, c.rope_interleave, c.tied, c.attention_bias) == (2.5, True, False, False)
    b = load(FIXTURES / NAMES[1])
    c = b.config
    assert (c.q_lora_rank, c.v_head_dim, c.qk_head_dim, c.rope_interleave, c.tied, c.attention_bias) == \
        (None, 16, 20, False, True, True)
    assert (c.n_shared, c.n_group, c.topk_group, c.norm_topk, c.first_k_dense) == (2, 3, 2, False, 2)
    for model, path in ((a, NAMES[0]), (b, NAMES[1])):
        tensors = read_tensors(FIXTURES / Path(path))
        assert dict(deepseek.manifest(model.config)) == {k: tuple(v.shape) for k, v in tensors.items()}
        assert model.n_params() == model.config.n_params() == sum(v.size for v in tensors.values())


def test_the_published_shape_counts_as_measure_experts_does():
    """DeepSeek-V3's config (the hub's numbers) against measure/experts.py's arithmetic: the same total
    and active parameters but the router biases (E a sparse layer), and 61·576·2 = 70,272 KV bytes a token."""
    s = PUBLISHED["DeepSeek-V3"]
    a = s["mla"]
    c = DeepSeekConfig(n_layer=61, n_head=128, n_embd=7168, n_ctx=163840, vocab_size=129280, ffn=18432,
                       kv_lora_rank=a["kv_lora"], q_lora_rank=a["q_lora"], qk_nope_head_dim=a["nope"],
                       qk_rope_head_dim=a["rope"], v_head_dim=a["v"], n_expert=256, top_k=8, expert_ffn=2048)
    total, active = published_params(s)
    biases = len(c.sparse_layers) * c.n_expert
    assert (c.n_params(), c.active_params()) == (total + biases, active + biases)
    assert c.kv_bytes_per_token(2) == kv_bytes_per_token(shape("deepseek-v3"), 2) == 70_272


def copy_fixture(tmp_path, name=NAMES[0]):
    dst = tmp_path / "ds"
    shutil.copytree(FIXTURES / name, dst)
    return dst


def edit_config(folder, drop=(), **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for k in drop:
        cfg.pop(k)
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, message", [
    (dict(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}), "quantized .fp8"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 40, "rope_theta": 1e4}), "rope scaling 'yarn'"),
    (dict(n_group=3), "8 routed experts do not split into n_group=3"),
    (dict(topk_group=3), "topk_group=3: there are only n_group=2"),
    (dict(num_experts_per_tok=5), "top_k=5 experts but its 1 group"),
    (dict(qk_rope_head_dim=7), "qk_rope_head_dim=7"),
    (dict(n_shared_experts=-1), "n_shared=-1"),
    (dict(topk_method="greedy"), "topk_method='greedy'"),
    (dict(model_type="deepseek_v2"), "model_type 'deepseek_v2' is not supported; minillm runs .*deepseek_v3"),
    (dict(kv_lora_rank="512"), "kv_lora_rank"),
])
def test_bad_configs_get_one_clear_line(tmp_path, changes, message):
    folder = copy_fixture(tmp_path)
    edit_config(folder, **changes)
    with pytest.raises(ConfigError, match=message):
        load(folder)


def test_a_missing_field_is_named(tmp_path):
    folder = copy_fixture(tmp_path)
    edit_config(folder, drop=("kv_lora_rank", "moe_intermediate_size"))
    with pytest.raises(ConfigError, match="missing kv_lora_rank, moe_intermediate_size"):
        load(folder)


# -- random configs ------------------------------------------------------------------------------------

@st.composite
def configs(draw):
    G = draw(st.sampled_from([1, 2, 3]))
    per = draw(st.sampled_from([2, 3]))
    topk_group = draw(st.integers(1, G))
    L = draw(st.integers(1, 3))
    return DeepSeekConfig(
        n_layer=L, n_head=draw(st.sampled_from([1, 2, 3])), n_embd=draw(st.sampled_from([16, 24])), n_ctx=64,
        vocab_size=61, ffn=draw(st.sampled_from([16, 24])), kv_lora_rank=draw(st.sampled_from([8, 12])),
        q_lora_rank=draw(st.sampled_from([None, 8, 20])), qk_nope_head_dim=draw(st.sampled_from([4, 6])),
        qk_rope_head_dim=draw(st.sampled_from([2, 4])), v_head_dim=draw(st.sampled_from([4, 6])),
        n_expert=G * per, top_k=draw(st.integers(1, topk_group * per)), expert_ffn=draw(st.sampled_from([8, 12])),
        n_shared=draw(st.integers(0, 2)), n_group=G, topk_group=topk_group,
        routed_scale=draw(st.sampled_from([1.0, 2.5])), norm_topk=draw(st.booleans()),
        first_k_dense=draw(st.integers(0, L)), eps=1e-6, theta=1e4, rope_interleave=draw(st.booleans()),
        attention_bias=draw(st.booleans()), tied=draw(st.booleans()))


def build(c, dtype=np.float64, seed=0, mla_decode="absorbed", weights="float32", kernels="numpy"):
    target = Target.resolve("cpu", dtype, weights, kernels)
    return DeepSeekV3(c, random_params(c, seed=seed, std=0.3, dtype=np.float64), target, mla_decode=mla_decode)


def decode_logits(model, prompt, tokens):
    """The prompt prefilled, then each token decoded: the logits of every step, [len(tokens) + 1, V]."""
    logits, cache = model.prefill(prompt)
    return np.stack([logits] + [model.decode_step(int(t), cache) for t in tokens])


@settings(max_examples=25)
@given(c=configs(), seed=st.integers(0, 2**16), P=st.integers(1, 6), n=st.integers(1, 5))
def test_absorbed_equals_decompressed(c, seed, P, n):
    """Decoding inside the latent computes what every head's rebuilt K and V compute (float64: to
    rounding), whole model through the cache: any query path, groups, shared experts or none, biases,
    rotary layout, tied head."""
    rng = np.random.default_rng(seed)
    prompt, tokens = rng.integers(0, c.vocab_size, P), rng.integers(0, c.vocab_size, n)
    a = decode_logits(build(c, seed=seed, mla_decode="absorbed"), prompt, tokens)
    b = decode_logits(build(c, seed=seed, mla_decode="decompressed"), prompt, tokens)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)


@settings(max_examples=30)
@given(c=configs(), seed=st.integers(0, 2**16), Tq=st.integers(1, 5), extra=st.integers(0, 6))
def test_absorbed_equals_decompressed_one_layer(c, seed, Tq, extra):
    """The two attention functions on one block's parameters, queries after earlier rows (decode and a
    prompt chunk over a cached prefix)."""
    rng = np.random.default_rng(seed)
    p = build(c, seed=seed).blocks[0]
    Tk = Tq + extra
    q = rng.standard_normal((c.n_head, Tq, c.qk_head_dim))
    rows = rng.standard_normal((1, Tk, c.head_dim))
    a = mla.absorbed(mla.whole_sequence, q, rows, p, c)
    b = mla.decompressed(mla.whole_sequence, q, rows, p, c)
    assert a.shape == b.shape == (c.n_head, Tq, c.v_head_dim)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)


def interleaved_rope(x, positions, theta):
    """The paper's rotation, pairs (2i, 2i + 1) turned by p·θ^(-2i/n) in place. x [..., T, n]."""
    n = x.shape[-1]
    angle = positions[:, None] * theta ** (-np.arange(0, n, 2) / n)          # [T, n/2]
    out = x.copy()
    out[..., 0::2] = x[..., 0::2] * np.cos(angle) - x[..., 1::2] * np.sin(angle)
    out[..., 1::2] = x[..., 1::2] * np.cos(angle) + x[..., 0::2] * np.sin(angle)
    return out


@given(n=st.sampled_from([2, 4, 8, 16]), T=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_deinterleaved_rows_turn_as_the_paper_turns(n, T, seed):
    """ops.rope on the reordered coordinates gives the interleaved rotation's values, reordered the same way."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, T, n))
    pos = rng.integers(0, 500, T)
    cos, sin = ops.rope_tables(pos, n, 1e4, np.float64)
    order = deepseek.deinterleave(n)
    np.testing.assert_allclose(ops.rope(x[..., order], cos, sin), interleaved_rope(x, pos, 1e4)[..., order], atol=1e-12)


# -- the router against the paper's rule ---------------------------------------------------------------

def route_alone(x, router, bias, c):
    """DeepSeek-V3's routing for one row at a time, written from the paper: no arrays shared with the code."""
    tops, weights = [], []
    per = c.n_expert // c.n_group
    for row in x:
        s = [1 / (1 + math.exp(-float(v))) for v in row @ router]
        choice = [s[e] + float(bias[e]) for e in range(c.n_expert)]
        group_score = [sum(sorted(choice[g * per:(g + 1) * per], reverse=True)[:2]) for g in range(c.n_group)]
        open_groups = sorted(range(c.n_group), key=lambda g: (-group_score[g], g))[:c.topk_group]
        allowed = [e for g in open_groups for e in range(g * per, (g + 1) * per)]
        top = sorted(allowed, key=lambda e: (-choice[e], e))[:c.top_k]
        w = [s[e] for e in top]
        total = sum(w) if c.norm_topk else 1.0
        tops.append(top)
        weights.append([c.routed_scale * v / total for v in w])
    return np.array(tops), np.array(weights)


@settings(max_examples=40)
@given(c=configs(), seed=st.integers(0, 2**16), N=st.integers(1, 6))
def test_router_picks_and_weighs_as_the_paper_says(c, seed, N):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, c.n_embd))
    router = rng.standard_normal((c.n_embd, c.n_expert))
    bias = 0.3 * rng.standard_normal(c.n_expert)
    top, w = deepseek.route(x, router, bias, c)
    want_top, want_w = route_alone(x, router, bias, c)
    assert [set(t) for t in top] == [set(t) for t in want_top]
    order = np.argsort(top, axis=-1), np.argsort(want_top, axis=-1)
    np.testing.assert_allclose(np.take_along_axis(w, order[0], -1), np.take_along_axis(want_w, order[1], -1), rtol=1e-12)


def test_the_bias_picks_but_does_not_weigh():
    """A bias large enough to force expert 0 in gets it chosen, with the weight of its own affinity."""
    c = DeepSeekConfig(n_layer=1, n_head=1, n_embd=8, n_ctx=8, vocab_size=8, ffn=8, kv_lora_rank=4, q_lora_rank=None,
                       qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2, n_expert=4, top_k=1, expert_ffn=4,
                       n_group=1, topk_group=1, routed_scale=1.0, norm_topk=False)
    rng = np.random.default_rng(0)
    x, router = rng.standard_normal((5, 8)), rng.standard_normal((8, 4))
    top, w = deepseek.route(x, router, np.array([10.0, 0, 0, 0]), c)
    assert (top[:, 0] == 0).all()
    np.testing.assert_allclose(w[:, 0], 1 / (1 + np.exp(-(x @ router)[:, 0])), rtol=1e-12)


@settings(max_examples=25)
@given(c=configs(), seed=st.integers(0, 2**16), N=st.integers(1, 6))
def test_the_mixture_equals_each_row_alone(c, seed, N):
    """The grouped dispatch against every row through its k experts (and the shared ones) one at a time."""
    c = dataclasses.replace(c, first_k_dense=0)
    p = build(c, seed=seed).blocks[0]
    x = np.random.default_rng(seed).standard_normal((N, c.n_embd))
    top, w = route_alone(x, np.asarray(p["router.weight"]), p["router.bias"], c)
    want = np.zeros_like(x)
    silu = lambda g: g / (1 + np.exp(-g))
    for n in range(N):
        for e, we in zip(top[n], w[n]):
            gu = x[n] @ np.asarray(p[f"experts.{e}.gate_up.weight"])
            want[n] += we * ((silu(gu[:c.expert_ffn]) * gu[c.expert_ffn:]) @ np.asarray(p[f"experts.{e}.down_proj.weight"]))
        if c.n_shared:
            gu = x[n] @ np.asarray(p["shared.gate_up.weight"])
            F = c.n_shared * c.expert_ffn
            want[n] += (silu(gu[:F]) * gu[F:]) @ np.asarray(p["shared.down_proj.weight"])
    np.testing.assert_allclose(deepseek.mixture(x, p, c), want, rtol=1e-9, atol=1e-12)




# -- the cache holds the latent ------------------------------------------------------------------------

@settings(max_examples=15)
@given(c=configs(), seed=st.integers(0, 2**16), P=st.integers(1, 5), mla_decode=st.sampled_from(deepseek.MLA_DECODE))
def test_cached_equals_naive(c, seed, P, mla_decode):
    """Greedy with the latent cache (prefill, then one decode step a token, either way) gives the
    tokens of the naive loop (the whole sequence recomputed every token, no cache)."""
    model = build(c, seed=seed, mla_decode=mla_decode)
    prompt = np.random.default_rng(seed).integers(0, c.vocab_size, P)
    assert minillm.generate(model, prompt, 6) == minillm.generate(model, prompt, 6, kv_cache=False)


@settings(max_examples=10)
@given(c=configs(), seed=st.integers(0, 2**16), mla_decode=st.sampled_from(deepseek.MLA_DECODE),
       block_size=st.sampled_from([1, 2, 4]))
def test_batched_equals_alone_paged_and_contiguous(c, seed, mla_decode, block_size):
    """Sequences of different lengths decoded in shared steps, in one paged pool (blocks of 1 to 4
    positions: gathered through their tables) and in contiguous caches, give each sequence's tokens alone."""
    model = build(c, seed=seed, mla_decode=mla_decode)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, c.vocab_size, n).tolist() for n in (1, 4, 7)]
    alone = [minillm.generate(model, p, 5) for p in prompts]
    assert minillm.generate_batch(model, prompts, 5, cache="paged", block_size=block_size) == alone
    assert minillm.generate_batch(model, prompts, 5, cache="contiguous") == alone


@settings(max_examples=15)
@given(c=configs(), seed=st.integers(0, 2**16), T=st.integers(2, 12), cut=st.integers(1, 11), data=st.data())
def test_chunked_prefill_equals_whole_prefill(c, seed, T, cut, data):
    """A prompt prefilled in two chunks (the second attending over the first's cached rows, rebuilt
    from the latent) gives the whole prefill's logits and cache, contiguous or paged."""
    cut = min(cut, T - 1)
    model = build(c, seed=seed)
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, T)
    whole, cache = model.prefill(ids)
    if data.draw(st.booleans(), label="paged"):
        chunked = minillm.PagedKVPool(c, 16, data.draw(st.sampled_from([1, 3, 4]), label="block"), np.float64).sequence()
    else:
        chunked = model.new_cache()
    model.prefill(ids[:cut], chunked)
    logits, _ = model.prefill(ids[cut:], chunked)
    np.testing.assert_allclose(logits, whole, rtol=0, atol=1e-10)
    np.testing.assert_allclose(chunked.read(0, T)[0], cache.read(0, T)[0], rtol=0, atol=1e-12)
    assert chunked.read(0, T)[0].shape == (1, T, c.kv_lora_rank + c.qk_rope_head_dim)


def test_the_engine_serves_shared_prefixes_and_chunks_as_alone():
    """The serving engine with prefix caching (a repeated prompt's blocks reused, its rows not
    recomputed) and a token budget that chunks the long prompts: every request as alone, either way."""
    from minillm.engine.engine import Engine
    c = DeepSeekConfig(n_layer=2, n_head=2, n_embd=16, n_ctx=64, vocab_size=61, ffn=16, kv_lora_rank=8, q_lora_rank=8,
                       qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6, n_expert=4, top_k=2, expert_ffn=8,
                       n_shared=1, n_group=2, topk_group=1, first_k_dense=1)
    prefix = list(range(3, 15))
    prompts = [prefix + [20], prefix + [21, 22], prefix + [20], [5]]
    for way in deepseek.MLA_DECODE:
        model = build(c, mla_decode=way)
        alone = [minillm.generate(model, p, 6) for p in prompts]
        engine = Engine(model, num_blocks=64, block_size=4, prefix_cache=True, max_batched_tokens=8)
        first = [engine.add_request(p, 6) for p in prompts[:2]]
        engine.run()
        then = [engine.add_request(p, 6) for p in prompts[2:]]       # the prefix's 3 blocks are cached now
        engine.run()
        assert [r.output for r in first + then] == alone
        assert engine.blocks.hit_tokens >= 12


def test_an_int8_latent_cache_keeps_one_scale_a_row():
    c = deepseek.SHAPES["random-mla"]
    c = dataclasses.replace(c, n_layer=2, n_ctx=64)
    cache = minillm.KVCache(c, np.float32, kv_dtype="int8")
    assert cache.bytes_per_token() == 2 * (256 + 32 + 4)
    assert cache.arrays() == ("k", "k_scale")
    rows = np.random.default_rng(0).standard_normal((1, 5, 288)).astype(np.float32)
    cache.reserve(5)
    cache.write(0, 0, rows, rows[:, :, :256])
    k, v = cache.read(0, 5)
    assert v.shape == (1, 5, 256) and np.shares_memory(k, v)
    np.testing.assert_allclose(k, rows, atol=np.abs(rows).max() / 127)


# -- the meter against the closed forms ---------------------------------------------------------------

def metered(model, batch):
    """One step of `batch` [(ids, cache), ...] under a meter: its record, and each sparse layer's distinct experts."""
    with minillm.Meter() as m, routes() as r:
        model.step(batch)
    (s,) = m.steps
    return s, [len(set(a.ravel())) for a in r]


@settings(max_examples=20)
@given(c=configs(), N=st.integers(1, 5), seed=st.integers(0, 2**16), mla_decode=st.sampled_from(deepseek.MLA_DECODE),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_meter_reads_the_weights_the_closed_form_says(c, N, seed, mla_decode, dtype):
    """A prompt of N rows reads every weight once, the routed experts its rows chose and the shared
    ones, N rows of the embedding; a decode step (B = 1) the k chosen plus the shared ones: the meter
    equals `step_weight_bytes`, either way of attending."""
    model = build(c, dtype, seed=seed, mla_decode=mla_decode)
    b = np.dtype(dtype).itemsize
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, N)
    cache = model.new_cache()
    cache.reserve(N)
    s, distinct = metered(model, [(ids, cache)])
    assert s.bytes["weights"] == deepseek.step_weight_bytes(c, distinct, N, b)
    cache.reserve(1)
    s, distinct = metered(model, [(ids[:1], cache)])
    assert distinct == [c.top_k] * len(c.sparse_layers)
    assert s.bytes["weights"] == deepseek.step_weight_bytes(c, distinct, 1, b) == model.step_weight_bytes(1)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_meter_reads_quantized_weights_the_closed_form_says(fmt):
    c = DeepSeekConfig(n_layer=2, n_head=2, n_embd=64, n_ctx=32, vocab_size=96, ffn=64, kv_lora_rank=16,
                       q_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=16, n_expert=4, top_k=2,
                       expert_ffn=32, n_shared=1, n_group=2, topk_group=1, first_k_dense=1)
    model = build(c, np.float32, seed=1, weights=fmt)
    _, cache = model.prefill([1, 2, 3])
    cache.reserve(1)
    s, distinct = metered(model, [(np.array([3]), cache)])
    assert s.bytes["weights"] == deepseek.step_weight_bytes(c, distinct, 1, 4, fmt) == model.step_weight_bytes()
    assert s.bytes["weights"] < deepseek.step_weight_bytes(c, distinct, 1, 4)


@settings(max_examples=15)
@given(c=configs(), P=st.integers(1, 9), seed=st.integers(0, 2**16), dtype=st.sampled_from([np.float32, np.float64]),
       paged=st.booleans())
def test_meter_counts_the_latent_and_the_attention_by_their_closed_forms(c, P, seed, dtype, paged):
    """KV bytes a token: L·(r + dr)·b written by a prefill, and read by a decode step at context T either
    way, with the attention FLOPs of `decode_attention_cost`; the two ways' products differ by kv_b over
    the T cached rows (decompressed) against the query's and the output's trip through its halves."""
    b = np.dtype(dtype).itemsize
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, P + 1)
    T, steps = P + 1, {}
    for way in deepseek.MLA_DECODE:
        model = build(c, dtype, seed=seed, mla_decode=way)
        cache = minillm.PagedKVPool(c, 16, 4, dtype).sequence() if paged else model.new_cache()
        assert cache.bytes_per_token() == c.kv_bytes_per_token(b) == c.n_layer * (c.kv_lora_rank + c.qk_rope_head_dim) * b
        cache.reserve(P)
        s, _ = metered(model, [(ids[:P], cache)])
        assert s.bytes["kv_write"] == P * c.kv_bytes_per_token(b)
        cache.reserve(1)
        s, _ = metered(model, [(ids[P:], cache)])
        want = steps[way] = deepseek.decode_attention_cost(c, T, way, b)
        assert s.bytes["kv_read"] == want["kv_read"] == T * c.kv_bytes_per_token(b)
        assert s.bytes["kv_write"] == c.kv_bytes_per_token(b)
        assert s.flops["attention"] == want["attention"]
        want["matmul"] = s.flops["matmul"]
    a, d = steps["absorbed"], steps["decompressed"]
    assert d["matmul"] - a["matmul"] == d["matmul_T"] - a["matmul_fixed"]


# -- the commands ----------------------------------------------------------------------------------------

def minillm_cli(tmp_path, *args):
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1"}
    return subprocess.run([sys.executable, "-m", "minillm", *map(str, args)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, env=env, timeout=300, cwd=Path(__file__).parents[1])


def test_bench_context_sweep_runs_both_ways_beside_gqa(tmp_path):
    """`minillm bench --context-sweep`: the latent model both ways beside a GQA mixture at each context, the
    KV bytes and attention FLOPs the closed forms give; the table too, one way when asked."""
    mla, gqa = FIXTURES / NAMES[0], FIXTURES / "qwen3moe-tiny"
    r = minillm_cli(tmp_path, "bench", "--context-sweep", "--model", f"{mla},{gqa}", "--contexts", "16,64",
                    "--repeats", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    c, g = load(mla).config, minillm.load(gqa).config
    assert [(x["context"], x["way"]) for x in rows] == [(n, w) for n in (16, 64) for w in ("absorbed", "decompressed", None)]
    for x in rows:
        if x["way"] is None:
            T = x["kv_read"] // (2 * g.n_layer * g.n_kv_head * g.head_dim * 4)
            assert x["kv_read"] == T * 2 * g.n_layer * g.n_kv_head * g.head_dim * 4 and T == x["context"] + 1
            assert x["attention_flops"] == 4 * g.n_head * T * g.head_dim * g.n_layer      # g/2 a byte in float32
        else:
            T = x["context"] + (1 if x["way"] == "absorbed" else 2)        # the first way's counted step came first
            want = deepseek.decode_attention_cost(c, T, x["way"], 4)
            assert (x["kv_read"], x["attention_flops"]) == (want["kv_read"], want["attention"])
    table = minillm_cli(tmp_path, "bench", "--context-sweep", "--model", str(mla), "--contexts", "16", "--repeats", "1",
                        "--mla-decode", "decompressed")
    assert table.returncode == 0, table.stderr
    assert "deepseekv3-tiny decompressed" in table.stdout and "deepseekv3-tiny absorbed" not in table.stdout


@pytest.mark.parametrize("args, words", [
    (("generate", "hi", "--model", "random-tiny", "--mla-decode", "absorbed"), "has no latent attention"),
    (("bench", "--context-sweep", "--model", "random-tiny", "--contexts", "16", "--mla-decode", "absorbed"),
     "none of these models has latent attention"),
    (("bench", "--context-sweep", "--model", "random-tiny", "--contexts", "16", "--mla-decode", "sideways"),
     "give absorbed and/or decompressed"),
])
def test_mla_decode_is_refused_where_it_means_nothing(tmp_path, args, words):
    r = minillm_cli(tmp_path, *args)
    assert r.returncode != 0 and "Traceback" not in r.stderr and words in r.stderr, r.stderr


def test_options_are_values_checked_at_load():
    """The family's option goes to the constructor (no change after load); another value is another
    model sharing the weights, this one unchanged; a wrong option or value is one line at load."""
    from minillm.models.options import OptionError
    path = FIXTURES / NAMES[0]
    a = load(path, "decompressed")
    assert a.mla_decode == "decompressed" and a.options == {"mla_decode": "decompressed"}
    b = a.with_options(mla_decode="absorbed")
    assert (a.mla_decode, b.mla_decode) == ("decompressed", "absorbed") and b.blocks is a.blocks
    assert minillm.load(path, kernels="numpy").mla_decode == deepseek.MLA_OPTION.default
    for options, words in (({"mla_decode": "sideways"}, "choose absorbed or decompressed"),
                           ({"window": 4}, "no family takes it")):
        with pytest.raises(OptionError, match=words):
            minillm.load(path, options=options)
    with pytest.raises(OptionError, match="random-tiny has no latent attention"):
        minillm.load("random-tiny", options={"mla_decode": "absorbed"})
    with pytest.raises(OptionError, match="choose absorbed"):
        a.with_options(mla_decode="sideways")


def test_speculative_decoding_verifies_drafts_through_the_latent():
    """A speculative check is a multi-token step over a cached prefix (attended decompressed), a rejected
    guess rolled back: greedy tokens as plain decoding's, either way of decoding."""
    path, e = FIXTURES / NAMES[0], np.load(FIXTURES / NAMES[0] / "expected.npz")
    for way in deepseek.MLA_DECODE:
        new, _ = minillm.speculative_generate(load(path, way), e["input_ids"], 20, draft="ngram", k=3)
        assert new == e["greedy_ids"][:20].tolist()


def test_a_header_says_when_the_kernel_set_attends_with_numpys_form():
    """The fused set's attention kernel declines latent attention's options (its scale, narrower
    values): the set is left as it is (no edit), and the command's header says NumPy's form attends."""
    if not minillm.kernels.available():
        pytest.skip(f"the fused kernels: {minillm.kernels.status().reason}")
    from minillm.cli.common import kernels_label
    model = minillm.load(FIXTURES / NAMES[0], kernels="fused")
    assert model.kernel_set is minillm.models.kernel_sets.get("fused")
    assert "attention in NumPy's form" in kernels_label(model) and "scale, value_width" in kernels_label(model)
    assert "NumPy's form" not in kernels_label(minillm.load("random-tiny", kernels="fused"))
