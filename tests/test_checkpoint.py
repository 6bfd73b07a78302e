"""Loading checkpoints in every layout minillm accepts, the errors for those it refuses, and load()'s names."""

from __future__ import annotations

import json
import os
import re
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm.checkpoints.checkpoint import expected_shapes, load_checkpoint, save_checkpoint
from minillm.models.gpt2 import random_params
from minillm.models.gpt2 import GPT2_SIZES, GPT2Config
from minillm.errors import ConfigError, ModelNotFoundError, WeightsError
from minillm.checkpoints.safetensors import write_safetensors

FIXTURES = Path(__file__).parent / "fixtures"
SMALL = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=12, vocab_size=40)


def nontrivial_params(config: GPT2Config, seed: int = 0) -> dict[str, np.ndarray]:
    """random_params with random biases and gains too, so every tensor is distinguishable."""
    params = random_params(config, seed=seed, std=0.3)
    rng = np.random.default_rng(seed + 1)
    for p in params.values():
        p += rng.standard_normal(p.shape, dtype=np.float32) * np.float32(0.1)
    return params


def write_checkpoint_dir(directory: Path, tensors: dict[str, np.ndarray], config: dict) -> Path:
    """A checkpoint directory written by hand: any tensors, any config.json."""
    directory.mkdir(parents=True, exist_ok=True)
    write_safetensors(directory / "model.safetensors", tensors)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def assert_same_params(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name in expected:
        assert actual[name].dtype == np.float32, name
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def shows_shape(message: str, shape) -> bool:
    """The message names this shape, as a list [16, 48] or a tuple (16, 48)."""
    dims = r",\s*".join(str(d) for d in shape)
    return re.search(rf"\[{dims}\]|\({dims},?\)", message) is not None


# -- the layouts that load --------------------------------------------------------------------------


def test_save_then_load_a_directory_round_trips(tmp_path):
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=12, vocab_size=40, ln_eps=1e-6)
    params = nontrivial_params(config)
    save_checkpoint(tmp_path / "ckpt", params, config)
    hf = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert hf["n_positions"] == 12 and hf["n_layer"] == 2 and hf["n_head"] == 2 and hf["n_embd"] == 16
    loaded_config, loaded = load_checkpoint(tmp_path / "ckpt")
    assert loaded_config == config
    assert_same_params(loaded, params)


def test_lone_file_saved_by_minillm_takes_its_config_from_the_metadata(tmp_path):
    # 4 heads of 32: inferring from the shapes would say 2 heads of 64, so only the metadata gets this right.
    config = GPT2Config(n_layer=1, n_head=4, n_embd=128, n_ctx=8, vocab_size=30, ln_eps=1e-6)
    params = nontrivial_params(config)
    save_checkpoint(tmp_path / "ckpt", params, config)
    loaded_config, loaded = load_checkpoint(tmp_path / "ckpt" / "model.safetensors")
    assert loaded_config == config
    assert_same_params(loaded, params)


def test_lone_file_without_metadata_is_read_with_64_wide_heads(tmp_path):
    config = GPT2Config(n_layer=3, n_head=4, n_embd=128, n_ctx=10, vocab_size=30)
    params = nontrivial_params(config)
    write_safetensors(tmp_path / "bare.safetensors", params)
    loaded_config, loaded = load_checkpoint(tmp_path / "bare.safetensors")
    assert loaded_config == GPT2Config(n_layer=3, n_head=2, n_embd=128, n_ctx=10, vocab_size=30)
    assert_same_params(loaded, params)


def test_lone_file_without_metadata_whose_width_is_not_a_multiple_of_64_asks_for_a_config(tmp_path):
    write_safetensors(tmp_path / "bare.safetensors", nontrivial_params(SMALL))    # width 16
    with pytest.raises(WeightsError, match="config.json"):
        load_checkpoint(tmp_path / "bare.safetensors")


@pytest.mark.parametrize("prefix", [False, True], ids=["bare-names", "transformer-prefix"])
@pytest.mark.parametrize("buffers", [False, True], ids=["no-buffers", "mask-buffers"])
@pytest.mark.parametrize("lm_head", [False, True], ids=["no-lm_head", "tied-lm_head"])
def test_hf_naming_variants_all_load_the_same_params(tmp_path, prefix, buffers, lm_head):
    params = nontrivial_params(SMALL)
    tensors = {("transformer." if prefix else "") + n: t for n, t in params.items()}
    if buffers:   # what older Hugging Face files carry: the causal mask, and the value masked scores get
        for i in range(SMALL.n_layer):
            name = ("transformer." if prefix else "") + f"h.{i}.attn."
            tensors[name + "bias"] = np.tril(np.ones((1, 1, SMALL.n_ctx, SMALL.n_ctx), np.float32))
            tensors[name + "masked_bias"] = np.array(-1e4, np.float32)
    if lm_head:
        tensors["lm_head.weight"] = params["wte.weight"].copy()
    write_checkpoint_dir(tmp_path / "ckpt", tensors, SMALL.to_hf())
    config, loaded = load_checkpoint(tmp_path / "ckpt")
    assert config == SMALL
    assert_same_params(loaded, params)


