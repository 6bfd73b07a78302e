"""The integer kernel set's weights (`--kernels int8`): quantized products the way llama.cpp
multiplies them, W8A8 / W4A8 (minillm/kernels/int8.py: the arithmetic, its exact NumPy reference and
what it costs in accuracy; _int8.py: the kernels and their measured forms).

Int8Quant is a QuantMatrix (same values, same bytes, same `rows`, `dequantize`, `fixed_matmul`)
whose product rounds each row of x to int8 blocks once and multiplies the blocks in integers, for
any number of rows: one pass over the weight's groups serves all of x's rows (32 at a time from the
cache), so decode rows and a prefill's tiles are the same kernel. A weight keeps its values (Q8_0)
or nibbles (Q4) in the order the kernels read them (kernels/int8.py's lane order), not GGUF's, and
only so: `q` and `q_rows` give GGUF's order back, a copy of the rows asked for (an embedding's
lookup reads those rows alone). Float weights (a float32 model, norms aside) are the fused set's
(models/fused.py): the integer set changes quantized products only. `compiled_blocks`: the set's
decode step, its blocks in one compiled call.
"""

from __future__ import annotations

import numpy as np

from .. import meter
from ..kernels import int8
from ..kernels.aligned import aligned_empty
from .fused import fuse
from .quant import QK, QuantMatrix, kept_counts


