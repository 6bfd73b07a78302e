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

A prompt that is cached whole still computes its last position (its logits give the first new
token): its last cached block is copied into a fresh block, and the sequence starts one position
before the end of the prompt.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..cache.paged import KVCacheFullError, PagedKVCache, PagedKVPool
from .sequence import Sequence


def block_hash(parent: bytes | None, tokens) -> bytes:
    """The name of a full block: its parent's name and its tokens, hashed (blake2b, 16 bytes)."""
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


class BlockManager:
    """Gives sequences their caches in one pool, and keeps the prefix cache (when `prefix_cache`)."""

    def __init__(self, pool: PagedKVPool, prefix_cache: bool = False) -> None:
        self.pool = pool
        self.allocator = pool.allocator
        self.block_size = pool.block_size
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
        return -(-n_positions // self.block_size)

    def _forget(self, block: int) -> None:
        h = self.hash_of.pop(block, None)
        if h is not None and self.cached.get(h) == block:
            del self.cached[h]

    # -- a sequence's cache ----------------------------------------------------------------------

    def _chain(self, tokens: list[int], n_blocks: int, start: list[bytes]) -> list[bytes]:
        bs, out = self.block_size, list(start)
        for j in range(len(out), n_blocks):
            out.append(block_hash(out[-1] if out else None, tokens[j * bs:(j + 1) * bs]))
        return out

    def match(self, seq: Sequence) -> int:
        """How many of the sequence's leading positions the cache holds (whole blocks; nothing
        is taken). At most every position but the last."""
        if not self.prefix_cache:
            return 0
        tokens = seq.tokens
        hashes = self._chain(tokens, len(tokens) // self.block_size, [])
        n = 0
        for h in hashes:
            if h not in self.cached:
                break
            n += 1
        return min(n * self.block_size, len(tokens) - 1)

    def blocks_to_admit(self, seq: Sequence, n_first: int) -> int:
        """Free blocks that admitting `seq` and running its first `n_first` uncached positions takes
        (a cached block nobody holds is counted: reviving it takes it off the free list)."""
        cached = self.match(seq)
        bs = self.block_size
        total = self.blocks_for(cached + n_first)
        n_shared = cached // bs
        revived = sum(1 for h in self._chain(seq.tokens, n_shared, [])
                      if self.allocator.refs[self.cached[h]] == 0)
        return total - n_shared + revived

    def admit(self, seq: Sequence) -> PagedKVCache:
        """A cache for the sequence, holding the cached blocks of its prefix (shared), its length
        the number of cached positions. Raises KVCacheFullError (taking nothing) if a needed copy
        finds no free block."""
        bs, a = self.block_size, self.allocator
        tokens = seq.tokens
        if self.prefix_cache:
            self.lookup_tokens += len(tokens)
        n = self.match(seq)
        full = n // bs
        hashes = self._chain(tokens, full + (1 if n % bs else 0), [])
        table = []
        for h in hashes[:full]:
            b = self.cached[h]
            table.append(a.share(b) if a.refs[b] else a.revive(b))
        if n % bs:                        # the whole prompt was cached: copy its last block, write after it
            src = self.cached[hashes[full]]
            try:
                b = a.allocate()          # first: an unheld src stays intact unless it is the block handed out
            except KVCacheFullError:
                for t in reversed(table):
                    a.release(t)
                raise
            if b != src:                  # (b == src: the block already holds what the copy would write)
                self.pool.k[:, :, b] = self.pool.k[:, :, src]
                self.pool.v[:, :, b] = self.pool.v[:, :, src]
            table.append(b)
        self.hit_tokens += n
        self.hashes[seq.id] = hashes[:full]
        return PagedKVCache(self.pool, table, n)

    def computed(self, seq: Sequence) -> None:
        """After a step: name the sequence's newly completed full blocks so later requests find them."""
        if not self.prefix_cache or seq.cache is None:
            return
        cache = seq.cache
        full = cache.length // self.block_size
        known = self.hashes.setdefault(seq.id, [])
        if full <= len(known):
            return
        hashes = self._chain(seq.tokens, full, known)
        for j in range(len(known), full):
            h, b = hashes[j], cache.table[j]
            if h not in self.cached and b not in self.hash_of:
                self.cached[h] = b
                self.hash_of[b] = h
        self.hashes[seq.id] = hashes

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
