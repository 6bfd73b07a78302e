"""Config bombs: a checkpoint folder of a few megabytes whose config.json asks for 2^62 layers,
heads, widths, words or experts, or a linear-attention state of terabytes. Each is refused in one
line before anything is sized by it: under a second and ~100 MB (the file's size, twice, at most),
for every family minillm reads. And a DeepSeek-V3 checkpoint that holds its multi-token-prediction
block loads (the block dropped), with the logits of the same checkpoint without it.
"""

from __future__ import annotations

import json
import shutil
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm.checkpoints.safetensors import read_safetensors, write_safetensors
from minillm.errors import ConfigError, MiniLLMError

FIXTURES = Path(__file__).parent / "fixtures"
QWEN35 = FIXTURES / "w5" / "qwen35-tiny"
DEEPSEEK = FIXTURES / "deepseekv3-direct-bf16"
HUGE = (10**8, 2**40, 2**62)


@pytest.fixture(scope="module", autouse=True)
def _imported():
    """The readers' modules imported once (the first load's imports are not what is timed)."""
    minillm.load(QWEN35)
    minillm.load(FIXTURES / "gpt2-tiny-a")


def copy_with(tmp_path: Path, src: Path, drop=(), **changes) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k in drop:
        cfg.pop(k, None)
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def refused_quickly(folder: Path, *words: str) -> str:
    """minillm.load(folder) refuses in one line naming `words`, in under a second and 100 MB."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(MiniLLMError) as e:
            minillm.load(folder)
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    assert took < 1.0, f"{took:.2f} s to refuse: {msg}"
    assert peak < 100e6, f"{peak / 1e6:.0f} MB to refuse: {msg}"
    return msg


@pytest.mark.parametrize("layers", HUGE)
def test_qwen35_layers_without_layer_types_are_refused_before_any_list_of_them(tmp_path, layers):
    """No layer_types: the reader would list every layer's kind (10^8 entries: 2.6 GB and 45 s); the
    count is checked against the blocks the file holds first."""
    folder = copy_with(tmp_path, QWEN35, drop=["layer_types"], num_hidden_layers=layers)
    refused_quickly(folder, "num_hidden_layers", "blocks")


@pytest.mark.parametrize("dims", [(2**12, 2**12), (2**14, 2**15), (2**20, 2**20)])
def test_a_linear_attention_state_larger_than_the_weights_or_the_machine_is_refused(tmp_path, dims):
    """linear_key_head_dim · linear_value_head_dim per value head: a state of 0.8 GiB to 12 TiB for
    one sequence, from a config of a few bytes. Refused at load, before a pool is sized by it."""
    dk, dv = dims
    folder = copy_with(tmp_path, QWEN35, linear_key_head_dim=dk, linear_value_head_dim=dv)
    refused_quickly(folder, "linear-attention state", "bytes")


def test_the_fixtures_state_still_loads():
    m = minillm.load(QWEN35)
    assert m.config.state_bytes() < 4 * m.config.n_params()


FAMILY_BOMBS = {
    "llama-tiny": ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
                   "intermediate_size", "vocab_size", "head_dim", "max_position_embeddings"),
    "qwen3moe-tiny": ("num_hidden_layers", "num_local_experts", "decoder_sparse_step", "num_experts_per_tok", "moe_intermediate_size",
                      "vocab_size", "hidden_size"),
    "mixtral-tiny": ("num_hidden_layers", "num_local_experts", "num_experts_per_tok", "vocab_size"),
    "deepseekv3-direct-bf16": ("num_hidden_layers", "n_routed_experts", "num_experts_per_tok", "kv_lora_rank",
                               "qk_rope_head_dim", "v_head_dim", "n_group", "vocab_size", "hidden_size",
                               "num_nextn_predict_layers"),
    "w5/qwen35-tiny": ("num_hidden_layers", "linear_num_value_heads", "linear_num_key_heads", "head_dim",
                       "vocab_size", "hidden_size", "linear_conv_kernel_dim"),
    "gpt2-tiny-a": ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions"),
}


@pytest.mark.parametrize("name, field", [(n, f) for n, fs in FAMILY_BOMBS.items() for f in fs])
@pytest.mark.parametrize("value", [2**40, 2**62])
def test_every_familys_counts_are_refused_quickly_when_huge(tmp_path, name, field, value):
    """Each count a config gives (layers, heads, widths, words, experts, ...) at 2^40 and 2^62: one line
    (or, for a count the file cannot contradict and nothing is sized by, a model that loads), under
    a second and 100 MB either way."""
    src = FIXTURES / name
    folder = copy_with(tmp_path, src, **{field: value})
    if field == "num_nextn_predict_layers":               # names blocks the file does not hold: nothing to drop
        assert minillm.load(folder).config == minillm.load(src).config
        return
    refused_quickly(folder)


def test_a_deepseek_v3_checkpoint_with_its_multi_token_prediction_block_loads(tmp_path):
    """DeepSeek-V3's files hold one more block after the last (num_nextn_predict_layers = 1): its own
    embedding norm, hidden norm, projection, shared head and a whole decoder block. minillm drops it
    and computes the same logits as without it."""
    cfg = json.loads((DEEPSEEK / "config.json").read_text())
    L = cfg["num_hidden_layers"]
    tensors, meta = read_safetensors(DEEPSEEK / "model.safetensors")
    tensors = {k: np.array(v) for k, v in tensors.items()}
    last = f"model.layers.{L - 1}."
    mtp = {k.replace(last, f"model.layers.{L}."): v for k, v in tensors.items() if k.startswith(last)}
    d = cfg["hidden_size"]
    rng = np.random.default_rng(0)
    for name, shape in (("enorm.weight", (d,)), ("hnorm.weight", (d,)), ("eh_proj.weight", (d, 2 * d)),
                        ("shared_head.norm.weight", (d,)), ("shared_head.head.weight", (cfg["vocab_size"], d))):
        mtp[f"model.layers.{L}.{name}"] = rng.standard_normal(shape).astype(np.float32)
    folder = copy_with(tmp_path, DEEPSEEK, num_nextn_predict_layers=1)
    write_safetensors(folder / "model.safetensors", {**tensors, **mtp}, meta)
    e = np.load(DEEPSEEK / "expected.npz")
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    assert np.array_equal(minillm.load(folder).forward(ids), minillm.load(DEEPSEEK).forward(ids))
    folder2 = copy_with(tmp_path / "b", DEEPSEEK, num_nextn_predict_layers=0)      # not named: refused
    write_safetensors(folder2 / "model.safetensors", {**tensors, **mtp}, meta)
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        minillm.load(folder2)