def test_an_untied_lm_head_is_refused(tmp_path):
    params = nontrivial_params(SMALL)
    tensors = params | {"lm_head.weight": params["wte.weight"] + np.float32(0.5)}
    write_checkpoint_dir(tmp_path / "ckpt", tensors, SMALL.to_hf())
    with pytest.raises(WeightsError, match="lm_head"):
        load_checkpoint(tmp_path / "ckpt")


def test_config_with_n_positions_and_no_n_ctx(tmp_path):
    hf = SMALL.to_hf()
    del hf["n_ctx"]                    # as newer transformers write it (and as the fixtures are)
    write_checkpoint_dir(tmp_path / "ckpt", nontrivial_params(SMALL), hf)
    config, _ = load_checkpoint(tmp_path / "ckpt")
    assert config.n_ctx == SMALL.n_ctx == hf["n_positions"]


# -- half-precision files ---------------------------------------------------------------------------


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def write_bfloat16_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """NumPy has no bfloat16, so write_safetensors cannot: lay the file out by hand."""
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        data = bfloat16_bits(t).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(chunks))


# Rounding every weight moves the logits (scale ~7 on fixture a) by a relative error of about
# 1e-3 in float16 (11-bit mantissa) and 1e-2 in bfloat16 (8-bit); measured 8e-3 and 6.5e-2 max-abs.
# The tolerances are 4x those; misread bytes (wrong half, wrong shift, read as float16) give garbage.
HALF_TOLERANCE = {"float16": 5e-3, "bfloat16": 4e-2}    # times the largest |logit|


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_precision_files_load_as_float32_with_nearly_the_same_logits(tmp_path, half):
    reference = minillm.load(FIXTURES / "gpt2-tiny-a")
    directory = tmp_path / half
    if half == "float16":
        save_checkpoint(directory, reference.params, reference.config, dtype="float16")
        rounded = {n: p.astype(np.float16).astype(np.float32) for n, p in reference.params.items()}
    else:
        directory.mkdir()
        write_bfloat16_safetensors(directory / "model.safetensors", reference.params)
        (directory / "config.json").write_text(json.dumps(reference.config.to_hf()))
        rounded = {n: (bfloat16_bits(p).astype(np.uint32) << 16).view(np.float32)
                   for n, p in reference.params.items()}
    model = minillm.load(directory)
    assert model.dtype == np.float32
    assert_same_params(model.params, rounded)                  # exactly the half-precision values

    ids = np.load(FIXTURES / "gpt2-tiny-a" / "expected.npz")["input_ids"]
    want = reference.forward(ids)
    got = model.forward(ids)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=HALF_TOLERANCE[half] * np.abs(want).max())


# -- checkpoints that are refused ---------------------------------------------------------------------


def test_missing_tensor_is_named_with_its_expected_shape(tmp_path):
    params = nontrivial_params(SMALL)
    del params["h.1.mlp.c_fc.bias"]
    write_checkpoint_dir(tmp_path / "ckpt", params, SMALL.to_hf())
    with pytest.raises(WeightsError, match=re.escape("h.1.mlp.c_fc.bias")) as e:
        load_checkpoint(tmp_path / "ckpt")
    assert shows_shape(str(e.value), (64,)), str(e.value)


def test_wrong_shape_names_the_tensor_and_both_shapes(tmp_path):
    params = nontrivial_params(SMALL)
    params["h.0.attn.c_attn.weight"] = params["h.0.attn.c_attn.weight"].T.copy()    # [48, 16], want [16, 48]
    write_checkpoint_dir(tmp_path / "ckpt", params, SMALL.to_hf())
    with pytest.raises(WeightsError, match=re.escape("h.0.attn.c_attn.weight")) as e:
        load_checkpoint(tmp_path / "ckpt")
    message = str(e.value)
    assert shows_shape(message, (16, 48)), f"expected shape missing: {message}"
    assert shows_shape(message, (48, 16)), f"found shape missing: {message}"


@pytest.mark.parametrize("extra", ["h.2.ln_1.weight", "score.weight"])
def test_an_unexpected_tensor_is_refused_by_name(tmp_path, extra):
    params = nontrivial_params(SMALL) | {extra: np.ones(16, np.float32)}
    write_checkpoint_dir(tmp_path / "ckpt", params, SMALL.to_hf())
    with pytest.raises(WeightsError, match=re.escape(extra)):
        load_checkpoint(tmp_path / "ckpt")


