"""The paged KV cache: PagedAttention's memory layout, in NumPy.

A contiguous cache reserves n_ctx positions per sequence whatever it will use. A paged cache cuts
the memory into fixed-size blocks of `block_size` positions, one pool for all sequences, and gives a
sequence a block only when its previous one is full: a sequence wastes at most one partly filled
block. Each sequence keeps a block table (its blocks, in order); position p lives in block
`table[p // block_size]` at offset `p % block_size`.

    pool.k  [L, Hkv, num_blocks, block_size, hd]   (and pool.v): one layer's pool is [Hkv, blocks, bs, hd]
                                                   (a latent pool: pool.v a view of pool.k's first columns)

Blocks are numbered; the allocator keeps a free list and a reference count per block, so a block
can be shared by several sequences (a common prompt prefix) and returns to the free list only when
its last user lets it go.

KV cache groups (vLLM's name): a model that mixes sliding and global layers (Gemma 3: 5 to 1;
gpt-oss: alternating) splits its layers by kind into groups of P layers each, P the greatest common
divisor of the two kinds' counts, so every block is the same size and one free list serves them all.
A block holds one group's P layers for block_size positions; a sequence keeps one block table per
group (`tables`, every table the same length). A global group keeps every block; a sliding group
gives a block back once every position in it fell behind the next query's window (`drop_behind`).
One pool for both kinds, not one each: a block a sliding group gives back can hold a global group's
next positions, and no split of the memory between the kinds has to be guessed. A layer writes and
reads through its own group's table (`write`, `read`, and models/plan.py's paged kernel call); a
pool of several groups is attended sequence by sequence (the batched gather takes one table). Every
other model is one group of all its layers, one table: P = L below.

    pool.k  [P, Hkv, num_blocks, block_size, hd]   layer l at row pool.slot_of[l] of its group's blocks

Reading a sequence's keys for attention: when its blocks are one ascending run (b, b+1, ...), the
[Hkv, t, hd] keys are a view of the pool, no copy; otherwise they are gathered through the block
table into a fresh array. That gather is a real copy, counted as such: the pool is read (kv_read),
the copy written and then read again by attention (activations).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from ..config import ModelConfig
from ..errors import MiniLLMError, PromptError
from .. import backend, meter
from .contiguous import CacheBase, untouched_zeros


class KVCacheFullError(MiniLLMError):
    """The paged pool has no free block left."""


class BlockAllocator:
    """Block numbers 0 .. num_blocks-1: a free list and a reference count per block.

    Invariants (a stateful property test checks them): every block is either free (count 0, on the
    free list once) or used (count >= 1, not on the list); free + used = total."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise MiniLLMError(f"a paged KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self.free_list: deque[int] = deque(range(num_blocks))   # oldest freed first
        self.on_reuse = None   # called with a block's number when allocate hands it out again

    @property
    def n_free(self) -> int:
        return len(self.free_list)

    @property
    def n_used(self) -> int:
        return self.num_blocks - len(self.free_list)

    def allocate(self) -> int:
        """A free block, now used once. Raises KVCacheFullError when none is left."""
        if not self.free_list:
            raise KVCacheFullError(
                f"the KV cache's {self.num_blocks} blocks are all in use: give it more memory "
                "(--kv-memory) or run fewer sequences at once")
        block = self.free_list.popleft()
        self.refs[block] = 1
        if self.on_reuse is not None:   # a prefix cache forgets what the block held
            self.on_reuse(block)
        return block

    def allocate_many(self, n: int) -> list[int]:
        """n free blocks, all or none: KVCacheFullError (taking nothing) when fewer are free."""
        if n > len(self.free_list):
            raise KVCacheFullError(
                f"{n} KV blocks are needed and {len(self.free_list)} of {self.num_blocks} are free: give the "
                "cache more memory (--kv-memory) or run fewer sequences at once")
        return [self.allocate() for _ in range(n)]

    def revive(self, block: int) -> int:
        """A free block taken back off the free list, used once: a prefix cache's hit on a block
        that no sequence held any more (its keys and values are still there)."""
        if self.refs[block] != 0:
            raise ValueError(f"block {block} is in use: share it instead")
        self.free_list.remove(block)
        self.refs[block] = 1
        return block

    def share(self, block: int) -> int:
        """One more user of a used block."""
        if self.refs[block] < 1:
            raise ValueError(f"block {block} is free: it cannot be shared")
        self.refs[block] += 1
        return block

    def release(self, block: int) -> bool:
        """One user fewer; the block is free again (True) when it was the last one."""
        if self.refs[block] < 1:
            raise ValueError(f"block {block} is already free (released twice?)")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free_list.append(block)
            return True
        return False


