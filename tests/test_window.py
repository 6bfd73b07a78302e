"""A window that slides, in the engine, on random small Gemma 3 and gpt-oss configs (float64): cached
== naive, chunked prefill == whole, paged and batched == contiguous and alone, a window as long as
the sequence == full attention, a sink of -inf == no sink, every request of an engine == alone; and
the meter: a windowed layer's decode step reads min(position + 1, window) positions (closed form)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm import meter
from minillm.cache.paged import PagedKVPool, layer_groups
from minillm.models import gemma3, gptoss
from minillm.models.target import Target

KINDS = ("sliding_attention", "full_attention")
EXACT = 1e-9


@st.composite
def gemma_configs(draw, window=None):
    L = draw(st.integers(1, 3))
    n_kv, hd = draw(st.sampled_from([1, 2])), draw(st.sampled_from([8, 16]))
    return gemma3.Gemma3Config(
        n_layer=L, n_head=n_kv * draw(st.sampled_from([1, 2])), n_kv_head=n_kv, head_dim=hd,
        n_embd=draw(st.sampled_from([16, 32])), n_ctx=96, vocab_size=61, ffn=24,
        layer_types=tuple(draw(st.lists(st.sampled_from(KINDS), min_size=L, max_size=L))),
        window=window or draw(st.integers(1, 9)), query_scalar=draw(st.sampled_from([0, 5.0])),
        tied=draw(st.booleans()))


@st.composite
def gptoss_configs(draw, window=None):
    L = draw(st.integers(1, 3))
    n_kv = draw(st.sampled_from([1, 2]))
    return gptoss.GptOssConfig(
        n_layer=L, n_head=n_kv * draw(st.sampled_from([1, 2])), n_kv_head=n_kv, head_dim=draw(st.sampled_from([8, 16])),
        n_embd=draw(st.sampled_from([16, 32])), n_ctx=96, vocab_size=61, expert_ffn=8, n_expert=4,
        top_k=draw(st.integers(1, 2)), layer_types=tuple(draw(st.lists(st.sampled_from(KINDS), min_size=L, max_size=L))),
        window=window or draw(st.integers(1, 9)), rope_original=32, rope_factor=draw(st.sampled_from([1.0, 4.0])))


def configs(window=None):
    return st.one_of(gemma_configs(window), gptoss_configs(window))


def build(c, tensors=None):
    family = gemma3 if isinstance(c, gemma3.Gemma3Config) else gptoss
    t = tensors or family.random_params(c, seed=0, std=0.3, dtype=np.float64)
    return family.MODEL(c, t, Target.numpy(np.float64)), t


@settings(max_examples=20, deadline=None)
@given(configs(), st.integers(1, 20), st.integers(1, 12), st.integers(0, 2**31))
def test_cached_equals_naive(c, P, N, seed):
    model, _ = build(c)
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, P + N)
    ref = model.forward(ids)
    logits, cache = model.prefill(ids[:P])
    rows = [logits] + [model.decode_step(int(t), cache) for t in ids[P:]]
    np.testing.assert_allclose(np.array(rows), ref[P - 1:], rtol=0, atol=EXACT)


@settings(max_examples=20, deadline=None)
@given(configs(), st.lists(st.integers(1, 9), min_size=1, max_size=4), st.integers(0, 2**31))
def test_prefill_in_chunks_equals_whole(c, sizes, seed):
    model, _ = build(c)
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, sum(sizes))
    whole, _ = model.prefill(ids)
    cache, i = model.new_cache(), 0
    for s in sizes:
        logits, cache = model.prefill(ids[i:i + s], cache)
        i += s
    np.testing.assert_allclose(logits, whole, rtol=0, atol=EXACT)


@settings(max_examples=20, deadline=None)
@given(configs(), st.lists(st.integers(1, 12), min_size=1, max_size=4), st.integers(1, 10), st.integers(1, 5),
       st.integers(0, 2**31))
def test_paged_and_batched_equal_contiguous_and_alone(c, prompts, steps, block_size, seed):
    """B sequences in one paged pool (their blocks interleaved: the window's reads gather), prefilled
    together and decoded together, give each sequence's rows alone in a contiguous cache."""
    model, _ = build(c)
    rng = np.random.default_rng(seed)
    ps = [rng.integers(0, c.vocab_size, n) for n in prompts]
    ts = rng.integers(0, c.vocab_size, (len(ps), steps))
    alone = []
    for p, t in zip(ps, ts):
        logits, cache = model.prefill(p)
        alone.append([logits] + [model.decode_step(int(x), cache) for x in t])
    pool = PagedKVPool(c, sum(PagedKVPool.blocks_for_positions(c, len(p) + steps, block_size) for p in ps) + 1,
                       block_size, np.float64)
    caches = [pool.sequence() for _ in ps]
    for cache, p in zip(caches, ps):
        cache.reserve(len(p))
    rows = [[r] for r in model.step(list(zip(ps, caches)))]
    for j in range(steps):
        for cache in caches:
            cache.reserve(1)
        for i, r in enumerate(model.step([(ts[i, j:j + 1], cache) for i, cache in enumerate(caches)])):
            rows[i].append(r)
    for got, want in zip(rows, alone):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=EXACT)
    for cache in caches:
        cache.free()
    assert pool.allocator.n_free == pool.num_blocks