def test_a_directory_without_model_safetensors_is_a_weights_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMALL.to_hf()))
    with pytest.raises(WeightsError, match="model.safetensors"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("n_layer", [10**7, 2**31])
@pytest.mark.parametrize("where", ["metadata", "config.json"])
def test_a_config_claiming_huge_sizes_costs_no_more_than_the_file(tmp_path, n_layer, where):
    """A tiny file whose config says 10**7 layers once built every expected name first: 25 s, 3 GB."""
    config = SMALL.to_hf() | {"n_layer": n_layer}
    params = nontrivial_params(SMALL)
    if where == "metadata":
        path = tmp_path / "lone.safetensors"
        write_safetensors(path, {"wte.weight": params["wte.weight"]}, {"config": json.dumps(config)})
    else:
        path = write_checkpoint_dir(tmp_path / "ckpt", params, config)
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(WeightsError, match=f"the config's {n_layer} layers need {12 * n_layer + 4:,} tensors"):
        load_checkpoint(path)
    seconds, peak = time.perf_counter() - t0, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 10_000_000, (seconds, peak)      # memory, not the clock: a busy machine's 2 s prove nothing


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_a_non_finite_weight_is_refused_by_name(tmp_path, bad):
    params = nontrivial_params(SMALL)
    params["h.1.mlp.c_fc.weight"][3, 5] = float(bad)
    write_checkpoint_dir(tmp_path / "ckpt", params, SMALL.to_hf())
    with pytest.raises(WeightsError, match=re.escape("tensor h.1.mlp.c_fc.weight holds 1 NaN or infinite value;")):
        load_checkpoint(tmp_path / "ckpt")


def test_finite_weights_whose_sum_overflows_still_load(tmp_path):
    params = nontrivial_params(SMALL)
    params["wte.weight"][:4] = 3e38                           # finite, but their float32 sum is inf
    write_checkpoint_dir(tmp_path / "ckpt", params, SMALL.to_hf())
    assert load_checkpoint(tmp_path / "ckpt")[1]["wte.weight"][0, 0] == np.float32(3e38)


@pytest.mark.parametrize("value, words", [
    ("1" + "0" * 400, "layer_norm_epsilon=1000"), ("nan", "layer_norm_epsilon=nan"), (-1, "layer_norm_epsilon=-1"),
    ([1e-5], "layer_norm_epsilon=[1e-05]")])
def test_an_impossible_epsilon_is_a_config_error(tmp_path, value, words):
    config = SMALL.to_hf() | {"layer_norm_epsilon": float(value) if value == "nan" else
                              int(value) if isinstance(value, str) else value}
    write_checkpoint_dir(tmp_path / "ckpt", nontrivial_params(SMALL), config)
    with pytest.raises(ConfigError, match=re.escape(words)):
        load_checkpoint(tmp_path / "ckpt")


def test_a_config_nested_too_deep_is_a_config_error(tmp_path):
    folder = write_checkpoint_dir(tmp_path / "ckpt", nontrivial_params(SMALL), {})
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_checkpoint(folder)


def test_a_config_json_over_the_cap_is_refused_unparsed(tmp_path):
    """config.json is read as every JSON file a model folder holds (paths.read_json, a 16 MiB cap): a
    file of exactly the cap loads, one byte more is refused by its size (not parsed), with one line
    naming the file and what to do."""
    from minillm.paths import MAX_JSON_BYTES as MAX_CONFIG_BYTES

    assert MAX_CONFIG_BYTES == 1 << 24
    folder = write_checkpoint_dir(tmp_path / "ckpt", nontrivial_params(SMALL), {})
    text = json.dumps(SMALL.to_hf())
    (folder / "config.json").write_text(text + " " * (MAX_CONFIG_BYTES - len(text)))   # valid JSON, padded
    assert (folder / "config.json").stat().st_size == MAX_CONFIG_BYTES
    assert load_checkpoint(folder)[0] == SMALL
    (folder / "config.json").write_text(text + " " * (MAX_CONFIG_BYTES + 1 - len(text)))
    with pytest.raises(ConfigError) as e:
        load_checkpoint(folder)
    message = str(e.value)
    assert f"config.json: {MAX_CONFIG_BYTES + 1:,} bytes, over the {MAX_CONFIG_BYTES:,}-byte cap" in message, message
    assert "\n" not in message and "not valid JSON" not in message, message


@pytest.mark.parametrize("where", ["config.json", "no config"])
def test_a_scalar_position_embedding_is_named(tmp_path, where):
    """A 0-D wpe.weight: one WeightsError naming the tensor and its shape, and saying what to do."""
    params = nontrivial_params(SMALL)
    params["wpe.weight"] = np.array(1.5, dtype=np.float32)
    if where == "config.json":
        source = write_checkpoint_dir(tmp_path / "ckpt", params, SMALL.to_hf())
        words = ["tensor wpe.weight has shape []", f"needs [{SMALL.n_ctx}, {SMALL.n_embd}]", "re-download or re-save"]
    else:
        source = tmp_path / "lone.safetensors"
        write_safetensors(source, params)                      # no config: inferred from the shapes
        words = ["tensor wpe.weight has shape []", "GPT-2's is a matrix", "is this a GPT-2 checkpoint?"]
    with pytest.raises(WeightsError) as e:
        minillm.load(source)
    message = str(e.value)
    assert "\n" not in message, message
    for w in words:
        assert w in message, (w, message)


@pytest.mark.parametrize("shape", [[SMALL.vocab_size * SMALL.n_embd], [SMALL.vocab_size, SMALL.n_embd, 1]])
def test_a_vector_or_cube_embedding_is_named(tmp_path, shape):
    params = nontrivial_params(SMALL)
    params["wte.weight"] = params["wte.weight"].reshape(shape)
    path = tmp_path / "lone.safetensors"
    write_safetensors(path, params)                            # no config: inferred from the shapes
    with pytest.raises(WeightsError, match=re.escape(f"tensor wte.weight has shape {shape}")):
        load_checkpoint(path)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_config_json_that_is_not_a_regular_file_is_named_not_read(tmp_path, kind):
    """A FIFO used to hang the loader forever; a link to /dev/zero read until memory ran out."""
    folder = write_checkpoint_dir(tmp_path / "ckpt", nontrivial_params(SMALL), {})
    (folder / "config.json").unlink()
    {"fifo": lambda p: os.mkfifo(p), "dev-zero": lambda p: p.symlink_to("/dev/zero"),
     "directory": lambda p: p.mkdir()}[kind](folder / "config.json")
    with pytest.raises(WeightsError, match="config.json: is a (FIFO|character device|directory)"):
        load_checkpoint(folder)


@pytest.mark.parametrize("source", ["/dev/null", "/dev/zero", "fifo"])
def test_a_model_path_that_is_not_a_regular_file_says_what_it_is(tmp_path, source):
    if source == "fifo":
        source = tmp_path / "fifo"
        os.mkfifo(source)
    with pytest.raises(WeightsError, match="is a (character device|FIFO)"):
        minillm.load(source)


# -- load(): names and dtypes --------------------------------------------------------------------------


@pytest.mark.slow
def test_random_124m_has_gpt2_smalls_parameter_count():
    model = minillm.load("random-124m")
    assert model.config == GPT2_SIZES["124m"]
    assert model.n_params() == 124_439_808
    assert model.dtype == np.float32


def test_random_tiny_is_seeded_and_complete():
    a, b = minillm.load("random-tiny"), minillm.load("random-tiny")
    assert a.config.vocab_size == 50257
    assert sorted(a.params) == sorted(expected_shapes(a.config))
    assert a.n_params() == a.config.n_params()
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name], err_msg=name)
    assert a.forward([464, 2068]).shape == (2, 50257)


