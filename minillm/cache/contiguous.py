"""The contiguous KV cache: every layer's keys and values for every position of one sequence,
preallocated to n_ctx (a context longer than PREALLOCATE positions, 32,768, starts there and doubles
as positions fill: a model claiming 10^7 positions does not reserve gigabytes for a short chat).

Layout [L, Hkv, n_ctx, hd] (Hkv = the model's KV heads: GPT-2's H, fewer with grouped-query
attention; latent attention's one row of r + dr values, whose first r are the values: `values_in_keys`): for one layer, the keys of all heads are one [Hkv, t, hd] view
`k[layer, :, :t]`, so a decode step attends over every head in one batched product, with no
per-step concatenation and no copy of what the cache already holds. The arrays are allocated
once (the pages are touched only as positions fill), and a step writes only its own positions.

Every cache speaks the same small protocol, and the model uses nothing else:

    length                    positions filled so far (read-only for the model)
    capacity                  positions it has room for now (a step may fill up to this)
    reserve(n)                make room for n more positions, or raise PromptError saying why not
    write(layer, pos, k, v)   store keys and values [Hkv, n, hd] of positions pos .. pos+n-1
    read(layer, t, start=0)   keys and values of positions start .. t-1, [Hkv, t - start, hd] each;
                              reports the read (start > 0: a sliding window's, the positions behind
                              it neither read nor counted)
    read_rows(layer, t, start=0)  the same for a kernel told t (the fused attention): arrays whose
                              first t - start rows per head are those positions (CacheBase's: `read`)
    advance(n)                the step is done: n more positions are filled
    truncate(t)               forget every position from t on (speculative decoding's roll-back)
    free()                    give the memory back (a paged cache returns its blocks)

An 8-bit KV cache (`KVCache(config, kv_dtype="int8")`) stores each head's key (and value) vector of a
position as 127 levels of its largest magnitude, q = round(x ÷ s) with s = max|x| ÷ 127, and keeps the
float32 scale s beside it: hd + 4 bytes per vector instead of 4·hd. `read` widens them back to the
model's dtype for attention; the meter counts the int8 values and scales as the KV read, the widened
copy as activations (written, then read by attention) and the widening as `dequant` FLOPs. This is
what vLLM's `--kv-cache-dtype fp8` and llama.cpp's `-ctk q8_0 -ctv q8_0` do, at one scale per vector.
"""

from __future__ import annotations

import math
import mmap

import numpy as np

from ..config import ModelConfig
from ..errors import PromptError
from .. import meter


def no_room(length: int, n_new: int, n_ctx: int) -> PromptError:
    return PromptError(
        f"the KV cache holds {length} of {n_ctx} positions; {n_new} more do not fit "
        f"(the model's context is {n_ctx} tokens): shorten the prompt or generate fewer tokens"
    )


