"""gpt-oss (models/gptoss.py) against transformers' fixtures (gptoss-tiny: sliding and full layers
alternating, a window of 8 under 12 + 40 tokens, a sink per head, YaRN, biased experts with the clamped
SwiGLU; gptoss-bf16: bfloat16, full first then two sliding, a window of 6, 6 experts top-3, YaRN's ramp
truncated, another clamp), its config reader, and MXFP4 experts widened at load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm.errors import ConfigError, MiniLLMError, WeightsError
from minillm.models import gptoss
from minillm.models.gptoss import FULL, SLIDING, GptOss, GptOssConfig

FIXTURES = Path(__file__).parent / "fixtures" / "w6"
NAME = "gptoss-tiny"
BF16 = "gptoss-bf16"       # benchmarks/reference/make_w6_bf16.py: what the float32 one does not have
ATOL = 1e-4


def load(name=NAME, **kw):
    return minillm.load(FIXTURES / name, kernels=kw.pop("kernels", "numpy"), **kw)


@pytest.fixture(scope="module")
def fixture():
    return load(), np.load(FIXTURES / NAME / "expected.npz")


@pytest.fixture(scope="module", params=[NAME, BF16])
def each(request):
    """Each of the two checkpoints, with what transformers computed from it."""
    return load(request.param), np.load(FIXTURES / request.param / "expected.npz")


def raw_tensors(name=NAME):
    from minillm.checkpoints.llama_load import read_tensors
    return read_tensors(FIXTURES / name)


def test_fixture_logits_match_transformers(each):
    m, e = each
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(m.forward(ids), e["logits"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("kv_cache", [True, False])
def test_fixture_greedy_matches_transformers(each, kv_cache):
    m, e = each
    assert minillm.generate(m, e["input_ids"], len(e["greedy_ids"]), kv_cache=kv_cache) == e["greedy_ids"].tolist()


def test_fixture_prefill_and_decode_rows(each):
    m, e = each
    P = len(e["input_ids"])
    logits, cache = m.prefill(e["input_ids"])
    rows = [logits] + [m.decode_step(int(t), cache) for t in e["greedy_ids"][:-1]]
    np.testing.assert_allclose(np.array(rows), e["logits"][P - 1:-1], rtol=0, atol=ATOL)


@pytest.mark.parametrize("change", ["no sinks", "no window"])
def test_the_sinks_and_the_window_matter_in_the_fixture(each, change):
    """Without its sinks (each -inf) or its window, the same weights give other logits."""
    m, e = each
    t = dict(raw_tensors(m.name))
    c = m.config
    if change == "no sinks":
        t.update({k: np.full_like(v, -np.inf) for k, v in t.items() if k.endswith("sinks")})
    else:
        c = GptOssConfig(**{**c.asdict(), "layer_types": (FULL,) * c.n_layer})
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    assert np.abs(GptOss(c, t).forward(ids) - e["logits"]).max() > 100 * ATOL


def test_fixture_config_read_as_written(fixture):
    c = fixture[0].config
    assert c.layer_types == (SLIDING, FULL, SLIDING, FULL) and c.window_layers == (0, 2) and c.window == 8
    assert (c.theta, c.rope_factor, c.rope_original, c.rope_truncate, c.n_expert, c.top_k, c.tied) == \
        (150000.0, 4.0, 128, False, 8, 2, False)
    assert fixture[0].n_params() == c.n_params()


def test_bf16_fixture_config_read_as_written():
    """Full first, then two sliding layers; window 6; 6 experts, 3 a token; 6 heads / 2 KV heads of 16
    on a width of 48; YaRN 8x over 64 positions with its ramp's ends rounded (`truncate`); the clamp
    at 5 and the gate's sigmoid at 1.5; every tensor stored as bfloat16."""
    m = load(BF16)
    c = m.config
    assert c.layer_types == (FULL, SLIDING, SLIDING) and c.window_layers == (1, 2) and c.window == 6
    assert (c.n_expert, c.top_k, c.expert_ffn, c.n_head, c.n_kv_head, c.head_dim, c.n_embd) == (6, 3, 32, 6, 2, 16, 48)
    assert (c.theta, c.rope_factor, c.rope_original, c.rope_truncate, c.swiglu_limit, c.swiglu_alpha, c.tied) == \
        (50000.0, 8.0, 64, True, 5.0, 1.5, False)
    assert m.n_params() == c.n_params()
    raw = (FIXTURES / BF16 / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}