class Int8Quant(QuantMatrix):
    """A QuantMatrix multiplied by the integer kernels (see the module's docstring)."""

    def __init__(self, fmt, q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None) -> None:
        super().__init__(fmt, q, d, m)
        self.planes = int8.lane_order(int8.planes(q, d, m))       # the kernel's arguments, made once, on
                                                                   # 64-byte boundaries (kernels/aligned.py)
        self._kernel = None

    # q, d and m live in the planes alone, in lane order: each read gives GGUF's order back, a copy
    # (a weight keeps its bytes once); q_rows and scale_rows read only the rows asked for.

    @property
    def q(self) -> np.ndarray:
        """q in GGUF's order ([R, C] int8, or [R, C/2] uint8 nibbles), made from the lane order the
        kernels read (a copy: the weight keeps its bytes once)."""
        return self.q_rows(slice(None))

    @q.setter
    def q(self, q: np.ndarray) -> None:          # QuantMatrix's __init__: the planes hold it, laid out
        pass

    @property
    def d(self) -> np.ndarray:
        """The scales in GGUF's order, float16 [R, C/32] (a copy, as q)."""
        return self._plane_rows(1, slice(None))

    @d.setter
    def d(self, d: np.ndarray) -> None:
        pass

    @property
    def m(self) -> np.ndarray | None:
        """Q4_1's minimums in GGUF's order, float16 [R, C/32] (a copy, as q); None for other formats."""
        return self._plane_rows(2, slice(None)) if self.fmt.has_min else None

    @m.setter
    def m(self, m: np.ndarray | None) -> None:
        pass

    def q_rows(self, rows) -> np.ndarray:
        R, C = self.shape
        return int8.lane_rows(self.planes[0], R, C // QK, rows)

    def rows(self, ids: np.ndarray, dtype=None) -> np.ndarray:
        """QuantMatrix.rows' floats (GGUF's dequantization) read straight from the lane order in one
        compiled loop (int8.dequant_rows); other dtypes as QuantMatrix gives them."""
        if dtype not in (None, np.float32):
            return super().rows(ids, dtype)
        return int8.dequant_rows(self.planes, ids)

    def scale_rows(self, rows) -> tuple:
        return self._plane_rows(1, rows), self._plane_rows(2, rows) if self.fmt.has_min else None

    def _plane_rows(self, i: int, rows) -> np.ndarray:
        """Rows `rows` of the scales (i = 1) or minimums (i = 2), float16 in GGUF's order."""
        R, C = self.shape
        return int8.scale_rows(self.planes[i], R, C // QK, rows).view(np.float16)

    def __repr__(self) -> str:
        return "Int8" + super().__repr__()

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x [T, C] @ this^T -> [T, R] float32: x rounded to int8 blocks, the blocks multiplied in
        integers (float64 x: QuantMatrix's float product, the NumPy path's)."""
        if x.dtype != np.float32:
            return super().matmul(x)
        R, C = self.shape
        if x.ndim != 2 or x.shape[1] != C:      # the kernel trusts x's width: a narrower x is read past
            raise ValueError(f"quantized product: x {x.shape} against a [{R}, {C}] matrix: x needs {C} columns")
        if self._kernel is None:                 # chosen at the first product: MINILLM_INT8_ISA read then
            self._kernel = int8.kernel(len(self.planes) == 2)
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        y = np.empty((x.shape[0], self.shape[0]), np.float32)
        self._kernel(*self.planes, x, y)
        return y

    def take_rows(self, order: np.ndarray) -> "Int8Quant":
        return Int8Quant(self.fmt, self.q_rows(order), *self.scale_rows(order))

    @kept_counts
    def counts(self, T: int, itemsize: int = 4) -> dict:
        """What a product of T rows tells the meter (its 2·T·R·C multiply-adds, integer here, are
        ops.linear's `matmul`). weights = the blocks' bytes, read once (the passes after the first
        32 rows of x find them in the cache); scratch = x's rounded copy, written once and read back
        (C int8 values and each block's scale, sum and d·sum: C + 12·nb bytes a row); dequant = the
        rest: rounding x, 7 per value (|x|, max, divide, round, two clips, the sum) and 2 per block
        (the scale, d·sum); per pass of 32 rows over the weight each scale (and minimum) widened from
        float16, 1, and Q4's nibbles split, 1 per value; per block and row of x, the block's float
        work: int to float, d_w·d_x, the product, the add, 4 (Q4_0's -8·Σx in integers +1, Q4_1's
        m_w·m_x and its add +2). A row's blocks add up in its own lane: no sum across lanes."""
        if itemsize != 4:
            return super().counts(T, itemsize)
        R, C = self.shape
        nb = C // QK
        passes = -(-T // 32)
        n_s = 2 if self.fmt.has_min else 1
        per_block = 4 + {"q8_0": 0, "q4_0": 1, "q4_1": 2}[self.fmt.name]
        dequant = (T * C * 7 + T * nb * 2 + passes * (R * nb * n_s + (R * C if self.fmt.bits == 4 else 0))
                   + T * R * nb * per_block)
        return {"weights": self.nbytes, "scratch": 2 * T * (C + 12 * nb), "dequant": dequant}


def integer(w):
    """The integer set's implementation of a NumPy weight: a QuantMatrix -> Int8Quant (same planes,
    no copy); a float weight -> the fused set's (models/fused.py); anything else unchanged."""
    if isinstance(w, Int8Quant):
        return w
    if isinstance(w, QuantMatrix):
        return Int8Quant.of(w)
    return fuse(w)


def compiled_blocks(model, plan, cos: np.ndarray, sin: np.ndarray):
    """The integer set's decode step, its blocks in one compiled call: None, or a function x [N, d]
    -> x that runs every block through kernels/_block.py's `decode_layers` (the same kernels the
    operations call, in the same order, on the same values: the same bits, the same cache rows) in
    place of `transformer_block`'s dozen Python calls a block. Taken only where it is that block
    exactly: plain Llama blocks (`model.plain_block`) of integer products, one new token a sequence
    over a contiguous float32 cache or a paged pool the set's paged kernel reads in place (the plan's
    `decode_pages`, which checks the caches' shapes against the model's), and no meter listening (a
    meter, and so a trace or a lesson, sees every operation: the step then runs them one by one)."""
    if meter.active() is not None or not model.plain_block:
        return None
    pages = plan.decode_pages(model.config)
    runs = pages and _block_params(model)
    if not runs:
        return None
    from ..kernels import _block, products
    c = model.config
    kp, vp, blocks, offsets, table, lengths = pages
    eps, scale, chunk = c.eps, np.float32(1.0 / np.sqrt(c.head_dim)), products.DECODE_CHUNK

    def blocks_of(x: np.ndarray) -> np.ndarray:
        for first, n, isa, stacked in runs:                              # one run a kind of block (most: one)
            _block.decode_layers(isa, x, *stacked, cos, sin, kp[first:first + n], vp[first:first + n], blocks,
                                 offsets, table, lengths, c.n_head, c.n_kv_head, eps, scale, chunk)
        return x
    return blocks_of


def runs_compiled_blocks(model) -> bool:
    """Does this model's decode step, with no meter listening, run its blocks in one compiled call (a
    kernel set with `compiled_block`, plain blocks, every product an Int8Quant)?"""
    return model.kernel_set.compiled_block is compiled_blocks and model.plain_block and bool(_block_params(model))


_PRODUCTS = ("qkv.weight", "o_proj.weight", "gate_up.weight", "down_proj.weight")


def _block_params(model):
    """The blocks as `decode_layers` takes them: runs of consecutive blocks whose products share their
    formats, shapes and instruction set (most models: one run), each (first block, blocks,
    instruction set, (norm1, norm2, then each product's planes), every array stacked, a block a row).
    Made at the first call and kept on the model; the products' planes are stacked once and each
    weight's planes become its rows of the stack (views: the bytes are kept once, where its own
    product reads them too). None where a block has a product that is not exactly an Int8Quant (a
    float weight, a subclass with its own product) or whose products disagree on the instructions."""
    got = getattr(model, "_compiled_params", False)
    if got is not False:
        return got
    from ..kernels import _block
    from ..kernels._int8 import KERNELS
    entries = {k: name for (_, name), k in KERNELS.items()}
    runs = []
    for i, p in enumerate(model.blocks):
        mats = [p[n] for n in _PRODUCTS]
        if any(type(w) is not Int8Quant for w in mats):
            runs = None
            break
        for w in mats:
            if w._kernel is None:
                w._kernel = int8.kernel(len(w.planes) == 2)
        isas = {entries.get(w._kernel) for w in mats}
        if len(isas) != 1 or None in isas:
            runs = None
            break
        isa = _block.isa(isas.pop())
        kind = [(w.fmt.name, w.shape) for w in mats]
        if runs and runs[-1][2] is isa and runs[-1][3] == kind:
            runs[-1][1].append(p)
        else:
            runs.append([i, [p], isa, kind])
    model._compiled_params = runs and [(first, len(ps), isa, _stacked(ps)) for first, ps, isa, _ in runs]
    return model._compiled_params


def _stacked(blocks) -> tuple:
    """(norm1, norm2, each product's planes) of these blocks stacked, a block a row; each weight's
    planes then its rows of the stack, so that the bytes are held once (while one product's are
    stacked, twice)."""
    norms = tuple(np.stack([p[n] for p in blocks])
                  for n in ("input_layernorm.weight", "post_attention_layernorm.weight"))
    out = []
    for name in _PRODUCTS:
        ws = [p[name] for p in blocks]
        planes = tuple(_stack([w.planes[j] for w in ws]) for j in range(len(ws[0].planes)))
        for i, w in enumerate(ws):
            w.planes = int8.lane_planes((a[i] for a in planes), w.shape)   # its rows: the bytes held once
        out.append(planes)
    return norms + tuple(out)


def _stack(arrays: list) -> np.ndarray:
    """np.stack on a 64-byte boundary (kernels/aligned.py): each row too, where a row's bytes are a
    multiple of 64 (SmolLM2's planes all are)."""
    out = aligned_empty((len(arrays),) + arrays[0].shape, arrays[0].dtype)
    for i, a in enumerate(arrays):
        out[i] = a
    return out
