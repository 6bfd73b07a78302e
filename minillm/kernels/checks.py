"""What the public kernels check of their arguments before numba runs them. A compiled kernel
trusts its shapes: x narrower than the weight, H not a multiple of Hkv, a head_dim that differs
between q and k, a short norm weight or rotation table, a block id outside the pool: each read past
an array (a block id of 10^9 crashed the process), or left part of an output from np.empty
unwritten (its old memory returned as the result). Each check is O(the shapes), plus one min and
max over a paged block table, and refuses with a ValueError naming the arrays, the class NumPy's
path (models/ops.py) raises for the same arrays. A scale's finiteness is the weight's to check,
once, when it is made (models/quant.py's QuantMatrix), not here per product.

Each check is written for the common case first: the shapes unpacked and compared in one
condition, the message built only when it fails (a decode step of a 30-layer model makes some 300
of these calls). A quantized weight's planes are checked once, when `planes()` makes them (a
`Planes` tuple); a product over them then checks only x. benchmarks/kernel_checks.py times a
decode step with these and with each replaced by a no-op.
"""

from __future__ import annotations

import numpy as np

QK = 32          # values per quantized block


def _shape(a, n: int, what: str) -> tuple:
    """a's shape, which must have n dimensions."""
    shape = getattr(a, "shape", None)
    if shape is None or len(shape) != n:
        raise ValueError(f"{what}: expected {n} dimensions, got {shape if shape is not None else type(a).__name__}")
    return shape


class Planes(tuple):
    """A quantized matrix's planes, (q, d) for Q8_0 or (q, d, m) for Q4, checked once when made
    (`planes`): n_in is the product's input width."""
    n_in: int


def planes(p: tuple) -> Planes:
    """Check a quantized matrix's planes (see `quant_product`) -> them as a checked `Planes`."""
    if len(p) not in (2, 3):
        raise ValueError(f"quantized product: planes are (q, d) or (q, d, m), got {len(p)} arrays")
    q, d = p[0], p[1]
    R, nb = _shape(d, 2, "quantized product's d")
    _shape(q, 2, "quantized product's q")
    per_block = QK if len(p) == 2 else QK // 2                   # Q8_0: a byte a value; Q4: two
    want_q = np.int8 if len(p) == 2 else np.uint8
    if q.dtype != want_q or d.dtype != np.uint16 or q.shape != (R, nb * per_block):
        raise ValueError(f"quantized product: q {q.shape} {q.dtype} and scales {d.shape} {d.dtype} do not "
                         f"match ({want_q.__name__} [{R}, {nb * per_block}] and uint16 [{R}, {nb}] for "
                         f"{nb} blocks a row)")
    if len(p) == 3:
        m = p[2]
        _shape(m, 2, "quantized product's m")
        if m.dtype != np.uint16 or (m.shape != (R, nb) and m.shape != (0, 0)):
            raise ValueError(f"quantized product: minimums {m.shape} {m.dtype}, need uint16 [{R}, {nb}] "
                             "(Q4_1) or an empty [0, 0] (Q4_0)")
    checked = Planes(p)
    checked.n_in = nb * QK
    return checked


def quant_product(p: tuple, x) -> None:
    """quant_matmul_t: planes (q, d) Q8_0 or (q, d, m) Q4 (checked here unless a `Planes`), x [T, C]."""
    n_in = p.n_in if type(p) is Planes else planes(p).n_in
    shape = getattr(x, "shape", ())
    if len(shape) != 2 or shape[1] != n_in:
        raise ValueError(f"quantized product: x {shape} needs 2 dimensions and the weight's {n_in} inputs "
                         f"([{p[0].shape[0]}, {n_in}])")


def dense_product(wt, x) -> None:
    """dense_matmul_t: wt [R, C], x [T, C]."""
    R, C = _shape(wt, 2, "dense product's weight")
    shape = getattr(x, "shape", ())
    if len(shape) != 2 or shape[1] != C:
        raise ValueError(f"dense product: x {shape} needs 2 dimensions and the weight's {C} inputs ([{R}, {C}], "
                         "kept [out, in])")


def heads(H: int, Hkv: int, what: str) -> int:
    """g, the query heads per KV head: Hkv >= 1 dividing H."""
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"{what}: {H} query heads over {Hkv} KV heads; the KV heads must be at least one "
                         "and divide the query heads (grouped-query attention)")
    return H // Hkv


def attention(q, k, v, Tk: int | None) -> int:
    """attention (fused and batch-invariant): q [H, Tq, hd], k, v [Hkv, >= Tk, hd]. -> Tk."""
    H, Tq, hd = _shape(q, 3, "attention's q")
    Hkv, rows, khd = _shape(k, 3, "attention's k")
    vh, vrows, vhd = _shape(v, 3, "attention's v")
    Tk = rows if Tk is None else int(Tk)
    if khd == hd and vhd == hd and vh == Hkv and Hkv >= 1 and H % Hkv == 0 and 1 <= Tk and \
            Tq <= Tk <= min(rows, vrows):
        return Tk
    if khd != hd or vhd != hd or vh != Hkv:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape}: k and v need the same KV heads "
                         f"and q's head size {hd}")
    heads(H, Hkv, "attention")
    raise ValueError(f"attention over Tk = {Tk} keys needs at least the {Tq} queries' own (and one) and "
                     f"at most the {min(rows, vrows)} rows k and v hold")


