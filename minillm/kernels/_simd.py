"""Vector registers in numba: small numba types whose values are LLVM vectors, and the few
operations the integer kernels (_int8.py) need, each emitted as LLVM IR through llvmlite.

numba compiles plain Python loops over integers with int64 arithmetic (an int8 times an int8 is
typed as an int64), so an integer dot product written as a loop runs 8 lanes a vector at best. The
instruction the integer product wants is VNNI's vpdpbusd: 64 unsigned bytes times 64 signed bytes,
each four products summed into one of 16 int32 lanes and added to an accumulator, one instruction.
LLVM reaches it only through its intrinsic, so these types hold vectors as numba values:

    I8x64    <64 x i8>     64 bytes of integers (a block's or a group's)
    I32x16   <16 x i32>    16 int32 lanes
    F32x16   <16 x float>  16 float32 lanes

and `dot8` picks the instruction from the `Isa` its kernel was compiled for (an argument whose numba
type names the instruction set, so each ISA is its own compiled specialisation, cached apart):

    "avx512-vnni"   vpdpbusd on 512-bit registers (AVX512-VNNI)
    "avx-vnni"      vpdpbusd on 256-bit registers (AVX-VNNI, or AVX512-VNNI with AVX512-VL)
    "avx2"          vpmaddubsw then vpmaddwd (AVX2): pairs of u8·s8 to int16, pairs of those to int32
    "generic"       LLVM's portable vectors: widen to int32, multiply, add fours (any CPU LLVM targets)

Every form computes the same int32 lanes exactly (each lane: four consecutive byte products), so
the kernels' answers do not depend on the ISA. Float operations are emitted without fast-math flags:
no fused multiply-add, no reassociation, each rounding as the NumPy reference rounds.
"""

from __future__ import annotations

import operator

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import (NativeValue, intrinsic, models, overload, register_model, typeof_impl,
                             unbox)

# -- the types --------------------------------------------------------------------------------------

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_F32, _F16 = ir.FloatType(), ir.HalfType()
_ELT = {"i8": _I8, "i16": _I16, "i32": _I32, "f32": _F32}


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
W8 = types.UniTuple(I8x64, 8)       # a group's weights, 8 vectors of 64 bytes (block-per-lane order)


class Isa:
    """Which integer-dot instructions a kernel is compiled for (one of ISAS), passed as its first
    argument: numba compiles (and caches) one specialisation per Isa."""

    def __init__(self, name: str) -> None:
        if name not in ISAS:
            raise ValueError(f"unknown integer instruction set {name!r}; one of {', '.join(ISAS)}")
        self.name = name

    def __repr__(self) -> str:
        return f"Isa({self.name!r})"


ISAS = ("avx512-vnni", "avx-vnni", "avx2", "generic")


class IsaType(types.Type):
    def __init__(self, isa: str) -> None:
        self.isa = isa
        super().__init__(name=f"Isa({isa})")


register_model(IsaType)(models.OpaqueModel)


@typeof_impl.register(Isa)
def _typeof_isa(val, c):
    return IsaType(val.name)


@unbox(IsaType)
def _unbox_isa(typ, obj, c):
    return NativeValue(c.context.get_constant_null(typ))


# -- helpers for the code generators -------------------------------------------------------------------

def _c32(v: int) -> ir.Constant:
    return ir.Constant(_I32, v)


def _splat(ty: ir.VectorType, v) -> ir.Constant:
    return ir.Constant(ty, [v] * ty.count)


def _ptr(context, builder, arrty, arr, off, elt: ir.Type):
    """Address of element `off` of a C-contiguous array (flat index), as a pointer to `elt`."""
    a = context.make_array(arrty)(context, builder, arr)
    p = builder.gep(a.data, [off])
    return builder.bitcast(p, elt.as_pointer())


def _call(builder, name: str, ret: ir.Type, args: list):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _mask(builder, n: int, valid) -> ir.Value:
    """<n x i1>: lane i is on when i < valid (an integer value)."""
    if valid.type.width > 32:
        valid = builder.trunc(valid, _I32)
    elif valid.type.width < 32:
        valid = builder.sext(valid, _I32)
    iota = ir.Constant(ir.VectorType(_I32, n), list(range(n)))
    vv = builder.insert_element(ir.Constant(ir.VectorType(_I32, n), None), valid, _c32(0))
    vv = builder.shuffle_vector(vv, vv, ir.Constant(ir.VectorType(_I32, n), [0] * n))
    return builder.icmp_signed("<", iota, vv)


