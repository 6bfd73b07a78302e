"""GGUF files (llama.cpp's format): minillm's own bounded reader, and `gguf.quants` to widen blocks.

A GGUF file is a header of typed key/value metadata (the architecture's hyper-parameters, the
tokenizer's vocabulary and merges, the chat template), then tensor descriptions (name, shape, type,
offset), then the tensors, many of them quantized in blocks (Q4_1: 32 weights share a float16 scale
and minimum, each weight 4 bits). minillm reads the header itself (a small loop, below:
the `gguf` package's reader took 15 s over a 49,152-token vocabulary) and `gguf.quants.dequantize`,
llama.cpp's own NumPy code, turns each block-quantized tensor back into float32.

`read_gguf(path)` gives the metadata and the raw tensors, still quantized (`GGUFTensor`: type,
shape, bytes) for whoever computes on them directly; `checkpoint_tensors(raw, names)` gives
the tensors in a family's checkpoint names (`GGUFNames`, from the family's row in
checkpoints/families.py), float32 or kept quantized. This is minillm's one GGUF reader, for every
family; writing goes through the `gguf` package (checkpoints/gguf_gpt2.py).

Every count is checked against the file's size before the reader trusts it: a header that claims
more tensors or keys than the file could hold, an array or a string longer than the bytes left,
is refused, so a damaged or lying file costs a clear error, never a huge allocation or a long loop.
A numeric array stays a read-only view of the file's bytes (no Python list of 2^30 numbers). The
tensors must lie as llama.cpp's own loader demands: in the order listed, each at the offset where
the one before ends (padded to the alignment), each its type's size: two tensors at one offset, or
a type that does not match the bytes (Q8_0 declared on F32 data), are refused.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import DAMAGED
from ..errors import ConfigError, WeightsError
from ..models.quant import FORMATS, QuantMatrix
from ..paths import read_regular

MAGIC = b"GGUF"
# The tensor types minillm dequantizes (all the `gguf` package knows how to; these are the ones tested).
SUPPORTED = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor as the file stores it: `data` is its raw memory-mapped bytes (or values, for
    F32/F16), `shape` the logical NumPy shape ([rows, columns], rows = the output features)."""
    name: str
    type: str
    shape: tuple[int, ...]
    data: np.ndarray


def _error(path, problem: str) -> WeightsError:
    """One line: a damaged file's names may hold any character, shown as "?" unless printable."""
    problem = "".join(c if c.isprintable() else "?" for c in problem)
    return WeightsError(f"{path}: {problem}; {DAMAGED}")


def _check_header(path: Path) -> None:
    """The magic, the version and the counts, before the reader trusts them."""
    size, head = read_regular(path, lambda size: 24, "pass a .gguf file")
    if len(head) < 24:
        raise _error(path, f"only {size} bytes, too short for a GGUF header")
    if head[:4] != MAGIC:
        raise _error(path, f"starts with {head[:4]!r}, not {MAGIC!r}")
    version, n_tensors, n_kv = struct.unpack("<IQQ", head[4:24])
    if version not in (2, 3):
        raise _error(path, f"GGUF version {version}; minillm reads versions 2 and 3")
    # every key/value takes at least 12 bytes (a length, a type, a value), every tensor description 24
    if n_kv * 12 + n_tensors * 24 > size - 24:
        raise _error(path, f"the header claims {n_kv:,} keys and {n_tensors:,} tensors, more than "
                           f"its {size:,} bytes can hold (truncated download?)")


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
MAX_DIMS = 4


class _Cursor:
    """Reads the header's values from the memory-mapped bytes, every length checked against the file.
    (gguf's own GGUFReader builds a NumPy view per value: 15 s for a 49,152-token vocabulary here;
    reading the strings straight from the bytes takes a fraction of a second.)"""

    def __init__(self, buf, path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise _error(self.path, f"the header runs past the end of the file at byte {self.pos:,} "
                                    "(truncated download?)")

    def scalar(self, fmt: str):
        n = struct.calcsize(fmt)
        self.need(n)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        self.need(n)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int, depth: int = 0):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind == 9 and depth == 0:
            item, n = self.scalar("<I"), self.scalar("<Q")
            if item in _NUMPY:
                size = np.dtype(_NUMPY[item]).itemsize
                self.need(n * size)
                out = np.frombuffer(self.buf, _NUMPY[item], n, self.pos)      # a view: no copy, no list
                self.pos += n * size
                return out
            self.need(n * 8)                     # every string or array item takes 8 bytes at least
            return [self.value(item, depth + 1) for _ in range(n)]
        raise _error(self.path, f"unknown value type {kind} at byte {self.pos:,}")


