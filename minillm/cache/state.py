"""A fixed-size state per sequence: what a linear-attention layer keeps instead of a KV cache.

A full-attention layer keeps every position's key and value, so its cache grows with the context.
A linear-attention layer (Gated DeltaNet, models/qwen35.py) folds the past into a state of fixed
size and keeps only that. For each such layer a sequence holds:

    conv  [K-1, C]        the last K-1 inputs of its causal convolution over q|k|v (C channels)
    ssm   [Hv, dk, dv]    one [dk, dv] matrix per value head, written by the gated delta rule

whatever its length: 4 tokens or 32,768 cost the same bytes. A decode step reads each layer's
state once and writes it once (`read`, `write`: counted as kv_read and kv_write, as a KV cache's
positions are), and never reads anything older: there is no position to go back to.

    StatePool(shapes, layers, slots)   the memory: `slots` sequences' states, [slots, layers, *shape]
                                       per name, and a free list of slots
    State                              one sequence's slot: `read(layer)`, `write(layer, ...)`
    HybridKVCache                      a contiguous KV cache over the full-attention layers only,
                                       plus one State: the cache protocol of cache/contiguous.py
    HybridPagedPool, HybridPagedCache  the same over a paged pool (cache/paged.py): KV blocks for the
                                       full layers, and a state slot per running sequence paid for in
                                       blocks of the same pool: one budget, one free list

A hybrid config answers `attention()` (the config its full layers' KV is sized by: their count as
n_layer), and declares `state_shapes()` and `linear_layers` (config.Layout: every config has them,
empty for a plain transformer); the caches here read nothing else of it. The caches and the pool
answer the protocol every cache and pool answers (`state`, `state_nbytes()`; `states`,
`state_blocks`), so nothing asks which kind it holds.

What a fixed state cannot do, and says so in one line: go back (`truncate` to an earlier position:
speculative decoding's roll-back). The state after position t is gone once position t + 1 is in.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .. import meter
from ..errors import MiniLLMError
from .contiguous import KVCache, untouched_zeros
from .paged import KVCacheFullError, PagedKVCache, PagedKVPool


class StateFullError(KVCacheFullError):
    """Every state slot of a pool is in use."""


class NoRollback(MiniLLMError):
    """A sequence with a recurrent state asked to forget positions."""


class StatePool:
    """`slots` sequences' states: per name an array [slots, layers, *shape], and a free list of slots.

    shapes: name -> one layer's shape, e.g. {"conv": (K-1, C), "ssm": (Hv, dk, dv)}."""

    def __init__(self, shapes: dict[str, tuple], layers: int, slots: int, dtype=np.float32, xp=np) -> None:
        if slots < 1:
            raise MiniLLMError(f"a state pool needs at least one slot, got {slots}")
        self.shapes = dict(shapes)
        self.layers = layers
        self.dtype = np.dtype(dtype)
        self.arrays = {name: untouched_zeros((slots, layers) + tuple(shape), dtype, xp)
                       for name, shape in self.shapes.items()}
        self.free_list: deque[int] = deque(range(slots))

    @property
    def slots(self) -> int:
        return next(iter(self.arrays.values())).shape[0] if self.arrays else 0

    @property
    def n_free(self) -> int:
        return len(self.free_list)

    @staticmethod
    def slot_nbytes_for(shapes: dict[str, tuple], layers: int, itemsize: int) -> int:
        """One sequence's state, every layer: what a slot costs whatever the sequence's length."""
        return layers * itemsize * sum(int(np.prod(s)) for s in shapes.values())

    @property
    def slot_nbytes(self) -> int:
        return self.slot_nbytes_for(self.shapes, self.layers, self.dtype.itemsize)

    def take(self) -> "State":
        """A free slot, zeroed (a new sequence's state is zeros). StateFullError when none is left."""
        if not self.free_list:
            raise StateFullError(f"the {self.slots} state slots are all in use: give the cache more memory "
                                 "or run fewer sequences at once")
        slot = self.free_list.popleft()
        for a in self.arrays.values():
            a[slot] = 0
        return State(self, slot)

    def give(self, slot: int) -> None:
        if slot in self.free_list:
            raise ValueError(f"state slot {slot} is already free (given back twice?)")
        self.free_list.appendleft(slot)      # reused first: its pages are touched already