@pytest.mark.parametrize("change", ["ramp not truncated", "the clamp at 7", "the sigmoid's 1.702", "top-2",
                                    "the float32 one's pattern"])
def test_what_is_new_in_the_bf16_fixture_matters(change):
    """Each thing gptoss-bf16 adds changes its logits: the match above would fail without it."""
    e = np.load(FIXTURES / BF16 / "expected.npz")
    c = load(BF16).config.asdict()
    c.update({"ramp not truncated": {"rope_truncate": False},
              "the clamp at 7": {"swiglu_limit": 7.0}, "the sigmoid's 1.702": {"swiglu_alpha": 1.702},
              "top-2": {"top_k": 2},
              "the float32 one's pattern": {"layer_types": (SLIDING, FULL, SLIDING)}}[change])
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    assert np.abs(GptOss(GptOssConfig(**c), raw_tensors(BF16)).forward(ids) - e["logits"]).max() > 100 * ATOL


def test_fixture_through_the_fused_set(fixture):
    from minillm.models import kernel_sets
    try:
        kernel_sets.spec("fused").check()
    except MiniLLMError:
        pytest.skip("fused cannot run here")
    m, e = load(kernels="fused"), fixture[1]
    assert m.kernel_set.declines(m.ATTENTION_ASKS) == ["sinks", "window"]
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(m.forward(ids), e["logits"], rtol=0, atol=ATOL)
    assert minillm.generate(m, e["input_ids"], len(e["greedy_ids"])) == e["greedy_ids"].tolist()


def copy_fixture(tmp_path):
    dst = tmp_path / NAME
    shutil.copytree(FIXTURES / NAME, dst)
    return dst


@pytest.mark.parametrize("change, words", [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "yarn"),
    ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"sliding_window": -1}, "sliding_window"),
])
def test_bad_configs_are_one_line(tmp_path, change, words):
    folder = copy_fixture(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(change)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises((ConfigError, WeightsError)) as err:
        minillm.load(folder)
    assert words in str(err.value) and "\n" not in str(err.value)


# -- MXFP4 -----------------------------------------------------------------------------------------------

def test_mxfp4_dequantizes_a_hand_made_block():
    """Codes 0..15 twice (low nibble first), scale bytes 127 (2^0) and 129 (2^2); one more block at 2^-3."""
    codes = np.arange(32) % 16
    packed = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)                 # 16 bytes
    blocks = np.stack([packed, packed, packed])[None]                            # [1, 3, 16]
    scales = np.array([[127, 129, 124]], dtype=np.uint8)                         # [1, 3]
    e2m1 = [0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6]
    want = np.concatenate([np.array(e2m1 * 2) * 2.0 ** s for s in (0, 2, -3)])[None]
    got = gptoss.mxfp4_dequantize(blocks, scales)
    assert got.shape == (1, 96) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert np.signbit(got[0, 8])                                                 # code 8 is -0


