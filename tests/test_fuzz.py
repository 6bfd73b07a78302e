"""Malformed checkpoints of every kind the reader and `minillm.load` have been caught out by, thrown at
both: each must load or raise a `MiniLLMError` (never another exception, a hang, or an allocation
that grows with the numbers the file claims rather than with its bytes)."""

from __future__ import annotations

import json
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import minillm
from minillm.checkpoints.checkpoint import expected_shapes
from minillm.models.gpt2 import GPT2Config
from minillm.errors import MiniLLMError
from minillm.checkpoints.safetensors import read_safetensors

CONFIG = GPT2Config(n_layer=1, n_head=1, n_embd=4, n_ctx=4, vocab_size=8)
SHAPES = expected_shapes(CONFIG)
NAMES = sorted(SHAPES)

json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6)
huge = st.sampled_from([0, -1, 10**7, 2**31, 2**63, 10**400])
config_value = huge | json_value | st.just("1" + "0" * 400)


@st.composite
def checkpoints(draw) -> tuple[bytes, bytes | None]:
    """(the .safetensors bytes, a config.json beside it or None), damaged in one or more ways."""
    cfg = CONFIG.to_hf()
    if draw(st.booleans()):
        cfg[draw(st.sampled_from(["n_layer", "n_head", "n_embd", "n_positions", "vocab_size",
                                  "layer_norm_epsilon"]))] = draw(config_value)
    cfg_text = json.dumps(cfg)
    if draw(st.integers(0, 9)) == 0:
        cfg_text = "[" * 100_000 + "]" * 100_000                                   # nested too deep
    tensors = {}                                                    # name -> [dtype, shape, bytes]
    for name in NAMES:
        array = np.random.default_rng(0).standard_normal(SHAPES[name]).astype(np.float32)
        tensors[name] = ["F32", list(SHAPES[name]), bytearray(array.tobytes())]
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(sorted(tensors)))
        kind = draw(st.sampled_from(["dtype", "shape", "drop", "nan", "embedding"]))
        if kind == "dtype":
            tensors[name][0] = draw(json_value | st.sampled_from(["F16", "BF16", "I8", "BOOL", "U64"]))
        elif kind == "shape":
            tensors[name][1] = draw(json_value | st.lists(huge | st.integers(0, 9), max_size=70)
                                    | st.just([0, 2**63]) | st.just([1] * 65))
        elif kind == "drop":
            del tensors[name]
        elif kind == "nan":
            tensors[name][2][:4] = np.float32(draw(st.sampled_from([np.nan, np.inf, -np.inf]))).tobytes()
        else:                            # wte/wpe as a vector, a cube, a scalar: bytes to match, so the loader sees it
            shape = draw(st.sampled_from([[32], [8, 4, 1], [], [1, 8, 4], [0, 4], [2, 0]]))
            tensors[draw(st.sampled_from(["wte.weight", "wpe.weight"]))] = ["F32", shape, bytearray(4 * int(np.prod(shape)))]
    header: dict = {}
    data = bytearray()
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if draw(st.integers(0, 3)) == 0:
        header[draw(st.sampled_from(sorted(header)))]["data_offsets"] = draw(
            json_value | st.lists(st.integers(-9, len(data) + 9), max_size=3))
    header["__metadata__"] = {"format": "pt", "config": cfg_text}
    if draw(st.booleans()):
        header.pop("__metadata__")
    raw = json.dumps(header).encode()
    if draw(st.integers(0, 5)) == 0:                                               # a key given twice
        raw = raw[:-1] + b', "wte.weight": ' + json.dumps(header.get("wpe.weight", {})).encode() + b"}"
    raw += b" " * (-len(raw) % 8 + 8)
    length = len(raw) + draw(st.sampled_from([0, 0, 0, -1, -3, -8, 1, 2**40]))     # a length a few bytes off
    blob = bytearray(length.to_bytes(8, "little") + raw + bytes(data))
    for _ in range(draw(st.integers(0, 2))):                                       # flip a byte anywhere
        blob[draw(st.integers(0, len(blob) - 1))] = draw(st.integers(0, 255))
    if draw(st.integers(0, 4)) == 0:
        blob = blob[:draw(st.integers(0, len(blob)))]                              # truncated
    return bytes(blob), (cfg_text.encode() if draw(st.booleans()) else None)


def load_every_way(blob: bytes, config: bytes | None) -> None:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "ckpt"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(blob)
        if config is not None:
            (folder / "config.json").write_bytes(config)
        tracemalloc.start()
        try:
            for attempt in (lambda: read_safetensors(folder / "model.safetensors"),
                            lambda: minillm.load(folder / "model.safetensors", quiet=True),
                            lambda: minillm.load(folder, quiet=True)):
                try:
                    attempt()
                    event("loaded")
                except MiniLLMError as e:
                    event(type(e).__name__)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        # the input's bytes, a few copies of them (float32 params, the model's buffers), and a constant
        assert peak < 2_000_000 + 64 * (len(blob) + len(config or b"")), f"peak {peak:,} bytes"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(checkpoints())
def test_damaged_checkpoints_load_or_raise_minillm_error(case):
    load_every_way(*case)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(checkpoints())
def test_damaged_checkpoints_long_run(case):
    load_every_way(*case)
