"""The integer kernels (numba), and the vector operations they are written with. Imported only
where numba works; compiled on first call for the Isa passed, cached on disk as _numba.py's are
(the vector operations live in this file so that an edit to them reaches numba's cache, which
checks only the file of the function it compiled).

    quantize_x(x) -> (xq, xd, xs, xm)       activations to int8 blocks, in the kernels' layout
    KERNELS[("q8_0", isa)](q, d, x, y)      y [T, R] = x @ W^T, W Q8_0, q in lane order (x rounded inside, once)
    KERNELS[("q4", isa)](q, d, m, x, y)     Q4_0 (m empty) and Q4_1, q in lane order (int8.lane_order)

The arithmetic is int8.py's reference, bit for bit (see its docstring).

Vectors in numba. numba compiles a plain loop over integers with int64 arithmetic (an int8 times an
int8 is typed int64), so an integer dot product written as a loop runs 8 lanes a vector at best. The
instruction an integer product wants is VNNI's vpdpbusd: 64 unsigned bytes times 64 signed bytes,
each four products summed into one of 16 int32 lanes and added to an accumulator, one instruction.
LLVM reaches it only through its intrinsic, so small numba types here hold LLVM vectors as values
(I8x64 <64 x i8>, I32x16 <16 x i32>, F32x16 <16 x float>), and each operation on them is a few
lines of LLVM IR written with llvmlite (`@intrinsic`). `dot8` picks its instructions from the Isa the
kernel was compiled for (a constant of each entry function at the end, whose numba type names the
instruction set; each entry is its own compiled function, cached apart):

    "avx512-vnni"   vpdpbusd on 512-bit registers (AVX512-VNNI)
    "avx-vnni"      vpdpbusd on 256-bit registers (AVX-VNNI, or AVX512-VNNI with AVX512-VL)
    "avx2"          vpmaddubsw then vpmaddwd: pairs of u8·s8 to int16, pairs of those to int32
    "generic"       LLVM's portable vectors: widen to int32, multiply, add fours (any CPU)

Every form leaves the same exact int32 in each lane. Float operations are emitted without fast-math
flags: no fused multiply-add, no reassociation, each rounding as the NumPy reference's.

Measured (benchmarks/int8_bench.py: whole passes over every product weight, the forms interleaved
in one process, medians of 7 rounds, one thread, AMD EPYC Zen 4 (AVX512-VNNI) shared with other
work, as multiples of NumPy float32's speed in the same run), GPT-2-124M's shapes in Q8_0 at B = 1 /
4 / 16 / 128 rows: avx512-vnni 3.18 / 5.94 / 2.26 / 1.62x, avx-vnni 3.17 / 5.77 / 2.42 / 1.29x,
avx2 2.30 / 3.81 / 1.52 / 1.00x, generic 1.83 / 2.00 / 0.66 / 0.36x, the plain numba loop over
int8 (each product typed int64; x rounded before its timer) 0.40 / 0.31 / 0.09 / 0.06x; the fused
float kernel 2.95 / 3.49 / 1.07 / 0.82x. SmolLM2-135M's in Q4_1 at B = 1 / 4 / 16 (load 4 on 2
cores): avx512-vnni 3.53 / 6.76 / 2.61x, avx-vnni 2.71 / 6.58 / 2.59x, avx2 3.38 / 6.12 / 2.40x,
plain loop 0.36 / 0.35 / 0.10x; fused 2.79 / 5.10 / 1.36x. The generic form first widened bytes to
int32 (SmolLM2 Q4_1, B = 1: 0.82x); in int16 products added in pairs, LLVM's multiply-add shape,
1.80x. Along the way: the group's eight dot instructions in one chain waited on each other (two
chains: 5% at one row); a division per lane in the pattern copy (an integer % per lane cost 1.7 µs of
a 576-wide row's 2.6); an argument typed by a Python object cost numba's dispatcher 0.8-2.9 µs a call
(hence one entry per instruction set); masks computed for every group's loads instead of the last's.

One row of x (a decode step) has a path of its own (each kernel's T == 1 branch): the same float
operations in the same order, but the row's 16-lane accumulator is a register (the general path
keeps a [32, 16] array per work item of 16 rows, allocated per item, stored and loaded per group)
and the lane pattern is counted up instead of divided out per group. Measured (Intel Xeon VM,
AVX512-VNNI, one thread, each weight in the cache, both forms in one process, medians of 9
interleaved rounds): SmolLM2's Q4_1 576x576 / 960x576 / 3072x576 / 576x1536 1.63 / 1.68 / 1.84 /
1.55x the general path, its Q8_0 head's rows 1.39x. Then, each against the one before over SmolLM2's
120 Q4_1 products and head in turn (2 threads, medians of 11 interleaved rounds): the high nibbles
multiplied in place (16·n, summed apart and shifted right by 4: one operation fewer a vector) about
1.05x; the weights asked for 128 blocks ahead (`prefetch`) 1.11-1.13x the products, 1.18-1.41x the
head; Q4 laid out in lane order when the weight is made (no shuffles) 1.07x the products; a whole
group's scales loaded without a mask (made per group before) 1.04x the products, 1.10x the head.
Rounding x (_quantize_row), each block's max |v| and its rounding in two vectors (`block_absmax`,
`block_round`) where a scalar loop had run: the same bits (IEEE division and rint lane by lane; the
max of values >= 0 in any order), 1.48x / 1.99x a row of 576 / 1,536 (one thread, compiled loops of
2,000, medians of 9 interleaved rounds, Intel Xeon VM): 0.46 and 1.14 µs fewer per product.

AVX2 (no VNNI: a Zen 3, say) multiplies Q4 with vpmaddubsw, whose int16 pair sums of a nibble and an
int8 are at most 3,840: a group's eight add in int16 exactly, one vpmaddwd a half widens them
(`_avx2_q4_sums`), and one row's group is split into nibbles and multiplied as it is loaded
(`q4_dot8`: q4_group's sixteen 256-bit halves had gone to the stack, AVX2 having 16 registers).
Measured on an AMD EPYC Zen 3 VM against the form before (one vpmaddwd a vector, the group split
first), interleaved in one process: one thread, each weight in cache, medians of 7 rounds, SmolLM2's
576x576 / 1536x576 / 576x1536 1.16 / 1.17 / 1.20x; its 210 Q4_1 products in turn, 2 threads, out of
cache, the rounds' ratios' medians of 21 rounds 1.04x at one row, 1.08x at four (ranges 0.94-1.24
and 0.62-1.43: not ranked).

A row per lane. A group is 16 rows' block j (int8.lane_order lays the weight out so, once, when it
is made): vector k (k = 0..7) holds in its lane L (4 bytes) values 4k..4k+3 of row L's block, so that
eight dot instructions leave each row's block sum in a lane of its own, and x's word k, the same for
every row, is one 4-byte broadcast (a load the dot instruction can take as its operand). A work item
is 16 rows: it walks their nb groups in storage order, each row's sum adding up in its own lane from
+0.0 in block order (the reference's step 5), and ends with one 16-lane store. x is rounded in plain
order (`_quantize`: what the reference gives). Read as Q8_0 8 plain loads a group, Q4 4 (each word's
low and high nibbles are vectors k and k + 4).

Before, a group was 16 consecutive blocks in storage order, across row ends ("block per lane"): a
row's blocks spread over the lanes, so every row ended in a sum across the 16 lanes, a group could
hold the end of one row and the start of the next (masks, a branch), and x was rounded into the lane
patterns a weight's rows need (nb / gcd(nb, 16) of them). Measured, that form against this one in
one process (Intel Xeon VM, AVX512-VNNI, medians of interleaved rounds, each round's ratio):
SmolLM2's Q4_1 products at one row of x, one thread, each weight in the cache (11 rounds): q|k|v
960x576 1.90x [1.83-2.00], o 576x576 1.74x [1.29-2.11], gate|up 3072x576 1.87x [1.34-1.97], down
576x1536 1.43x [1.10-1.64]; all 120 in turn from memory, two threads (15 rounds): 5,539 -> 3,564 µs
a pass, 1.54x [1.17-1.71] (66.4 MB: 18.6 GB/s on a slow hour). The same pass without the bytes
asked for AHEAD groups ahead: 4,891 against 3,249 µs with them, 1.44x [1.32-1.61].
"""