def pack_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., n] values that are E2M1 codes' values times a power of two per 32 -> (blocks, scales)."""
    *lead, n = w.shape
    g = w.reshape(*lead, n // 32, 32)
    top = np.abs(g).max(-1)
    s = np.where(top > 0, np.floor(np.log2(np.where(top > 0, top, 1))) - 2, 0).astype(int)   # 6·2^s >= max
    values = g / np.exp2(s)[..., None]
    codes = np.abs(gptoss.FP4_VALUES[None, :8] - np.abs(values)[..., None]).argmin(-1) + 8 * (values < 0)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (s + 127).astype(np.uint8)


def test_a_model_with_mxfp4_experts_equals_its_widened_twin():
    """Experts stored as MXFP4 blocks ([E, out, G, 16] and [E, out, G], as released) give the model
    of the same experts stored as floats."""
    c = GptOssConfig(n_layer=2, n_head=4, n_kv_head=2, head_dim=16, n_embd=64, n_ctx=128, vocab_size=50,
                     expert_ffn=32, n_expert=4, top_k=2, layer_types=(SLIDING, FULL), window=4, rope_original=32,
                     rope_factor=2.0)
    t = gptoss.random_params(c, seed=1, std=0.2)
    packed = dict(t)
    for i in range(c.n_layer):
        for name in ("gate_up_proj", "down_proj"):
            key = f"layers.{i}.mlp.experts.{name}"
            blocks, scales = pack_mxfp4(np.swapaxes(t[key], -1, -2))          # [E, out, in]
            t[key] = np.swapaxes(gptoss.mxfp4_dequantize(blocks, scales), -1, -2)
            del packed[key]
            packed[key + "_blocks"], packed[key + "_scales"] = blocks, scales
    ids = np.arange(12) % c.vocab_size
    np.testing.assert_array_equal(GptOss(c, packed).forward(ids), GptOss(c, t).forward(ids))
    assert not np.allclose(GptOss(c, gptoss.random_params(c, seed=1, std=0.2)).forward(ids),
                           GptOss(c, t).forward(ids), atol=1e-6)


def test_a_folder_with_mxfp4_experts_loads_widened(tmp_path):
    """The fixture with its experts' gate|up packed as the release packs them (U8 `*_blocks` / `*_scales`)
    loads through minillm.load and gives the model of the same experts widened."""
    from minillm.checkpoints.safetensors import read_safetensors, write_safetensors
    folder = copy_fixture(tmp_path)
    raw, _ = read_safetensors(folder / "model.safetensors")
    widened = dict(raw)
    for key in [k for k in raw if k.endswith("experts.gate_up_proj")]:     # (down's rows, 48, are not blocks of 32)
        blocks, scales = pack_mxfp4(np.swapaxes(raw[key], -1, -2))
        widened[key] = np.swapaxes(gptoss.mxfp4_dequantize(blocks, scales), -1, -2)
        del raw[key]
        raw[key + "_blocks"], raw[key + "_scales"] = blocks, scales
    write_safetensors(folder / "model.safetensors", raw)
    packed = minillm.load(folder, kernels="numpy")
    twin = GptOss(packed.config, {k.removeprefix("model."): v for k, v in widened.items()})
    ids = np.arange(20) % 600
    np.testing.assert_array_equal(packed.forward(ids), twin.forward(ids))


def test_a_folder_with_other_integer_tensors_is_still_refused(tmp_path):
    from minillm.checkpoints.safetensors import read_safetensors, write_safetensors
    folder = copy_fixture(tmp_path)
    raw, _ = read_safetensors(folder / "model.safetensors")
    raw["model.norm.weight"] = raw["model.norm.weight"].astype(np.int8)
    write_safetensors(folder / "model.safetensors", raw)
    with pytest.raises(WeightsError, match="not as floats"):
        minillm.load(folder)


def test_mxfp4_blocks_without_scales_are_one_line():
    with pytest.raises(WeightsError, match="scales"):
        gptoss.unpack_mxfp4({"a_blocks": np.zeros((1, 1, 16), np.uint8)})


def test_released_shapes_count_their_parameters():
    """gpt-oss-20b: 20.9B in all, 3.6B active; 120b: 116.8B, 5.1B active (the model card, whose active
    count leaves out the embedding table: a token reads one row of it)."""
    a, b = gptoss.RELEASED["gpt-oss-20b"], gptoss.RELEASED["gpt-oss-120b"]
    table = a.vocab_size * a.n_embd
    assert 20.8e9 < a.n_params() < 21.0e9 and 3.5e9 < a.active_params() - table < 3.7e9
    assert 116.7e9 < b.n_params() < 116.9e9 and 5.0e9 < b.active_params() - table < 5.2e9


def test_random_preset_decodes():
    m = minillm.load("random-gptoss", kernels="numpy")
    assert isinstance(m, GptOss) and m.config.window_layers == (0, 2)
    assert len(minillm.generate(m, [1, 2, 3], 4)) == 4
