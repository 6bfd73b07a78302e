"""Gemma 3 (models/gemma3.py) against transformers' fixtures (gemma3-tiny: a window of 8 under 13 + 40
tokens, so attending past the window changes the logits; gemma3-bf16: bfloat16, another layer pattern,
a window of 5, a query scale that is not 1/sqrt(hd), a linear rotary factor, its own head), its config
readers, and its presets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm.errors import ConfigError, MiniLLMError, WeightsError
from minillm.models import gemma3
from minillm.models.gemma3 import FULL, SLIDING, Gemma3Config

FIXTURES = Path(__file__).parent / "fixtures" / "w6"
NAME = "gemma3-tiny"
BF16 = "gemma3-bf16"       # benchmarks/reference/make_w6_bf16.py: what the float32 one does not have
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


def test_the_window_matters_in_the_fixture(each):
    """The same weights attending every position (all layers full) give other logits: the test above
    would fail if the window were forgotten."""
    m, e = each
    c = m.config
    full = gemma3.Gemma3(Gemma3Config(**{**c.asdict(), "layer_types": (FULL,) * c.n_layer}),
                         {k: np.asarray(v) for k, v in raw_tensors(m.name).items()})
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    assert np.abs(full.forward(ids) - e["logits"]).max() > 100 * ATOL


def raw_tensors(name=NAME):
    from minillm.checkpoints.llama_load import read_tensors
    return read_tensors(FIXTURES / name)


def test_fixture_config_read_as_written(fixture):
    c = fixture[0].config
    assert c.layer_types == (SLIDING,) * 5 + (FULL,) and c.window_layers == (0, 1, 2, 3, 4)
    assert (c.window, c.theta, c.local_theta, c.query_scalar, c.tied, c.scale) == (8, 1e6, 1e4, 32, True, None)
    m = fixture[0]
    assert m.n_params() == c.n_params() == sum(int(np.prod(s)) for _, s in gemma3.iter_expected(c))


def stored_dtypes(name):
    """The dtypes model.safetensors' header gives its tensors."""
    raw = (FIXTURES / name / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_bf16_fixture_config_read_as_written():
    """Its own pattern (the full layers 3rd and 5th, not `_sliding_window_pattern`'s 6th, which its
    config.json still carries), window 5, 2 KV heads of 16 on a width of 48, a query scale of 24^-1/2,
    the full layers' linear rotary factor 8, an untied head; every tensor stored as bfloat16."""
    m = load(BF16)
    c = m.config
    assert c.layer_types == (SLIDING, SLIDING, FULL, SLIDING, FULL) and c.window_layers == (0, 1, 3)
    assert (c.window, c.n_head, c.n_kv_head, c.head_dim, c.n_embd) == (5, 4, 2, 16, 48)
    assert (c.query_scalar, c.scale, c.rope_factor, c.theta, c.local_theta, c.tied) == \
        (24, 24 ** -0.5, 8.0, 1e6, 1e4, False)
    assert m.n_params() == c.n_params() == sum(int(np.prod(s)) for _, s in gemma3.iter_expected(c))
    assert stored_dtypes(BF16) == {"BF16"} and "lm_head.weight" in raw_tensors(BF16)


@pytest.mark.parametrize("change", ["query scale 1/sqrt(hd)", "no rotary factor", "tied head",
                                    "the float32 one's pattern"])
def test_what_is_new_in_the_bf16_fixture_matters(change):
    """Each thing gemma3-bf16 adds changes its logits: the match above would fail without it."""
    e, t = np.load(FIXTURES / BF16 / "expected.npz"), dict(raw_tensors(BF16))
    c = load(BF16).config.asdict()
    if change == "query scale 1/sqrt(hd)":
        c["query_scalar"] = c["head_dim"]
    elif change == "no rotary factor":
        c["rope_factor"] = 1.0
    elif change == "tied head":
        c["tied"] = True
        del t["lm_head.weight"]
    else:
        c["layer_types"] = (SLIDING,) * 4 + (FULL,)
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    assert np.abs(gemma3.Gemma3(Gemma3Config(**c), t).forward(ids) - e["logits"]).max() > 100 * ATOL


def test_fixture_through_the_fused_set(fixture):
    """The fused set's attention kernel declines a window: those layers attend with NumPy's form."""
    from minillm.models import kernel_sets
    try:
        kernel_sets.spec("fused").check()
    except MiniLLMError:
        pytest.skip("fused cannot run here")
    m, e = load(kernels="fused"), fixture[1]
    assert m.kernel_set.declines(m.ATTENTION_ASKS) == ["window"]              # (its scale is 1/√hd)
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(m.forward(ids), e["logits"], rtol=0, atol=ATOL)
    assert minillm.generate(m, e["input_ids"], len(e["greedy_ids"])) == e["greedy_ids"].tolist()


def copy_fixture(tmp_path):
    dst = tmp_path / NAME
    shutil.copytree(FIXTURES / NAME, dst)
    return dst


def edit_config(folder, drop=(), **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for k in drop:
        cfg.pop(k, None)
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_older_spellings_read_the_same(tmp_path):
    """transformers 4.5x's config: rope_theta / rope_local_base_freq, sliding_window_pattern, no layer_types."""
    folder = copy_fixture(tmp_path)
    edit_config(folder, drop=["layer_types", "rope_parameters", "_sliding_window_pattern"], rope_theta=1e6,
                rope_local_base_freq=1e4, sliding_window_pattern=6, rope_scaling=None)
    assert minillm.load(folder).config == load().config


@pytest.mark.parametrize("change, words", [
    ({"layer_types": ["sliding_attention", "chunked"] * 3}, "layer_types"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ({"hidden_activation": "relu"}, "hidden_activation"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6},
                          "sliding_attention": {"rope_theta": 1e4}}}, "yarn"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
])
def test_bad_configs_are_one_line(tmp_path, change, words):
    folder = copy_fixture(tmp_path)
    edit_config(folder, **change)
    with pytest.raises((ConfigError, WeightsError)) as err:
        minillm.load(folder)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_released_shapes_count_their_parameters():
    """The published sizes: 270M (268M), 1B (1.0B) and 27B (27.0B text)."""
    counts = {n: c.n_params() for n, c in gemma3.RELEASED.items()}
    assert 0.26e9 < counts["gemma-3-270m"] < 0.275e9
    assert 0.98e9 < counts["gemma-3-1b"] < 1.01e9
    assert 26.5e9 < counts["gemma-3-27b"] < 27.5e9


def test_random_preset_decodes():
    m = minillm.load("random-gemma3", kernels="numpy")
    assert isinstance(m, gemma3.Gemma3) and len(m.config.window_layers) == 5
    out = minillm.generate(m, [1, 2, 3], 4)
    assert len(out) == 4


def test_capacity_counts_a_windowed_layers_kv_as_min_context_window():
    """`hardware --shape gemma-3-27b --fit T`: 10 global layers keep T positions, 52 sliding keep 1,024."""
    from minillm.measure.shapes import capacity, kv_bytes_per_sequence, shape
    s = shape("gemma-3-27b")
    per_layer = 2 * 16 * 128 * 2
    for T in (512, 1024, 32768, 131072):
        assert kv_bytes_per_sequence(s, T, 2) == per_layer * (10 * T + 52 * min(T, 1024))
    assert capacity(s, 131072, 80e9)["kv_bytes_per_sequence"] == per_layer * (10 * 131072 + 52 * 1024)


def test_lesson_19s_window_claim_holds_and_fails_when_capacity_ignores_the_window(monkeypatch):
    """The lesson's third way: its claim is computed from the capacity function; with every layer
    counted at the whole context it no longer holds."""
    import importlib
    from minillm.measure import shapes
    lesson = importlib.import_module("minillm.lessons.19_state")
    common = importlib.import_module("minillm.lessons._common")
    L = common.Lesson(19, "A state that does not grow", fast=True, no_pause=True)
    lesson.the_third_way(L)
    assert any("Gemma 3 27B" in c for c in L.claims)
    flat = shapes.kv_bytes_per_sequence
    monkeypatch.setattr(shapes, "kv_bytes_per_sequence",
                        lambda s, context, b: flat({k: v for k, v in s.items() if k != "window"}, context, b))
    with pytest.raises(common.ClaimFailed):
        lesson.the_third_way(common.Lesson(19, "A state that does not grow", fast=True, no_pause=True))