class State:
    """One sequence's slot of a StatePool: its states, layer by layer."""

    def __init__(self, pool: StatePool, slot: int) -> None:
        self.pool, self.slot = pool, slot

    def read(self, layer: int) -> tuple[np.ndarray, ...]:
        """The layer's states, in the pool's order of names (conv window, matrix): views, no copy.
        Counted as a KV read: the step streams them once."""
        out = tuple(a[self.slot, layer] for a in self.pool.arrays.values())
        m = meter.active()
        if m is not None:
            m.count("state_read", kv_read=sum(a.nbytes for a in out))
        return out

    def write(self, layer: int, *states: np.ndarray) -> None:
        """The layer's new states, in the order `read` gave them, into the slot. Counted as a KV write."""
        for a, s in zip(self.pool.arrays.values(), states, strict=True):
            a[self.slot, layer] = s
        m = meter.active()
        if m is not None:
            m.count("state_write", kv_write=sum(s.nbytes for s in states))

    def copy_from(self, other: "State") -> None:
        for a, b in zip(self.pool.arrays.values(), other.pool.arrays.values(), strict=True):
            a[self.slot] = b[other.slot]

    def zero(self) -> None:
        for a in self.pool.arrays.values():
            a[self.slot] = 0

    @property
    def nbytes(self) -> int:
        return self.pool.slot_nbytes

    def at(self, layer: int) -> "LayerState":
        """This state's one layer, as a linear layer reads and writes it."""
        return LayerState(self, layer)


class LayerState:
    """One sequence's state for one linear layer: `read()` and `write(*states)` (what a step's plan
    offers a linear layer: models/plan.py's `states`)."""

    def __init__(self, state: State, layer: int) -> None:
        self.state, self.layer = state, layer

    def read(self) -> tuple[np.ndarray, ...]:
        return self.state.read(self.layer)

    def write(self, *s: np.ndarray) -> None:
        self.state.write(self.layer, *s)


def no_rollback(length: int, t: int) -> NoRollback:
    return NoRollback(f"this model's linear-attention layers keep one state per sequence, not its positions: "
                      f"it cannot go back from {length} to {t} positions (speculative decoding needs that)")


def state_pool(config, slots: int, dtype, xp=np) -> StatePool:
    return StatePool(config.state_shapes(), len(config.linear_layers), slots, dtype, xp)


class HybridKVCache(KVCache):
    """A hybrid model's contiguous cache: KV for its full-attention layers (sized by
    `config.attention()`) and one state slot for its linear layers. Speaks the cache protocol;
    `state` is what the linear layers read and write."""

    def __init__(self, config, dtype=np.float32, xp=np) -> None:
        super().__init__(config.attention(), dtype, xp=xp)
        self.hybrid = config
        self.state = state_pool(config, 1, dtype, xp).take()

    def nbytes_used(self) -> int:
        return super().nbytes_used() + self.state.nbytes

    def truncate(self, t: int) -> None:
        self.check_truncate(t)
        if t != self.length:
            raise no_rollback(self.length, t)

    def free(self) -> None:
        super().free()
        self.state.zero()

    def fork(self) -> "HybridKVCache":
        other = HybridKVCache(self.hybrid, self.dtype, self.xp)
        other.reserve(self.length)
        other.k[:, :, :self.length] = self.k[:, :, :self.length]
        other.v[:, :, :self.length] = self.v[:, :, :self.length]
        other.state.copy_from(self.state)
        other.length = self.length
        return other