from __future__ import annotations

import operator

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.imputils import lower_constant
from numba.extending import (NativeValue, intrinsic, models, overload, register_model, typeof_impl,
                             unbox)

from ._numba import f16, prefetch

QK = 32          # values per block
GROUP = 16       # rows per group: a row a lane (a group is 16 rows' block j: int8.lane_order)
AHEAD = 16       # groups: how far ahead a one-row product asks for the weights (Q4: 4 KB; the
                 # prefetcher alone left SmolLM2's decode products at 1.44x the time: measured above)
TILE = 32        # rows of x per pass over a work item's groups


# == vector values in numba ===========================================================================

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_F32, _F16 = ir.FloatType(), ir.HalfType()
_ELT = {"i8": _I8, "i32": _I32, "f32": _F32}


class Vec(types.Type):
    """An LLVM vector of `n` elements of `kind` ("i8", "i32", "f32") held as a numba value."""

    def __init__(self, kind: str, n: int) -> None:
        self.kind, self.n = kind, n
        super().__init__(name=f"Vec({kind}x{n})")

    @property
    def llvm(self) -> ir.VectorType:
        return ir.VectorType(_ELT[self.kind], self.n)


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, fe_type.llvm)


I8x64 = Vec("i8", 64)
I32x16 = Vec("i32", 16)
F32x16 = Vec("f32", 16)
W8 = types.UniTuple(I8x64, 8)       # a group's weights: 8 vectors of 64 bytes, a row per lane
ISAS = ("avx512-vnni", "avx-vnni", "avx2", "generic")
VNNI = ("avx512-vnni", "avx-vnni")


class IsaType(types.Type):
    def __init__(self, isa: str, sources: str = "") -> None:
        self.isa = isa
        super().__init__(name=f"Isa({isa}, {sources})" if sources else f"Isa({isa})")


register_model(IsaType)(models.OpaqueModel)


class Isa:
    """Which integer-dot instructions a kernel is compiled for (one of ISAS): a constant of the
    kernel (the entries at the end of this file), whose numba type names the instruction set (and,
    given `sources`, a version of the code a compiled caller links in: kernels/_block.py's)."""

    def __init__(self, name: str, sources: str = "") -> None:
        if name not in ISAS:
            raise ValueError(f"unknown integer instruction set {name!r}; one of {', '.join(ISAS)}")
        self.name = name
        self._numba_type_ = IsaType(name, sources)

    def __repr__(self) -> str:
        return f"Isa({self.name!r})"


@typeof_impl.register(Isa)
def _typeof_isa(val, c):
    return val._numba_type_


@unbox(IsaType)
def _unbox_isa(typ, obj, c):
    return NativeValue(c.context.get_constant_null(typ))


@lower_constant(IsaType)
def _isa_constant(context, builder, ty, pyval):
    return context.get_constant_null(ty)


# -- helpers for the code generators -------------------------------------------------------------------

def _c32(v: int) -> ir.Constant:
    return ir.Constant(_I32, v)


def _splat(ty: ir.VectorType, v) -> ir.Constant:
    return ir.Constant(ty, [v] * ty.count)


def _ptr(context, builder, arrty, arr, off, elt: ir.Type):
    """Address of element `off` (a flat index) of a C-contiguous array, as a pointer to `elt`."""
    a = context.make_array(arrty)(context, builder, arr)
    return builder.bitcast(builder.gep(a.data, [off]), elt.as_pointer())


def _call(builder, name: str, ret: ir.Type, args: list):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _i64(builder, v):
    it = ir.IntType(64)
    return v if v.type.width == 64 else builder.sext(v, it) if v.type.width < 64 else builder.trunc(v, it)


def _mask(builder, n: int, valid) -> ir.Value:
    """<n x i1>: lane i on when i < valid, built as an n-bit integer (a kmov; n <= 64). valid <= 0
    turns every lane off: a shift by a negative amount would be poison in LLVM (any lanes on, a read
    past the array's end: a partial group's vectors past its last valid byte have valid < 0)."""
    it = ir.IntType(64)
    valid = _i64(builder, valid)
    valid = builder.select(builder.icmp_signed("<", valid, ir.Constant(it, 0)), ir.Constant(it, 0), valid)
    full = builder.icmp_signed(">=", valid, ir.Constant(it, n))
    low = builder.sub(builder.shl(ir.Constant(it, 1), builder.select(full, ir.Constant(it, 0), valid)),
                      ir.Constant(it, 1))
    bits = builder.select(full, ir.Constant(it, (1 << n) - 1 if n < 64 else -1), low)
    bits = builder.trunc(bits, ir.IntType(n)) if n < 64 else bits
    return builder.bitcast(bits, ir.VectorType(ir.IntType(1), n))


