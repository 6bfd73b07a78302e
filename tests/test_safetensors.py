"""safetensors read/write: round trips, BF16, the real fixtures, every kind of damage, atomic writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minillm.checkpoints.safetensors as stf
from minillm.errors import MiniLLMError, SafetensorsError
from minillm.checkpoints.safetensors import read_header, read_safetensors, write_safetensors

FIXTURES = Path(__file__).parent / "fixtures"


def raw_file(path: Path, header, data: bytes = b"", *, length: int | None = None, pad: int = 0) -> Path:
    """Write a file by hand: any header (object or raw bytes), any data, optionally a lying length field."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    head += b" " * pad
    path.write_bytes((len(head) if length is None else length).to_bytes(8, "little") + head + data)
    return path


def entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def no_temp_files(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


# --------------------------------------------------------------------------------------- round trips

DTYPES = ["<f8", "<f4", "<f2", ">f4", "<i8", "<i4", ">i2", "i1", "<u8", "<u4", "<u2", "u1", "?"]
tensor = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
)
names = st.text(min_size=0, max_size=8).filter(lambda s: s != "__metadata__")


@settings(max_examples=60, deadline=None)
@given(tensors=st.dictionaries(names, tensor, max_size=4),
       metadata=st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))
def test_round_trip(tensors, metadata):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.safetensors"
        write_safetensors(path, tensors, metadata)
        back, meta = read_safetensors(path)
        assert meta == (metadata or {})
        assert set(back) == set(tensors)
        for name, a in tensors.items():
            b = back[name]
            assert b.shape == a.shape
            assert b.dtype == a.dtype.newbyteorder("<")
            assert b.tobytes() == a.astype(b.dtype).tobytes()  # bit-exact, NaN payloads and -0.0 included
            assert not b.flags.writeable
        header, data_start = read_header(path)
        assert data_start % 8 == 0  # header padded so the data is aligned
        assert list(header) == sorted(tensors)
        assert no_temp_files(Path(d))


def test_reads_are_memory_mapped(tmp_path):
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"w": np.arange(1000, dtype=np.float32)})
    w = read_safetensors(path)[0]["w"]
    base = w
    while not isinstance(base, np.memmap) and base is not None:
        base = base.base
    assert isinstance(base, np.memmap)


def test_overwrite_and_written_layout(tmp_path):
    path = tmp_path / "x.safetensors"
    write_safetensors(path, {"old": np.zeros(3, np.float32)})
    write_safetensors(path, {"b": np.ones((2, 3), np.float16), "a": np.int64(7)}, {"format": "pt"})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0 and raw[8:8 + n].rstrip(b" ").endswith(b"}")
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"format": "pt"}
    assert header["a"] == entry("I64", [], (0, 8)) and header["b"] == entry("F16", [2, 3], (8, 20))
    assert len(raw) == 8 + n + 20


def test_bf16_read_as_float32(tmp_path):
    # bfloat16 bit patterns written by hand: sign, 8 exponent bits, 7 mantissa bits
    bf16 = np.array([0x3F80, 0xC020, 0x0000, 0x7F80, 0x4049, 0xF180], dtype="<u2")
    values = np.array([1.0, -2.5, 0.0, np.inf, 3.140625, -(2.0**100)], dtype=np.float32)
    path = raw_file(tmp_path / "bf.safetensors", {"x": entry("BF16", [2, 3], (0, 12))}, bf16.tobytes())
    x = read_safetensors(path)[0]["x"]
    assert x.dtype == np.float32 and x.shape == (2, 3)
    np.testing.assert_array_equal(x.ravel(), values)


def test_padding_and_empty_file_body(tmp_path):
    path = raw_file(tmp_path / "p.safetensors", {"x": entry(), "__metadata__": {"k": "v"}},
                    np.array([1, 2], np.float32).tobytes(), pad=5)
    tensors, meta = read_safetensors(path)
    np.testing.assert_array_equal(tensors["x"], [1, 2])
    assert meta == {"k": "v"}
    empty = raw_file(tmp_path / "e.safetensors", {"z": entry(shape=[0, 3], offsets=(0, 0))})
    assert read_safetensors(empty)[0]["z"].shape == (0, 3)
    assert read_safetensors(raw_file(tmp_path / "n.safetensors", {})) == ({}, {})


# ------------------------------------------------------------------------------------ real fixtures


def test_fixture_a_f32_with_transformer_prefix():
    path = FIXTURES / "gpt2-tiny-a" / "model.safetensors"
    tensors, meta = read_safetensors(path)
    assert meta == {"format": "pt"}
    assert len(tensors) == 2 * 12 + 4
    assert all(name.startswith("transformer.") and t.dtype == np.float32 for name, t in tensors.items())
    assert tensors["transformer.wte.weight"].shape == (512, 64)
    assert tensors["transformer.wpe.weight"].shape == (64, 64)
    assert tensors["transformer.h.1.attn.c_attn.weight"].shape == (64, 192)
    assert tensors["transformer.h.0.mlp.c_proj.weight"].shape == (256, 64)
    assert np.isfinite(tensors["transformer.wte.weight"]).all()


