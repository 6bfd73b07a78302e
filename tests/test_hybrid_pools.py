"""A hybrid's paged pool holds one state slot per sequence that can run, whatever its blocks cost:
an all-linear hybrid (blocks of no bytes) gets as many states as its memory holds, not one per
block (8.2 GiB reserved for a 256 MB budget before); the engine admits by blocks and free slots;
generate_batch sizes its pool with the states, so hybrid requests that fit run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm.cache.state import HybridPagedPool
from minillm.engine.batch import generate_batch
from minillm.engine.engine import Engine
from minillm.models.qwen35 import FULL, LINEAR, Qwen35Config
from minillm.models import qwen35

QWEN35 = Path(__file__).parent / "fixtures" / "w5" / "qwen35-tiny"


def config(types, n_ctx=4096):
    return Qwen35Config(n_layer=len(types), n_head=2, n_kv_head=1, head_dim=8, n_embd=16, n_ctx=n_ctx,
                        vocab_size=50, ffn=16, layer_types=tuple(types), lin_k_heads=1, lin_v_heads=2,
                        lin_k_dim=8, lin_v_dim=8)


def reserved(pool) -> int:
    return sum(a.nbytes for a in pool.states.arrays.values())


@pytest.mark.parametrize("n_ctx", [512, 4096, 32768])
def test_an_all_linear_pool_holds_one_state_per_sequence_its_memory_holds(n_ctx):
    c = config((LINEAR, LINEAR), n_ctx)
    state = c.state_bytes(4)
    for budget in (state, 5 * state + 1, 64 * state):
        pool = HybridPagedPool.from_memory(c, budget, 16)
        assert pool.states.slots == budget // state, (n_ctx, budget)
        assert reserved(pool) <= budget


@pytest.mark.parametrize("types", [(LINEAR, LINEAR), (LINEAR, FULL), (LINEAR, LINEAR, LINEAR, FULL)])
@pytest.mark.parametrize("num_blocks", [2, 7, 64])
def test_a_pools_slots_are_the_sequences_its_blocks_can_run(types, num_blocks):
    """Each running sequence holds its state's blocks and at least one block of positions."""
    c = config(types, 256)
    pool = HybridPagedPool(c, num_blocks, 16)
    can_run = num_blocks // (pool.state_blocks + 1)
    assert pool.states.slots == max(1, can_run)


def test_the_engine_runs_more_short_requests_than_slots_one_slot_at_a_time():
    """All-linear, memory for 2 states: 6 short requests finish (blocks of no bytes would admit all six
    at once; the free slots admit two), every slot and block back at the end."""
    c = config((LINEAR, LINEAR), 512)
    model = qwen35.random(c)
    engine = Engine(model, kv_memory=2 * c.state_bytes(4), max_seqs=8)
    assert engine.pool.states.slots == 2
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 50, 3 + i).tolist() for i in range(6)]
    reqs = [engine.add_request(p, 4) for p in prompts]
    most = []
    engine.on_step = lambda e, info: most.append(len(info.sequences))
    engine.run()
    assert all(len(r.output) == 4 for r in reqs) and max(most) <= 2
    assert engine.pool.states.n_free == 2 and engine.blocks.n_free == engine.pool.num_blocks
    for p, r in zip(prompts, reqs):
        assert list(r.output) == list(minillm.generate(model, p, 4))


def test_generate_batch_runs_hybrid_requests_that_fit():
    """The shared fixture, 5 prompt tokens and 6 new ones: refused (ContextFull) while the pool was
    sized without the states; each request's tokens are its tokens alone."""
    model = minillm.load(QWEN35)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11], [3, 1, 4, 1, 5]]
    out = generate_batch(model, prompts, 6)
    for p, o in zip(prompts, out):
        alone = minillm.generate(model, p, 6)
        assert list(o) == list(alone), (o, alone)


def test_with_the_integer_set_generate_batch_gives_a_hybrid_its_tokens_alone():
    """The README's statement for the int8 set and hybrids, as far as it holds: every prompt whole
    in the first step (generate_batch), then decode steps: each request's tokens are its tokens alone."""
    from minillm import kernels
    if not kernels.available():
        pytest.skip("numba kernels cannot run here")
    model = minillm.load(QWEN35, weights="q8_0", kernels="int8")
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13], [3, 1, 4]]
    for p, o in zip(prompts, generate_batch(model, prompts, 6)):
        assert list(o) == list(minillm.generate(model, p, 6))