_SEEN: list = [None]    # (table, lengths, max of lengths - 1, max id): the last read-only pair checked


def paged(q, kp, vp, table, lengths) -> tuple[np.ndarray, np.ndarray]:
    """paged_decode_attention: q [H, B, hd], pools [Hkv, blocks, bs, hd], table [B, nb] of block ids
    in the pool, lengths [B] of 1 .. nb·bs. -> (table, lengths) as intp arrays."""
    H, B, hd = _shape(q, 3, "paged decode's q")
    Hkv, blocks, bs, khd = _shape(kp, 4, "paged decode's k pool")
    if getattr(vp, "shape", None) != kp.shape or khd != hd:
        raise ValueError(f"paged decode: q {q.shape}, k pool {kp.shape}, v pool {getattr(vp, 'shape', vp)}: "
                         f"the pools need one shape and q's head size {hd}")
    heads(H, Hkv, "paged decode")
    table = np.ascontiguousarray(table, np.intp)
    lengths = np.ascontiguousarray(lengths, np.intp)
    if B < 1 or bs < 1 or table.ndim != 2 or table.shape[0] != B or lengths.shape != (B,):
        raise ValueError(f"paged decode: {B} queries need a table of {B} rows and {B} lengths; got a "
                         f"{table.shape} table and lengths {lengths.shape}")
    # One max each, read as unsigned: a negative value becomes one past any bound (a length of 0
    # too, less one), so each max checks both ends. A step's table and lengths, arrays of their own
    # made read-only by their maker (models/plan.py's BatchedDecode), are the same arrays for every
    # layer (nothing can change them): their maxima are found at the first layer's check and kept
    # (`_SEEN`), each later layer compares two numbers.
    seen = _SEEN[0]
    if seen is not None and seen[0] is table and seen[1] is lengths:
        longest, top = seen[2], seen[3]
    else:
        longest = (lengths - 1).view(np.uintp).max()
        top = table.view(np.uintp).max() if table.size else 0
        if not (table.flags.writeable or lengths.flags.writeable) and table.base is None and lengths.base is None:
            _SEEN[0] = (table, lengths, longest, top)
    if longest >= table.shape[1] * bs:
        raise ValueError(f"paged decode: {B} queries need lengths of at least 1 key, each within its table row's "
                         f"{table.shape[1]} blocks of {bs}; got lengths {lengths.tolist()[:8]}")
    if top >= blocks:
        raise ValueError(f"paged decode: the table's block ids run from {table.min()} to {table.max()}; the "
                         f"pool holds blocks 0 to {blocks - 1}")
    return table, lengths


def rms_norm(x, w) -> None:
    """rms_norm: x [..., n], w [n]."""
    shape = getattr(x, "shape", ())
    if not shape or getattr(w, "shape", None) != shape[-1:]:
        raise ValueError(f"rms_norm: x {shape} needs a weight [{shape[-1] if shape else '?'}], got "
                         f"{getattr(w, 'shape', w)}")


def layer_norm(x, w, b) -> None:
    """layer_norm: x [..., n], w and b [n]."""
    shape = getattr(x, "shape", ())
    n = shape[-1] if shape else "?"
    if not shape or getattr(w, "shape", None) != shape[-1:] or getattr(b, "shape", None) != shape[-1:]:
        raise ValueError(f"layer_norm: x {shape} needs a weight and a bias of [{n}], got "
                         f"{getattr(w, 'shape', w)} and {getattr(b, 'shape', b)}")


def rows(x, what: str) -> None:
    """An elementwise kernel's x: an array of at least one axis, its last axis not empty."""
    shape = getattr(x, "shape", None)
    if shape is None or not shape or shape[-1] == 0:
        raise ValueError(f"{what}: x needs rows of at least one value, got shape {shape}")


def rope(x, cos, sin) -> None:
    """rope: x [H, N, hd] with hd even, cos and sin [N, hd/2]."""
    H, N, hd = _shape(x, 3, "rope's x")
    if hd % 2 == 0 and getattr(cos, "shape", None) == (N, hd // 2) and getattr(sin, "shape", None) == (N, hd // 2):
        return
    if hd % 2:
        raise ValueError(f"rope: x {x.shape} has an odd head size {hd}; it turns pairs of coordinates")
    raise ValueError(f"rope: x {x.shape} needs cos and sin [{N}, {hd // 2}], got {getattr(cos, 'shape', cos)} "
                     f"and {getattr(sin, 'shape', sin)}")


def swiglu(gate_up) -> None:
    """swiglu: gate_up [N, 2F]."""
    N, W = _shape(gate_up, 2, "swiglu's gate_up")
    if W % 2:
        raise ValueError(f"swiglu: gate_up {gate_up.shape} has an odd width; it holds the gate and up "
                         "projections side by side, [N, 2F]")


def positive(**values) -> None:
    """Counts that must be whole numbers of at least 1 (a chunk's keys, a batch, heads, a block)."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} = {v!r}: must be a whole number of at least 1")
