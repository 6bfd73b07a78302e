"""Read and write the safetensors format in pure NumPy (no torch, no pickle: a file holds only data).

A safetensors file is three parts:

    [ 8 bytes ][ N bytes                                         ][ data section ...      ]
      N (u64,   JSON header: {"name": {"dtype": "F32",              raw little-endian,
      little-    "shape": [768], "data_offsets": [begin, end]},     C-order bytes
      endian)    ..., "__metadata__": {"format": "pt"}}

Offsets are relative to the start of the data section. Reading memory-maps the data section, so a
500 MB checkpoint "loads" instantly and pages come in from disk only when the weights are used.
Every size in the header is checked against the file *before* any array is made: a damaged file
raises `SafetensorsError`, never a huge allocation or a confusing NumPy error.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ..errors import SafetensorsError
from ..paths import _open_checked, atomic_write, not_a_regular_file

# The format's names for element types. BF16 (bfloat16) has no NumPy dtype: it is read as its raw
# 16-bit patterns and widened to float32 (a bfloat16 is the top half of a float32).
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
MAX_HEADER_BYTES = 100_000_000  # the format's cap on N
MAX_DIMS = 32  # NumPy 1's limit on an array's dimensions (NumPy 2 allows 64)
METADATA_KEY = "__metadata__"
_DAMAGED = "the file is damaged or not a safetensors file; re-download or re-save it"


def _error(path, problem: str, fix: str = _DAMAGED) -> SafetensorsError:
    return SafetensorsError(f"{path}: {problem}; {fix}")


# ----------------------------------------------------------------------------------------- reading


def _open(path: Path):
    """The file, opened once and checked by what was opened (paths._open_checked: a regular file; a
    model folder's, inside its folder), as a binary file object: the header and the data are both
    read from it, never from the name again (a file swapped between two opens is never mixed in)."""
    problem = not_a_regular_file(path)
    if problem == "not found":
        raise _error(path, "not found", "check the path, or download the model first")
    if problem is not None:
        fix = "pass the model.safetensors file inside it" if path.is_dir() else "pass a .safetensors file"
        raise _error(path, problem, fix)
    return os.fdopen(_open_checked(path), "rb")


def _read_raw_header(path: Path, f=None) -> tuple[bytes, int]:
    """The header's bytes and the file's size, after checking that the file holds them (from the open
    file f, else the file at path, opened here)."""
    if f is None:
        with _open(path) as f:
            return _read_raw_header(path, f)
    try:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            what = "is empty" if size == 0 else f"is only {size} bytes, too short for the 8-byte header length"
            raise _error(path, what)
        n = int.from_bytes(f.read(8), "little")
        if n > MAX_HEADER_BYTES:
            raise _error(path, f"header length {n} is over the format's {MAX_HEADER_BYTES}-byte cap")
        if n > size - 8:
            raise _error(path, f"header claims {n} bytes but the file has only {size - 8} after the length "
                               "field (truncated download?)")
        return f.read(n), size
    except OSError as e:
        raise _error(path, f"cannot be read ({e.strerror or e})", "check that it exists and is readable") from None


def _parse_json(path: Path, raw: bytes) -> dict:
    """The header as a JSON object (trailing space padding is fine: JSON ignores it)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _error(path, f"header is not UTF-8 text (bad byte at position {e.start})") from None
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as e:
        raise _error(path, f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise _error(path, f"header is a JSON {type(header).__name__}, expected an object of tensors")
    return header


def _no_duplicates(pairs: list) -> dict:
    """A JSON object, refusing a key given twice (which one would count is anyone's guess)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {key!r} appears twice")
    return obj


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)  # JSON true/false parse as bools, which are ints


def _check_metadata(path: Path, metadata) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _error(path, f"{METADATA_KEY} must be an object of string values")
    return metadata


def _check_entry(path: Path, name: str, entry, data_size: int) -> None:
    """One tensor's entry: known dtype, a shape of sizes >= 0, offsets inside the data, matching sizes."""
    where = f"tensor {name!r}"
    if not isinstance(entry, dict):
        raise _error(path, f"{where}: entry is a JSON {type(entry).__name__}, expected an object")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
    if missing:
        raise _error(path, f"{where}: entry is missing {', '.join(missing)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _error(path, f"{where}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})",
                     "re-save the checkpoint in one of those dtypes")
    if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
        raise _error(path, f"{where}: shape {shape!r} is not a list of non-negative integers")
    if len(shape) > MAX_DIMS:
        raise _error(path, f"{where}: has {len(shape)} dimensions, more than NumPy's {MAX_DIMS}")
    if 0 in shape and math.prod(s for s in shape if s) > np.iinfo(np.intp).max:  # NumPy's limit, even when empty
        raise _error(path, f"{where}: shape {shape} is empty but too large for an array")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise _error(path, f"{where}: data_offsets {offsets!r} is not a pair of integers [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise _error(path, f"{where}: data_offsets [{begin}, {end}] fall outside the {data_size}-byte data "
                           "section (truncated file?)")
    expected = math.prod(shape) * DTYPES[dtype].itemsize  # Python ints: no overflow
    if end - begin != expected:
        raise _error(path, f"{where}: holds {end - begin} bytes but shape {shape} of {dtype} needs {expected}")


