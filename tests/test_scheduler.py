"""The scheduler and the engine: a request's tokens do not depend on how it was scheduled.

Random small float64 models (test_properties.random_model) and random workloads: 1-8 requests,
some sharing a prefix (so the prefix cache hits), arriving at random times, greedy or seeded
sampling; every policy, with and without prefix caching, with a KV pool from roomy down to barely
the largest request (so sequences are preempted and recomputed), token budgets small enough to
chunk prompts. For every request: its tokens equal `minillm.generate` alone; when the workload
ends every block is free.

Tolerance for logits, float64: |a - b| <= 1e-9 * max(1, max|logits|), as in test_batch: a batched
step or a prefix computed in another step only sums in another order (1e-15 of the logit scale).
"""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import minillm
from minillm.models.gpt2 import GPT2Config
from minillm.engine import runner
from minillm.engine.block_manager import BlockManager, block_hash
from minillm.engine.engine import Engine
from minillm.engine.scheduler import POLICIES
from minillm.engine.sequence import SamplingParams
from minillm.errors import MiniLLMError

from test_properties import REL_TOL, random_model


@st.composite
def workloads(draw):
    n_head = draw(st.integers(1, 2))
    config = GPT2Config(n_layer=draw(st.integers(1, 2)), n_head=n_head, n_embd=n_head * draw(st.integers(4, 8)),
                        n_ctx=draw(st.integers(16, 48)), vocab_size=draw(st.integers(20, 80)))
    V = config.vocab_size
    shared = draw(st.lists(st.integers(0, V - 1), min_size=0, max_size=config.n_ctx // 2))
    reqs = []
    for _ in range(draw(st.integers(1, 8))):
        head = shared[:draw(st.integers(0, len(shared)))]
        tail = draw(st.lists(st.integers(0, V - 1), min_size=0 if head else 1, max_size=6))
        prompt = (head + tail)[:config.n_ctx - 1]
        n = draw(st.integers(1, min(6, config.n_ctx - len(prompt))))
        reqs.append((prompt, n, draw(st.floats(0, 0.05))))
    sampling = draw(st.sampled_from([None, 0.8, 1.3]))
    return config, draw(st.integers(0, 2**16)), reqs, sampling


def sampling_for(temperature, i):
    return SamplingParams() if temperature is None else SamplingParams(temperature=temperature, seed=1000 + i)


@settings(max_examples=150, deadline=None)
@given(workloads(), st.sampled_from(POLICIES), st.booleans(), st.integers(1, 6), st.integers(1, 12),
       st.sampled_from([0, 0, 1, 2, 4, 8]), st.integers(1, 5))
def test_every_request_gets_its_tokens_alone(w, policy, prefix_cache, block_size, budget, spare, max_seqs):
    config, seed, reqs, temperature = w
    model = random_model(config, seed)
    biggest = max(-(-(len(p) + n) // block_size) for p, n, _ in reqs)
    engine = Engine(model, num_blocks=biggest + spare, block_size=block_size, prefix_cache=prefix_cache,
                    policy=policy, max_seqs=max_seqs, max_batched_tokens=budget)
    made = {}
    rs = [engine.add_request(p, n, sampling_for(temperature, i), arrival=t) for i, (p, n, t) in enumerate(reqs)]
    while engine.has_work:
        info = engine.step()
        for r, tok in (info.made if info else []):
            made.setdefault(r.id, []).append(tok)
    event(f"preempted: {engine.scheduler.preemptions > 0}")
    event(f"prefix hits: {engine.blocks.hit_tokens > 0}")
    for i, ((prompt, n, _), r) in enumerate(zip(reqs, rs)):
        s = sampling_for(temperature, i)
        alone = minillm.generate(model, prompt, n, temperature=s.temperature, seed=s.seed)
        assert r.output == alone, f"request {i} ({policy}, prefix cache {prefix_cache}): tokens differ from alone"
        assert made.get(r.id) == alone, f"request {i}: the steps did not hand over its tokens"
        assert len(r.token_times) == n and r.ttft >= 0 and all(d >= 0 for d in r.tbt)
    a = engine.pool.allocator
    assert a.n_free == a.num_blocks, "blocks left held after the workload ended"
    assert all(a.refs[b] == 0 for b in range(a.num_blocks))
    assert not engine.scheduler.running and not engine.scheduler.waiting


def test_a_tiny_pool_forces_preemption_and_the_tokens_stay():
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=64, vocab_size=60)
    model = random_model(config, 3)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, 60, 6)) for _ in range(5)]
    for prefix_cache in (False, True):
        engine = Engine(model, num_blocks=7, block_size=4, prefix_cache=prefix_cache, max_seqs=5, max_batched_tokens=64)
        rs = [engine.add_request(p, 20, SamplingParams(temperature=1.0, seed=i)) for i, p in enumerate(prompts)]
        engine.run()
        assert engine.scheduler.preemptions > 0, "the pool was meant to run out"
        for i, (p, r) in enumerate(zip(prompts, rs)):
            assert r.output == minillm.generate(model, p, 20, temperature=1.0, seed=i)
        assert engine.pool.allocator.n_free == 7


