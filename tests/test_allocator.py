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
from minillm.config import GPT2Config

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