def read_gguf(path) -> tuple[dict, dict[str, GGUFTensor]]:
    """The metadata (key -> Python value) and every tensor, raw (not dequantized, memory-mapped)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    path = Path(path)
    _check_header(path)
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    c = _Cursor(buf, path)
    c.pos = 8
    n_tensors, n_kv = c.scalar("<Q"), c.scalar("<Q")
    metadata = {}
    for _ in range(n_kv):
        key = c.string()
        if key in metadata:
            raise _error(path, f"metadata key {key[:60]} appears twice")
        metadata[key] = c.value(c.scalar("<I"))
    infos, seen = [], set()
    for _ in range(n_tensors):
        name = c.string()
        if name in seen:
            raise _error(path, f"tensor {name[:60]} appears twice")
        seen.add(name)
        n_dims = c.scalar("<I")
        if not 1 <= n_dims <= MAX_DIMS:
            raise _error(path, f"tensor {name[:60]} has {n_dims} dimensions")
        dims = [c.scalar("<Q") for _ in range(n_dims)]
        if min(dims) < 1:
            raise _error(path, f"tensor {name[:60]} has shape {dims} with an empty dimension")
        kind, offset = c.scalar("<I"), c.scalar("<Q")
        infos.append((name, dims, kind, offset))
    align = metadata.get("general.alignment", 32)
    if not isinstance(align, int) or align < 1 or align & (align - 1):
        raise _error(path, f"general.alignment {align!r} is not a power of two")
    data_start = -(-c.pos // align) * align
    tensors = {}
    end, before = 0, None                   # where the tensors so far end (from data_start), the last one
    for name, dims, kind, offset in infos:
        try:
            qtype = GGMLQuantizationType(kind)
        except ValueError:
            raise _error(path, f"tensor {name[:60]} has unknown type {kind}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        if dims[0] % block:
            raise _error(path, f"tensor {name[:60]}: a row of {dims[0]} is not whole {qtype.name} blocks")
        row_bytes = dims[0] // block * type_size
        n_rows = math.prod(dims[1:])
        begin, nbytes = data_start + offset, row_bytes * n_rows
        if begin + nbytes > len(buf):
            raise _error(path, f"tensor {name[:60]} ({nbytes:,} bytes at {begin:,}) runs past the end of "
                               f"the file's {len(buf):,} bytes (truncated download?)")
        if offset != end:                   # llama.cpp's rule: each tensor where the one before ends
            raise _error(path, _misplaced(name, offset, end, before))
        end, before = offset + -(-nbytes // align) * align, (name, qtype.name, dims, nbytes)
        raw = np.asarray(buf[begin:begin + nbytes])
        shape = tuple(reversed(dims))                   # GGUF lists the fastest axis first
        if qtype.name in ("F32", "F16"):
            data = raw.view("<f4" if qtype.name == "F32" else "<f2").reshape(shape)
        else:
            data = raw.reshape(*shape[:-1], row_bytes)
        tensors[name] = GGUFTensor(name, qtype.name, shape, data)
    if before is not None and len(buf) - data_start - end >= align:
        raise _error(path, f"{len(buf) - data_start - end:,} bytes follow the last tensor's "
                           + _misplaced(None, len(buf) - data_start, end, before))
    return metadata, tensors


def _misplaced(name, offset: int, end: int, before) -> str:
    """Why a tensor does not start where the one before it ends: they overlap, or the one before
    declares fewer bytes than it holds (its type or shape does not match its data)."""
    if before is None:
        return f"tensor {name[:60]} starts at offset {offset:,}, not at 0 where the tensor data begins"
    prev, kind, dims, nbytes = before
    what = f"tensor {prev[:60]} ({kind}, shape {dims}: {nbytes:,} bytes)"
    if name is None:
        return f"end ({what}): its type or shape does not match its bytes"
    if offset < end:
        return f"tensor {name[:60]} at offset {offset:,} overlaps {what}, which ends at {end:,}"
    return (f"tensor {name[:60]} starts at offset {offset:,}, {offset - end:,} bytes after the end of {what}: "
            "its type or shape does not match its bytes")


def dequantize(t: GGUFTensor, where) -> np.ndarray:
    """A tensor in float32, its logical shape."""
    if t.type not in SUPPORTED:
        raise WeightsError(f"{where}: tensor {t.name} has type {t.type}; minillm dequantizes "
                           f"{', '.join(SUPPORTED)}")
    try:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as gguf_dequantize
        out = gguf_dequantize(t.data, GGMLQuantizationType[t.type])
        out = np.asarray(out, dtype=np.float32).reshape(t.shape)
    except Exception as e:
        raise _error(where, f"tensor {t.name} ({t.type}, shape {list(t.shape)}) cannot be dequantized "
                            f"({type(e).__name__}: {str(e)[:80]})") from None
    return out


@dataclass(frozen=True)
class GGUFNames:
    """A family's tensor names both ways: the checkpoint's (`h.3.attn.c_attn.weight`) and GGUF's
    (`blk.3.attn_qkv.weight`). The reader uses it one way, `minillm quantize`'s writer the other."""
    block: str                   # the checkpoint's block prefix: "h" (GPT-2), "layers" (Llama)
    blocks: dict                 # a block tensor's name, no prefix and no .weight/.bias -> GGUF's
    top: dict                    # the others, the same way

    def to_gguf(self, name: str) -> str:
        """`h.3.attn.c_attn.weight` -> `blk.3.attn_qkv.weight`."""
        stem, suffix = name.rsplit(".", 1)
        if stem in self.top:
            return f"{self.top[stem]}.{suffix}"
        _, i, rest = stem.split(".", 2)
        return f"blk.{i}.{self.blocks[rest]}.{suffix}"

    def from_gguf(self, name: str) -> str | None:
        """`blk.3.attn_qkv.weight` -> `h.3.attn.c_attn.weight`; None for a name the family does not use."""
        parts = name.split(".")
        back = {g: k for k, g in self.blocks.items()}
        if parts[0] == "blk" and len(parts) == 4 and parts[2] in back and parts[1].isdigit():
            return f"{self.block}.{parts[1]}.{back[parts[2]]}.{parts[3]}"
        top = {g: k for k, g in self.top.items()}
        if len(parts) == 2 and parts[0] in top:
            return f"{top[parts[0]]}.{parts[1]}"
        return None