@settings(max_examples=15, deadline=None)
@given(configs(window=64), st.integers(1, 40), st.integers(0, 2**31))
def test_a_window_as_long_as_the_sequence_is_full_attention(c, T, seed):
    """Every layer sliding with a window >= the sequence gives the logits of every layer full (Gemma's
    sliding layers with the full layers' rotary base)."""
    if isinstance(c, gemma3.Gemma3Config):
        c = replace(c, local_theta=c.theta)
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, T)
    sliding, t = build(replace(c, layer_types=("sliding_attention",) * c.n_layer))
    full, _ = build(replace(c, layer_types=("full_attention",) * c.n_layer), t)
    np.testing.assert_array_equal(sliding.forward(ids), full.forward(ids))


@settings(max_examples=15, deadline=None)
@given(gptoss_configs(), st.integers(1, 20), st.integers(0, 2**31))
def test_a_sink_of_minus_infinity_is_no_sink(c, T, seed):
    t = gptoss.random_params(c, seed=0, std=0.3, dtype=np.float64)
    t = {k: np.full_like(v, -np.inf) if k.endswith("sinks") else v for k, v in t.items()}
    sunk, _ = build(c, t)
    plain, _ = build(c, t)
    plain.specs = [replace(s, sinks=None) for s in plain.specs]
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, T)
    np.testing.assert_array_equal(sunk.forward(ids), plain.forward(ids))


@settings(max_examples=10, deadline=None)
def run_engine_alone_equal(c, reqs, block_size: int, budget: int, prefix_cache: bool):
    """The engine over `reqs` in a pool just big enough for the longest (two blocks a group to spare),
    every request's tokens checked against `minillm.generate` alone; returns the engine."""
    from minillm.engine.engine import Engine
    model, _ = build(c)
    biggest = max(PagedKVPool.blocks_for_positions(c, len(p) + n, block_size) for p, n in reqs)
    engine = Engine(model, num_blocks=biggest + 2 * len(layer_groups(c)), block_size=block_size,
                    max_batched_tokens=budget, prefix_cache=prefix_cache)
    rs = [engine.add_request(p, n) for p, n in reqs]
    engine.run()
    for (p, n), r in zip(reqs, rs):
        assert r.output == minillm.generate(model, p, n)
    return engine


@given(configs(), st.lists(st.tuples(st.lists(st.integers(0, 60), min_size=1, max_size=14), st.integers(1, 8)),
                           min_size=1, max_size=4),
       st.integers(1, 5), st.integers(1, 12), st.booleans())
def test_engine_gives_every_request_its_tokens_alone(c, reqs, block_size, budget, prefix_cache):
    """Chunked prefill, batched decode and preemption in a small pool, the prefix cache on or off:
    every request's tokens equal `minillm.generate` alone; every block is free at the end."""
    engine = run_engine_alone_equal(c, reqs, block_size, budget, prefix_cache)
    assert engine.pool.allocator.n_free == engine.pool.num_blocks or prefix_cache


# -- the meter ----------------------------------------------------------------------------------------------

def kv_read_closed_form(c, position: int, itemsize: int) -> int:
    """A decode step at `position` (that many cached before it): each layer reads its keys and values
    of min(position + 1, window) positions if it slides, position + 1 if not."""
    per = 2 * c.n_kv_head * c.head_dim * itemsize
    return sum(per * (min(position + 1, c.window) if kind == "sliding_attention" else position + 1)
               for kind in c.layer_types)