def traced_logits(model, engine_kwargs, prompts, n):
    """Every request's logits, per token, through the engine."""
    engine = Engine(model, **engine_kwargs)
    seen = {}
    rs = [engine.add_request(p, n) for p in prompts]
    by_rng = {id(r.seq.rng): r.id for r in rs}
    original = runner.pick

    def pick(logits, temperature, top_k, top_p, rng):
        seen.setdefault(by_rng[id(rng)], []).append(np.array(logits))
        return original(logits, temperature, top_k, top_p, rng)

    with patch.object(runner, "pick", pick):
        engine.run()
    return [seen[r.id] for r in rs], engine


@pytest.mark.parametrize("block_size", [1, 3, 4, 8])
def test_a_prefix_cache_hit_gives_the_logits_of_a_miss(block_size):
    """float64; tolerance 1e-9 of the logit scale. The second and later requests share a 17-token
    prefix (every block of it, and with block size 1 the whole of a repeated prompt, is a hit)."""
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=64, vocab_size=70)
    model = random_model(config, 5)
    rng = np.random.default_rng(1)
    prefix = list(rng.integers(0, 70, 17))
    prompts = [prefix + list(rng.integers(0, 70, k)) for k in (3, 0, 5)] + [prefix]   # a prompt cached whole
    kw = dict(num_blocks=64, block_size=block_size, max_seqs=1)   # one at a time: later ones hit
    hit, engine = traced_logits(model, {**kw, "prefix_cache": True}, prompts, 4)
    miss, _ = traced_logits(model, {**kw, "prefix_cache": False}, prompts, 4)
    assert engine.blocks.hit_tokens >= 2 * (17 // block_size) * block_size
    for i, (a, b) in enumerate(zip(hit, miss)):
        for t, (x, y) in enumerate(zip(a, b)):
            np.testing.assert_allclose(x, y, rtol=0, atol=REL_TOL * max(1.0, np.abs(y).max()),
                                       err_msg=f"request {i}, token {t}")


def test_a_prompt_cached_whole_still_runs_its_last_position():
    config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=32, vocab_size=30)
    model = random_model(config, 2)
    prompt = list(range(8))                    # two full blocks of 4
    engine = Engine(model, num_blocks=16, block_size=4, prefix_cache=True, max_seqs=1)
    a = engine.add_request(prompt, 3)
    b = engine.add_request(prompt, 3)
    engine.run()
    assert a.output == b.output == minillm.generate(model, prompt, 3)
    assert engine.blocks.hit_tokens == 7       # all but the last position
    first_b = [i for i in engine.steps if any(rid == b.id for rid, _, _ in i.seqs)][0]
    assert [(p, n) for rid, p, n in first_b.seqs if rid == b.id] == [(7, 1)]


def test_unreferenced_cached_blocks_are_evicted_least_recently_used():
    config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=32, vocab_size=30)
    model = random_model(config, 2)
    engine = Engine(model, num_blocks=6, block_size=4, prefix_cache=True, max_seqs=1)
    for p in ([1] * 8, [2] * 8, [3] * 8):       # each fills 3 blocks (2 cached), frees them
        engine.add_request(p, 2)
        engine.run()
    m = engine.blocks
    kept = [m.match(engine.add_request(p, 1).seq).cached for p in ([1] * 8 + [0], [2] * 8 + [0], [3] * 8 + [0])]
    assert kept[0] == 0 and kept[1] > 0 and kept[2] == 8, f"cached positions per prompt: {kept}"


def test_block_hashes_chain_their_parents():
    assert block_hash(None, [1, 2]) != block_hash(block_hash(None, [0, 0]), [1, 2])
    assert block_hash(b"x", [1, 2]) == block_hash(b"x", np.array([1, 2]))


def test_abort_gives_the_blocks_back_at_once():
    config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=32, vocab_size=30)
    model = random_model(config, 2)
    engine = Engine(model, num_blocks=10, block_size=4, prefix_cache=True)
    r = engine.add_request(list(range(9)), 10)
    other = engine.add_request(list(range(5)), 3)
    engine.step()
    assert engine.pool.allocator.n_used > 0
    engine.abort(r.id)
    assert r.aborted and r.done
    engine.run()
    assert engine.pool.allocator.n_free == 10 and other.output == minillm.generate(model, list(range(5)), 3)


def test_bad_requests_are_refused_with_one_line():
    config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=32, vocab_size=30)
    model = random_model(config, 2)
    engine = Engine(model, num_blocks=2, block_size=4)
    with pytest.raises(MiniLLMError, match="KV blocks"):
        engine.add_request(list(range(9)), 3)
    with pytest.raises(MiniLLMError, match="max_new_tokens"):
        engine.add_request([1], -1)
    with pytest.raises(MiniLLMError, match="max_new_tokens"):
        engine.add_request([1], 2.0)
    nothing = engine.add_request([1], 0)           # 0 new tokens: done at once, as generate([1], 0) == []
    assert nothing.done and nothing.output == [] == minillm.generate(model, [1], 0)
    with pytest.raises(MiniLLMError, match="kv_memory"):
        Engine(model, kv_memory=0)
    with pytest.raises(MiniLLMError, match="policy"):
        Engine(model, num_blocks=2, policy="fastest")