def _masked_load(builder, ptr, vty: ir.VectorType, mask):
    """llvm.masked.load: lanes off the mask read nothing (no fault past an array's end) and are 0."""
    name = f"llvm.masked.load.v{vty.count}{'f32' if vty.element == _F32 else 'i' + str(vty.element.width)}.p0"
    return _call(builder, name, vty, [builder.bitcast(ptr, vty.as_pointer()), _c32(1), mask,
                                      ir.Constant(vty, None)])


def _shuffle(builder, a, b, idx: list[int]):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _halves(builder, v, n: int):
    return (_shuffle(builder, v, v, list(range(n // 2))), _shuffle(builder, v, v, list(range(n // 2, n))))


# -- loads and stores ---------------------------------------------------------------------------------

@intrinsic
def load_i8x64(typingctx, arr, off):
    """64 bytes of an int8/uint8 array from flat index `off`."""
    def cg(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], I8x64.llvm), align=1)
    return I8x64(arr, off), cg


@intrinsic
def load_i32x16(typingctx, arr, off):
    def cg(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], I32x16.llvm), align=4)
    return I32x16(arr, off), cg


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
    """16 float16 values (stored as uint16 bits) from flat index `off`, the first `valid` of them
    (the rest read as 0), converted to float32 exactly (LLVM's fpext: vcvtph2ps with F16C; inf and
    NaN stay inf and NaN)."""
    def cg(context, builder, sig, args):
        vty = ir.VectorType(_I16, 16)
        p = _ptr(context, builder, sig.args[0], args[0], args[1], _I16)
        h = _masked_load(builder, p, vty, _mask(builder, 16, args[2]))
        return builder.fpext(builder.bitcast(h, ir.VectorType(_F16, 16)), F32x16.llvm)
    return F32x16(arr, off, valid), cg


# -- arithmetic ---------------------------------------------------------------------------------------

def _binop(op_name):
    def impl(a, b):
        if isinstance(a, Vec) and a == b:
            inst = {"add": "fadd" if a.kind == "f32" else "add", "sub": "fsub" if a.kind == "f32" else "sub",
                    "mul": "fmul" if a.kind == "f32" else "mul"}[op_name]

            @intrinsic
            def _op(typingctx, x, y):
                def cg(context, builder, sig, args):
                    return getattr(builder, inst)(args[0], args[1])
                return x(x, y), cg
            return lambda a, b: _op(a, b)
    return impl


overload(operator.add)(_binop("add"))
overload(operator.sub)(_binop("sub"))
overload(operator.mul)(_binop("mul"))


@intrinsic
def zero_f32x16(typingctx):
    def cg(context, builder, sig, args):
        return ir.Constant(F32x16.llvm, None)
    return F32x16(), cg


@intrinsic
def to_f32(typingctx, v):
    """int32 lanes -> float32 lanes (exact below 2^24, which every block sum here is)."""
    def cg(context, builder, sig, args):
        return builder.sitofp(args[0], F32x16.llvm)
    return F32x16(v), cg


@intrinsic
def shl_i32(typingctx, v, k):
    """int32 lanes shifted left by the constant `k` (a multiply by 2^k)."""
    def cg(context, builder, sig, args):
        return builder.shl(args[0], _splat(I32x16.llvm, sig.args[1].literal_value))
    if not isinstance(k, types.IntegerLiteral):
        return None
    return I32x16(v, k), cg


@intrinsic
def neg_i32(typingctx, v):
    def cg(context, builder, sig, args):
        return builder.sub(ir.Constant(I32x16.llvm, None), args[0])
    return I32x16(v), cg