def unpermute(w, n_head: int):
    """Undo llama.cpp's converter, which reorders each head's q and k rows from the rotate-half
    layout (i, i + hd/2) to interleaved pairs (2i, 2i + 1). w [n_head·hd, d] -> the same shape.
    A quantized w (models/quant.py) has its rows reordered whole, blocks and scales with them."""
    rows = w.shape[0]
    if isinstance(w, QuantMatrix):
        return w.take_rows(unpermute(np.arange(rows)[:, None], n_head)[:, 0])
    pairs = w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])     # [heads, hd/2, 2, d]: (2i, 2i+1)
    return pairs.swapaxes(1, 2).reshape(w.shape)                        # [heads, 2, hd/2, d]: (i, i+hd/2)


def checkpoint_tensors(raw: dict[str, GGUFTensor], names: GGUFNames, path, *,
                       keep_quantized: bool = False) -> dict:
    """`read_gguf`'s tensors in the checkpoint's names, as the file lays them out (a matrix as its
    [out, in] rows). Every tensor float32, or with keep_quantized, the file's Q8_0 / Q4_0 / Q4_1
    matrices as `QuantMatrix` (its bytes, unwidened). Names the family does not use are skipped."""
    tensors = {}
    for name, t in raw.items():
        ours = names.from_gguf(name)
        if ours is None:
            if name.startswith("rope_freqs"):
                raise ConfigError(f"{path}: tensor {name} (rope frequency factors) is not implemented; "
                                  "minillm runs the default rotary embedding only")
            continue
        if keep_quantized and t.type.lower() in FORMATS and len(t.shape) == 2:
            tensors[ours] = QuantMatrix.from_gguf_blocks(t.data, t.type.lower(), t.shape)
        else:
            tensors[ours] = dequantize(t, path)
    return tensors
