"""KV blocks for the scheduler, with prefix caching: requests that share a prompt prefix share its blocks.

A full block's keys and values depend only on the tokens at and before it, so a block is named by a
hash of (its parent block's hash, its own tokens): two sequences whose first k blocks hold the same
tokens have the same k hashes, and the second can use the first one's blocks instead of computing
them again.

    tokens   [The quick brown fox][jumps over the lazy][dog and ...
    hash     h1 = H(-, block 1)   h2 = H(h1, block 2)   (partly filled: not cached)

Blocks are shared by reference count (the pool's allocator). A cached block that no sequence holds
any more stays on the allocator's free list with its contents: a later hit takes it back
(`revive`); a new allocation takes the block freed longest ago and the cache forgets it
(least recently used eviction, the allocator's `on_reuse` hook).

A model that mixes sliding and global layers keeps one block table per KV cache group (cache/paged.py).
Its groups meet the prefix cache simply: the first group's block is named by the chain's hash as
above, group g's by that hash with g in it (`group_hash`), and a block of positions is a hit only when
every group's block for it is still in the pool (held, or given back and not yet handed out again). A
sliding group's block given back behind a window stays findable that way until it is reused; once it
is, the prefix from there on is computed again.

A prompt that is cached whole still computes its last position (its logits give the first new
token): its last cached block is copied into a fresh block, and the sequence starts one position
before the end of the prompt.

The scheduler asks this module for everything about memory (can this sequence grow by n positions,
how many fit, admit it, free it) and never looks inside a cache: the block manager alone allocates.
`ContiguousBlocks` is the same interface over one n_ctx cache per sequence (what `generate_batch(...,
cache="contiguous")` runs on): it never runs out of blocks, it only reserves the whole context.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ..cache.contiguous import KVCache
from ..cache.paged import KVCacheFullError, PagedKVPool
from ..errors import MiniLLMError
from .sequence import Sequence


def block_hash(parent: bytes | None, tokens) -> bytes:
    """The name of a full block: its parent's name and its tokens, hashed (blake2b, 16 bytes)."""
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


def group_hash(h: bytes, group: int) -> bytes:
    """Group g's name for the block the chain names h (group 0's is h itself; a token id is never
    negative, so -g names no block of positions)."""
    return h if group == 0 else block_hash(h, (-group,))


def write_all(cache, k: np.ndarray, v: np.ndarray) -> None:
    """Every layer's keys and values of positions 0..T-1, k, v [L, Hkv, T, hd], into an empty cache
    that has room for them; the cache then holds T positions."""
    for layer in range(k.shape[0]):
        cache.write(layer, 0, k[layer], v[layer])
    cache.advance(k.shape[2])


@dataclass
class Match:
    """What the prefix cache holds of a sequence: its first `cached` positions, in the blocks named
    by `hashes` (the chain of its leading full blocks that are cached, computed once per admission)."""
    cached: int = 0
    hashes: list = field(default_factory=list)