# ------------------------------------------------------------------ the engine's boundary: step, adopt


def test_step_returns_its_info_with_the_tokens_it_made():
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, n_ctx=64, vocab_size=40)
    model = random_model(config, 3)
    engine = Engine(model, num_blocks=20, block_size=4)
    a = engine.add_request([1, 2, 3, 4, 5], 3)
    b = engine.add_request([6, 7], 2, arrival=5.0)          # arrives later: the first step is a's alone
    info = engine.step()
    assert info is engine.steps[-1] and engine.n_steps == 1
    assert info.made == [(a, a.output[0])] and info.prefill_tokens == 5 and info.decode_tokens == 0
    assert info.record is not None and info.model_seconds == info.record.seconds
    assert 0 < info.model_seconds <= info.seconds
    made = {a.id: list(a.output)}
    while engine.has_work:
        info = engine.step()
        for r, tok in (info.made if info else []):
            made.setdefault(r.id, []).append(tok)
    assert made == {a.id: a.output, b.id: b.output}
    assert a.output == minillm.generate(model, [1, 2, 3, 4, 5], 3)
    assert engine.step() is None                              # nothing left to run


def test_a_step_that_can_run_nothing_with_nothing_on_its_way_says_so():
    config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=32, vocab_size=30)
    engine = Engine(random_model(config, 0), num_blocks=4, block_size=4)
    engine.add_request(list(range(5)), 3)
    engine.pool.allocator.allocate_many(3)                    # blocks taken behind the scheduler's back
    with pytest.raises(MiniLLMError, match="can run nothing"):
        engine.step()


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_an_adopted_sequence_makes_the_tokens_of_a_fresh_prefill_and_frees_its_blocks(temperature):
    from minillm.serving.disagg import export_kv
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=64, vocab_size=50)
    model = random_model(config, 7)
    prompt, n, sampling = list(range(3, 14)), 6, SamplingParams(temperature, seed=11)
    fresh = Engine(model, num_blocks=16, block_size=4)
    whole = fresh.add_request(prompt, n, sampling)
    fresh.run()
    prefill = Engine(model, num_blocks=16, block_size=4)
    p = prefill.add_request(prompt, n, sampling)
    (req, first), = prefill.step().made                       # the prompt runs, its first token sampled
    k, v = export_kv(p.seq.cache)
    decode = Engine(model, num_blocks=16, block_size=4)
    r = decode.new_request(prompt, n, sampling)
    assert decode.adopt(r, k, v, output=[first], rng=p.seq.rng)
    assert decode.scheduler.running == [r.seq] and not decode.scheduler.waiting
    assert r.seq.n_computed == len(prompt) and decode.pool.allocator.n_used == -(-(len(prompt) + 1) // 4)
    decode.run()
    assert r.output == whole.output
    assert decode.pool.allocator.n_free == 16 and decode.pool.allocator.n_used == 0


def test_adopt_takes_nothing_when_there_is_no_room():
    from minillm.serving.disagg import export_kv
    config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=32, vocab_size=30)
    model = random_model(config, 1)
    prefill = Engine(model, num_blocks=8, block_size=4)
    p = prefill.add_request(list(range(9)), 4)
    (_, first), = prefill.step().made
    k, v = export_kv(p.seq.cache)
    small = Engine(model, num_blocks=4, block_size=4)           # 10 positions need 3 blocks: 2 are free
    small.pool.allocator.allocate_many(2)
    r = small.new_request(list(range(9)), 4)
    assert not small.adopt(r, k, v, output=[first], rng=p.seq.rng)
    assert small.pool.allocator.n_free == 2 and not small.scheduler.running and r.id not in small.requests
    full = Engine(model, num_blocks=8, block_size=4, max_seqs=1)
    full.add_request([1, 2], 2)
    full.step()
    assert not full.adopt(full.new_request(list(range(9)), 4), k, v, output=[first], rng=p.seq.rng)
    assert len(full.scheduler.running) == 1


def test_block_states_map_the_pool_as_the_allocator_and_the_prefix_cache_hold_it():
    config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=64, vocab_size=30)
    engine = Engine(random_model(config, 4), num_blocks=12, block_size=4, prefix_cache=True)
    first = engine.add_request(list(range(10)), 2)
    engine.run()
    states = engine.blocks.block_states()
    assert len(states) == 12 and "held" not in states and "shared" not in states
    assert states.count("cached") == 2                       # the prompt's two full blocks stay named
    engine.add_request(list(range(10)), 4)
    engine.add_request(list(range(10)) + [7, 7], 4)
    engine.step()
    states = engine.blocks.block_states()
    a = engine.pool.allocator
    assert states.count("shared") == sum(1 for r in a.refs if r > 1) == 2 and first.done
    assert states.count("held") + states.count("shared") == a.n_used
    assert engine.blocks.block_states(stride=5) == states[::5]
