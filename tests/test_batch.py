"""Many sequences in one step: batched == alone, paged == contiguous, chunked == whole, and a
context long enough to cross prefill's query blocks.

Random small float64 models (test_properties.random_model: rough weights, random norms and biases)
and random sets of 1-6 sequences with different prompt lengths, joining the batch at different
steps, their prompts fed in random chunks (chunked prefill) beside other sequences' decode tokens.

Tolerance, float64: |a - b| <= 1e-9 * max(1, max|logits|), as in test_properties. A batched step
sums each product in another order than a single sequence's (a [N, d] @ [d, out] product blocks
differently from [1, d] @ [d, out]); in float64 that is rounding at the 1e-15 level of the logit
scale, while a real bug (a row of another sequence, a position off by one, a cache slot shared by
two sequences) moves logits by 1e-3 or more.
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.cache.contiguous import KVCache
from minillm.cache.paged import PagedKVPool, reserve_step
from minillm.models.gpt2 import GPT2Config
from minillm.engine import runner
from minillm.engine.runner import run_step
from minillm.engine.sequence import SamplingParams, Sequence
from minillm.errors import PromptError
from minillm.models import plan

from test_properties import REL_TOL, configs, random_model


class Traced(Sequence):
    """A Sequence that keeps the logits it sampled each token from (`tracing` records them: the
    runner samples each sequence with its own random stream, which names the sequence)."""

    by_rng: dict = {}

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.logits = []
        Traced.by_rng[id(self.rng)] = self.logits


@contextmanager
def tracing():
    """While inside, every token the runner samples records its logits on its Traced sequence."""
    original = runner.pick

    def pick(logits, temperature, top_k, top_p, rng):
        Traced.by_rng.get(id(rng), []).append(np.array(logits))
        return original(logits, temperature, top_k, top_p, rng)

    with patch.object(runner, "pick", pick):
        yield


def alone(model, prompt, n, sampling: SamplingParams):
    """The sequence by itself: prefill, then one decode_step per token, on a contiguous cache."""
    rng = np.random.default_rng(sampling.seed)
    logits, cache = model.prefill(prompt)
    out, seen = [], []
    for i in range(n):
        if i:
            logits = model.decode_step(out[-1], cache)
        seen.append(logits)
        out.append(minillm.sample(logits, sampling.temperature, sampling.top_k, sampling.top_p, rng))
    return out, seen


@st.composite
def workloads(draw):
    config = draw(configs(min_ctx=8))
    n_seqs = draw(st.integers(1, 6))
    seqs = []
    for _ in range(n_seqs):
        P = draw(st.integers(1, config.n_ctx - 1))
        n = draw(st.integers(1, min(config.n_ctx - P, 6)))
        prompt = draw(st.lists(st.integers(0, config.vocab_size - 1), min_size=P, max_size=P))
        join = draw(st.integers(0, 4))
        seqs.append((prompt, n, join))
    sampled = draw(st.booleans())
    sampling = SamplingParams(temperature=draw(st.sampled_from([0.7, 1.0, 1.5])), seed=draw(st.integers(0, 2**16))) \
        if sampled else SamplingParams()
    cache = draw(st.sampled_from(["contiguous", "paged"]))
    block_size = draw(st.integers(1, 8))
    chunk_seed = draw(st.integers(0, 2**16))
    return config, draw(st.integers(0, 2**16)), seqs, sampling, cache, block_size, chunk_seed


def run_workload(model, seqs, sampling, cache, block_size, chunk_seed, pool_blocks=None):
    """Drive run_step by hand: sequence i joins at step join_i; prompts go in random chunks."""
    c = model.config
    rng = np.random.default_rng(chunk_seed)
    pool = None
    if cache == "paged":
        need = sum(-(-(len(p) + n) // block_size) for p, n, _ in seqs)
        pool = PagedKVPool(c, pool_blocks or need, block_size, model.dtype)
    traced = []
    for prompt, n, join in seqs:
        s = Traced(prompt, n, sampling)
        s.cache = pool.sequence() if pool else KVCache(c, model.dtype)
        traced.append((join, s))
    step = 0
    while any(not s.finished for _, s in traced):
        active = [s for join, s in traced if join <= step and not s.finished]
        if active:
            chunks = [int(rng.integers(1, s.n_pending + 1)) for s in active]
            for s, n in zip(active, chunks):
                s.cache.reserve(n)
            with tracing():
                run_step(model, active, chunks)
            for s in active:
                if s.finished:
                    s.cache.free()
        step += 1
    return [s for _, s in traced], pool


@settings(max_examples=60, deadline=None)
@given(workloads())
def test_batched_steps_give_every_sequence_its_tokens_alone(w):
    config, seed, seqs, sampling, cache, block_size, chunk_seed = w
    model = random_model(config, seed)
    done, pool = run_workload(model, seqs, sampling, cache, block_size, chunk_seed)
    for i, ((prompt, n, _), s) in enumerate(zip(seqs, done)):
        tokens, logits = alone(model, prompt, n, sampling)
        assert s.output == tokens, f"sequence {i}: batched tokens differ from alone"
        for t, (a, b) in enumerate(zip(s.logits, logits)):
            np.testing.assert_allclose(a, b, rtol=0, atol=REL_TOL * max(1.0, np.abs(b).max()),
                                       err_msg=f"sequence {i}, token {t}")
        assert s.output == minillm.generate(model, prompt, n, temperature=sampling.temperature,
                                            seed=sampling.seed)
    if pool is not None:
        assert pool.allocator.n_free == pool.num_blocks, "blocks left held after every sequence finished"


@settings(max_examples=30, deadline=None)
@given(workloads())
def test_generate_batch_equals_generate_alone(w):
    config, seed, seqs, sampling, cache, block_size, _ = w
    model = random_model(config, seed)
    prompts = [p for p, _, _ in seqs]
    limits = [n for _, n, _ in seqs]
    got = minillm.generate_batch(model, prompts, limits, temperature=sampling.temperature, seed=sampling.seed,
                                 cache=cache, block_size=block_size)
    want = [minillm.generate(model, p, n, temperature=sampling.temperature, seed=sampling.seed)
            for p, n in zip(prompts, limits)]
    assert got == want


def test_generate_batch_seed_per_prompt_and_limits():
    model = random_model(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=32, vocab_size=97), 3)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    got = minillm.generate_batch(model, prompts, [4, 0, 6], temperature=1.0, seed=[7, 8, 9])
    assert got[1] == [] and [len(g) for g in got] == [4, 0, 6]
    assert got[0] == minillm.generate(model, prompts[0], 4, temperature=1.0, seed=7)
    assert got[2] == minillm.generate(model, prompts[2], 6, temperature=1.0, seed=9)


@pytest.mark.parametrize("bad, match", [
    (([], 3), "non-empty list"),
    (([[1], [2]], [3]), "1 values for 2 prompts"),
    (([[1], []], 3), "prompt 1"),
    (([[1], [10**6]], 3), "prompt 1: token id 1000000"),
    (([[1] * 30], 5), "prompt 0: .*at most 2 new tokens fit"),
    (([[1]], 2.5), "max_new_tokens=2.5"),
])
def test_generate_batch_bad_input_names_the_prompt(bad, match):
    model = random_model(GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=32, vocab_size=50), 0)
    with pytest.raises(minillm.MiniLLMError, match=match):
        minillm.generate_batch(model, *bad)


def test_a_step_rejects_one_cache_twice_and_empty_batches():
    model = random_model(GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=16, vocab_size=50), 0)
    cache = model.new_cache()
    with pytest.raises(PromptError, match="twice"):
        model.step([([1, 2], cache), ([3], cache)])
    with pytest.raises(PromptError, match="at least one"):
        model.step([])
    assert cache.length == 0


# -- paged == contiguous, at the level of the cache ----------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.lists(st.integers(1, 9), min_size=1, max_size=6),
       st.integers(0, 2**16), st.booleans())
def test_paged_cache_reads_what_a_contiguous_cache_reads(bs, other, writes, seed, interleave):
    """Random write chunks into a paged sequence (its blocks interleaved with another sequence's
    or not) and into a contiguous cache: every read is equal, exactly."""
    config = GPT2Config(n_layer=2, n_head=3, n_embd=12, n_ctx=64, vocab_size=10)
    rng = np.random.default_rng(seed)
    pool = PagedKVPool(config, 3 * (64 // bs + 1), bs, np.float64)
    a, b, ref = pool.sequence(), pool.sequence(), KVCache(config, np.float64)
    b.reserve(other)
    b.advance(other)
    for n in writes:
        if ref.length + n > config.n_ctx:
            break
        for cache in (a, ref):
            cache.reserve(n)
        if interleave and b.length + bs <= b.n_ctx:   # b takes the next block: a's run is broken
            b.reserve(bs)
            b.advance(bs)
        for layer in range(config.n_layer):
            k, v = rng.standard_normal((2, config.n_head, n, config.head_dim))
            for cache in (a, ref):
                cache.write(layer, cache.length, k, v)
        for cache in (a, ref):
            cache.advance(n)
        for layer in range(config.n_layer):
            for t in (1, ref.length // 2 + 1, ref.length):
                for x, y in zip(a.read(layer, t), ref.read(layer, t)):
                    np.testing.assert_array_equal(x, y)


def test_paged_read_is_a_view_when_the_blocks_are_one_run_and_a_copy_otherwise():
    config = GPT2Config(n_layer=1, n_head=2, n_embd=8, n_ctx=64, vocab_size=10)
    pool = PagedKVPool(config, 16, 4)
    a, b = pool.sequence(), pool.sequence()
    a.reserve(8)
    a.advance(8)
    k, _ = a.read(0, 8)
    assert np.shares_memory(k, pool.k)
    b.reserve(1)           # takes the next block: a's next one is not adjacent any more
    a.reserve(1)
    a.advance(1)
    k, _ = a.read(0, 9)
    assert not np.shares_memory(k, pool.k)


def test_fork_shares_full_blocks_and_copies_the_partial_one():
    model = random_model(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=32, vocab_size=61), 5)
    pool = PagedKVPool(model.config, 12, 4, model.dtype)
    base = pool.sequence()
    logits, _ = model.prefill(list(range(10)), base)               # 10 positions: 2 full blocks + 2
    fork = base.fork()
    assert fork.table[:2] == base.table[:2] and fork.table[2] != base.table[2]
    assert [pool.allocator.refs[b] for b in base.table] == [2, 2, 1]
    x = model.decode_step(3, fork)
    y = model.decode_step(3, base)
    np.testing.assert_allclose(x, y, rtol=0, atol=1e-12)
    fork.free()
    base.free()
    assert pool.allocator.n_free == pool.num_blocks


def test_a_full_pool_says_what_to_do_and_takes_nothing():
    config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=64, vocab_size=10)
    pool = PagedKVPool(config, 3, 4)
    a = pool.sequence()
    with pytest.raises(minillm.MiniLLMError, match="4 KV blocks are needed and 3 of 3 are free"):
        a.reserve(13)
    assert pool.allocator.n_free == 3 and a.table == []
    with pytest.raises(minillm.MiniLLMError, match="holds no block"):
        PagedKVPool.from_memory(config, 10, 4)


# -- a long context: prefill's query blocks (128) crossed --------------------------------------

def test_forward_chunked_prefill_and_decode_agree_past_the_query_blocks():
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=320, vocab_size=71)
    model = random_model(config, 11)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, 300)
    full = model.forward(ids)                                          # [300, V]
    scale = max(1.0, np.abs(full).max())
    for cache in (model.new_cache(), PagedKVPool(config, 40, 8, np.float64).sequence()):
        parts, start = [], 0
        for n in (100, 150, 30):                                       # chunks crossing 128 and 256
            cache.reserve(n)
            (lg,) = model.step([(ids[start:start + n], cache)], scores="all")
            parts.append(lg)
            start += n
        for t in range(start, 300):                                    # then decode steps
            parts.append(model.decode_step(int(ids[t]), cache)[None])
        np.testing.assert_allclose(np.concatenate(parts), full, rtol=0, atol=REL_TOL * scale)


def test_batched_decode_gather_and_per_sequence_reads_agree(monkeypatch):
    """The two decode-attention paths (one gather for the batch, or a read per sequence) agree."""
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=64, vocab_size=71)
    model = random_model(config, 2)
    prompts = [[1, 2, 3], list(range(20)), [7] * 9]
    results = []
    for limit in (0, plan.BATCHED_DECODE_KEYS):
        monkeypatch.setattr(plan, "BATCHED_DECODE_KEYS", limit)
        seqs = [Traced(p, 8) for p in prompts]
        pool = PagedKVPool(config, 20, 4, np.float64)
        for s in seqs:
            s.cache = pool.sequence()
        while not all(s.finished for s in seqs):
            live = [s for s in seqs if not s.finished]
            for s in live:
                s.cache.reserve(s.n_pending)
            with tracing():
                run_step(model, live)
        results.append(seqs)
    for a, b in zip(*results):
        assert a.output == b.output
        for x, y in zip(a.logits, b.logits):
            np.testing.assert_allclose(x, y, rtol=0, atol=REL_TOL * max(1.0, np.abs(y).max()))


def test_a_step_one_block_short_reserves_nothing():
    """A batch whose blocks the pool is one short of: nothing is reserved, for any sequence (the model
    used to reserve each cache in turn, so the ones before the failing cache kept blocks for
    positions never written). The model itself reserves nothing: an unreserved step is refused."""
    config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=64, vocab_size=10)
    model = random_model(config, 0)
    pool = PagedKVPool(config, 5, 4, np.float64)
    caches = [pool.sequence() for _ in range(3)]
    batch = [([1] * 8, caches[0]), ([2] * 5, caches[1]), ([3] * 5, caches[2])]   # 2 + 2 + 2 = 6 blocks
    with pytest.raises(minillm.MiniLLMError, match="6 KV blocks are needed and 5 of 5 are free"):
        reserve_step([(c, len(ids)) for ids, c in batch])
    assert pool.allocator.n_free == 5 and all(c.table == [] for c in caches)
    with pytest.raises(PromptError, match="reserve them first"):
        model.step(batch)
    assert pool.allocator.n_free == 5 and all(c.table == [] and c.length == 0 for c in caches)
    reserve_step([(c, len(ids)) for ids, c in batch[:2]])            # 4 blocks: fits
    assert pool.allocator.n_free == 1
    model.step(batch[:2])
    assert [c.length for c in caches] == [8, 5, 0]