@pytest.mark.parametrize("name", ["random-7b", "gpt5", "no-such-model"])
def test_unknown_model_name_lists_the_known_ones(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                # so the name cannot be a path by accident
    with pytest.raises(ModelNotFoundError) as e:
        minillm.load(name)
    message = str(e.value)
    assert name in message
    for known in ("random-124m", "random-tiny", "gpt2"):
        assert known in message, f"{known} should be listed: {message}"


def test_gpt2_not_downloaded_says_how_to_download_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_HOME", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match=re.escape("minillm download gpt2")):
        minillm.load("gpt2")


def test_load_float64_gives_float64_params_with_the_same_values(tmp_path):
    save_checkpoint(tmp_path / "ckpt", nontrivial_params(SMALL), SMALL)
    single = minillm.load(tmp_path / "ckpt")
    double = minillm.load(tmp_path / "ckpt", dtype=np.float64)
    assert double.dtype == np.float64
    for name, p in double.params.items():
        assert p.dtype == np.float64, name
        np.testing.assert_array_equal(p, single.params[name].astype(np.float64), err_msg=name)
    assert double.forward([1, 2, 3]).dtype == np.float64


def test_load_random_tiny_in_float64():
    model = minillm.load("random-tiny", dtype=np.float64)
    assert model.dtype == np.float64
    assert {p.dtype for p in model.params.values()} == {np.dtype(np.float64)}
