"""Qwen3.5's hybrid (models/qwen35.py) against transformers' fixtures, and its invariants on random
configs: layer patterns, heads, widths, convolution widths, chunk sizes.

The fixtures' float32 logits are transformers' float32 run; this model amplifies float32 rounding
(transformers' own float32 logits, rerun on another machine, moved by 5.6e-4, and its float32 is
3.8e-4 from the same math in float64). So the tight test is float64 against float64:
`expected_float64.npz` holds transformers' Qwen3.5 code run with its float32 casts promoted to
float64 (benchmarks/reference/qwen35_fixtures.py), and minillm in float64 must agree to 1e-9. In
float32 the logits agree within FLOAT32_ATOL and the greedy ids exactly, with and without the cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm import meter
from minillm.cache.paged import KVCacheFullError
from minillm.cache.state import HybridPagedPool, NoRollback
from minillm.errors import ConfigError, MiniLLMError, WeightsError
from minillm.models import deltanet, qwen35
from minillm.models.qwen35 import FULL, LINEAR, Qwen35, Qwen35Config, random_params
from minillm.models.target import Target

FIXTURES = Path(__file__).parent / "fixtures" / "w5"
NAMES = ("qwen35-tiny", "qwen35-bf16")       # bf16: another layer pattern, conv width 3, tied, rotary half
EXACT = 1e-9             # float64 against transformers' math in float64
FLOAT32_ATOL = 1e-3      # float32 against transformers' float32 (measured: 5.4e-4 and 1.5e-4)


def load(name, dtype=np.float32):
    return minillm.load(FIXTURES / name, dtype=dtype, kernels="numpy")


@pytest.fixture(scope="module", params=NAMES)
def fixture(request):
    path = FIXTURES / request.param
    e, x = np.load(path / "expected.npz"), np.load(path / "expected_float64.npz")
    return load(request.param), load(request.param, np.float64), e, x["logits"]


def test_fixture_float64_is_transformers_math(fixture):
    _, m64, e, exact = fixture
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(m64.forward(ids), exact, rtol=0, atol=EXACT)


def test_fixture_float64_cached_rows(fixture):
    """Prefill (the chunked form) then decode (the recurrent form) give the same rows."""
    _, m64, e, exact = fixture
    P = len(e["input_ids"])
    logits, cache = m64.prefill(e["input_ids"])
    np.testing.assert_allclose(logits, exact[P - 1], rtol=0, atol=EXACT)
    for i, t in enumerate(e["greedy_ids"]):
        np.testing.assert_allclose(m64.decode_step(int(t), cache), exact[P + i], rtol=0, atol=EXACT)


def test_fixture_float32_logits(fixture):
    m32, _, e, _ = fixture
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(m32.forward(ids), e["logits"], rtol=0, atol=FLOAT32_ATOL)


@pytest.mark.parametrize("kv_cache", [True, False])
def test_fixture_greedy_matches_transformers(fixture, kv_cache):
    m32, _, e, _ = fixture
    assert minillm.generate(m32, e["input_ids"], len(e["greedy_ids"]), kv_cache=kv_cache) == e["greedy_ids"].tolist()


def test_fixture_configs_read_as_written():
    a, b = load("qwen35-tiny").config, load("qwen35-bf16").config
    assert a.layer_types == (LINEAR, LINEAR, LINEAR, FULL) and a.full_layers == (3,)
    assert (a.conv_kernel, a.rotary_dim, a.lin_k_heads, a.lin_v_heads, a.lin_k_dim, a.lin_v_dim, a.tied) == \
        (4, 8, 2, 4, 16, 24, False)
    assert b.layer_types == (FULL, LINEAR, LINEAR, FULL, LINEAR) and b.linear_layers == (1, 2, 4)
    assert (b.conv_kernel, b.rotary_dim, b.lin_k_heads, b.lin_v_heads, b.tied, b.theta) == (3, 8, 1, 3, True, 1e5)
    for name in NAMES:
        m = load(name)
        assert m.n_params() == m.config.n_params() == sum(int(np.prod(s)) for _, s in qwen35.manifest(m.config)) \
            - (0 if m.config.tied else 0)


def copy_fixture(tmp_path, name="qwen35-tiny"):
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def edit_config(folder, drop=(), **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for k in drop:
        cfg.pop(k)
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_older_spellings_read_the_same(tmp_path):
    """No layer_types: every full_attention_interval-th layer is full; partial_rotary_factor at the top."""
    folder = copy_fixture(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg["rope_parameters"]
    edit_config(folder, drop=["layer_types"], full_attention_interval=4, partial_rotary_factor=rope.pop("partial_rotary_factor"),
                rope_parameters=rope)
    assert load("qwen35-tiny").config == minillm.load(folder).config


@pytest.mark.parametrize("change, words", [
    ({"layer_types": ["linear_attention", "sliding", "linear_attention", "full_attention"]}, "layer_types"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"attention_bias": True}, "attention_bias"),
    ({"linear_num_key_heads": 3}, "linear_num_key_heads must divide"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e7}}, "rope_type"),
    ({"linear_conv_kernel_dim": 0}, "conv_kernel"),
])
def test_bad_configs_are_one_line(tmp_path, change, words):
    folder = copy_fixture(tmp_path)
    edit_config(folder, **change)
    with pytest.raises((ConfigError, WeightsError)) as err:
        minillm.load(folder)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_fixed_state_refuses_to_go_back():
    m = load("qwen35-tiny")
    _, cache = m.prefill([1, 2, 3, 4])
    cache.truncate(4)                                   # staying put is fine
    with pytest.raises(NoRollback, match="cannot go back from 4 to 2"):
        cache.truncate(2)


# -- the two forms of the gated delta rule -------------------------------------------------------------

@st.composite
def delta_inputs(draw):
    H, n, dk, dv = draw(st.integers(1, 3)), draw(st.integers(1, 70)), draw(st.sampled_from([2, 4, 8])), \
        draw(st.sampled_from([1, 3, 8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    k = rng.standard_normal((H, n, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)                          # the model's keys are unit vectors
    q = rng.standard_normal((H, n, dk)) / np.sqrt(dk)
    v = rng.standard_normal((H, n, dv))
    g = -rng.uniform(0, draw(st.sampled_from([0.1, 2.0, 8.0])), (H, n))     # slow to fast forgetting
    beta = rng.uniform(0, 1, (H, n))
    S = rng.standard_normal((H, dk, dv)) * draw(st.sampled_from([0.0, 1.0]))
    return q, k, v, g, beta, S, draw(st.integers(1, 80))


@settings(max_examples=60, deadline=None)
@given(delta_inputs())
def test_chunked_equals_recurrent(inputs):
    q, k, v, g, beta, S, chunk = inputs
    o1, S1 = deltanet.delta_rule_recurrent(q, k, v, g, beta, S)
    o2, S2 = deltanet.delta_rule_chunked(q, k, v, g, beta, S, chunk)
    np.testing.assert_allclose(o2, o1, rtol=0, atol=1e-10)
    np.testing.assert_allclose(S2, S1, rtol=0, atol=1e-10)
    f = lambda a: a.astype(np.float32)
    o3, S3 = deltanet.delta_rule_chunked(*map(f, (q, k, v, g, beta, S)), chunk)
    assert o3.dtype == np.float32
    np.testing.assert_allclose(o3, o1, rtol=0, atol=2e-5 * max(1.0, np.abs(o1).max()))


@settings(max_examples=30, deadline=None)
@given(delta_inputs(), st.data())
def test_a_prompt_split_anywhere_carries_the_state(inputs, data):
    """Two calls, the state of the first handed to the second, equal one call: chunked prefill."""
    q, k, v, g, beta, S, chunk = inputs
    n = q.shape[1]
    cut = data.draw(st.integers(0, n))
    o, S_end = deltanet.delta_rule_chunked(q, k, v, g, beta, S, chunk)
    part = lambda a, s: a[:, s]
    oa, Sa = deltanet.delta_rule(*(part(a, slice(0, cut)) for a in (q, k, v, g, beta)), S, chunk) if cut else (o[:, :0], S)
    ob, Sb = deltanet.delta_rule(*(part(a, slice(cut, n)) for a in (q, k, v, g, beta)), Sa, chunk) if cut < n \
        else (o[:, :0], Sa)
    np.testing.assert_allclose(np.concatenate([oa, ob], axis=1), o, rtol=0, atol=1e-10)
    np.testing.assert_allclose(Sb, S_end, rtol=0, atol=1e-10)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 20), st.integers(0, 2**31))
def test_ut_inverse_inverts(C, seed):
    rng = np.random.default_rng(seed)
    A = np.tril(rng.uniform(-1, 1, (2, C, C)), -1)
    T = deltanet.ut_inverse(A)
    np.testing.assert_allclose((np.eye(C) + A) @ T, np.broadcast_to(np.eye(C), A.shape), atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 12), st.integers(0, 12), st.integers(0, 2**31))
def test_convolution_in_pieces_carries_its_window(K, n, cut, seed):
    rng = np.random.default_rng(seed)
    cut = min(cut, n)
    x, w = rng.standard_normal((n, 6)), rng.standard_normal((K, 6))
    zero = np.zeros((K - 1, 6))
    y, window = deltanet.causal_conv(x, zero, w)
    ya, wa = deltanet.causal_conv(x[:cut], zero, w)
    yb, wb = deltanet.causal_conv(x[cut:], wa, w)
    np.testing.assert_allclose(np.concatenate([ya, yb]), y, atol=1e-12)
    np.testing.assert_array_equal(wb, window)
    padded = np.concatenate([zero, x])                                   # the definition, one output at a time
    direct = np.array([(padded[t:t + K] * w).sum(0) for t in range(n)])
    np.testing.assert_allclose(y, direct / (1 + np.exp(-direct)), atol=1e-12)


# -- random configs -------------------------------------------------------------------------------------

@st.composite
def configs(draw):
    L = draw(st.integers(1, 4))
    types = tuple(draw(st.lists(st.sampled_from([LINEAR, FULL]), min_size=L, max_size=L)))
    n_kv = draw(st.sampled_from([1, 2]))
    hd = draw(st.sampled_from([8, 16]))
    Hk = draw(st.sampled_from([1, 2]))
    return Qwen35Config(n_layer=L, n_head=n_kv * draw(st.sampled_from([1, 2])), n_kv_head=n_kv, head_dim=hd,
                        n_embd=draw(st.sampled_from([16, 32])), n_ctx=96, vocab_size=97, ffn=24, layer_types=types,
                        lin_k_heads=Hk, lin_v_heads=Hk * draw(st.sampled_from([1, 2])),
                        lin_k_dim=draw(st.sampled_from([4, 8])), lin_v_dim=draw(st.sampled_from([4, 6])),
                        conv_kernel=draw(st.integers(1, 5)), rotary_dim=draw(st.sampled_from([2, hd // 2, hd])),
                        theta=draw(st.sampled_from([1e4, 1e7])), tied=draw(st.booleans()))


def build(c, dtype=np.float64, seed=0):
    return Qwen35(c, random_params(c, seed=seed, std=0.3, dtype=np.float64), Target.numpy(dtype))


@settings(max_examples=25, deadline=None)
@given(configs(), st.integers(1, 40), st.integers(2, 40), st.integers(0, 2**31))
def test_model_chunk_size_changes_nothing(c, chunk, n, seed):
    model = build(c)
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, n)
    ref = model.forward(ids)
    model.chunk = chunk
    np.testing.assert_allclose(model.forward(ids), ref, rtol=0, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(configs(), st.integers(1, 30), st.integers(1, 12), st.integers(0, 2**31))
def test_cached_equals_naive(c, P, N, seed):
    """A prefill (chunked form) and N decode steps (recurrent form) give the rows of one cache-less pass."""
    model = build(c)
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, P + N)
    ref = model.forward(ids)
    logits, cache = model.prefill(ids[:P])
    rows = [logits] + [model.decode_step(int(t), cache) for t in ids[P:]]
    np.testing.assert_allclose(np.array(rows), ref[P - 1:], rtol=0, atol=1e-9)


@settings(max_examples=20, deadline=None)
@given(configs(), st.lists(st.integers(1, 9), min_size=1, max_size=4), st.integers(0, 2**31))
def test_prefill_in_chunks_equals_whole(c, sizes, seed):
    model = build(c)
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, sum(sizes))
    whole, _ = model.prefill(ids)
    cache, i = model.new_cache(), 0
    for s in sizes:
        logits, cache = model.prefill(ids[i:i + s], cache)
        i += s
    np.testing.assert_allclose(logits, whole, rtol=0, atol=1e-9)


def test_decode_step_reads_and_writes_each_state_once():
    """A decode step: each linear layer's state read once and written once (kv_read / kv_write),
    and the full layers' KV of every position so far (read) and of the new one (written)."""
    model = load("qwen35-tiny")
    c = model.config
    _, cache = model.prefill(np.arange(10))
    with meter.Meter() as m:
        model.decode_step(3, cache)
    (r,) = m.steps
    kv = c.kv_bytes_per_token(4)
    assert r.bytes["kv_read"] == c.state_bytes(4) + 11 * kv
    assert r.bytes["kv_write"] == c.state_bytes(4) + kv
    assert r.bytes["weights"] == model.step_weight_bytes(1)


