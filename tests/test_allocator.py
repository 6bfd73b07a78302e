"""The paged cache's allocator as a state machine (hypothesis' RuleBasedStateMachine): sequences
come, grow, fork, roll back and go, in any order, and after every step:

  - every block is free (count 0, on the free list exactly once) or used (count >= 1, not on it);
  - free + used = total;
  - each block's count is exactly the number of sequences whose table holds it (nothing shared
    without a count, nothing leaked, nothing freed twice);
  - a full pool refuses a reservation and takes nothing from it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from minillm.cache.paged import BlockAllocator, KVCacheFullError, PagedKVPool
from minillm.models.gpt2 import GPT2Config

CONFIG = GPT2Config(n_layer=1, n_head=1, n_embd=4, n_ctx=64, vocab_size=10)


class PagedPool(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    def __init__(self):
        super().__init__()
        self.pool = PagedKVPool(CONFIG, 12, 4)
        self.live = []

    @rule(target=seqs)
    def new_sequence(self):
        s = self.pool.sequence()
        self.live.append(s)
        return s

    @rule(s=seqs, n=st.integers(1, 20))
    def grow(self, s, n):
        if s not in self.live or s.length + n > s.n_ctx:
            return
        before = (list(s.table), self.pool.allocator.n_free)
        try:
            s.reserve(n)
        except KVCacheFullError:
            assert (list(s.table), self.pool.allocator.n_free) == before, "a refused reservation took blocks"
            return
        s.advance(n)

    @rule(target=seqs, s=seqs)
    def fork(self, s):
        if s not in self.live:
            return s
        try:
            f = s.fork()
        except KVCacheFullError:
            return s
        self.live.append(f)
        return f

    @rule(s=seqs, data=st.data())
    def truncate(self, s, data):
        if s in self.live:
            s.truncate(data.draw(st.integers(0, s.length)))

    @rule(s=consumes(seqs))
    def free(self, s):
        if s in self.live:
            s.free()
            self.live.remove(s)

    @invariant()
    def conservation(self):
        a = self.pool.allocator
        held = Counter(b for s in self.live for b in s.table)
        assert a.n_free + a.n_used == a.num_blocks
        assert len(set(a.free_list)) == len(a.free_list), "a block is on the free list twice"
        for b in range(a.num_blocks):
            assert a.refs[b] == held[b], f"block {b}: count {a.refs[b]}, held by {held[b]} sequences"
            assert (b in a.free_list) == (a.refs[b] == 0)
        for s in self.live:
            assert len(s.table) == -(-s.length // 4), "a sequence holds more or fewer blocks than its length needs"


PagedPool.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPagedPool = PagedPool.TestCase


def test_releasing_a_free_block_or_sharing_one_is_refused():
    a = BlockAllocator(2)
    b = a.allocate()
    a.release(b)
    with pytest.raises(ValueError, match="already free"):
        a.release(b)
    with pytest.raises(ValueError, match="is free"):
        a.share(b)


# -- the same pool with a prefix cache on top (engine/block_manager.py) ----------------------------

from minillm.engine.block_manager import BlockManager  # noqa: E402
from minillm.engine.sequence import Sequence  # noqa: E402


class PrefixCachedPool(RuleBasedStateMachine):
    """Sequences over a two-letter alphabet (so prefixes repeat) are admitted, computed, grown and
    freed in any order. Besides the invariants above: every cached block holds the tokens its hash
    names (each position's key is written as its token, so this is checked on the pool itself), a
    cached block nobody holds waits on the free list, and no hash names two blocks."""

    seqs = Bundle("cached_seqs")

    def __init__(self):
        super().__init__()
        self.pool = PagedKVPool(CONFIG, 10, 2)
        self.blocks = BlockManager(self.pool, prefix_cache=True)
        self.live = []
        self.tokens_of = {}

    def _compute(self, s, n):
        """Run n pending positions: 'write' each position's token as its key."""
        c = s.cache
        for p in range(c.length, c.length + n):
            b, o = c.table[p // 2], p % 2
            self.pool.k[0, 0, b, o] = s.tokens[p]
        c.advance(n)
        self.blocks.computed(s)

    @rule(target=seqs, prompt=st.lists(st.integers(0, 1), min_size=1, max_size=9))
    def admit(self, prompt):
        s = Sequence(prompt, 4)
        m = self.blocks.match(s)
        cached = m.cached
        if not self.blocks.can_admit(s, m):
            return s
        self.blocks.admit(s, m)
        assert s.cache.length == cached and s.cache.capacity >= len(s)
        for p in range(cached):
            assert self.pool.k[0, 0, s.cache.table[p // 2], p % 2, 0] == prompt[p], "a hit holds other tokens"
        self._compute(s, s.n_pending)
        self.live.append(s)
        return s

    @rule(s=seqs, token=st.integers(0, 1))
    def grow(self, s, token):
        if s not in self.live or len(s) >= CONFIG.n_ctx:
            return
        s.output.append(token)
        try:
            self.blocks.append(s, 1)
        except KVCacheFullError:
            s.output.pop()
            return
        self._compute(s, 1)

    @rule(s=consumes(seqs))
    def free(self, s):
        if s in self.live:
            self.blocks.free(s)
            self.live.remove(s)

    @invariant()
    def consistent(self):
        a, m = self.pool.allocator, self.blocks
        held = Counter(b for s in self.live for b in s.cache.table)
        assert a.n_free + a.n_used == a.num_blocks
        assert len(set(a.free_list)) == len(a.free_list)
        for b in range(a.num_blocks):
            assert a.refs[b] == held[b], f"block {b}: count {a.refs[b]}, held by {held[b]} sequences"
            assert (b in a.free_list) == (a.refs[b] == 0)
        assert len(set(m.cached.values())) == len(m.cached), "two hashes name one block"
        assert all(m.cached[h] == b for b, h in m.hash_of.items())
        for s in self.live:          # the blocks a sequence holds hold its tokens
            for p in range(s.cache.length):
                assert self.pool.k[0, 0, s.cache.table[p // 2], p % 2, 0] == s.tokens[p]


PrefixCachedPool.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPrefixCachedPool = PrefixCachedPool.TestCase



def test_a_whole_cached_prompt_is_admitted_when_its_own_unheld_last_block_is_the_only_free_one():
    """(hypothesis found it) Admitting a prompt that is cached whole copies its last block; that
    must not need a block more than blocks_to_admit counted, even when the free block the copy is
    handed is that last block itself."""
    pool = PagedKVPool(CONFIG, 3, 2)
    blocks = BlockManager(pool, prefix_cache=True)
    first = Sequence([1, 0, 1, 0], 4)
    blocks.admit(first, blocks.match(first))
    a, b = first.cache.table
    pool.k[0, 0, a], pool.k[0, 0, b] = 7.0, 9.0
    first.cache.advance(4)
    blocks.computed(first)
    blocks.free(first)                                   # both blocks cached, nobody holds them
    other = pool.allocator.allocate()                    # the third block is taken
    assert other not in (a, b) and pool.allocator.n_free == 2
    again = Sequence([1, 0, 1, 0], 4)
    m = blocks.match(again)
    assert blocks.blocks_to_admit(again, m) == 2
    blocks.admit(again, m)
    assert again.cache.length == 3 and pool.allocator.n_free == 0
    k, _ = again.cache.read(0, 3)
    assert (k[0, :2] == 7.0).all() and (k[0, 2] == 9.0).all()