def layer_groups(config) -> list[tuple[tuple[int, ...], int | None]]:
    """The pool's KV cache groups, (their layers, their window: None for global), global groups first.
    Every layer global, or every layer sliding: one group of them all. Mixed: each kind's layers in
    runs of P = gcd(global count, sliding count), so that every group's block has the same bytes."""
    L, sliding = config.n_layer, tuple(config.window_layers)
    full = tuple(layer for layer in range(L) if layer not in sliding)
    if not sliding or not full:
        return [(tuple(range(L)), config.window if sliding else None)]
    P = math.gcd(len(full), len(sliding))
    return ([(full[i:i + P], None) for i in range(0, len(full), P)]
            + [(sliding[i:i + P], config.window) for i in range(0, len(sliding), P)])


class PagedKVPool:
    """The memory: K and V blocks for every layer, shared by all sequences, and their allocator.

    What the block manager asks of every pool: `state_blocks`, the blocks a sequence's fixed state
    costs besides its positions', and `states`, the pool of those states (cache/state.py's
    HybridPagedPool has them; here 0 and None: a plain pool keeps K and V only)."""

    state_blocks = 0
    states = None
    dropped = 0          # blocks given back behind a sliding window (`PagedKVCache.drop_behind`), counted

    @classmethod
    def state_blocks_for(cls, config, block_size: int = 16, dtype=np.float32) -> int:
        """Blocks one sequence's fixed state takes besides its positions': none in a plain pool."""
        return 0

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16, dtype=np.float32,
                 xp=np) -> None:
        """xp: the module of the model's arrays (numpy; cupy puts the blocks on the GPU)."""
        if block_size < 1:
            raise MiniLLMError(f"block_size={block_size}: must be at least 1")
        self.config = config
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks)
        self.groups = layer_groups(config)          # [(layers, window)]: one group unless kinds mix
        self.group_of, self.slot_of = [0] * config.n_layer, [0] * config.n_layer
        for g, (layers, _) in enumerate(self.groups):
            for j, layer in enumerate(layers):
                self.group_of[layer], self.slot_of[layer] = g, j
        shape = (len(self.groups[0][0]), config.n_kv_head, num_blocks, block_size, config.head_dim)
        self.k = untouched_zeros(shape, dtype, xp)   # [L, Hkv, blocks, bs, hd]; pages are touched as blocks fill
        self.shared = config.values_in_keys          # a latent pool: the values are the keys' first columns
        self.v = self.k[..., :self.shared] if self.shared else untouched_zeros(shape, dtype, xp)

    @classmethod
    def block_nbytes_for(cls, config: ModelConfig, block_size: int, dtype=np.float32) -> int:
        """One block's bytes: its group's layers' K and V for block_size positions."""
        arrays = 1 if config.values_in_keys else 2
        layers = len(layer_groups(config)[0][0])
        return arrays * layers * config.n_kv_head * config.head_dim * block_size * np.dtype(dtype).itemsize

    @classmethod
    def from_memory(cls, config: ModelConfig, nbytes: int, block_size: int = 16, dtype=np.float32,
                    xp=np) -> "PagedKVPool":
        """As many blocks as fit in nbytes of K and V."""
        per_block = cls.block_nbytes_for(config, block_size, dtype)
        if nbytes < per_block:
            raise MiniLLMError(
                f"a KV memory of {nbytes:,} bytes holds no block: one block of {block_size} positions takes "
                f"{per_block:,} bytes for this model; give at least that much")
        return cls(config, nbytes // per_block, block_size, dtype, xp)

    @classmethod
    def blocks_for_positions(cls, config: ModelConfig, n_positions: int, block_size: int = 16) -> int:
        """The blocks n_positions take with none given back: a block per group per block_size positions."""
        return len(layer_groups(config)) * -(-n_positions // block_size)

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def block_nbytes(self) -> int:
        return self.block_nbytes_for(self.config, self.block_size, self.k.dtype)

    def nbytes(self) -> int:
        return self.k.nbytes + (0 if self.shared else self.v.nbytes)

    def copy_block(self, src: int, dst: int) -> None:
        """Block dst's keys and values become a copy of block src's, every layer of its group."""
        self.k[:, :, dst] = self.k[:, :, src]
        if not self.shared:
            self.v[:, :, dst] = self.v[:, :, src]

    def sequence(self, table: list[int] | None = None, length: int = 0,
                 tables: list[list[int]] | None = None) -> "PagedKVCache":
        """A new sequence in this pool (empty, or holding `length` positions in `table`'s blocks, or in
        `tables`', one per group, where the model's layers form several groups)."""
        return PagedKVCache(self, table, length, tables)


DROPPED = -1   # a table entry whose block was given back: every position in it fell behind the window


class PagedKVCache(CacheBase):
    """One sequence's view of a pool: its block tables (one per KV cache group) and its length.
    Speaks the cache protocol.

    A sliding group's layers never read a position again once it fell behind the window of the next
    query: after each step its blocks wholly behind it go back to the pool (`drop_behind`, their
    entries DROPPED, counted in `dropped`). A global group (Gemma 3's and gpt-oss's global layers)
    keeps every block. `table` is the first group's table (the only one unless the kinds mix)."""

    def __init__(self, pool: PagedKVPool, table: list[int] | None = None, length: int = 0,
                 tables: list[list[int]] | None = None) -> None:
        self.pool = pool
        self.config = pool.config
        self.dtype = pool.k.dtype
        n = len(pool.groups)
        if tables is None:
            if table and n > 1:
                raise MiniLLMError("this model mixes sliding and global layers: its paged sequences keep one "
                                   f"block table per group ({n}), not one")
            tables = [table if table is not None else []] + [[] for _ in range(n - 1)]
        self.tables: list[list[int]] = tables
        self.slides = [window is not None for _, window in pool.groups]
        self.length = length
        self.dropped = 0                     # leading entries of each sliding group's table given back
        self._runs = [self._run_length(t, 0, 0) for t in tables]   # each table's leading ascending run

    @property
    def table(self) -> list[int]:
        return self.tables[0]

    @table.setter
    def table(self, value: list[int]) -> None:
        self.tables[0] = value

    @property
    def _run(self) -> int:
        return self._runs[0]

    @_run.setter
    def _run(self, value: int) -> None:
        self._runs[0] = value

    @staticmethod
    def _run_length(t: list[int], start: int, run: int) -> int:
        """The ascending run at the head of table t, given `run` over its first `start` blocks."""
        if run < start or not t:
            return run
        run = max(run, 1)
        while run < len(t) and t[run] == t[run - 1] + 1:
            run += 1
        return run

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def capacity(self) -> int:
        """Positions its blocks hold room for (up to the context)."""
        return min(len(self.table) * self.block_size, self.n_ctx)

    def blocks_held(self) -> int:
        """Blocks it holds now, every group's (those given back behind a window not counted)."""
        return sum(len(t) - (self.dropped if s else 0) for t, s in zip(self.tables, self.slides))

    def blocks_needed(self, n_new: int) -> int:
        """How many more blocks n_new more positions take (one per group per new block of positions)."""
        return len(self.tables) * max(0, -(-(self.length + n_new) // self.block_size) - len(self.table))

    def reserve(self, n_new: int) -> None:
        """Room for n_new more positions: new blocks from the pool, all or none."""
        self.check_fits(n_new)
        self.extend(self.pool.allocator.allocate_many(self.blocks_needed(n_new)))

    def extend(self, blocks: list[int]) -> None:
        """Append blocks (already allocated to this sequence) to the tables: as many to each group's."""
        n = len(blocks) // len(self.tables)
        for g, t in enumerate(self.tables):
            before = len(t)
            t.extend(blocks[g * n:(g + 1) * n])
            self._runs[g] = self._run_length(t, before, self._runs[g])

    def _where(self, table: list[int], pos: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        p = np.arange(pos, pos + n)                                # laid out on the host, moved to the pool's device
        xp = backend.namespace(self.pool.k)
        return xp.asarray(np.asarray(table, dtype=np.intp)[p // self.block_size]), xp.asarray(p % self.block_size)

    def write(self, layer: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store keys and values [Hkv, n, hd] of positions pos .. pos+n-1 into their blocks."""
        n = k.shape[1]
        v = None if self.pool.shared else v                       # a latent pool: the keys hold the values
        table, row = self.tables[self.pool.group_of[layer]], self.pool.slot_of[layer]
        if n == 1:
            b, o = table[pos // self.block_size], pos % self.block_size
            self.pool.k[row, :, b, o] = k[:, 0]
            if v is not None:
                self.pool.v[row, :, b, o] = v[:, 0]
        else:
            blocks, offsets = self._where(table, pos, n)
            self.pool.k[row][:, blocks, offsets] = k
            if v is not None:
                self.pool.v[row][:, blocks, offsets] = v
        m = meter.active()
        if m is not None:
            m.count("kv_write", kv_write=k.nbytes + (0 if v is None else v.nbytes))

    def contiguous(self, n_blocks: int, group: int = 0) -> bool:
        """Are the first n_blocks of a group's table one ascending run (b, b+1, ...)? (Kept up to date
        by reserve and truncate: change the tables only through them.)"""
        return n_blocks <= self._runs[group]

    def read(self, layer: int, t: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values of positions start .. t-1, [Hkv, t - start, hd] each: a view of the pool when
        their blocks are one ascending run, else a copy gathered through the layer's block table
        (start > 0: a sliding window's positions, from the block that holds `start`)."""
        bs, g = self.block_size, self.pool.group_of[layer]
        table, row = self.tables[g], self.pool.slot_of[layer]
        first, nb = start // bs, -(-t // bs)                       # the blocks read: first .. nb-1
        if self.slides[g] and first < self.dropped:
            raise MiniLLMError(f"positions {start} .. {t - 1}: the blocks before position {self.dropped * bs} "
                               "fell behind the sliding window and went back to the pool")
        lo, hi = start - first * bs, t - first * bs                # the positions' rows in them
        H, hd = self.config.n_kv_head, self.config.head_dim
        shared = self.pool.shared                                  # a latent pool: keys only, values in them
        pools = (self.pool.k[row],) if shared else (self.pool.k[row], self.pool.v[row])   # [Hkv, blocks, bs, hd]
        run = self.contiguous(nb, g) if first == 0 else self.contiguous_from(first, nb, table)
        n = nb - first
        if run:
            b0 = table[first]
            kv = [p[:, b0:b0 + n].reshape(H, n * bs, hd)[:, lo:hi] for p in pools]   # views: no copy
            gathered = 0
        else:
            xp = backend.namespace(pools[0])
            idx = xp.asarray(np.asarray(table[first:nb], dtype=np.intp))        # a gather: one copy of n blocks
            kv = [xp.take(p, idx, axis=1).reshape(H, n * bs, hd)[:, lo:hi]      # (take writes it C-ordered, so
                  for p in pools]                                               # the reshape is free)
            gathered = len(pools) * H * n * bs * hd * pools[0].itemsize
        k, v = kv[0], kv[0][..., :shared] if shared else kv[1]
        m = meter.active()
        if m is not None:
            used = sum(a.nbytes for a in kv)
            if gathered:   # read the blocks, write the copy, attention reads the copy
                m.count("kv_gather", kv_read=gathered, activations=gathered + used)
            else:
                m.count("kv_read", kv_read=used)
        return k, v

    def contiguous_from(self, first: int, nb: int, table: list[int] | None = None) -> bool:
        """Are blocks first .. nb-1 of the table (the first group's unless given) one ascending run?"""
        t = self.table if table is None else table
        return all(t[i + 1] == t[i] + 1 for i in range(first, nb - 1))

    def advance(self, n: int) -> None:
        self.length += n
        self.drop_behind()

    def drop_behind(self) -> None:
        """Give back each sliding group's blocks whose positions all fell behind the window of the next
        query (at position `length`, its first key at length - window + 1); a global group keeps all."""
        c = self.config
        if not any(self.slides):
            return
        behind = min(max(0, self.length - c.window + 1) // self.block_size, len(self.table))
        while self.dropped < behind:
            for t, slides in zip(self.tables, self.slides):
                if slides:
                    self.pool.allocator.release(t[self.dropped])
                    t[self.dropped] = DROPPED
                    self.pool.dropped += 1
            self.dropped += 1

    def truncate(self, t: int) -> None:
        """Keep positions 0 .. t-1 and give back the blocks past them (back to a position whose window
        reaches a block already given back: one line)."""
        self.check_truncate(t)
        if t and self.dropped and t - self.config.window + 1 < self.dropped * self.block_size:
            raise PromptError(f"truncate({t}): the blocks before position {self.dropped * self.block_size} fell "
                              "behind the sliding window and went back to the pool")
        keep = -(-t // self.block_size)
        for g, table in enumerate(self.tables):
            for b in reversed(table[keep:]):   # a prompt's last blocks go first to the free list
                if b != DROPPED:
                    self.pool.allocator.release(b)
            del table[keep:]
            self._runs[g] = min(self._runs[g], keep)
        self.dropped = min(self.dropped, keep)
        self.length = t

    def free(self) -> None:
        """Every block back to the pool (shared ones only lose this user)."""
        self.truncate(0)

    def fork(self) -> "PagedKVCache":
        """A second sequence with the same positions: full blocks are shared (one more reference
        each), each group's partly filled last block is copied so both can write past it."""
        bs = self.block_size
        full = self.length // bs
        tails = []
        if self.length % bs:                      # first the allocations that can fail
            tails = self.pool.allocator.allocate_many(len(self.tables))
            for t, b in zip(self.tables, tails):
                self.pool.copy_block(t[full], b)
        tables = [[b if b == DROPPED else self.pool.allocator.share(b) for b in t[:full]] + tails[g:g + 1]
                  for g, t in enumerate(self.tables)]
        other = PagedKVCache(self.pool, None, self.length, tables=tables)
        other.dropped = self.dropped
        return other


def reserve_step(items) -> None:
    """Room for every (cache, n new positions) of one step, or for none: the blocks all these paged
    caches need are counted first and taken only if the pool has them all (KVCacheFullError, taking
    nothing, otherwise). Contiguous caches only check that they fit their context."""
    for cache, n in items:
        cache.check_fits(n)
    need: dict = {}
    for cache, n in items:
        pool = cache.pool
        if pool is not None:
            need.setdefault(id(pool), [pool, 0])[1] += cache.blocks_needed(n)
    for pool, n_blocks in need.values():
        if n_blocks > pool.allocator.n_free:
            raise KVCacheFullError(
                f"{n_blocks} KV blocks are needed and {pool.allocator.n_free} of {pool.num_blocks} are free: "
                "give the cache more memory (--kv-memory) or run fewer sequences at once")
    for cache, n in items:
        cache.reserve(n)