@intrinsic
def tree_sum(typingctx, v):
    """The 16 float32 lanes added in a fixed tree: a[i] = v[i] + v[i+8] (i < 8), then the same
    halving to 4, 2 and 1 lanes. The NumPy reference adds in this order."""
    def cg(context, builder, sig, args):
        v = args[0]
        n = 16
        while n > 1:
            lo, hi = _shuffle(builder, v, v, list(range(n // 2))), _shuffle(builder, v, v, list(range(n // 2, n)))
            v = builder.fadd(lo, hi)
            n //= 2
        return builder.extract_element(v, _c32(0))
    return types.float32(v), cg


# -- a group's weights in block-per-lane order --------------------------------------------------------
#
# A group is 16 blocks of 32 values of one weight row. Stored (GGUF's order, the planes'), block after
# block: Q8_0 32 bytes each (512), Q4 16 bytes each (256, value j in byte j's low nibble, j + 16 in
# its high nibble). The integer dot wants "block per lane": vector k (k = 0..7) holds in its lane L
# (4 bytes) values 4k..4k+3 of block L, so that 8 dot instructions leave each block's sum in a lane of
# its own, with no horizontal sums. The activations are quantized straight into that order; the
# weights are rearranged in registers as they are loaded: a transpose of 4-byte words (Q8_0: 16
# blocks x 8 words, three rounds of two-register shuffles; Q4: 16 x 4 words, two rounds, then each
# word's low and high nibbles are vectors k and k + 4).

def _transpose_plan(n_vec: int, n_word: int) -> list:
    """Shuffle rounds that turn n_vec vectors of 16 int32 lanes, holding a row-major [16 blocks,
    n_word words] matrix, into n_word vectors whose lane L is block L's word k. Each round pairs
    vectors differing in one bit of their number and swaps that bit with a bit of the word index;
    masks are found by following where every element goes."""
    pos = [[v * 16 + l for l in range(16)] for v in range(n_vec)]          # element f = block·n_word + word
    word_bits = n_word.bit_length() - 1
    vec_bits = n_vec.bit_length() - 1
    rounds = []
    for s in range(vec_bits):
        vb = 1 << s                        # vector bit to swap...
        wb = 1 << s                        # ...with this bit of the word index
        new = [None] * n_vec
        masks = []
        for a in range(n_vec):
            if a & vb:
                continue
            b = a | vb
            both = pos[a] + pos[b]
            for bit in (0, 1):
                sel = sorted((i for i in range(32) if bool((both[i] % n_word) & wb) == bool(bit)),
                             key=lambda i: (both[i] % n_word, both[i] // n_word) if s == vec_bits - 1
                             else both[i])
                out = a | (vb if bit else 0)
                new[out] = [both[i] for i in sel]
                masks.append((a, b, out, sel))
        pos = new
        rounds.append(masks)
    assert word_bits == vec_bits
    for k in range(n_vec):                  # the result: vector k lane L = block L, word k
        assert pos[k] == [L * n_word + k for L in range(16)], pos[k]
    return rounds


_Q8_PLAN = _transpose_plan(8, 8)
_Q4_PLAN = _transpose_plan(4, 4)


def _transpose(builder, vecs: list, plan) -> list:
    for masks in plan:
        new = list(vecs)
        for a, b, out, sel in masks:
            new[out] = _shuffle(builder, vecs[a], vecs[b], sel)
        vecs = new
    return vecs


def _load_group(builder, base, nbytes: int, valid):
    """nbytes // 64 vectors of <16 x i32> from `base` (an i8 pointer), the first `valid` bytes of the
    group read, the rest 0 (a row's last, partial group)."""
    vty = ir.VectorType(_I8, 64)
    out = []
    for i in range(nbytes // 64):
        p = builder.gep(base, [_c32(64 * i)])
        left = builder.sub(valid, ir.Constant(valid.type, 64 * i))
        out.append(builder.bitcast(_masked_load(builder, p, vty, _mask(builder, 64, left)), I32x16.llvm))
    return out


@intrinsic
def q8_group(typingctx, isa, q, off, valid):
    """A Q8_0 row's group of 16 blocks from flat byte index `off` (`valid` bytes of it: the rest 0),
    in block-per-lane order. For the VNNI forms each byte is also flipped to w + 128 (xor 0x80): the
    instruction's first operand is unsigned, and the kernel subtracts 128·Σx per block after."""
    def cg(context, builder, sig, args):
        isa_name = sig.args[0].isa
        base = _ptr(context, builder, sig.args[1], args[1], args[2], _I8)
        vecs = _transpose(builder, _load_group(builder, base, 512, args[3]), _Q8_PLAN)
        out = []
        for v in vecs:
            v = builder.bitcast(v, I8x64.llvm)
            if isa_name in VNNI:
                v = builder.xor(v, _splat(I8x64.llvm, 0x80))
            out.append(v)
        return context.make_tuple(builder, W8, out)
    return W8(isa, q, off, valid), cg


@intrinsic
def q4_group(typingctx, q, off, valid):
    """A Q4 row's group of 16 blocks (256 packed bytes from flat byte index `off`, `valid` of them
    read) as 8 vectors of nibbles 0..15, block-per-lane order: vector k < 4 the low nibbles of each
    block's bytes 4k..4k+3 (its values 4k..4k+3), vector k + 4 their high nibbles (values 16+4k..)."""
    def cg(context, builder, sig, args):
        base = _ptr(context, builder, sig.args[0], args[0], args[1], _I8)
        words = _transpose(builder, _load_group(builder, base, 256, args[2]), _Q4_PLAN)
        lo, hi = [], []
        m = _splat(I32x16.llvm, 0x0F0F0F0F)
        for w in words:
            lo.append(builder.bitcast(builder.and_(w, m), I8x64.llvm))
            hi.append(builder.bitcast(builder.and_(builder.lshr(w, _splat(I32x16.llvm, 4)), m), I8x64.llvm))
        return context.make_tuple(builder, W8, lo + hi)
    return W8(q, off, valid), cg


# -- the integer dot: 8 weight vectors against 8 vectors of activations -------------------------------

def _dot_one(builder, isa: str, signed_w: bool, acc, w, x):
    """acc (<16 x i32>) + for each lane the four products of w's and x's bytes in that lane.
    w: unsigned bytes (signed when signed_w: Q8_0 outside the VNNI forms), x: signed bytes."""
    v32 = I32x16.llvm
    if isa == "avx512-vnni":
        return _call(builder, "llvm.x86.avx512.vpdpbusd.512", v32,
                     [acc, builder.bitcast(w, v32), builder.bitcast(x, v32)])
    if isa == "avx-vnni":
        v8 = ir.VectorType(_I32, 8)
        parts = []
        for a, wh, xh in zip(_halves(builder, acc, 16), _halves(builder, w, 64), _halves(builder, x, 64)):
            parts.append(_call(builder, "llvm.x86.avx512.vpdpbusd.256", v8,
                               [a, builder.bitcast(wh, v8), builder.bitcast(xh, v8)]))
        return _shuffle(builder, parts[0], parts[1], list(range(16)))
    if isa == "avx2":
        b32, w16, d8 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)
        ones = _splat(w16, 1)
        parts = []
        for wh, xh in zip(_halves(builder, w, 64), _halves(builder, x, 64)):
            if signed_w:              # |w| (unsigned, at most 128) times x with w's sign: pairs fit int16
                xh = _call(builder, "llvm.x86.avx2.psign.b", b32, [xh, wh])
                wh = _call(builder, "llvm.abs.v32i8", b32, [wh, ir.Constant(ir.IntType(1), 0)])
            p16 = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", w16, [wh, xh])
            parts.append(_call(builder, "llvm.x86.avx2.pmadd.wd", d8, [p16, ones]))
        return builder.add(acc, _shuffle(builder, parts[0], parts[1], list(range(16))))
    # generic: widen to int32, multiply, add each lane's four
    v64 = ir.VectorType(_I32, 64)
    ww = builder.sext(w, v64) if signed_w else builder.zext(w, v64)
    p = builder.mul(ww, builder.sext(x, v64))
    s = None
    for j in range(4):
        part = _shuffle(builder, p, p, [4 * L + j for L in range(16)])
        s = part if s is None else builder.add(s, part)
    return builder.add(acc, s)


VNNI = ("avx512-vnni", "avx-vnni")


@intrinsic
def dot8(typingctx, isa, q8, acc, w, x, xoff):
    """acc + Σ_k (lane-wise four-byte products of w[k] and the k-th 64 bytes of x from `xoff`):
    with block-per-lane order, each block's integer dot product in its lane. q8: a literal bool,
    whether w is a Q8_0 group from q8_group (signed bytes, or w + 128 on the VNNI forms) or a Q4
    group of nibbles (unsigned)."""
    if not isinstance(q8, types.BooleanLiteral):
        return None

    def cg(context, builder, sig, args):
        isa_name = sig.args[0].isa
        signed = sig.args[1].literal_value and isa_name not in VNNI
        base = _ptr(context, builder, sig.args[4], args[4], args[5], _I8)
        acc = args[2]
        for k in range(8):
            wk = builder.extract_value(args[3], k)
            xk = builder.load(builder.bitcast(builder.gep(base, [_c32(64 * k)]), I8x64.llvm.as_pointer()), align=1)
            acc = _dot_one(builder, isa_name, signed, acc, wk, xk)
        return acc
    return I32x16(isa, q8, acc, w, x, xoff), cg


@intrinsic
def block_init(typingctx, isa, q8, xs, off):
    """What a group's dot starts from, per block (lane): minus the offset times the activations'
    block sums xs[off:off+16]. Q8_0 on the VNNI forms multiplies w + 128 (see q8_group): -128·Σx;
    Q4_0 (q8 False, the value n - 8 multiplied as n): -8·Σx; otherwise 0. The kernels pass xs only
    where one of those applies (else any int32 array, unread)."""
    if not isinstance(q8, types.BooleanLiteral):
        return None

    def cg(context, builder, sig, args):
        q8v = sig.args[1].literal_value
        shift = 7 if q8v else 3
        if q8v and sig.args[0].isa not in VNNI:
            return ir.Constant(I32x16.llvm, None)
        v = builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], I32x16.llvm), align=4)
        return builder.sub(ir.Constant(I32x16.llvm, None), builder.shl(v, _splat(I32x16.llvm, shift)))
    return I32x16(isa, q8, xs, off), cg


@intrinsic
def zero_i32x16(typingctx):
    def cg(context, builder, sig, args):
        return ir.Constant(I32x16.llvm, None)
    return I32x16(), cg