def _masked_load(builder, ptr, vty: ir.VectorType, mask):
    """llvm.masked.load: lanes off the mask read nothing (no fault past an array's end) and are 0."""
    name = f"llvm.masked.load.v{vty.count}{'f32' if vty.element == _F32 else 'i' + str(vty.element.width)}.p0"
    return _call(builder, name, vty, [builder.bitcast(ptr, vty.as_pointer()), _c32(1), mask,
                                      ir.Constant(vty, None)])


def _whole_or_masked(builder, base, vty: ir.VectorType, n: int, valid) -> list:
    """n vectors of vty one after another from `base` (a pointer to vty's element), the first `valid`
    elements read and the rest 0: plain loads when all n·count elements are valid (the likely case),
    masked loads otherwise (a matrix's last, partial group), joined by phis."""
    c = vty.count
    whole = builder.icmp_signed(">=", valid, ir.Constant(valid.type, n * c))
    with builder.if_else(whole, likely=True) as (then, otherwise):
        with then:
            full = [builder.load(builder.bitcast(builder.gep(base, [_c32(c * i)]), vty.as_pointer()), align=1)
                    for i in range(n)]
            blk_full = builder.block
        with otherwise:
            part = [_masked_load(builder, builder.gep(base, [_c32(c * i)]), vty,
                                 _mask(builder, c, builder.sub(valid, ir.Constant(valid.type, c * i))))
                    for i in range(n)]
            blk_part = builder.block
    phis = []
    for f, p in zip(full, part):                   # phis first: they lead their block
        phi = builder.phi(vty)
        phi.add_incoming(f, blk_full)
        phi.add_incoming(p, blk_part)
        phis.append(phi)
    return phis


def _shuffle(builder, a, b, idx: list[int]):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _halves(builder, v, n: int):
    return _shuffle(builder, v, v, list(range(n // 2))), _shuffle(builder, v, v, list(range(n // 2, n)))


def _broadcast(builder, x, vt: ir.VectorType):
    """A scalar value x in every lane of vt (a constant's lanes: `_splat`)."""
    return builder.shuffle_vector(builder.insert_element(ir.Constant(vt, None), x, _c32(0)), ir.Constant(vt, None),
                                  ir.Constant(ir.VectorType(_I32, vt.count), [0] * vt.count))


# -- loads, stores, arithmetic ------------------------------------------------------------------------

@intrinsic
def load_f32x16(typingctx, arr, off):
    def cg(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], F32x16.llvm), align=4)
    return F32x16(arr, off), cg


@intrinsic
def store_f32x16(typingctx, arr, off, v):
    def cg(context, builder, sig, args):
        builder.store(args[2], _ptr(context, builder, sig.args[0], args[0], args[1], F32x16.llvm), align=4)
        return context.get_dummy_value()
    return types.none(arr, off, v), cg


@intrinsic
def load_f16x16(typingctx, arr, off, valid):
    """16 float16 values (their bits, uint16) from flat index `off`, the first `valid` read (the rest
    0), to float32 exactly (LLVM's fpext: vcvtph2ps with F16C; inf and NaN stay inf and NaN)."""
    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _I16)
        h = _whole_or_masked(builder, p, ir.VectorType(_I16, 16), 1, args[2])[0]
        if "f16c" in _target_features():
            return builder.fpext(builder.bitcast(h, ir.VectorType(_F16, 16)), F32x16.llvm)
        return _f16_bits_to_f32(builder, h)
    return F32x16(arr, off, valid), cg


def _target_features() -> frozenset:
    """The features both the host and numba's target have (int8.cpu_features): what may be emitted."""
    from .cpu import cpu_features
    return cpu_features()


def _f16_bits_to_f32(builder, h):
    """<16 x i16> float16 bits -> <16 x float>, exactly, in integer operations: for a target without
    F16C, where LLVM's fpext calls a runtime function (__extendhfsf2) numba's JIT does not have.
    Normal: the exponent rebased by 112, the mantissa shifted; subnormal or zero: mantissa · 2^-24
    (exact); inf and NaN: exponent all ones, the mantissa kept (NaN stays NaN)."""
    v32 = ir.VectorType(_I32, 16)
    x = builder.zext(h, v32)
    sign = builder.shl(builder.and_(x, _splat(v32, 0x8000)), _splat(v32, 16))
    e = builder.and_(builder.lshr(x, _splat(v32, 10)), _splat(v32, 0x1F))
    mant = builder.and_(x, _splat(v32, 0x3FF))
    normal = builder.or_(builder.shl(builder.add(e, _splat(v32, 112)), _splat(v32, 23)),
                         builder.shl(mant, _splat(v32, 13)))
    special = builder.or_(_splat(v32, 0x7F800000), builder.shl(mant, _splat(v32, 13)))
    sub = builder.bitcast(builder.fmul(builder.sitofp(mant, F32x16.llvm), _splat(F32x16.llvm, 2.0 ** -24)), v32)
    mag = builder.select(builder.icmp_unsigned("==", e, _splat(v32, 0)), sub,
                         builder.select(builder.icmp_unsigned("==", e, _splat(v32, 0x1F)), special, normal))
    return builder.bitcast(builder.or_(mag, sign), F32x16.llvm)


def _binop(inst_f: str, inst_i: str):
    def impl(a, b):
        if isinstance(a, Vec) and a == b:
            inst = inst_f if a.kind == "f32" else inst_i

            @intrinsic
            def _op(typingctx, x, y):
                def cg(context, builder, sig, args):
                    return getattr(builder, inst)(args[0], args[1])
                return x(x, y), cg
            return lambda a, b: _op(a, b)
    return impl


overload(operator.add)(_binop("fadd", "add"))
overload(operator.mul)(_binop("fmul", "mul"))


@intrinsic
def zero_f32x16(typingctx):
    def cg(context, builder, sig, args):
        return ir.Constant(F32x16.llvm, None)
    return F32x16(), cg