class BlockManager:
    """Gives sequences their caches in one pool, and keeps the prefix cache (when `prefix_cache`)."""

    def __init__(self, pool: PagedKVPool, prefix_cache: bool = False) -> None:
        if prefix_cache and pool.states is not None:   # cache/state.py: the hybrid's pool
            raise MiniLLMError("prefix caching is off for models with linear-attention layers: their state "
                               "exists only at the end of what ran, not at every block; run without it")
        self.pool = pool
        self.state_blocks = pool.state_blocks   # what a sequence's fixed state costs (a hybrid)
        self.allocator = pool.allocator
        self.block_size = pool.block_size
        self.n_groups = len(pool.groups)         # blocks a block of positions takes: one per group
        self.prefix_cache = prefix_cache
        self.cached: dict[bytes, int] = {}      # block hash -> block number
        self.hash_of: dict[int, bytes] = {}     # block number -> its hash
        self.hashes: dict[int, list[bytes]] = {}   # sequence id -> hashes of its full blocks, in order
        self.hit_tokens = 0                      # prompt positions found in the cache
        self.lookup_tokens = 0                   # prompt positions looked up
        if prefix_cache:
            self.allocator.on_reuse = self._forget

    # -- the pool's state ----------------------------------------------------------------------

    @property
    def n_free(self) -> int:
        """Blocks an allocation can take (cached blocks nobody holds count: they can be evicted)."""
        return self.allocator.n_free

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    def blocks_for(self, n_positions: int) -> int:
        """Blocks n_positions take with none given back (one per group per block of positions)."""
        return self.n_groups * -(-n_positions // self.block_size)

    def block_states(self, stride: int = 1) -> list[str]:
        """Every `stride`-th block's state, in block order: "shared" (held by several sequences),
        "held" (by one), "cached" (nobody holds it, the prefix cache still names it: a hit takes it
        back, a new allocation may evict it) or "free". What a live view draws as the pool's map."""
        refs = self.allocator.refs
        return ["shared" if refs[b] > 1 else "held" if refs[b] == 1 else "cached" if b in self.hash_of else "free"
                for b in range(0, self.num_blocks, stride)]

    def fits(self, n_positions: int) -> bool:
        """Could a sequence of n_positions ever run here (with the whole pool to itself)? Counted with
        no block given back behind a window: a preempted sequence is admitted again with every position
        it has, its blocks all reserved before its sliding groups give any back."""
        return self.blocks_for(n_positions) + self.state_blocks <= self.num_blocks

    def blocks_held(self, seq: Sequence) -> int:
        return seq.cache.blocks_held() if seq.cache is not None else 0

    def usage(self, seqs) -> tuple[int, int]:
        """(positions stored, positions reserved) in the blocks these sequences hold; a shared block
        counts once, and where the layers form several groups each group's blocks count (a position
        is stored once per group)."""
        bs, filled = self.block_size, {}
        for s in seqs:
            c = s.cache
            for table, slides in zip(c.tables, c.slides):
                skip = c.dropped if slides else 0                       # (the blocks behind a window: given back)
                for j, b in enumerate(table[skip:], skip):
                    filled[b] = max(filled.get(b, 0), min(bs, max(0, c.length - j * bs)))
        return sum(filled.values()), len(filled) * bs

    def _forget(self, block: int) -> None:
        h = self.hash_of.pop(block, None)
        if h is not None and self.cached.get(h) == block:
            del self.cached[h]

    # -- a running sequence's growth -------------------------------------------------------------

    def can_append(self, seq: Sequence, n: int) -> bool:
        """Are there free blocks for n more positions of the sequence?"""
        return seq.cache.blocks_needed(n) <= self.n_free

    def room(self, seq: Sequence) -> int:
        """How many more positions the sequence can take now: its blocks' room and every free block."""
        c = seq.cache
        return (len(c.table) + self.n_free // self.n_groups) * self.block_size - c.length

    def append(self, seq: Sequence, n: int) -> None:
        """Blocks for n more positions (all or none)."""
        seq.cache.reserve(n)

    # -- admission ---------------------------------------------------------------------------------

    def match(self, seq: Sequence) -> Match:
        """How many of the sequence's leading positions the cache holds (whole blocks; nothing is
        taken). At most every position but the last, whose logits give the next token."""
        if not self.prefix_cache:
            return Match()
        tokens, bs = seq.tokens, self.block_size
        hashes: list[bytes] = []
        for j in range(len(tokens) // bs):
            h = block_hash(hashes[-1] if hashes else None, tokens[j * bs:(j + 1) * bs])
            if any(group_hash(h, g) not in self.cached for g in range(self.n_groups)):
                break
            hashes.append(h)
        return Match(min(len(hashes) * bs, len(tokens) - 1), hashes)

    def blocks_to_admit(self, seq: Sequence, m: Match) -> int:
        """Free blocks admitting the sequence takes: its whole pending length's blocks, less the cached
        ones it shares (a cached block nobody holds is taken off the free list: it counts)."""
        shared = m.cached // self.block_size
        revived = sum(1 for h in m.hashes[:shared] for g in range(self.n_groups)
                      if self.allocator.refs[self.cached[group_hash(h, g)]] == 0)
        return self.blocks_for(len(seq)) - shared * self.n_groups + revived + self.state_blocks

    def can_admit(self, seq: Sequence, m: Match) -> bool:
        states = self.pool.states               # a hybrid's: a free state slot too (blocks of no bytes)
        return self.blocks_to_admit(seq, m) <= self.n_free and (states is None or states.n_free > 0)

    def admit(self, seq: Sequence, m: Match) -> None:
        """Give the sequence a cache holding the cached blocks of its prefix (shared) and free blocks
        for every other position it has now. Raises KVCacheFullError (taking nothing) if they are
        not there: check `can_admit` first."""
        bs, a = self.block_size, self.allocator
        if self.prefix_cache:
            self.lookup_tokens += len(seq)
        full = m.cached // bs
        tables = [[a.share(b) if a.refs[b] else a.revive(b)
                   for b in (self.cached[group_hash(h, g)] for h in m.hashes[:full])] for g in range(self.n_groups)]
        cache = None
        try:
            if m.cached % bs:             # the whole prompt was cached: copy its last block, write after it
                srcs = [self.cached[group_hash(m.hashes[full], g)] for g in range(self.n_groups)]
                fresh = a.allocate_many(self.n_groups)   # first: an unheld src stays intact unless handed out
                spare = [b for b in fresh if b not in srcs]
                for table, src in zip(tables, srcs):
                    if src in fresh:      # handed out: it already holds what the copy would write
                        table.append(src)
                    else:                 # (a spare block is no group's src: the copy overwrites none)
                        table.append(spare.pop())
                        self.pool.copy_block(src, table[-1])
            if self.n_groups == 1:        # a hybrid's: its state's blocks taken too
                cache = self.pool.sequence(tables[0], m.cached)
            else:
                cache = self.pool.sequence(None, m.cached, tables)
            cache.reserve(len(seq) - m.cached)
        except KVCacheFullError:
            if cache is not None:
                cache.free()
            else:
                for table in reversed(tables):
                    for t in reversed(table):
                        a.release(t)
            raise
        self.hit_tokens += m.cached
        self.hashes[seq.id] = m.hashes[:full]
        seq.cache = cache

    def adopt(self, seq: Sequence, k: np.ndarray, v: np.ndarray) -> None:
        """Admit a sequence whose first T positions were computed elsewhere, nothing shared: blocks
        for its whole length, k, v [L, Hkv, T, hd] written into them (check `can_admit` first)."""
        if self.pool.states is not None:
            raise MiniLLMError("a model with linear-attention layers cannot take a prompt computed elsewhere: "
                               "its state does not travel with the keys and values")
        self.admit(seq, Match())
        write_all(seq.cache, k, v)

    # -- after a step, and at the end ----------------------------------------------------------------

    def computed(self, seq: Sequence) -> None:
        """After a step: name the sequence's newly completed full blocks so later requests find them."""
        if not self.prefix_cache or seq.cache is None:
            return
        cache, bs = seq.cache, self.block_size
        full = cache.length // bs
        known = self.hashes.setdefault(seq.id, [])
        tokens = seq.tokens
        for j in range(len(known), full):
            h = block_hash(known[-1] if known else None, tokens[j * bs:(j + 1) * bs])
            known.append(h)
            for g, table in enumerate(cache.tables):
                hg, b = group_hash(h, g), table[j]
                if b >= 0 and hg not in self.cached and b not in self.hash_of:   # (b < 0: given back behind a window)
                    self.cached[hg] = b
                    self.hash_of[b] = hg

    def free(self, seq: Sequence) -> None:
        """Every block of the sequence back (cached ones stay findable until they are evicted)."""
        if seq.cache is not None:
            seq.cache.free()
            seq.cache = None
        self.hashes.pop(seq.id, None)

    @property
    def hit_rate(self) -> float:
        """Prompt positions found in the cache / prompt positions looked up."""
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


class ContiguousBlocks:
    """The block manager's interface over contiguous caches: each sequence gets one n_ctx cache, so a
    sequence can always grow to the context, and there is no prefix cache."""

    prefix_cache = False
    hit_rate = hit_tokens = state_blocks = 0

    def __init__(self, config, dtype, xp=np, new_cache=None) -> None:
        self.config, self.dtype, self.xp = config, dtype, xp
        self.new_cache = new_cache or (lambda: KVCache(config, dtype, xp=xp))   # the model's own (a hybrid's)
        self.block_size = config.n_ctx           # one "block" per sequence: its whole context
        self.n_free = self.num_blocks = 1 << 62  # never the limit

    def fits(self, n_positions: int) -> bool:
        return n_positions <= self.config.n_ctx

    def blocks_for(self, n_positions: int) -> int:
        return 1

    def blocks_held(self, seq: Sequence) -> int:
        return 1 if seq.cache is not None else 0

    def usage(self, seqs) -> tuple[int, int]:
        return sum(s.cache.length for s in seqs), len(seqs) * self.config.n_ctx

    def can_append(self, seq: Sequence, n: int) -> bool:
        return seq.cache.length + n <= self.config.n_ctx

    def room(self, seq: Sequence) -> int:
        return self.config.n_ctx - seq.cache.length

    def append(self, seq: Sequence, n: int) -> None:
        seq.cache.reserve(n)

    def match(self, seq: Sequence) -> Match:
        return Match()

    def can_admit(self, seq: Sequence, m: Match) -> bool:
        return True

    def admit(self, seq: Sequence, m: Match) -> None:
        seq.cache = self.new_cache()

    def adopt(self, seq: Sequence, k: np.ndarray, v: np.ndarray) -> None:
        self.admit(seq, Match())
        write_all(seq.cache, k, v)

    def computed(self, seq: Sequence) -> None:
        pass

    def free(self, seq: Sequence) -> None:
        seq.cache = None