class CacheBase:
    """What every KV cache shares: its length, the context it lives in, and the checks on both."""

    config: ModelConfig
    length: int = 0
    pool = None          # a paged cache's pool of blocks (cache/paged.py); None: the cache owns its arrays
    state = None         # a hybrid's fixed per-sequence state (cache/state.py's State); None: it keeps none
    transient = False    # True for a pass that keeps nothing (PassKV): a state starts at zeros and is dropped
    kv_dtype = None      # "int8": an 8-bit cache (KVCache); None: the model's dtype

    def state_nbytes(self) -> int:
        """The bytes of its fixed state (0: none)."""
        return 0 if self.state is None else self.state.nbytes

    @property
    def n_ctx(self) -> int:
        return self.config.n_ctx

    def bytes_per_token(self) -> int:
        """K and V, every layer: 2·L·Hkv·hd·b (72 KiB for GPT-2 small in float32, where Hkv·hd = d);
        an int8 cache keeps hd one-byte values and one float32 scale per vector: 2·L·Hkv·(hd + 4).
        A latent cache (`values_in_keys`) holds the keys only: L·Hkv·hd·b (MLA's L·(r + dr)·b)."""
        c = self.config
        arrays = 1 if c.values_in_keys else 2
        if self.kv_dtype == "int8":
            return arrays * c.n_layer * c.n_kv_head * (c.head_dim + SCALE_BYTES)
        return arrays * c.n_layer * c.n_kv_head * c.head_dim * self.dtype.itemsize

    def nbytes_used(self) -> int:
        return self.length * self.bytes_per_token()

    def check_fits(self, n_new: int) -> None:
        if self.length + n_new > self.n_ctx:
            raise no_room(self.length, n_new, self.n_ctx)

    def advance(self, n: int) -> None:
        self.length += n

    def read_rows(self, layer: int, t: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """`read`, for a kernel told the row count (the fused attention): keys and values whose first
        t - start rows of each head are positions start .. t-1, [Hkv, >= t - start, hd]. Here `read`'s."""
        return self.read(layer, t, start)

    def check_truncate(self, t: int) -> None:
        if not 0 <= t <= self.length:
            raise ValueError(f"truncate({t}): the cache holds {self.length} positions")


def untouched_zeros(shape: tuple, dtype, xp=np) -> np.ndarray:
    """A zero-filled array whose memory the system maps only where it is written, 4 KiB at a time:
    a private anonymous mmap, with huge pages declined. np.zeros of 4 MiB and more asks Linux for
    2 MiB pages (NumPy madvises them), and then the first write to any position of a layer's head
    faults in and zeroes 2 MiB: a SmolLM2 prefill of 128 tokens into a new cache of n_ctx = 8,192
    positions touched 180 of them, 360 MiB (README, "The KV cache's memory"). Another module's arrays
    (CuPy's) are its own zeros; where mmap cannot give a private anonymous map, np.zeros."""
    if xp is not np:
        return xp.zeros(shape, dtype=dtype)
    dtype = np.dtype(dtype)
    n = math.prod(shape) * dtype.itemsize                       # exact: no int64 wrap-around
    private = getattr(mmap, "MAP_PRIVATE", None)
    anonymous = getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", None))
    if n == 0 or private is None or anonymous is None:           # Windows: no flags to ask with
        return np.zeros(shape, dtype)
    try:
        buf = mmap.mmap(-1, n, flags=private | anonymous)         # zero-filled, copy-on-write across fork
    except (OSError, OverflowError) as e:                         # OverflowError: past the address space
        raise MemoryError(f"cannot allocate {n:,} bytes for an array of shape {tuple(shape)}: "
                          f"{getattr(e, 'strerror', None) or e}") from None
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype).reshape(shape)