class HybridPagedPool(PagedKVPool):
    """A paged pool for a hybrid, one budget for both: KV blocks of `block_size` positions for the
    full-attention layers (`pool.k` [L_full, Hkv, blocks, bs, hd]), and a state slot per sequence for
    the linear layers (`pool.states`) that costs `state_blocks` whole blocks of the same allocator,
    ⌈state bytes ÷ block bytes⌉, held for the sequence's whole life. Admitting a sequence is then one
    question, asked of one free list: are there blocks for its positions and its state? (The blocks
    held for a state are never written: their pages are never touched. The slots' arrays, one per
    `state_blocks` blocks, are touched only where a sequence uses one: memory stays the budget.)

    A hybrid with no full-attention layer has blocks of no bytes: each state then costs one block,
    and `from_memory` counts states (`slots`) instead."""

    def __init__(self, config, num_blocks: int, block_size: int = 16, dtype=np.float32, xp=np,
                 slots: int | None = None) -> None:
        super().__init__(config.attention(), num_blocks, block_size, dtype, xp)
        self.hybrid = config
        self.state_blocks = self.state_blocks_for(config, block_size, dtype)     # blocks one state takes
        if slots is None:           # one per sequence that can run: each holds its state's blocks and at
            slots = num_blocks // (self.state_blocks + 1)      # least one block of positions
        self.states = state_pool(config, max(1, slots), dtype, xp)

    @classmethod
    def state_blocks_for(cls, config, block_size: int = 16, dtype=np.float32) -> int:
        """Blocks one sequence's state takes: ⌈state bytes ÷ block bytes⌉ (1 where blocks hold no bytes)."""
        state = StatePool.slot_nbytes_for(config.state_shapes(), len(config.linear_layers), np.dtype(dtype).itemsize)
        block = cls.block_nbytes_for(config.attention(), block_size, dtype)
        return -(-state // block) if block else 1

    @classmethod
    def from_memory(cls, config, nbytes: int, block_size: int = 16, dtype=np.float32, xp=np) -> "HybridPagedPool":
        """As many blocks as fit in nbytes; each sequence's state is paid in blocks out of them."""
        per_block = cls.block_nbytes_for(config.attention(), block_size, dtype)
        state = StatePool.slot_nbytes_for(config.state_shapes(), len(config.linear_layers), np.dtype(dtype).itemsize)
        if per_block == 0:          # states only: as many as fit, with blocks enough to count their positions
            slots = nbytes // state if state else 1
            if slots < 1:
                raise MiniLLMError(f"a KV memory of {nbytes:,} bytes holds no sequence's state of {state:,} bytes "
                                   "for this model; give at least that much")
            return cls(config, slots * (1 + -(-config.n_ctx // block_size)), block_size, dtype, xp, slots=slots)
        need = per_block * (-(-state // per_block) + 1)
        if nbytes < need:
            raise MiniLLMError(f"a KV memory of {nbytes:,} bytes holds no sequence: one needs its state "
                               f"({state:,} bytes) and a KV block of {per_block:,} bytes; give at least {need:,}")
        return cls(config, nbytes // per_block, block_size, dtype, xp)

    def sequence(self, table: list[int] | None = None, length: int = 0) -> "HybridPagedCache":
        """A new sequence: its state's blocks and slot taken now (KVCacheFullError, taking nothing,
        when the blocks are not free), its table `table` (blocks already taken for it)."""
        return HybridPagedCache(self, table, length)


class HybridPagedCache(PagedKVCache):
    """One sequence of a HybridPagedPool: its block table, its length, its state slot and the blocks
    that pay for it (`state_table`)."""

    def __init__(self, pool: HybridPagedPool, table: list[int] | None = None, length: int = 0) -> None:
        if length:
            raise ValueError("a hybrid sequence starts empty: a state cannot be shared or copied in")
        self.state_table = pool.allocator.allocate_many(pool.state_blocks)
        super().__init__(pool, table, length)
        try:
            self.state = pool.states.take()
        except StateFullError:                  # every slot in use: the state's blocks back, nothing taken
            for b in reversed(self.state_table):
                pool.allocator.release(b)
            raise

    def truncate(self, t: int) -> None:
        self.check_truncate(t)
        if t != self.length:
            raise no_rollback(self.length, t)

    def free(self) -> None:
        """Every block back to the pool, the state's with its slot."""
        PagedKVCache.truncate(self, 0)
        if self.state is not None:
            self.pool.states.give(self.state.slot)
            for b in reversed(self.state_table):
                self.pool.allocator.release(b)
            self.state, self.state_table = None, []

    def fork(self) -> "HybridPagedCache":
        """A second sequence with the same positions: full blocks shared, the last one copied, the
        state copied into a slot (and blocks) of its own."""
        other = HybridPagedCache(self.pool)
        try:
            kv = PagedKVCache.fork(self)
        except KVCacheFullError:
            other.free()
            raise
        other.table, other.length, other._run = kv.table, kv.length, kv._run
        other.state.copy_from(self.state)
        return other