# -- paged, batched -------------------------------------------------------------------------------------

def paged_pool(model, sequences=8, block_size=4, positions=64):
    """Room for `sequences` states and `positions` positions."""
    probe = HybridPagedPool(model.config, 1, block_size, model.dtype)
    return HybridPagedPool(model.config, sequences * probe.state_blocks + -(-positions // block_size), block_size,
                           model.dtype)


def run_alone(model, cache, prompt, tokens):
    cache.reserve(len(prompt))
    rows = [model.step([(np.asarray(prompt), cache)])[0]]
    for t in tokens:
        cache.reserve(1)
        rows.append(model.step([(np.array([t]), cache)])[0])
    return np.array(rows)


@settings(max_examples=20, deadline=None)
@given(configs(), st.lists(st.integers(1, 12), min_size=1, max_size=4), st.integers(1, 6), st.integers(0, 2**31))
def test_paged_and_batched_equal_contiguous_and_alone(c, prompts, steps, seed):
    """B sequences in one paged pool, prefilled together and decoded together (one step for all: the
    full layers' batched gather, each linear layer's states read and written one sequence at a time),
    give each sequence's rows run alone in a contiguous cache."""
    model = build(c)
    rng = np.random.default_rng(seed)
    ps = [rng.integers(0, c.vocab_size, n) for n in prompts]
    ts = rng.integers(0, c.vocab_size, (len(ps), steps))
    alone = [run_alone(model, model.new_cache(), p, t) for p, t in zip(ps, ts)]
    pool = paged_pool(model, len(ps), positions=sum(len(p) + steps + 4 for p in ps))
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
        np.testing.assert_allclose(np.array(got), want, rtol=0, atol=1e-9)
    for cache in caches:
        cache.free()
    assert pool.states.n_free == pool.states.slots and pool.allocator.n_free == pool.num_blocks


def test_a_pool_without_state_slots_is_refused():
    model = load("qwen35-tiny")
    from minillm.cache.paged import PagedKVPool
    cache = PagedKVPool(model.config.attention(), 8, 4).sequence()
    cache.reserve(3)
    with pytest.raises(MiniLLMError, match="no slot for one"):
        model.step([(np.array([1, 2, 3]), cache)])


def test_a_static_step_refuses_a_hybrid_in_one_line():
    """A plan kind that carries no state (the static decode step) refuses a hybrid before it runs,
    and its `states` refuses too: the linear layers never run on a plan that cannot feed them."""
    from minillm.models.plan import NoStaticState, StaticPlan
    model = load("qwen35-tiny")
    pool = paged_pool(model, sequences=2)
    table, ids, pos = np.zeros((2, 2), dtype=np.intp), np.zeros(2, dtype=np.intp), np.zeros(2, dtype=np.intp)
    with pytest.raises(NoStaticState, match="no per-sequence state") as e:
        model.static_plan(pool, table, ids, pos)
    assert "\n" not in str(e.value)
    plan = StaticPlan(pool, table, ids, pos, model.kernel_set)
    with pytest.raises(NoStaticState, match="eager steps"):
        plan.states(0)


def test_a_state_is_paid_in_blocks_of_the_same_pool():
    """One budget: a sequence takes ⌈state ÷ block⌉ blocks for its state at once, and blocks for its
    positions as it grows; when they are not free it is refused in one line, taking nothing."""
    model = load("qwen35-tiny")
    c = model.config
    block = HybridPagedPool.block_nbytes_for(c.attention(), 16)
    pool = HybridPagedPool.from_memory(c, 2 * c.state_bytes(4) + 10 * block, 16)
    assert pool.state_blocks == -(-c.state_bytes(4) // block) and pool.num_blocks == (2 * c.state_bytes(4)) // block + 10
    a = pool.sequence()
    assert pool.allocator.n_free == pool.num_blocks - pool.state_blocks
    b = pool.sequence()
    b.reserve(pool.allocator.n_free * 16)
    with pytest.raises(KVCacheFullError):
        pool.sequence()
    assert pool.allocator.n_free == 0
    slot = a.state.slot
    a.free()
    assert a.state is None and pool.allocator.n_free == pool.state_blocks and pool.sequence().state.slot == slot
    with pytest.raises(MiniLLMError, match="holds no sequence"):
        HybridPagedPool.from_memory(c, c.state_bytes(4), 16)


def test_a_fork_copies_the_state_into_its_own_slot():
    model = load("qwen35-tiny")
    pool = paged_pool(model, 3)
    a = pool.sequence()
    run_alone(model, a, [1, 2, 3, 4, 5], [6])
    b = a.fork()
    assert b.state.slot != a.state.slot and b.length == a.length == 6
    rows = [model.step([(np.array([7]), cache)])[0] for cache in (a, b) if cache.reserve(1) is None]
    np.testing.assert_array_equal(rows[0], rows[1])
    a.free(), b.free()
    assert pool.allocator.n_free == pool.num_blocks


# -- the context sweep (minillm/measure/contexts.py) -----------------------------------------------------

def test_context_sweep_counts_a_fixed_state_and_a_growing_kv():
    from minillm.measure.contexts import run_context_sweep
    tiny = dict(n_layer=4, n_head=2, n_kv_head=1, head_dim=8, n_embd=16, n_ctx=128, vocab_size=50, ffn=16,
                lin_k_heads=1, lin_v_heads=2, lin_k_dim=4, lin_v_dim=4)
    h = qwen35.random(Qwen35Config(**tiny, layer_types=(LINEAR, LINEAR, LINEAR, FULL)), name="h")
    f = qwen35.random(Qwen35Config(**tiny, layer_types=(FULL,) * 4), name="f")
    r = run_context_sweep([h, f], (40, 8), repeats=2, steps=1)
    rows = {(x["model"], x["context"]): x for x in r["rows"]}
    assert r["contexts"] == [8, 40] and len(rows) == 4
    for m in (h, f):
        c = m.config
        for T in (8, 40):
            want = qwen35.decode_step_bytes(c, T)
            assert rows[(m.name, T)]["state"] == want["state"]
            assert rows[(m.name, T)]["kv"] == want["kv"]
            assert rows[(m.name, T)]["weights"] == want["weights"]
    assert rows[("h", 40)]["state"] == rows[("h", 8)]["state"] > 0 == rows[("f", 8)]["state"]
    with pytest.raises(MiniLLMError, match="sweep goes up to 125"):
        run_context_sweep([h], (126,), repeats=1, steps=2)


@pytest.mark.parametrize("a, b, found", [([3, 2, 1], [1, 2, 3], 1000), ([3, 1, 1], [2, 2, 2], 100),
                                         ([1, 1, 3], [2, 2, 2], None), ([1, 1, 1], [2, 2, 2], 10)])
def test_crossover_is_where_a_stays_below_b(a, b, found):
    from minillm.measure.contexts import crossover
    rows = [{"model": m, "context": T, "ms": v} for m, vs in (("a", a), ("b", b)) for T, v in zip((10, 100, 1000), vs)]
    assert crossover(rows, "a", "b") == found


def test_a_model_with_no_full_layer_runs_paged_with_blocks_of_no_bytes():
    c = Qwen35Config(n_layer=2, n_head=2, n_kv_head=1, head_dim=8, n_embd=16, n_ctx=40, vocab_size=50, ffn=16,
                     layer_types=(LINEAR, LINEAR), lin_k_heads=1, lin_v_heads=1, lin_k_dim=4, lin_v_dim=4)
    model = build(c)
    pool = HybridPagedPool.from_memory(c, 3 * c.state_bytes(8), 16, model.dtype)
    assert pool.num_blocks == 3 * 4 and pool.block_nbytes == 0 and c.kv_bytes_per_token() == 0
    assert pool.state_blocks == 1 and pool.states.slots == 3          # one per sequence that can run
    ids = np.arange(20) % 50
    cache = pool.sequence()
    np.testing.assert_allclose(run_alone(model, cache, ids[:10], ids[10:])[-1], model.forward(ids)[-1], atol=1e-9)


# -- in the engine: the block manager admits by blocks and state slots -------------------------------

@st.composite
def workloads(draw):
    c = draw(configs())
    reqs = []
    for _ in range(draw(st.integers(1, 6))):
        prompt = draw(st.lists(st.integers(0, c.vocab_size - 1), min_size=1, max_size=20))
        reqs.append((prompt, draw(st.integers(1, 6)), draw(st.floats(0, 0.05))))
    return c, draw(st.integers(0, 2**16)), reqs, draw(st.sampled_from([None, 0.9]))


@settings(max_examples=40, deadline=None)
@given(workloads(), st.sampled_from(["continuous", "static", "sequential"]), st.integers(1, 6),
       st.integers(1, 12), st.sampled_from([0, 1, 4]), st.integers(1, 4))
def test_engine_gives_every_request_its_tokens_alone(w, policy, block_size, budget, spare, max_seqs):
    """Random hybrids and workloads: chunked prefill (budgets down to one token a step), batched and
    continuous decode, pools so small that sequences are preempted and recomputed. Every request's
    tokens equal `minillm.generate` alone; at the end every block and every state slot is free."""
    from minillm.engine.engine import Engine
    from minillm.engine.sequence import SamplingParams
    c, seed, reqs, temperature = w
    model = build(c, seed=seed)
    biggest = max(-(-(len(p) + n) // block_size) for p, n, _ in reqs)
    state = HybridPagedPool(c, 1, block_size).state_blocks
    engine = Engine(model, num_blocks=biggest + state + spare, block_size=block_size, policy=policy, max_seqs=max_seqs,
                    max_batched_tokens=budget)
    sampling = lambda i: SamplingParams() if temperature is None else SamplingParams(temperature=temperature,
                                                                                    seed=100 + i)
    rs = [engine.add_request(p, n, sampling(i), arrival=t) for i, (p, n, t) in enumerate(reqs)]
    engine.run()
    for i, ((prompt, n, _), r) in enumerate(zip(reqs, rs)):
        s = sampling(i)
        assert r.output == minillm.generate(model, prompt, n, temperature=s.temperature, seed=s.seed), i
    pool = engine.pool
    assert pool.allocator.n_free == pool.num_blocks and pool.states.n_free == pool.states.slots
    assert engine.blocks.hit_tokens == 0


def test_engine_refuses_the_prefix_cache_for_a_hybrid_in_one_line():
    from minillm.engine.engine import Engine
    with pytest.raises(MiniLLMError) as e:
        Engine(load("qwen35-tiny"), num_blocks=16, prefix_cache=True)
    assert "prefix" in str(e.value) and "\n" not in str(e.value)


# -- shapes and capacity (minillm/measure/shapes.py) -------------------------------------------------

def test_a_hybrid_shape_counts_its_state_and_its_full_layers_kv():
    from minillm.measure.shapes import HYBRID_SHAPES, capacity, decode_step_bytes, kv_bytes_per_sequence, shape
    import math
    s, c = shape("qwen3.5-27b"), HYBRID_SHAPES["qwen3.5-27b"]
    assert (s["kv_layers"], s["linear_layers"]) == (16, 48) and round(s["n_params"] / 1e9) == 27
    conv, ssm = (48 * math.prod(v) for v in c.state_shapes().values())
    held = conv * 2 + ssm * 4                      # E23: the delta rule's matrices in float32, as released
    assert kv_bytes_per_sequence(s, 32768, 2) == 32768 * c.kv_bytes_per_token(2) + held
    step = decode_step_bytes(s, 1000, 2)
    assert step["state"] == 2 * held and step["kv"] == 1000 * c.kv_bytes_per_token(2)
    cap = capacity(s, 32768, 80e9)
    per = 32768 * c.kv_bytes_per_token(2) + held
    assert cap["sequences"] == int((72e9 - c.n_params() * 2) // per) and cap["state_bytes_per_sequence"] == held
    every = {**s, "kv_layers": 64, "state_values": 0}              # the same layers, all full attention
    assert capacity(every, 32768, 80e9)["sequences"] < cap["sequences"]


def test_hardware_shape_gives_a_hybrids_state(capsys):
    from minillm.cli import main
    assert main(["hardware", "--shape", "qwen3.5-27b", "--fit", "32768", "--memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "only 16 of the 64 layers keep K and V" in out and "153.9 MB at any" in out     # E23: float32
    assert "fixed state of 0.154 GB" in out and "that fit in 80GB: 7" in out


def test_a_request_whose_state_and_positions_never_fit_is_refused_at_once():
    from minillm.engine.engine import Engine
    model = load("qwen35-tiny")
    state = HybridPagedPool(model.config, 1, 4).state_blocks
    engine = Engine(model, num_blocks=state + 2, block_size=4)
    engine.add_request(list(range(5)), 3)                               # 2 blocks of positions: fits
    with pytest.raises(MiniLLMError, match=f"needs {state + 3} KV blocks \\(its state's included\\), the pool has "
                                           f"{state + 2}"):
        engine.add_request(list(range(9)), 3)
    assert [len(r.output) for r in engine.run()] == [3]


def test_the_block_manager_admits_by_positions_and_state_together():
    from minillm.engine.block_manager import BlockManager
    from minillm.engine.sequence import Sequence
    model = load("qwen35-tiny")
    s = HybridPagedPool(model.config, 1, 4).state_blocks
    bm = BlockManager(HybridPagedPool(model.config, s + 2 + s + 1, 4))
    a, b = Sequence(np.arange(8), 4), Sequence(np.arange(8), 4)
    assert bm.blocks_to_admit(a, bm.match(a)) == 2 + s and bm.can_admit(a, bm.match(a))
    bm.admit(a, bm.match(a))
    assert bm.n_free == s + 1 and not bm.can_admit(b, bm.match(b))    # its positions' blocks alone would be free
    with pytest.raises(KVCacheFullError):
        bm.admit(b, bm.match(b))
    assert bm.n_free == s + 1 and b.cache is None                       # refused whole: nothing taken
    bm.free(a)
    assert bm.n_free == bm.num_blocks and bm.pool.states.n_free == bm.pool.states.slots


def test_bench_context_sweep_prints_the_sweep_and_names_the_crossovers(monkeypatch, capsys):
    import json as _json
    from minillm.cli import bench_modes            # the context sweep's mode loads its models
    from minillm.cli import main
    tiny = dict(n_layer=4, n_head=2, n_kv_head=1, head_dim=8, n_embd=16, n_ctx=256, vocab_size=50, ffn=16,
                lin_k_heads=1, lin_v_heads=2, lin_k_dim=4, lin_v_dim=4)
    presets = {"h": Qwen35Config(**tiny, layer_types=(LINEAR, LINEAR, LINEAR, FULL)),
               "f": Qwen35Config(**tiny, layer_types=(FULL,) * 4)}
    monkeypatch.setattr(bench_modes, "load", lambda n, kernels=None: qwen35.random(presets[n], name=n))
    args = ["bench", "--context-sweep", "--model", "h,f", "--contexts", "8,64,200", "--repeats", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "1: h, weights" in out and "2: f, weights" in out and "h's step" in out
    assert main(args + ["--json"]) == 0
    r = _json.loads(capsys.readouterr().out)
    rows = {(x["model"], x["context"]): x for x in r["rows"]}
    assert r["crossover_bytes"] == min(T for T in (8, 64, 200) if all(
        rows[("h", U)]["moved"] < rows[("f", U)]["moved"] for U in (8, 64, 200) if U >= T))
    assert main(["bench", "--context-sweep", "--batch", "1,2"]) == 1
    assert "leave out --batch" in capsys.readouterr().err


def test_lesson_19s_claims_fail_when_the_meter_misses_the_state(monkeypatch, capsys):
    import importlib
    from minillm.cache import state as state_module
    lesson = importlib.import_module("minillm.lessons.19_state")
    original = state_module.State.read
    monkeypatch.setattr(state_module.State, "read",
                        lambda self, layer: tuple(a[self.slot, layer] for a in self.pool.arrays.values()))
    assert lesson.main(["--fast", "--no-pause"]) == 1
    assert "did not hold" in capsys.readouterr().out
    monkeypatch.setattr(state_module.State, "read", original)


# -- the other kernel sets ----------------------------------------------------------------------------

def usable(kernels):
    from minillm.models import kernel_sets
    try:
        kernel_sets.spec(kernels).check()
    except MiniLLMError:
        return False
    return True


@pytest.mark.parametrize("kernels", ["fused", "batch-invariant"])
def test_the_fixture_through_another_kernel_set(kernels):
    if not usable(kernels):
        pytest.skip(f"{kernels} cannot run here")
    e = np.load(FIXTURES / "qwen35-tiny" / "expected.npz")
    model = minillm.load(FIXTURES / "qwen35-tiny", kernels=kernels)
    assert model.kernels == kernels
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(model.forward(ids), e["logits"], rtol=0, atol=FLOAT32_ATOL)
    assert minillm.generate(model, e["input_ids"], len(e["greedy_ids"])) == e["greedy_ids"].tolist()


def test_batch_invariant_rows_are_bit_identical_to_alone():
    """With the batch-invariant set, a sequence's logits in a step shared with others, prefill and
    decode, are its logits alone, bit for bit (the linear layers run each sequence on its own state)."""
    if not usable("batch-invariant"):
        pytest.skip("batch-invariant cannot run here")
    model = minillm.load(FIXTURES / "qwen35-tiny", kernels="batch-invariant")
    rng = np.random.default_rng(3)
    ps = [rng.integers(0, 700, n) for n in (5, 9, 3)]
    alone = [run_alone(model, model.new_cache(), p, [7, 8]) for p in ps]
    pool = paged_pool(model, 3, positions=64)
    caches = [pool.sequence() for _ in ps]
    for cache, p in zip(caches, ps):
        cache.reserve(len(p))
    rows = [[r] for r in model.step(list(zip(ps, caches)))]
    for t in (7, 8):
        for cache in caches:
            cache.reserve(1)
        for i, r in enumerate(model.step([(np.array([t]), cache) for cache in caches])):
            rows[i].append(r)
    for got, want in zip(rows, alone):
        np.testing.assert_array_equal(np.array(got), want)