def test_fixture_b_f16_with_attn_bias_buffers():
    path = FIXTURES / "gpt2-tiny-b" / "model.safetensors"
    tensors, _ = read_safetensors(path)
    assert len(tensors) == 3 * 13 + 4
    assert all(t.dtype == np.float16 for t in tensors.values())
    assert tensors["wte.weight"].shape == (1000, 96)
    assert tensors["h.2.mlp.c_fc.weight"].shape == (96, 384)
    for i in range(3):
        assert tensors[f"h.{i}.attn.bias"].shape == (1, 1, 96, 96)
    header, data_start = read_header(path)
    assert header["ln_f.bias"] == entry("F16", [96], (726336, 726528))
    assert data_start == 8 + 3528


# ---------------------------------------------------------------------------------------- damage

GOOD = np.array([1, 2], np.float32).tobytes()
DAMAGE = {
    # case: (header, data, raw_file kwargs, words the message must contain)
    "broken JSON": (b'{"x": {"dtype": "F32",', GOOD, {}, "not valid JSON"),
    "not UTF-8": (b'{"\xff": 1}', GOOD, {}, "not UTF-8"),
    "not an object": ([1, 2], GOOD, {}, "expected an object"),
    "entry not an object": ({"x": 3}, GOOD, {}, "'x'"),
    "missing field": ({"x": {"dtype": "F32", "shape": [2]}}, GOOD, {}, "missing data_offsets"),
    "unknown dtype": ({"x": entry("F8_E4M3")}, GOOD, {}, "unknown dtype 'F8_E4M3' (known: F64, F32"),
    "bad shape": ({"x": entry(shape=[2, -1])}, GOOD, {}, "shape [2, -1]"),
    "float shape": ({"x": {**entry(), "shape": [2.0]}}, GOOD, {}, "shape [2.0]"),
    "bad offsets": ({"x": entry(offsets=[0])}, GOOD, {}, "data_offsets [0]"),
    "negative offset": ({"x": entry(offsets=(-8, 0))}, GOOD, {}, "outside"),
    "offsets beyond data": ({"x": entry(offsets=(8, 16))}, GOOD, {}, "outside the 8-byte data section"),
    "length mismatch": ({"x": entry(shape=[3])}, GOOD, {}, "holds 8 bytes but shape [3] of F32 needs 12"),
    "huge shape": ({"x": entry(shape=[10**12, 10**12])}, GOOD, {}, "needs 4000000000000000000000000"),
    "overlap": ({"a": entry(offsets=(0, 8)), "b": entry(shape=[1], offsets=(4, 8))}, GOOD, {}, "overlap"),
    "list dtype": ({"x": entry(["F32"])}, GOOD, {}, "unknown dtype ['F32']"),
    "too many dimensions": ({"x": entry(shape=[1] * 65 + [2])}, GOOD, {}, "66 dimensions"),
    "empty with a huge side": ({"x": entry(shape=[0, 2**63], offsets=(0, 0)), "y": entry()}, GOOD, {}, "too large for an array"),
    "duplicate key": (b'{"x": ' + json.dumps(entry()).encode() + b', "x": '
                      + json.dumps(entry(shape=[1], offsets=(0, 4))).encode() + b"}", GOOD, {}, "'x' appears twice"),
    "gap": ({"a": entry(shape=[1], offsets=(0, 4)), "b": entry(shape=[0], offsets=(8, 8))}, GOOD, {},
            "bytes 4..8 of the data section belong to no tensor"),
    "trailing bytes": ({"x": entry()}, GOOD + b"junk", {}, "the tensors cover 8 bytes but the data section holds 12"),
    "deep JSON": (b"[" * 100_000 + b"]" * 100_000, GOOD, {}, "not valid JSON"),
    "bad metadata": ({"x": entry(), "__metadata__": {"k": 1}}, GOOD, {}, "__metadata__"),
    "huge header length": ({}, b"", {"length": 2**63}, "over the format's 100000000-byte cap"),
    "header claims more than file": ({"x": entry()}, GOOD, {"length": 5000}, "header claims 5000 bytes but"),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_damaged_file_raises_helpful_error(tmp_path, case):
    header, data, kwargs, words = DAMAGE[case]
    path = raw_file(tmp_path / "bad.safetensors", header, data, **kwargs)
    for read in (read_safetensors, read_header):
        with pytest.raises(SafetensorsError) as err:
            read(path)
        message = str(err.value)
        assert str(path) in message and words in message
        assert "re-" in message  # says what to do: re-download or re-save


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_corruption_is_read_or_rejected_cleanly(data):
    """Flip, cut or change any bytes of a good file: either it still reads or raises SafetensorsError."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.safetensors"
        write_safetensors(path, {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.int8(5)})
        raw = bytearray(path.read_bytes())
        for _ in range(data.draw(st.integers(1, 4))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        path.write_bytes(bytes(raw[: data.draw(st.integers(0, len(raw)))]))
        try:
            tensors, _ = read_safetensors(path)
        except SafetensorsError:
            return
        assert sum(t.nbytes for t in tensors.values()) <= len(raw)


@pytest.mark.parametrize("content", [b"", b"\x10\x00\x00", b"\x00" * 7])
def test_empty_or_shorter_than_length_field(tmp_path, content):
    path = tmp_path / "short.safetensors"
    path.write_bytes(content)
    with pytest.raises(SafetensorsError, match="empty|too short"):
        read_safetensors(path)


def test_header_length_a_few_bytes_short_is_named(tmp_path):
    """The padding spaces keep the JSON valid when N is short: every tensor would be read shifted."""
    path = tmp_path / "s.safetensors"
    write_safetensors(path, {"a": np.arange(6, dtype=np.float32), "b": np.ones(3, np.float32)})
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    assert raw[8 + n - 1:8 + n] == b" "                            # the writer padded this header
    raw[:8] = (n - 1).to_bytes(8, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(SafetensorsError, match="cover 36 bytes but the data section holds 37"):
        read_safetensors(path)


def test_truncated_file(tmp_path):
    path = tmp_path / "t.safetensors"
    write_safetensors(path, {"w": np.zeros((16, 16), np.float32)})
    whole = path.read_bytes()
    for cut in (len(whole) - 1, len(whole) - 512, 20):
        path.write_bytes(whole[:cut])
        with pytest.raises(SafetensorsError, match="truncated"):
            read_safetensors(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(SafetensorsError, match="not found"):
        read_safetensors(tmp_path / "nope.safetensors")
    with pytest.raises(SafetensorsError, match="is a directory"):
        read_header(tmp_path)
    assert issubclass(SafetensorsError, MiniLLMError)


# ------------------------------------------------------------------------------------ atomic write


def test_unsupported_dtype_leaves_nothing(tmp_path):
    path = tmp_path / "o.safetensors"
    for bad in (np.array([object()]), np.array(["text"]), np.zeros(2, np.complex64)):
        with pytest.raises(SafetensorsError, match="cannot be stored"):
            write_safetensors(path, {"ok": np.zeros(2), "bad": bad})
    with pytest.raises(SafetensorsError):
        write_safetensors(path, {"__metadata__": np.zeros(2)})
    assert list(tmp_path.iterdir()) == []


def test_failure_mid_write_keeps_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"old": np.arange(3, dtype=np.float32)})
    before = path.read_bytes()
    real = stf._little_endian_bytes
    calls = []

    def fail_on_second(array):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("No space left on device")
        return real(array)

    monkeypatch.setattr(stf, "_little_endian_bytes", fail_on_second)
    with pytest.raises(OSError, match="No space"):
        write_safetensors(path, {"a": np.zeros(4), "b": np.ones(4), "c": np.ones(4)})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["w.safetensors"]

    calls.clear()
    fresh = tmp_path / "fresh.safetensors"
    with pytest.raises(OSError):
        write_safetensors(fresh, {"a": np.zeros(4), "b": np.ones(4)})
    assert not fresh.exists() and no_temp_files(tmp_path)


@pytest.mark.parametrize("step", ["fsync", "replace"])
def test_failure_at_fsync_or_rename_leaves_nothing(tmp_path, monkeypatch, step):
    def boom(*args):
        raise OSError(f"{step} failed")

    monkeypatch.setattr(os, step, boom)
    path = tmp_path / "f.safetensors"
    with pytest.raises(OSError, match=step):
        write_safetensors(path, {"a": np.zeros(4, np.float32)})
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_interrupt_is_cleaned_up_too(tmp_path, monkeypatch):
    def interrupt(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_safetensors(tmp_path / "k.safetensors", {"a": np.zeros(4)})
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_a_temporary_file_left_by_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    """SIGKILL inside a save leaves `.<name>.<pid>-<random>.tmp`; a live writer's temporary is kept."""
    path = tmp_path / "m.safetensors"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    left = tmp_path / f".m.safetensors.{dead}-abc.tmp"
    left.write_bytes(b"half a file")
    live = tmp_path / f".m.safetensors.{os.getppid()}-xyz.tmp"
    live.write_bytes(b"someone else is writing")
    other = tmp_path / f".other.{dead}-abc.tmp"
    other.write_bytes(b"not ours")
    write_safetensors(path, {"a": np.zeros(2, np.float32)})
    assert not left.exists() and live.exists() and other.exists()
    assert read_safetensors(path)[0]["a"].shape == (2,)