@pytest.mark.parametrize("name", ["gemma3-tiny", "gptoss-tiny"])
@pytest.mark.parametrize("paged", [False, True])
def test_a_windowed_decode_step_reads_min_position_window(name, paged):
    """Past the window, a step's KV read grows only by the full layers' bytes. (Paged: each group's
    blocks laid out as one run, read as views; blocks that are not a run are gathered whole, and the
    gather counts the whole blocks it reads.)"""
    model = minillm.load(f"tests/fixtures/w6/{name}", kernels="numpy")
    c = model.config
    if paged:
        pool = PagedKVPool(c, 8 * len(layer_groups(c)), 4)
        blocks = pool.allocator.allocate_many(pool.num_blocks)
        cache = pool.sequence(tables=[blocks[g:g + 8] for g in range(0, len(blocks), 8)])
    else:
        cache = model.new_cache()
    model.prefill(np.arange(3), cache)
    reads = {}
    for pos in range(3, 30):
        with meter.Meter() as m:
            model.decode_step(pos % 50, cache)
        reads[pos] = m.steps[0].bytes["kv_read"]
        assert reads[pos] == kv_read_closed_form(c, pos, 4), pos
    full = 2 * c.n_kv_head * c.head_dim * 4 * c.layer_types.count("full_attention")
    assert reads[29] - reads[28] == full and reads[20] - reads[5] == 15 * full + (c.window - 6) * \
        2 * c.n_kv_head * c.head_dim * 4 * len(c.window_layers)


def test_a_sink_adds_one_logit_per_head_to_the_attention_count():
    """A sink is one more logit in each head's softmax: 5 FLOPs (max, subtract, exp, sum, normalise) a
    head and query, in every layer; nothing else in the step changes."""
    import copy
    model = minillm.load("tests/fixtures/w6/gptoss-tiny", kernels="numpy")
    plain = copy.copy(model)
    plain.specs = [replace(s, sinks=None) for s in model.specs]
    steps = []
    for m_ in (model, plain):
        _, cache = m_.prefill(np.arange(6))
        with meter.Meter() as m:
            m_.decode_step(3, cache)
        steps.append(m.steps[0])
    H, L = model.config.n_head, model.config.n_layer
    assert steps[0].ops["attention"]["flops"] - steps[1].ops["attention"]["flops"] == 5 * H * L
    assert steps[0].bytes == steps[1].bytes


@pytest.mark.parametrize("name", ["gemma3-tiny", "gptoss-tiny"])
def test_batch_invariant_rows_are_bit_identical_to_alone(name):
    """With the batch-invariant set (its attention kernel declines a window and sinks: NumPy's form,
    one sequence at a time), a sequence's logits in a step shared with others are its logits alone."""
    from minillm.errors import MiniLLMError
    from minillm.models import kernel_sets
    try:
        kernel_sets.spec("batch-invariant").check()
    except MiniLLMError:
        pytest.skip("batch-invariant cannot run here")
    model = minillm.load(f"tests/fixtures/w6/{name}", kernels="batch-invariant")
    rng = np.random.default_rng(3)
    ps = [rng.integers(0, 500, n) for n in (5, 13, 3)]
    alone = []
    for p in ps:
        logits, cache = model.prefill(p)
        alone.append([logits] + [model.decode_step(t, cache) for t in (7, 8, 9)])
    pool = PagedKVPool(model.config, sum(PagedKVPool.blocks_for_positions(model.config, len(p) + 3, 4)
                                         for p in ps), 4)
    caches = [pool.sequence() for _ in ps]
    for cache, p in zip(caches, ps):
        cache.reserve(len(p))
    rows = [[r] for r in model.step(list(zip(ps, caches)))]
    for t in (7, 8, 9):
        for cache in caches:
            cache.reserve(1)
        for i, r in enumerate(model.step([(np.array([t]), cache) for cache in caches])):
            rows[i].append(r)
    for got, want in zip(rows, alone):
        np.testing.assert_array_equal(np.array(got), np.array(want))


@settings(max_examples=8, deadline=None)
@given(configs(), st.integers(1, 24), st.sampled_from(["fused", "int8"]), st.integers(0, 2**31))
def test_every_kernel_set_equals_numpy(c, T, kernels, seed):
    """A random windowed model through another kernel set (its products, norms and rotations; NumPy's
    attention where its kernel declines the window or the sinks) gives NumPy's logits, cached and not."""
    from minillm.errors import MiniLLMError
    from minillm.models import kernel_sets
    try:
        kernel_sets.spec(kernels).check()
    except MiniLLMError:
        pytest.skip(f"{kernels} cannot run here")
    family = gemma3 if isinstance(c, gemma3.Gemma3Config) else gptoss
    t = family.random_params(c, seed=0, std=0.3, dtype=np.float32)
    ref = family.MODEL(c, t, Target.numpy(np.float32))
    other = family.MODEL(c, t, Target.resolve(kernels=kernels))
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, T)
    tol = 2e-2 if kernels == "int8" else 1e-4
    np.testing.assert_allclose(other.forward(ids), ref.forward(ids), rtol=0, atol=tol)