def _check_coverage(path: Path, entries: dict, data_size: int) -> None:
    """The tensors, sorted by where they begin, must tile the data section exactly: back to back from
    byte 0 to its end, no overlap, no gap (as the format's own reader requires). A header length a few
    bytes short, say, would otherwise shift every tensor and still parse."""
    pos, previous = 0, None
    for begin, end, name in sorted((e["data_offsets"][0], e["data_offsets"][1], name) for name, e in entries.items()):
        if begin < pos:
            raise _error(path, f"tensors {previous!r} and {name!r} overlap in the data section")
        if begin > pos:
            raise _error(path, f"bytes {pos}..{begin} of the data section belong to no tensor (before {name!r})")
        pos, previous = end, name
    if pos != data_size:
        raise _error(path, f"the tensors cover {pos} bytes but the data section holds {data_size} "
                           "(a wrong header length, or bytes appended?)")


def _parse(path, f=None) -> tuple[dict, dict[str, str], int, int]:
    """(tensor entries, metadata, data section start, data section size), all validated (read from the
    open file f where given)."""
    path = path if isinstance(path, Path) else Path(path)
    raw, size = _read_raw_header(path, f)
    header = _parse_json(path, raw)
    metadata = _check_metadata(path, header.pop(METADATA_KEY, None))
    data_start = 8 + len(raw)
    data_size = size - data_start
    for name, entry in header.items():
        _check_entry(path, name, entry, data_size)
    _check_coverage(path, header, data_size)
    return header, metadata, data_start, data_size


def read_header(path) -> tuple[dict, int]:
    """The validated header (without `__metadata__`) and the absolute byte offset of the data section."""
    entries, _, data_start, _ = _parse(path)
    return entries, data_start


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 is the high 16 bits of a float32: shift them back into place."""
    return (bits.astype("<u4") << 16).view("<f4")


def read_safetensors(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """All tensors (read-only, memory-mapped, in the file's dtype; BF16 becomes float32) and the metadata."""
    path = path if isinstance(path, Path) else Path(path)
    with _open(path) as f:                      # one open: the header and the mapped data from it
        entries, metadata, data_start, data_size = _parse(path, f)
        if data_size > 0:
            data = np.asarray(np.memmap(f, dtype=np.uint8, mode="r", offset=data_start, shape=(data_size,)))
    if data_size <= 0:
        data = np.zeros(0, dtype=np.uint8)  # mmap cannot map zero bytes
        data.flags.writeable = False
    tensors = {}
    for name, entry in entries.items():
        begin, end = entry["data_offsets"]
        array = data[begin:end].view(DTYPES[entry["dtype"]]).reshape(entry["shape"])
        tensors[name] = _bf16_to_f32(array) if entry["dtype"] == "BF16" else array
    return tensors, metadata


# ----------------------------------------------------------------------------------------- writing


def _dtype_name(name: str, array: np.ndarray) -> str:
    little = array.dtype.newbyteorder("<")
    for dtype_name, dtype in DTYPES.items():
        if dtype_name != "BF16" and little == dtype:
            return dtype_name
    raise SafetensorsError(f"tensor {name!r}: dtype {array.dtype} cannot be stored in safetensors; "
                           f"convert it to one of {', '.join(n for n in DTYPES if n != 'BF16')} first")


def _build_header(arrays: dict[str, np.ndarray], metadata: dict[str, str] | None) -> bytes:
    """The JSON header for `arrays` laid out back to back in name order, space-padded to 8 bytes."""
    header: dict = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError("safetensors metadata must map strings to strings")
        header[METADATA_KEY] = dict(metadata)
    offset = 0
    for name in sorted(arrays):
        array = arrays[name]
        header[name] = {"dtype": _dtype_name(name, array), "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return raw + b" " * (-len(raw) % 8)  # data then starts 8-byte aligned


def _little_endian_bytes(array: np.ndarray) -> memoryview:
    """The array's bytes as the file stores them: little-endian, C order."""
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return memoryview(little.reshape(-1).view(np.uint8))


def write_safetensors(path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` (and string `metadata`) to `path` atomically: all of it, or nothing.

    The file is written under a temporary name in the same folder, flushed to disk, then renamed over
    `path` (`paths.atomic_write`): a reader never sees half a file, and a failed write leaves the old
    file (if any) untouched.
    """
    path = Path(path)
    for name in tensors:
        if not isinstance(name, str) or name == METADATA_KEY:
            raise SafetensorsError(f"tensor name {name!r}: names must be strings other than {METADATA_KEY!r}")
    arrays = {name: np.asarray(t) for name, t in tensors.items()}
    header = _build_header(arrays, metadata)  # checks dtypes before anything touches the disk
    with atomic_write(path) as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for name in sorted(arrays):
            f.write(_little_endian_bytes(arrays[name]))