PREALLOCATE = 1 << 15       # positions a contiguous cache allocates up front, at most
SCALE_BYTES = 4          # an int8 cache's float32 scale per head vector
KV_DTYPES = (None, "int8")


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [..., hd] -> (q int8 [..., hd], s float32 [..., 1]) with x ≈ q·s, s = max|x| ÷ 127 per vector."""
    s = (np.abs(x).max(axis=-1, keepdims=True) / 127.0).astype(np.float32)
    q = np.rint(x / np.where(s > 0, s, 1.0)).clip(-127, 127).astype(np.int8)
    return q, s


class KVCache(CacheBase):
    def __init__(self, config: ModelConfig, dtype=np.float32, kv_dtype: str | None = None, xp=np) -> None:
        """xp: the module of the model's arrays (numpy; cupy puts the cache on the GPU). kv_dtype "int8"
        stores each head vector as int8 with one float32 scale (NumPy only)."""
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype={kv_dtype!r}: choose None (the model's dtype) or 'int8'")
        if kv_dtype is not None and xp is not np:
            raise ValueError(f"kv_dtype={kv_dtype!r} is implemented for the CPU (NumPy) cache only")
        self.config = config
        self.dtype = np.dtype(dtype)            # what attention computes in (read returns this)
        self.kv_dtype = kv_dtype
        self.xp = xp
        self.k = self.v = None
        self.length = 0                         # positions filled so far
        self._allocate(min(config.n_ctx, PREALLOCATE))

    def _allocate(self, n: int) -> None:
        """Arrays for n positions, [L, Hkv, n, hd] each (an int8 cache's scales [L, Hkv, n, 1] beside
        them), the filled positions copied over."""
        c, t = self.config, self.length
        shape = (c.n_layer, c.n_kv_head, n, c.head_dim)
        store = np.int8 if self.kv_dtype == "int8" else self.dtype
        shared = self.shared = c.values_in_keys          # config.Layout: a latent cache or not
        grows = self.k is not None
        for name in self.arrays():
            scale = name.endswith("scale")
            new = untouched_zeros(shape[:-1] + (1,) if scale else shape, np.float32 if scale else store, self.xp)
            if grows:
                new[:, :, :t] = getattr(self, name)[:, :, :t]
            setattr(self, name, new)            # [L, Hkv, capacity, hd] (scales: [L, Hkv, capacity, 1])
        if shared:                              # a latent cache: the values are the keys' first columns
            self.v = self.k[..., :shared]
            self.v_scale = getattr(self, "k_scale", None)

    def arrays(self) -> tuple[str, ...]:
        """The names of the arrays it stores (a latent cache: no values, and no scales of them)."""
        names = ("k", "v", "k_scale", "v_scale") if self.kv_dtype == "int8" else ("k", "v")
        return names[::2] if self.shared else names

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def reserve(self, n_new: int) -> None:
        self.check_fits(n_new)
        if self.length + n_new > self.capacity:                      # only past PREALLOCATE: doubles
            self._allocate(min(self.n_ctx, max(2 * self.capacity, self.length + n_new)))

    def write(self, layer: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store keys and values [Hkv, T, hd] of positions pos .. pos+T-1 for one layer, in place."""
        T = k.shape[1]
        v = None if self.shared else v                                         # a latent cache: the keys hold it
        if self.kv_dtype == "int8":
            written = widened = 0
            for name, x in (("k", k), ("v", v)):
                if x is not None:
                    q, sc = quantize_int8(x)
                    getattr(self, name)[layer, :, pos:pos + T] = q
                    getattr(self, name + "_scale")[layer, :, pos:pos + T] = sc
                    written, widened = written + q.nbytes + sc.nbytes, widened + x.size
            m = meter.active()
            if m is not None:
                m.count("kv_write", kv_write=written, dequant=widened)
            return
        self.k[layer, :, pos:pos + T] = k
        if v is not None:
            self.v[layer, :, pos:pos + T] = v
        m = meter.active()
        if m is not None:
            m.count("kv_write", kv_write=k.nbytes + (0 if v is None else v.nbytes))

    def read(self, layer: int, t: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Views (no copy) of the keys and values of positions start .. t-1 of one layer: [Hkv, t - start,
        hd] each. Attention streams them once: counted here as the KV-cache read."""
        k, v = self.k[layer, :, start:t], self.v[layer, :, start:t]
        if self.kv_dtype == "int8":
            sk, sv = self.k_scale[layer, :, start:t], self.v_scale[layer, :, start:t]
            wk = (k * sk).astype(self.dtype, copy=False)                       # [Hkv, t, hd], widened
            own_v = not self.shared                                            # (a latent cache's: the keys' columns)
            wv = (v * sv).astype(self.dtype, copy=False) if own_v else wk[..., :self.shared]
            m = meter.active()
            if m is not None:
                m.count("kv_read", kv_read=k.nbytes + sk.nbytes + own_v * (v.nbytes + sv.nbytes),
                        activations=2 * (wk.nbytes + own_v * wv.nbytes), dequant=k.size + own_v * v.size)
            return wk, wv
        m = meter.active()
        if m is not None:
            m.count("kv_read", kv_read=k.nbytes + (0 if self.shared else v.nbytes))
        return k, v

    def read_rows(self, layer: int, t: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The layer's whole arrays, [Hkv, capacity, hd] each and C-contiguous (no copy, no view to
        undo), of which the first t rows of each head are read: counted as `read` counts them
        (start > 0: `read`'s views of positions start .. t-1)."""
        if self.kv_dtype == "int8" or self.xp is not np or start:
            return self.read(layer, t, start)
        m = meter.active()
        if m is not None:
            m.count("kv_read", kv_read=(1 if self.shared else 2) * self.k[layer, :, :t].nbytes)
        return self.k[layer], self.v[layer]

    def truncate(self, t: int) -> None:
        """Keep positions 0 .. t-1; the rest will be written over."""
        self.check_truncate(t)
        self.length = t

    def free(self) -> None:
        self.length = 0

    def fork(self) -> "KVCache":
        """A new cache holding a copy of the positions filled so far (a shared prompt prefix, say).
        Only the filled positions are copied; the rest of the new cache is fresh, untouched memory."""
        other = KVCache(self.config, self.dtype, self.kv_dtype, self.xp)
        other.reserve(self.length)
        for name in self.arrays():
            getattr(other, name)[:, :, :self.length] = getattr(self, name)[:, :, :self.length]
        other.length = self.length
        return other


class PassKV:
    """The "cache" of a cache-less forward pass: it holds this pass's keys and values (views, no
    copy) just long enough for attention to read them, and counts that read as activations."""

    length = 0
    capacity = float("inf")
    pool = None
    state = None
    transient = True         # keeps nothing: a hybrid's linear layers start from zeros and keep nothing

    def reserve(self, n_new: int) -> None:
        pass

    def write(self, layer: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        self._k, self._v = k, v

    def read(self, layer: int, t: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        k, v = self._k[:, start:], self._v[:, start:]                # (a whole pass: start is 0)
        m = meter.active()
        if m is not None:
            m.count("attention", activations=k.nbytes + v.nbytes)
        return k, v

    read_rows = read

    def advance(self, n: int) -> None:
        self._k = self._v = None