@intrinsic
def zero_i32x16(typingctx):
    def cg(context, builder, sig, args):
        return ir.Constant(I32x16.llvm, None)
    return I32x16(), cg


@intrinsic
def splat_f32x16(typingctx, x):
    """A float32 in all 16 lanes."""
    def cg(context, builder, sig, args):
        return _broadcast(builder, args[0], F32x16.llvm)
    return (F32x16(x), cg) if x == types.float32 else None


@intrinsic
def to_f32(typingctx, v):
    """int32 lanes -> float32 lanes (exact below 2^24, as every block sum here is)."""
    def cg(context, builder, sig, args):
        return builder.sitofp(args[0], F32x16.llvm)
    return F32x16(v), cg


@intrinsic
def tree_sum(typingctx, v):
    """The 16 float32 lanes added in a fixed tree: a_i = v_i + v_i+8 (i < 8), then the same halving
    to 4, 2 and 1 lanes (_exact.py's attention sums in this order)."""
    def cg(context, builder, sig, args):
        v, n = args[0], 16
        while n > 1:
            v = builder.fadd(_shuffle(builder, v, v, list(range(n // 2))), _shuffle(builder, v, v, list(range(n // 2, n))))
            n //= 2
        return builder.extract_element(v, _c32(0))
    return types.float32(v), cg


def _c_float32(x) -> bool:
    return isinstance(x, types.Array) and x.dtype == types.float32 and x.layout == "C"


def _block_vectors(context, builder, arrty, arr, off) -> list:
    """The 32 float32 of a block from flat index `off` of a C-contiguous array: two <16 x float>."""
    p = _ptr(context, builder, arrty, arr, off, _F32)
    return [builder.load(builder.bitcast(builder.gep(p, [_c32(16 * i)]), F32x16.llvm.as_pointer()), align=4)
            for i in range(2)]


@intrinsic
def block_absmax(typingctx, x, off):
    """A block of x's rounding (_quantize_row): the 32 float32 from flat index `off` of C-contiguous x
    -> (max |v|, whether any is inf or NaN, i.e. v - v != 0). The maximum of values >= 0 is the same
    in any order; where one is inf or NaN the caller ignores it."""
    def cg(context, builder, sig, args):
        v = _block_vectors(context, builder, sig.args[0], args[0], args[1])
        a = [_call(builder, "llvm.fabs.v16f32", F32x16.llvm, [u]) for u in v]
        m, n = builder.select(builder.fcmp_ordered(">", a[0], a[1]), a[0], a[1]), 16
        while n > 1:
            lo, hi = _shuffle(builder, m, m, list(range(n // 2))), _shuffle(builder, m, m, list(range(n // 2, n)))
            m, n = builder.select(builder.fcmp_ordered(">", lo, hi), lo, hi), n // 2
        zero = ir.Constant(F32x16.llvm, None)
        odd = builder.or_(*(builder.fcmp_unordered("!=", builder.fsub(u, u), zero) for u in v))
        bad = builder.icmp_unsigned("!=", builder.bitcast(odd, ir.IntType(16)), ir.Constant(ir.IntType(16), 0))
        return context.make_tuple(builder, sig.return_type, [builder.extract_element(m, _c32(0)), bad])
    return (types.Tuple((types.float32, types.boolean))(x, off), cg) if _c_float32(x) else None


@intrinsic
def block_round(typingctx, x, off, d, q, qoff):
    """The block's values rounded: clip(rint(v / d), ±127) of the 32 float32 from flat index `off` of
    C-contiguous x, d > 0 finite (IEEE division and rint, lane by lane: the scalar loop's bits), stored
    as int8 at flat index `qoff` of C-contiguous q -> their sum (int32, exact)."""
    def cg(context, builder, sig, args):
        v = _block_vectors(context, builder, sig.args[0], args[0], args[1])
        ty = F32x16.llvm
        dv = _broadcast(builder, args[2], ty)
        lo, hi = _splat(ty, -127.0), _splat(ty, 127.0)
        ints = []
        for u in v:
            r = _call(builder, "llvm.rint.v16f32", ty, [builder.fdiv(u, dv)])
            r = builder.select(builder.fcmp_ordered(">", r, lo), r, lo)
            r = builder.select(builder.fcmp_ordered("<", r, hi), r, hi)
            ints.append(builder.fptosi(r, I32x16.llvm))
        qp, b16 = _ptr(context, builder, sig.args[3], args[3], args[4], _I8), ir.VectorType(_I8, 16)
        for i, n in enumerate(ints):
            builder.store(builder.trunc(n, b16), builder.bitcast(builder.gep(qp, [_c32(16 * i)]), b16.as_pointer()),
                          align=1)
        return _call(builder, "llvm.vector.reduce.add.v16i32", _I32, [builder.add(ints[0], ints[1])])
    ok = _c_float32(x) and d == types.float32 and isinstance(q, types.Array) and q.dtype == types.int8 \
        and q.layout == "C"
    return (types.int32(x, off, d, q, qoff), cg) if ok else None


# -- a group's weights, a row per lane ---------------------------------------------------------------------

@intrinsic
def q8_group(typingctx, isa, q, off):
    """A Q8_0 group in lane order (int8.lane_order: 512 bytes from flat byte `off`, 16 rows' block j;
    rows past the weight's end are zeros) as 8 vectors, a row per lane: vector k the bytes 4k..4k+3
    of each row's block (its values 4k..4k+3), eight plain loads. For the VNNI forms each byte is
    flipped to w + 128 (xor 0x80): the instruction's first operand is unsigned; the kernel starts
    each block's sum at -128·Σx (block_init)."""
    def cg(context, builder, sig, args):
        base = _ptr(context, builder, sig.args[1], args[1], args[2], _I8)
        out = []
        for k in range(8):
            v = builder.load(builder.bitcast(builder.gep(base, [_c32(64 * k)]), I8x64.llvm.as_pointer()), align=1)
            out.append(builder.xor(v, _splat(I8x64.llvm, 0x80)) if sig.args[0].isa in VNNI else v)
        return context.make_tuple(builder, W8, out)
    return W8(isa, q, off), cg


def _high_in_place(isa: str) -> bool:
    """Are a Q4 group's high nibbles multiplied where they are (16·n, one mask, no shift; dot8 then
    shifts their int32 sums right by 4, exact: each is 16 times an integer)? Not on AVX2, whose
    vpmaddubsw adds two products in int16 with saturation (240·127·2 > 32767)."""
    return isa != "avx2"


def _q4_vectors(builder, isa: str, base) -> list:
    """q4_group's 8 vectors from the group's first byte."""
    words = [builder.load(builder.bitcast(builder.gep(base, [_c32(64 * i)]), I32x16.llvm.as_pointer()), align=1)
             for i in range(4)]
    m = _splat(I32x16.llvm, 0x0F0F0F0F)
    lo = [builder.bitcast(builder.and_(w, m), I8x64.llvm) for w in words]
    if _high_in_place(isa):
        hi = [builder.bitcast(builder.and_(w, _splat(I32x16.llvm, -0x0F0F0F10)), I8x64.llvm) for w in words]
    else:
        hi = [builder.bitcast(builder.and_(builder.lshr(w, _splat(I32x16.llvm, 4)), m), I8x64.llvm) for w in words]
    return lo + hi


@intrinsic
def q4_group(typingctx, isa, q, off):
    """A Q4 group in lane order (int8.lane_order: 256 bytes from flat byte `off`, 16 rows' block j;
    rows past the weight's end are zeros) as 8 vectors, a row per lane: vector k < 4 the low nibbles
    of each row's bytes 4k..4k+3 (its values 4k..4k+3), vector k + 4 their high nibbles (values
    16+4k..19+4k), as n or, where `_high_in_place`, as 16·n (the byte masked: one operation fewer
    per vector)."""
    def cg(context, builder, sig, args):
        base = _ptr(context, builder, sig.args[1], args[1], args[2], _I8)
        return context.make_tuple(builder, W8, _q4_vectors(builder, sig.args[0].isa, base))
    return W8(isa, q, off), cg


# -- the integer dot --------------------------------------------------------------------------------------

def _dot_one(builder, isa: str, signed_w: bool, acc, w, x):
    """acc (<16 x i32>) plus, per lane, the four products of w's and x's bytes there. w unsigned
    bytes (signed when signed_w: Q8_0 outside the VNNI forms, the only w the AVX2 form gets), x signed."""
    v32 = I32x16.llvm
    if isa == "avx512-vnni":
        return _call(builder, "llvm.x86.avx512.vpdpbusd.512", v32,
                     [acc, builder.bitcast(w, v32), builder.bitcast(x, v32)])
    if isa == "avx-vnni":
        v8 = ir.VectorType(_I32, 8)
        parts = [_call(builder, "llvm.x86.avx512.vpdpbusd.256", v8, [a, builder.bitcast(wh, v8), builder.bitcast(xh, v8)])
                 for a, wh, xh in zip(_halves(builder, acc, 16), _halves(builder, w, 64), _halves(builder, x, 64))]
        return _shuffle(builder, parts[0], parts[1], list(range(16)))
    if isa == "avx2":
        assert signed_w, "AVX2 takes Q8_0 here; Q4 goes through _avx2_q4_sums"   # checked as the IR is built
        b32, w16, d8 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)
        parts = []
        for wh, xh in zip(_halves(builder, w, 64), _halves(builder, x, 64)):
            # |w| (unsigned, at most 128) times x with w's sign: pairs of products fit int16
            xh = _call(builder, "llvm.x86.avx2.psign.b", b32, [xh, wh])
            wh = _call(builder, "llvm.abs.v32i8", b32, [wh, ir.Constant(ir.IntType(1), 0)])
            p16 = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", w16, [wh, xh])
            parts.append(_call(builder, "llvm.x86.avx2.pmadd.wd", d8, [p16, _splat(w16, 1)]))
        return builder.add(acc, _shuffle(builder, parts[0], parts[1], list(range(16))))
    # generic: bytes to int16 (a product of two fits: at most 255·127), then pairs of products added
    # in int32 (the shape of a multiply-add of int16 pairs, which LLVM knows), then pairs of those
    h64, d32 = ir.VectorType(_I16, 64), ir.VectorType(_I32, 32)
    w16 = builder.sext(w, h64) if signed_w else builder.zext(w, h64)
    x16 = builder.sext(x, h64)
    ev, od = list(range(0, 64, 2)), list(range(1, 64, 2))
    pairs = builder.add(builder.mul(builder.sext(_shuffle(builder, w16, w16, ev), d32), builder.sext(_shuffle(builder, x16, x16, ev), d32)),
                        builder.mul(builder.sext(_shuffle(builder, w16, w16, od), d32), builder.sext(_shuffle(builder, x16, x16, od), d32)))
    quads = builder.add(_shuffle(builder, pairs, pairs, list(range(0, 32, 2))), _shuffle(builder, pairs, pairs, list(range(1, 32, 2))))
    return builder.add(acc, quads)


def _x_word(builder, base, k: int, n: int = 64):
    """Word k (bytes 4k..4k+3) of x's block from `base`, in every 4-byte lane of an n-byte vector
    (every lane is a row of the weight, and every row takes the same x: a broadcast load)."""
    w = builder.load(builder.bitcast(builder.gep(base, [_c32(4 * k)]), _I32.as_pointer()), align=1)
    return builder.bitcast(_broadcast(builder, w, ir.VectorType(_I32, n // 4)), ir.VectorType(_I8, n))


def _dot8(builder, isa: str, q8: bool, acc, w: list, base):
    """dot8's IR: acc plus the group's eight vectors w against x's 8·64 bytes from `base`."""
    if isa == "avx2" and not q8:
        halves = [_halves(builder, wk, 64) for wk in w]
        return _avx2_q4_sums(builder, acc, [[_pmadd16(builder, halves[k][h],
                                                      _x_word(builder, base, k, 32))
                                             for k in range(8)] for h in range(2)])
    signed = q8 and isa not in VNNI
    accs = [acc, ir.Constant(I32x16.llvm, None)]        # two chains: a dot instruction waits for the
    split = not q8 and _high_in_place(isa)              # one before on its accumulator (Q4's 16·n:
    for k in range(8):                                  # the high ones apart)
        c = k // 4 if split else k % 2
        accs[c] = _dot_one(builder, isa, signed, accs[c], w[k], _x_word(builder, base, k))
    if split:
        return builder.add(accs[0], builder.ashr(accs[1], _splat(I32x16.llvm, 4)))
    return builder.add(accs[0], accs[1])


def _avx2_q4_sums(builder, acc, products: list):
    """A Q4 group's dot on AVX2, from products[h]: the 8 vpmaddubsw results (_pmadd16) of half h
    (lanes 8h..8h+7). vpmaddubsw leaves two int16 sums of two products a lane, each at most 15·128·2
    = 3,840 in size (a nibble times an int8), so a half's eight add in int16 exactly (8·3,840 <
    32,767) and one vpmaddwd widens them, where the other forms widen every vector."""
    w16, d8 = ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)
    parts = []
    for p in products:
        s = [builder.add(p[2 * i], p[2 * i + 1]) for i in range(4)]              # a tree: short chains
        s = builder.add(builder.add(s[0], s[1]), builder.add(s[2], s[3]))
        parts.append(_call(builder, "llvm.x86.avx2.pmadd.wd", d8, [s, _splat(w16, 1)]))
    return builder.add(acc, _shuffle(builder, parts[0], parts[1], list(range(16))))


def _pmadd16(builder, w, x):
    """vpmaddubsw: 32 unsigned bytes w times 32 signed bytes x, pairs summed to 16 int16."""
    return _call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(_I16, 16), [w, x])


@intrinsic
def dot8(typingctx, isa, q8, acc, w, x, xoff):
    """acc + Σ_k (per lane, the four byte products of w[k] and word k of x's block from flat byte
    `xoff`, the same in every lane): a row per lane, each row's block dot product in its lane. q8: a literal bool, w a
    Q8_0 group from q8_group (signed bytes, or w + 128 on the VNNI forms), else Q4 nibbles."""
    if not isinstance(q8, types.BooleanLiteral):
        return None

    def cg(context, builder, sig, args):
        base = _ptr(context, builder, sig.args[4], args[4], args[5], _I8)
        return _dot8(builder, sig.args[0].isa, sig.args[1].literal_value, args[2],
                     [builder.extract_value(args[3], k) for k in range(8)], base)
    return I32x16(isa, q8, acc, w, x, xoff), cg


@intrinsic
def q4_dot8(typingctx, isa, q, off, acc, x, xoff):
    """dot8(isa, False, acc, q4_group(isa, q, off), x, xoff), for a group used once (one row of x).
    On AVX2 each 32 bytes of the group are split into nibbles and multiplied as they are loaded: a
    few vectors live at a time, where q4_group's sixteen halves and x's took more than AVX2's 16
    registers and went to the stack."""
    def cg(context, builder, sig, args):
        isa_name = sig.args[0].isa
        qb = _ptr(context, builder, sig.args[1], args[1], args[2], _I8)
        xb = _ptr(context, builder, sig.args[4], args[4], args[5], _I8)
        if isa_name != "avx2":
            return _dot8(builder, isa_name, False, args[3], _q4_vectors(builder, isa_name, qb), xb)
        b32, v8 = ir.VectorType(_I8, 32), ir.VectorType(_I32, 8)
        m = _splat(v8, 0x0F0F0F0F)
        products = [[None] * 8 for _ in range(2)]
        for i in range(4):
            for h in range(2):
                word = builder.load(builder.bitcast(builder.gep(qb, [_c32(64 * i + 32 * h)]), v8.as_pointer()), align=1)
                lo = builder.bitcast(builder.and_(word, m), b32)
                products[h][i] = _pmadd16(builder, lo, _x_word(builder, xb, i, 32))
                hi = builder.bitcast(builder.and_(builder.lshr(word, _splat(v8, 4)), m), b32)
                products[h][i + 4] = _pmadd16(builder, hi, _x_word(builder, xb, i + 4, 32))
        return _avx2_q4_sums(builder, args[3], products)
    return I32x16(isa, q, off, acc, x, xoff), cg


@intrinsic
def block_init(typingctx, isa, q8, s):
    """Where a group's integer sums start, in every lane: minus an offset times the activations' block
    sum s (int32). Q8_0 on the VNNI forms multiplies w + 128 (q8_group): -128·s; Q4_0 (q8 False;
    n - 8 multiplied as n): -8·s; Q8_0 otherwise 0."""
    if not isinstance(q8, types.BooleanLiteral):
        return None

    def cg(context, builder, sig, args):
        q8v = sig.args[1].literal_value
        if q8v and sig.args[0].isa not in VNNI:
            return ir.Constant(I32x16.llvm, None)
        v32 = I32x16.llvm
        v = _broadcast(builder, args[2], v32)
        return builder.sub(ir.Constant(v32, None), builder.shl(v, _splat(v32, 7 if q8v else 3)))
    return I32x16(isa, q8, types.int32), cg


@intrinsic
def store_f32_lanes(typingctx, arr, off, v, n):
    """The first n lanes of v to flat index `off` of a float32 array (the rest not written)."""
    def cg(context, builder, sig, args):
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _F32)
        mask = _mask(builder, 16, _i64(builder, args[3]))
        _call(builder, "llvm.masked.store.v16f32.p0", ir.VoidType(),
              [args[2], builder.bitcast(p, F32x16.llvm.as_pointer()), _c32(4), mask])
        return context.get_dummy_value()
    return types.none(arr, off, v, n), cg


# == the kernels ==========================================================================================

@njit(inline="always")
def _past_either_end(ids, R):
    """Does an id (counted from the end where negative) lie past either end of an R-row weight?"""
    for n in range(ids.shape[0]):
        if ids[n] >= R or ids[n] < -R:
            return True
    return False


@njit(cache=True)
def gather_rows(words, R, nb, ids, out):
    """int8.lane_rows: rows ids (counted from the end where negative) of an R-row weight in lane
    order, back in GGUF's order, a 4-byte word at a time: words the lane order viewed as int32, out
    [n, ww·nb] int32 (ww = a block's words: 8 for Q8_0, 4 for Q4); int8.scale_rows: words a plane
    of scales (uint16, a word each), ww = 1. False, out unwritten, where an id lies past either end."""
    ww = out.shape[1] // nb
    if _past_either_end(ids, R):
        return False
    for n in range(ids.shape[0]):
        r = ids[n] + R if ids[n] < 0 else ids[n]
        for j in range(nb):
            g = r // GROUP * nb + j                           # the group holding the row's block j
            base = g * GROUP * ww + r % GROUP                 # its first word: word w 16 words on
            for w in range(ww):
                out[n, j * ww + w] = words[base + GROUP * w]
    return True


@njit(cache=True)
def dequant_rows(q, d, m, kind, R, nb, ids, out):
    """int8.dequant_rows: rows ids (counted from the end where negative) of an R-row weight in lane
    order, dequantized into out [n, 32·nb] float32 as models/quant.py's QuantMatrix.rows does it from
    GGUF's order, one rounding a step: kind 0 Q8_0 d·q, 1 Q4_0 d·(n - 8), 2 Q4_1 d·n + m (q's byte i
    of a Q4 block holds values i and i + 16). q the lane-order bytes (int8 or uint8), d and m the
    scales and minimums [groups, 16] uint16 (m unread unless kind 2). False, out unwritten, where an
    id lies past either end. One compiled call: an embedding's lookup after the head found the
    NumPy steps' code and data out of the cache (SmolLM2: 135 µs a step for one row)."""
    bb = 32 if kind == 0 else 16                      # q's bytes a block
    if _past_either_end(ids, R):
        return False
    for n in range(ids.shape[0]):
        r = ids[n] + R if ids[n] < 0 else ids[n]
        lane = r % GROUP
        for j in range(nb):
            g = r // GROUP * nb + j                       # the group holding the row's block j
            s = f16(d[g, lane])
            lo = np.float32(0.0)
            if kind == 2:
                lo = f16(m[g, lane])
            base = g * GROUP * bb + 4 * lane              # byte i at base + 64·(i//4) + i%4
            for i in range(bb):
                v = q[base + 64 * (i // 4) + i % 4]
                if kind == 0:
                    out[n, QK * j + i] = np.float32(v) * s
                else:
                    b = np.int32(v)
                    a = np.float32(b & 15)
                    h = np.float32(b >> 4)
                    if kind == 1:
                        out[n, QK * j + i] = (a - np.float32(8.0)) * s
                        out[n, QK * j + i + 16] = (h - np.float32(8.0)) * s
                    else:
                        out[n, QK * j + i] = a * s + lo
                        out[n, QK * j + i + 16] = h * s + lo
    return True


@njit(inline="always")
def _quantize_row(x, t, xq, xd, xs, xm):
    """Row t of x [T, C] float32 -> per block of 32 values d = max|x| / 127, q = clip(rint(x / d),
    ±127) (q = 0 where d is 0; d = NaN and q = 0 where the block holds inf or NaN), s = Σq,
    m = d·float(s): xq int8 [T, C], xd, xm float32 and xs int32 [T, nb] (the reference's step 1)."""
    C = x.shape[1]
    for b in range(C // QK):
        off = t * C + QK * b                          # the block's first value, a flat index
        amax, bad = block_absmax(x, off)              # bad: an inf or NaN
        d = amax / np.float32(127.0)
        s = np.int32(0)
        if bad or d == np.float32(0.0):
            for i in range(QK):
                xq[t, QK * b + i] = 0
            if bad:
                d = np.float32(np.nan)
        else:
            s = block_round(x, off, d, xq, off)
        xd[t, b] = d
        xs[t, b] = s
        xm[t, b] = d * np.float32(s)


PARALLEL_ROWS = 8     # rows of x from which their rounding runs on all threads


@njit(inline="always")
def _quantize(x):
    """All rows of x: (xq, xd, xs, xm); on one thread for a few rows (a parallel region costs more
    than rounding a decode row), on all from PARALLEL_ROWS."""
    T, C = x.shape
    nb = C // QK
    xq = np.empty((T, C), np.int8)                     # read 4 bytes at a time (broadcast): no boundary wanted
    f = np.empty((3, T, nb), np.float32)               # one allocation for the three (each costs)
    xd, xm, xs = f[0], f[1], f[2].view(np.int32)
    if T < PARALLEL_ROWS:
        for t in range(T):
            _quantize_row(x, t, xq, xd, xs, xm)
    else:
        for t in prange(T):
            _quantize_row(x, t, xq, xd, xs, xm)
    return xq, xd, xs, xm


@njit(parallel=True, cache=True)
def quantize_x(x):
    """Step 1 alone (the tests compare it with the reference's): x [T, C] -> (xq, xd, xs, xm)."""
    return _quantize(x)


@njit(inline="always")
def _prefetch_group(q, d, g, group_bytes):
    """Group g + AHEAD's weight bytes and scales, asked for before they are read (a caller with
    minimums asks for theirs too: `_prefetch_scales`)."""
    b = (g + AHEAD) * group_bytes
    for j in range(0, group_bytes, 64):
        prefetch(q, b + j)
    _prefetch_scales(d, g)


@njit(inline="always")
def _prefetch_scales(s, g):
    """Group g + AHEAD's 16 scales (or minimums), uint16 [groups, 16]."""
    prefetch(s, 2 * GROUP * (g + AHEAD))


@njit(inline="always")
def _store_rows(y, t, r0, R, acc):
    """Lane L of acc to y[t, r0 + L], for the rows that exist (a weight's last 16 may be fewer)."""
    if r0 + GROUP <= R:
        store_f32x16(y, t * R + r0, acc)
    else:
        store_f32_lanes(y, t * R + r0, acc, R - r0)


@njit(inline="always")
def _q8_0_matmul(isa, q, d, x, y):
    """Q8_0: y [T, R] float32 = x [T, C] float32 @ W^T, W's values q and scales d in lane order
    (int8.lane_order: int8 [groups·512], uint16 [groups, 16]); x rounded to int8 blocks first
    (_quantize). Each parallel item is 16 rows: its groups c·nb .. c·nb + nb - 1 in turn, each read
    once for up to TILE rows of x, the rows' sums in 16 lanes."""
    T, R = y.shape
    nb = x.shape[1] // QK
    xq, xd, xs, xm = _quantize(x)
    if T == 1:                                         # a decode step: the sum a register
        for c in prange((R + GROUP - 1) // GROUP):
            acc = zero_f32x16()
            for j in range(nb):
                g = c * nb + j
                _prefetch_group(q, d, g, 512)
                i = dot8(isa, True, block_init(isa, True, xs[0, j]), q8_group(isa, q, g * 512), xq, QK * j)
                acc = acc + (load_f16x16(d, g * GROUP, GROUP) * splat_f32x16(xd[0, j])) * to_f32(i)
            _store_rows(y, 0, c * GROUP, R, acc)
        return
    for c in prange((R + GROUP - 1) // GROUP):
        acc = np.empty((TILE, GROUP), np.float32)
        for t0 in range(0, T, TILE):
            nt = min(TILE, T - t0)
            for t in range(nt):
                store_f32x16(acc, t * GROUP, zero_f32x16())
            for j in range(nb):
                g = c * nb + j
                w = q8_group(isa, q, g * 512)
                dw = load_f16x16(d, g * GROUP, GROUP)
                for t in range(nt):
                    i = dot8(isa, True, block_init(isa, True, xs[t0 + t, j]), w, xq, (t0 + t) * x.shape[1] + QK * j)
                    a = (dw * splat_f32x16(xd[t0 + t, j])) * to_f32(i)
                    store_f32x16(acc, t * GROUP, load_f32x16(acc, t * GROUP) + a)
            for t in range(nt):
                _store_rows(y, t0 + t, c * GROUP, R, load_f32x16(acc, t * GROUP))


@njit(inline="always")
def _q4_matmul(isa, q, d, m, x, y):
    """Q4_0 and Q4_1: y [T, R] = x [T, C] @ W^T, W's nibbles q, scales d and minimums m in lane order
    (int8.lane_order: uint8 [groups·256], uint16 [groups, 16] each; Q4_1: value = d·n + m; Q4_0: m
    [0, 16], value = d·(n - 8)); x rounded to int8 blocks first (_quantize). As _q8_0_matmul."""
    T, R = y.shape
    C = x.shape[1]
    nb = C // QK
    xq, xd, xs, xm = _quantize(x)
    has_min = m.shape[0] > 0
    if T == 1:
        for c in prange((R + GROUP - 1) // GROUP):
            acc = zero_f32x16()
            for j in range(nb):
                g = c * nb + j
                _prefetch_group(q, d, g, 256)
                if has_min:
                    _prefetch_scales(m, g)
                dw = load_f16x16(d, g * GROUP, GROUP)
                if has_min:
                    i = q4_dot8(isa, q, g * 256, zero_i32x16(), xq, QK * j)
                    a = ((dw * splat_f32x16(xd[0, j])) * to_f32(i)
                         + load_f16x16(m, g * GROUP, GROUP) * splat_f32x16(xm[0, j]))
                else:
                    i = q4_dot8(isa, q, g * 256, block_init(isa, False, xs[0, j]), xq, QK * j)
                    a = (dw * splat_f32x16(xd[0, j])) * to_f32(i)
                acc = acc + a
            _store_rows(y, 0, c * GROUP, R, acc)
        return
    for c in prange((R + GROUP - 1) // GROUP):
        acc = np.empty((TILE, GROUP), np.float32)
        for t0 in range(0, T, TILE):
            nt = min(TILE, T - t0)
            for t in range(nt):
                store_f32x16(acc, t * GROUP, zero_f32x16())
            for j in range(nb):
                g = c * nb + j
                w = q4_group(isa, q, g * 256)
                dw = load_f16x16(d, g * GROUP, GROUP)
                if has_min:
                    mw = load_f16x16(m, g * GROUP, GROUP)
                    for t in range(nt):
                        i = dot8(isa, False, zero_i32x16(), w, xq, (t0 + t) * C + QK * j)
                        a = (dw * splat_f32x16(xd[t0 + t, j])) * to_f32(i) + mw * splat_f32x16(xm[t0 + t, j])
                        store_f32x16(acc, t * GROUP, load_f32x16(acc, t * GROUP) + a)
                else:
                    for t in range(nt):
                        i = dot8(isa, False, block_init(isa, False, xs[t0 + t, j]), w, xq, (t0 + t) * C + QK * j)
                        a = (dw * splat_f32x16(xd[t0 + t, j])) * to_f32(i)
                        store_f32x16(acc, t * GROUP, load_f32x16(acc, t * GROUP) + a)
            for t in range(nt):
                _store_rows(y, t0 + t, c * GROUP, R, load_f32x16(acc, t * GROUP))


# -- the entries: one per format and instruction set (an argument typed by a Python object costs
# numba's dispatcher 0.8-2.9 µs a call; a global is a constant of the compiled code) -----------------

_AVX512_VNNI, _AVX_VNNI, _AVX2, _GENERIC = (Isa(n) for n in ISAS)


@njit(parallel=True, cache=True)
def q8_0_avx512_vnni(q, d, x, y):
    _q8_0_matmul(_AVX512_VNNI, q, d, x, y)


@njit(parallel=True, cache=True)
def q8_0_avx_vnni(q, d, x, y):
    _q8_0_matmul(_AVX_VNNI, q, d, x, y)


@njit(parallel=True, cache=True)
def q8_0_avx2(q, d, x, y):
    _q8_0_matmul(_AVX2, q, d, x, y)


@njit(parallel=True, cache=True)
def q8_0_generic(q, d, x, y):
    _q8_0_matmul(_GENERIC, q, d, x, y)


@njit(parallel=True, cache=True)
def q4_avx512_vnni(q, d, m, x, y):
    _q4_matmul(_AVX512_VNNI, q, d, m, x, y)


@njit(parallel=True, cache=True)
def q4_avx_vnni(q, d, m, x, y):
    _q4_matmul(_AVX_VNNI, q, d, m, x, y)


@njit(parallel=True, cache=True)
def q4_avx2(q, d, m, x, y):
    _q4_matmul(_AVX2, q, d, m, x, y)


@njit(parallel=True, cache=True)
def q4_generic(q, d, m, x, y):
    _q4_matmul(_GENERIC, q, d, m, x, y)


KERNELS = {
    ("q8_0", "avx512-vnni"): q8_0_avx512_vnni, ("q8_0", "avx-vnni"): q8_0_avx_vnni,
    ("q8_0", "avx2"): q8_0_avx2, ("q8_0", "generic"): q8_0_generic,
    ("q4", "avx512-vnni"): q4_avx512_vnni, ("q4", "avx-vnni"): q4_avx_vnni,
    ("q4", "avx2"): q4_avx2, ("q4", "generic"): q4_generic,
}