# -- blocks given back behind the window -------------------------------------------------------------------

def all_sliding(c):
    return replace(c, layer_types=("sliding_attention",) * c.n_layer)


@settings(max_examples=10, deadline=None)
@given(configs(), st.integers(1, 4), st.integers(1, 30), st.integers(0, 2**31))
def test_a_long_sequence_decodes_in_a_pool_the_size_of_its_window(c, block_size, extra, seed):
    """Every layer sliding: a sequence decodes far past what its pool could hold, the blocks behind
    the window going back as it moves (counted), with the tokens of a contiguous cache."""
    c = all_sliding(c)
    model, _ = build(c)
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, 3)
    T = c.window + 2 * block_size + extra
    want = minillm.generate(model, ids, T)
    blocks = -(-(c.window + 1) // block_size) + 1          # the window's positions and the one being written
    pool = PagedKVPool(c, blocks, block_size, np.float64)
    cache = pool.sequence()
    logits, _ = model.prefill(ids, cache)
    got = [int(np.argmax(logits))]
    for _ in range(T - 1):
        got.append(int(np.argmax(model.decode_step(got[-1], cache))))
    assert got == want
    assert pool.dropped == cache.dropped > 0 and cache.dropped == (cache.length - c.window + 1) // block_size
    assert pool.allocator.n_used == len(cache.table) - cache.dropped
    cache.free()
    assert pool.allocator.n_free == pool.num_blocks


@settings(max_examples=10, deadline=None)
@given(configs(), st.lists(st.tuples(st.lists(st.integers(0, 60), min_size=1, max_size=14), st.integers(1, 12)),
                           min_size=1, max_size=4),
       st.integers(1, 4), st.integers(1, 12), st.booleans())
def test_an_engine_gives_back_blocks_behind_the_window_and_the_tokens_do_not_change(c, reqs, block_size, budget,
                                                                                   prefix_cache):
    """Every layer sliding, in the engine (chunked prefill, batched decode, preemption, the prefix
    cache on or off, repeated prompts sharing blocks): every request's tokens are its tokens alone,
    and at the end every block is back in the pool."""
    from minillm.engine.engine import Engine
    c = all_sliding(c)
    model, _ = build(c)
    reqs = reqs + reqs[:1]                                   # a repeated prompt: the prefix cache shares it
    biggest = max(-(-(len(p) + n) // block_size) for p, n in reqs)
    engine = Engine(model, num_blocks=biggest + 2, block_size=block_size, max_batched_tokens=budget,
                    prefix_cache=prefix_cache)
    rs = [engine.add_request(p, n) for p, n in reqs]
    engine.run()
    for (p, n), r in zip(reqs, rs):
        assert r.output == minillm.generate(model, p, n)
    assert engine.pool.allocator.n_free == engine.pool.num_blocks


def test_a_global_layer_keeps_every_block_and_the_sliding_ones_give_theirs_back():
    """Gemma 3's fixture (5 sliding layers, then 1 global; window 8): six groups of one layer. After 30
    positions in blocks of 4 the global group holds all 8 of its blocks; each sliding group gave back
    the (30 - 8 + 1) // 4 = 5 wholly behind the next query's window and holds 3."""
    model = minillm.load("tests/fixtures/w6/gemma3-tiny", kernels="numpy")
    pool = PagedKVPool(model.config, 48, 4)
    assert [len(layers) for layers, _ in pool.groups] == [1] * 6 and pool.groups[0] == ((5,), None)
    cache = pool.sequence()
    model.prefill(np.arange(30), cache)
    assert cache.dropped == 5 and pool.dropped == 5 * 5
    assert cache.tables[0] == list(range(8)) and all(t[:5] == [-1] * 5 for t in cache.tables[1:])
    assert pool.allocator.n_used == cache.blocks_held() == 8 + 5 * 3


def test_going_back_behind_a_given_back_block_is_one_line():
    from minillm.errors import PromptError
    c = gemma3.Gemma3Config(n_layer=1, n_head=2, n_kv_head=1, head_dim=8, n_embd=16, n_ctx=64, vocab_size=61, ffn=8,
                            layer_types=("sliding_attention",), window=4)
    model, _ = build(c)
    cache = PagedKVPool(c, 16, 2, np.float64).sequence()
    model.prefill(np.arange(20), cache)
    assert cache.dropped == 8
    cache.truncate(19)                                       # the next query's window still in the blocks kept
    with pytest.raises(PromptError) as e:
        cache.truncate(10)
    assert "fell behind the sliding window" in str(e.value) and "\n" not in str(e.value)


# -- models that mix sliding and global layers: one block table per group ------------------------------------

@st.composite
def mixed_configs(draw):
    """A random config with both kinds of layer: Gemma 3's pattern (k sliding, then one global, over
    and over) or gpt-oss's (sliding and global alternating)."""
    c = draw(configs())
    if isinstance(c, gemma3.Gemma3Config):
        k = draw(st.integers(1, 5))
        L = draw(st.integers(k + 1, min(k + 3, 6)))
        kinds = tuple(KINDS[1] if (i + 1) % (k + 1) == 0 else KINDS[0] for i in range(L))
    else:
        L = draw(st.integers(2, 4))
        kinds = tuple(KINDS[i % 2] for i in range(L))
    return replace(c, n_layer=L, layer_types=kinds)


def group_counts(c) -> tuple[int, int]:
    """(global groups, sliding groups) of a config's pool."""
    windows = [w for _, w in layer_groups(c)]
    return windows.count(None), len(windows) - windows.count(None)


@settings(max_examples=12, deadline=None)
@given(mixed_configs(), st.integers(1, 4), st.integers(0, 20), st.integers(0, 2**31))
def test_mixed_layers_give_back_the_sliding_groups_blocks_and_the_logits_do_not_change(c, block_size, extra,
                                                                                       seed):
    """Sliding and global layers mixed: a sequence decodes far past its window in a paged pool, its
    sliding groups' blocks wholly behind the next query's window back in the pool (counted: that many
    per sliding group), its global groups' all kept, with the logits of a contiguous cache."""
    model, _ = build(c)
    rng = np.random.default_rng(seed)
    ids, ts = rng.integers(0, c.vocab_size, 3), rng.integers(0, c.vocab_size, c.window + 2 * block_size + extra)
    logits, ref = model.prefill(ids)
    want = [logits] + [model.decode_step(int(t), ref) for t in ts]
    pool = PagedKVPool(c, PagedKVPool.blocks_for_positions(c, ref.length, block_size), block_size, np.float64)
    cache = pool.sequence()
    logits, _ = model.prefill(ids, cache)
    got = [logits] + [model.decode_step(int(t), cache) for t in ts]
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=EXACT)
    n_global, n_sliding = group_counts(c)
    behind, nb = (cache.length - c.window + 1) // block_size, -(-cache.length // block_size)
    assert n_global >= 1 and n_sliding >= 1 and behind >= 2 and cache.dropped == behind
    assert pool.dropped == n_sliding * behind
    assert pool.allocator.n_used == cache.blocks_held() == n_global * nb + n_sliding * (nb - behind)
    for table, (_, window) in zip(cache.tables, pool.groups):
        assert len(table) == nb and (table[:behind] == [-1] * behind) == (window is not None)
    cache.free()
    assert pool.allocator.n_free == pool.num_blocks


@settings(max_examples=10, deadline=None)
@given(mixed_configs(), st.lists(st.tuples(st.lists(st.integers(0, 60), min_size=1, max_size=14),
                                           st.integers(1, 16)), min_size=1, max_size=3),
       st.integers(1, 4), st.integers(1, 12), st.booleans())
def test_an_engine_of_mixed_layers_gives_back_blocks_and_the_tokens_do_not_change(c, reqs, block_size, budget,
                                                                                 prefix_cache):
    """Sliding and global layers mixed, in the engine (chunked prefill, batched decode, preemption, the
    prefix cache on or off, a repeated prompt sharing every group's blocks): every request's greedy
    tokens are its tokens alone, the sliding groups gave blocks back wherever a request went a block
    past its window, and at the end every block is back in the pool."""
    reqs = reqs + reqs[:1]
    engine = run_engine_alone_equal(c, reqs, block_size, budget, prefix_cache)
    longest = max(len(p) + n - 1 for p, n in reqs)          # the positions the longest one cached
    assert (engine.pool.dropped > 0) == (longest >= c.window + block_size - 1)
    assert engine.pool.allocator.n_free == engine.pool.num_blocks


@settings(max_examples=8, deadline=None)
@given(mixed_configs(), st.integers(2, 3), st.integers(1, 4), st.integers(0, 2**31))
def test_giving_blocks_back_buys_capacity(c, B, block_size, seed):
    """B sequences decoding together, long past the window, in a pool smaller than their blocks with
    every group keeping every block: admitted at once, none preempted, every token as alone. (The
    pool holds each one's global groups' blocks and a window's blocks per sliding group.)"""
    from minillm.engine.engine import Engine
    model, _ = build(c)
    rng = np.random.default_rng(seed)
    prompts, n_new = [rng.integers(0, c.vocab_size, 2) for _ in range(B)], c.window + 4 * block_size
    n = 2 + n_new
    n_global, n_sliding = group_counts(c)
    kept = PagedKVPool.blocks_for_positions(c, n, block_size)          # one sequence, nothing given back
    live = n_global * -(-n // block_size) + n_sliding * (-(-c.window // block_size) + 2)
    num_blocks = max(B * live, kept)
    assert num_blocks < B * kept                                       # too small for all kept
    engine = Engine(model, num_blocks=num_blocks, block_size=block_size, max_batched_tokens=2 * B, max_seqs=B)
    rs = [engine.add_request(p, n_new) for p in prompts]
    engine.step()
    assert len(engine.scheduler.running) == B
    engine.run()
    assert engine.scheduler.preemptions == 0
    for p, r in zip(prompts, rs):
        assert r.output == minillm.generate(model, p, n_new)


def test_serve_says_what_a_block_holds_where_the_layers_form_groups():
    """`minillm serve`'s first line: a block of a pool of several groups is one group's layers."""
    from minillm.cli.serve import groups_note
    gemma = minillm.load("tests/fixtures/w6/gemma3-tiny", kernels="numpy").config
    gptoss_ = minillm.load("tests/fixtures/w6/gptoss-tiny", kernels="numpy").config
    assert groups_note(PagedKVPool(gemma, 6, 4)) == " (a block: one group's 1 layer, 6 groups)"
    assert groups_note(PagedKVPool(gptoss_, 6, 4)) == " (a block: one group's 2 layers, 2 groups)"
    assert groups_note(PagedKVPool(all_sliding(gemma), 6, 4)) == ""


@pytest.mark.parametrize("kernels", ["fused", "int8"])
def test_a_pool_of_groups_runs_its_global_layers_through_the_paged_kernel(kernels, monkeypatch):
    """Gemma 3's fixture (its global layer attends plainly) in a pool of six groups, three sequences
    decoding together past the window with a kernel set's paged kernel: the global layer's step reads
    its own group's blocks in place (the kernel called once a sequence and step), and every row is
    NumPy's alone in a contiguous cache."""
    from minillm.errors import MiniLLMError
    from minillm.models import kernel_sets, ops
    try:
        kernel_sets.spec(kernels).check()
    except MiniLLMError:
        pytest.skip(f"{kernels} cannot run here")
    calls = []
    paged = ops.paged_decode_attention
    monkeypatch.setattr(ops, "paged_decode_attention", lambda *a, **k: calls.append(1) or paged(*a, **k))
    ref = minillm.load("tests/fixtures/w6/gemma3-tiny", kernels="numpy")
    model = minillm.load("tests/fixtures/w6/gemma3-tiny", kernels=kernels)
    rng = np.random.default_rng(5)
    ps, ts = [rng.integers(0, 500, n) for n in (5, 13, 3)], rng.integers(0, 500, 14)
    alone = []
    for p in ps:
        logits, cache = ref.prefill(p)
        alone.append([logits] + [ref.decode_step(int(t), cache) for t in ts])
    pool = PagedKVPool(model.config, sum(PagedKVPool.blocks_for_positions(model.config, len(p) + 14, 4)
                                         for p in ps), 4)
    caches = [pool.sequence() for _ in ps]
    for cache, p in zip(caches, ps):
        cache.reserve(len(p))
    rows = [[r] for r in model.step(list(zip(ps, caches)))]
    for t in ts:
        for cache in caches:
            cache.reserve(1)
        for i, r in enumerate(model.step([(np.array([t]), cache) for cache in caches])):
            rows[i].append(r)
    assert len(calls) == 3 * len(ts) and pool.dropped > 0
    tol = 2e-2 if kernels == "int8" else 1e-4
    for got, want in zip(rows, alone):
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=tol)
