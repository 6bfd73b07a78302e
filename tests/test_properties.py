"""Properties of the engine on random small GPT-2s: the three entry points agree, the two decode
loops agree, the context limit is exact, dtypes are kept, the KV cache is allocated once, and the
sampler does what it says.

The models are random but not gentle: weights with std 0.1-0.5 (GPT-2 uses 0.02, which makes
logits nearly flat, so a bug could hide in the noise), and random layer-norm gains and biases
everywhere (random_params makes them 1 and 0, which would hide a swapped or missing bias).

Tolerance for the float64 comparisons: |a - b| <= 1e-9 * max(1, max|logits|).
forward, prefill and decode_step compute the same sums in a different order (one [T, T] masked
score matrix vs one query row against the cache; different matmul shapes and so different BLAS
blocking), so in float64 they differ by rounding alone: measured on 150 such models at n_ctx 64,
at most 5e-15 of the logit scale. 1e-9 is 10^5 times that, and 10^6 times smaller than what any
real bug does here (a wrong position, a cache slot off by one, a leaky mask: 1e-3 to 10).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minillm
from minillm.models import ops
from minillm.models.gpt2 import random_params
from minillm.models.gpt2 import GPT2Config
from minillm.errors import MiniLLMError, PromptError
from minillm.engine.sampling import check_sampling, sample

REL_TOL = 1e-9


def assert_logits_close(actual, expected, scale, what=""):
    assert actual.shape == expected.shape, what
    np.testing.assert_allclose(actual, expected, rtol=0, atol=REL_TOL * max(1.0, scale), err_msg=what)


def random_model(config: GPT2Config, seed: int, std: float = 0.3, dtype=np.float64) -> minillm.GPT2:
    """random_params, plus random layer-norm gains (around 1) and biases (around 0)."""
    params = random_params(config, seed=seed, std=std, dtype=dtype)
    rng = np.random.default_rng(seed + 1)
    for name, p in params.items():
        if name.endswith(".bias"):
            p[...] = 0.3 * rng.standard_normal(p.shape)
        elif "ln_" in name:                       # ln_1, ln_2, ln_f gains
            p[...] = 1.0 + 0.3 * rng.standard_normal(p.shape)
    return minillm.GPT2(config, params)


@st.composite
def configs(draw, min_ctx: int = 1) -> GPT2Config:
    n_head = draw(st.integers(1, 4))
    return GPT2Config(
        n_layer=draw(st.integers(1, 3)),
        n_head=n_head,
        n_embd=n_head * draw(st.integers(4, 16)),
        n_ctx=draw(st.integers(min_ctx, 64)),
        vocab_size=draw(st.integers(50, 300)),
    )


@st.composite
def models(draw, min_ctx: int = 1) -> minillm.GPT2:
    return random_model(draw(configs(min_ctx)), seed=draw(st.integers(0, 2**32 - 2)),
                        std=draw(st.floats(0.1, 0.5)))


def token_lists(model: minillm.GPT2, min_size: int = 1, max_size: int | None = None):
    c = model.config
    return st.lists(st.integers(0, c.vocab_size - 1), min_size=min_size,
                    max_size=c.n_ctx if max_size is None else max_size)


# -- (a) forward, prefill and decode_step agree ------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(model=models(), data=st.data())
def test_prefill_then_decode_steps_match_forward(model, data):
    ids = data.draw(token_lists(model), label="ids")
    n_prompt = data.draw(st.integers(1, len(ids)), label="n_prompt")
    full = model.forward(ids)                                                   # [T, V]
    scale = float(np.abs(full).max())

    logits, cache = model.prefill(ids[:n_prompt])
    assert_logits_close(logits, model.forward(ids[:n_prompt])[-1], scale, "prefill vs forward")
    assert_logits_close(logits, full[n_prompt - 1], scale, "prefill vs the full forward's row")
    for t in range(n_prompt, len(ids)):
        logits = model.decode_step(ids[t], cache)
        assert cache.length == t + 1
        assert_logits_close(logits, model.forward(ids[:t + 1])[-1], scale, f"decode at {t} vs forward")
        assert_logits_close(logits, full[t], scale, f"decode at {t} vs the full forward's row")


@settings(max_examples=20, deadline=None)
@given(model=models(), data=st.data())
def test_prefill_in_chunks_matches_forward(model, data):
    """prefill into a cache that already holds positions (the mask must be offset by them)."""
    ids = data.draw(token_lists(model), label="ids")
    cuts = sorted(data.draw(st.lists(st.integers(1, len(ids)), max_size=3), label="cuts"))
    full = model.forward(ids)
    scale = float(np.abs(full).max())
    cache = model.new_cache()
    for start, stop in zip([0, *cuts], [*cuts, len(ids)]):
        if start == stop:
            continue
        logits, cache2 = model.prefill(ids[start:stop], cache)
        assert cache2 is cache and cache.length == stop
        assert_logits_close(logits, full[stop - 1], scale, f"chunk {start}:{stop}")


@settings(max_examples=20, deadline=None)
@given(model=models(), data=st.data())
def test_forward_last_only_is_the_last_row(model, data):
    ids = data.draw(token_lists(model), label="ids")
    full = model.forward(ids)
    last = model.forward(ids, last_only=True)
    assert last.shape == (1, model.config.vocab_size)
    assert_logits_close(last[0], full[-1], float(np.abs(full).max()))


# -- (b) the naive and the cached loop pick the same tokens ------------------------------------------

sampling_options = st.one_of(
    st.just({"temperature": 0.0}),
    st.fixed_dictionaries({
        "temperature": st.floats(0.2, 2.0),
        "top_k": st.none() | st.integers(1, 320),
        "top_p": st.none() | st.floats(0.05, 1.0),
        "seed": st.integers(0, 2**32 - 1),
    }),
)


@settings(max_examples=50, deadline=None)
@given(model=models(min_ctx=2), options=sampling_options, data=st.data())
def test_naive_and_cached_generate_pick_the_same_tokens(model, options, data):
    n_ctx = model.config.n_ctx
    prompt = data.draw(token_lists(model, max_size=n_ctx - 1), label="prompt")
    n_new = data.draw(st.integers(1, n_ctx - len(prompt)), label="n_new")
    cached = minillm.generate(model, prompt, n_new, kv_cache=True, **options)
    naive = minillm.generate(model, prompt, n_new, kv_cache=False, **options)
    assert len(cached) == n_new
    assert cached == naive
    assert all(0 <= t < model.config.vocab_size for t in cached)


def test_same_seed_same_tokens_and_another_seed_differs():
    model = random_model(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=40, vocab_size=100), seed=3)
    options = {"temperature": 1.0, "top_k": 50, "top_p": 0.95}
    a = minillm.generate(model, [1, 2, 3], 30, seed=7, **options)
    assert a == minillm.generate(model, [1, 2, 3], 30, seed=7, **options)
    assert a != minillm.generate(model, [1, 2, 3], 30, seed=8, **options)   # 30 draws: not a coin flip


# -- (c) the context limit is exact ------------------------------------------------------------------


def mentions(message: str, n: int) -> bool:
    return re.search(rf"(?<!\d){n}(?!\d)", message) is not None


@settings(max_examples=15, deadline=None)
@given(model=models(), data=st.data())
def test_exactly_n_ctx_tokens_fit_and_one_more_is_a_prompt_error(model, data):
    n_ctx = model.config.n_ctx
    ids = data.draw(token_lists(model, min_size=n_ctx + 1, max_size=n_ctx + 1), label="ids")

    assert model.forward(ids[:n_ctx]).shape == (n_ctx, model.config.vocab_size)
    _, cache = model.prefill(ids[:n_ctx])
    assert cache.length == n_ctx
    with pytest.raises(PromptError):
        model.decode_step(ids[-1], cache)                 # the cache is full
    assert cache.length == n_ctx

    for entry in (model.forward, model.prefill):
        with pytest.raises(PromptError, match="fit") as e:
            entry(ids)
        assert mentions(str(e.value), n_ctx), f"the message should say {n_ctx} fit: {e.value}"


@settings(max_examples=15, deadline=None)
@given(model=models(min_ctx=2), data=st.data())
def test_prefill_into_a_partly_filled_cache_says_how_many_more_fit(model, data):
    n_ctx = model.config.n_ctx
    held = data.draw(st.integers(1, n_ctx - 1), label="held")
    _, cache = model.prefill([0] * held)
    with pytest.raises(PromptError, match="fit") as e:
        model.prefill([0] * (n_ctx - held + 1), cache)
    assert mentions(str(e.value), n_ctx - held), f"the message should say {n_ctx - held} fit: {e.value}"
    assert cache.length == held                           # nothing was written
    model.prefill([0] * (n_ctx - held), cache)            # exactly the room left works
    assert cache.length == n_ctx


@pytest.mark.parametrize("kv_cache", [True, False])
def test_generate_fills_the_context_exactly_and_one_more_fails_before_any_work(kv_cache, monkeypatch):
    model = random_model(GPT2Config(n_layer=1, n_head=2, n_embd=8, n_ctx=12, vocab_size=60), seed=0)
    prompt = [5, 6, 7, 8]
    assert len(minillm.generate(model, prompt, 8, kv_cache=kv_cache)) == 8    # 4 + 8 == n_ctx

    def no_work(*args, **kwargs):
        raise AssertionError("generate ran the model before checking the context")

    for entry in ("forward", "prefill", "decode_step"):
        monkeypatch.setattr(model, entry, no_work)
    chosen = []
    with pytest.raises(PromptError, match="fit") as e:
        minillm.generate(model, prompt, 9, kv_cache=kv_cache, on_token=chosen.append)
    assert mentions(str(e.value), 8), f"the message should say 8 new tokens fit: {e.value}"
    assert chosen == []


# -- dtypes and the cache's memory -------------------------------------------------------------------

OPS = ("embedding", "layer_norm", "linear", "gelu", "add", "softmax", "attention", "lm_head")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_operation_computes_in_the_model_dtype(dtype, monkeypatch):
    """No silent float64 in a float32 model (picoGPT's np.tri bug), checked at every operation."""
    seen: dict[str, set] = {}

    def watch(name, fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            seen.setdefault(name, set()).add(out.dtype)
            return out
        return wrapped

    for name in OPS:
        monkeypatch.setattr(ops, name, watch(name, getattr(ops, name)))
    model = random_model(GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=20, vocab_size=64), seed=1, dtype=dtype)
    assert model.dtype == dtype

    assert model.forward([1, 2, 3]).dtype == dtype
    logits, cache = model.prefill([1, 2, 3])
    assert logits.dtype == dtype
    assert cache.k.dtype == dtype and cache.v.dtype == dtype
    assert model.decode_step(4, cache).dtype == dtype
    minillm.generate(model, [1, 2], 5, kv_cache=True, temperature=0.8, seed=0)
    minillm.generate(model, [1, 2], 5, kv_cache=False, temperature=0.8, seed=0)

    assert set(seen) == set(OPS), "every operation should have run"
    assert {name: dts for name, dts in seen.items() if dts != {np.dtype(dtype)}} == {}


def test_kv_cache_is_allocated_once_and_written_in_place():
    config = GPT2Config(n_layer=3, n_head=2, n_embd=12, n_ctx=24, vocab_size=50)
    model = random_model(config, seed=2, dtype=np.float32)
    _, cache = model.prefill([1, 2, 3])
    k, v = cache.k, cache.v
    assert k.shape == v.shape == (3, 2, 24, 6)             # [L, H, n_ctx, hd]
    where = (k.__array_interface__["data"][0], v.__array_interface__["data"][0])
    for t in range(3, 24):
        model.decode_step(t, cache)
    assert cache.k is k and cache.v is v
    assert (cache.k.__array_interface__["data"][0], cache.v.__array_interface__["data"][0]) == where
    assert cache.k.shape == (3, 2, 24, 6) and cache.length == 24
    assert np.all(cache.k != 0, axis=-1).any()            # positions really were written


# -- the sampler -------------------------------------------------------------------------------------

logit_vectors = hnp.arrays(np.float64, st.integers(1, 40),
                           elements=st.floats(-20, 20, allow_nan=False))
# Three values make ties certain: greedy and top_k=1 must break them the same way (the lowest id).
# (Past 16 elements NumPy's default argsort is not stable, which is how a tie-break bug would show.)
tied_logit_vectors = hnp.arrays(np.float64, st.integers(1, 64), elements=st.sampled_from([-1.0, 0.0, 1.0]))


@given(logits=logit_vectors | tied_logit_vectors)
def test_greedy_is_argmax(logits):
    assert sample(logits, temperature=0.0) == int(np.argmax(logits))


@given(logits=logit_vectors | tied_logit_vectors, temperature=st.floats(0.05, 10), seed=st.integers(0, 2**32 - 1))
def test_top_k_1_is_greedy_at_any_temperature(logits, temperature, seed):
    rng = np.random.default_rng(seed)
    assert sample(logits, temperature, top_k=1, rng=rng) == int(np.argmax(logits))


@given(logits=logit_vectors | tied_logit_vectors, temperature=st.floats(0.05, 10), seed=st.integers(0, 2**32 - 1))
def test_tiny_top_p_is_greedy(logits, temperature, seed):
    rng = np.random.default_rng(seed)
    assert sample(logits, temperature, top_p=1e-9, rng=rng) == int(np.argmax(logits))


@given(logits=logit_vectors, temperature=st.floats(0.05, 10), seed=st.integers(0, 2**32 - 1))
def test_same_seed_same_draws(logits, temperature, seed):
    a = [sample(logits, temperature, rng=np.random.default_rng(seed)) for _ in range(3)]
    b = [sample(logits, temperature, rng=np.random.default_rng(seed)) for _ in range(3)]
    assert a == b


def expected_probs(logits, temperature, top_k=None, top_p=None):
    """The documented recipe, written independently: softmax(logits / T), keep the top_k, then the
    smallest most-likely set reaching top_p, renormalise."""
    p = np.exp((logits - logits.max()) / temperature)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.zeros(p.size, bool)
    keep[order[:top_k]] = True
    if top_p is not None:
        q = np.where(keep, p, 0) / p[keep].sum()
        mass, n = 0.0, 0
        while mass < top_p:
            mass += q[order[n]]
            n += 1
        keep[:] = False
        keep[order[:n]] = True
    p = np.where(keep, p, 0)
    return p / p.sum()


@pytest.mark.parametrize("top_k, top_p", [(None, None), (3, None), (None, 0.8), (4, 0.7)])
def test_draws_follow_the_tempered_truncated_softmax(top_k, top_p):
    """Chi-square goodness of fit, fixed seed. With 6 outcomes the 0.1% critical value is 20.5; a
    sampler that ignores the temperature, truncates wrongly, or is off by one token scores in the
    hundreds."""
    logits = np.array([1.0, 2.5, -0.5, 2.0, 0.0, 1.5])
    temperature, n = 0.8, 6000
    p = expected_probs(logits, temperature, top_k, top_p)
    rng = np.random.default_rng(0)
    counts = np.bincount([sample(logits, temperature, top_k, top_p, rng) for _ in range(n)], minlength=6)
    assert np.all(counts[p == 0] == 0), f"drew tokens outside the kept set: {counts}, expected p {p}"
    kept = p > 0
    chi2 = float(np.sum((counts[kept] - n * p[kept]) ** 2 / (n * p[kept])))
    assert chi2 < 20.5, f"counts {counts} vs expected {np.round(n * p)}: chi2 {chi2:.1f}"


BAD_SAMPLING = [{"temperature": -1.0}, {"temperature": float("nan")}, {"temperature": 1.0, "top_k": 0},
                {"temperature": 1.0, "top_p": 0.0}, {"temperature": 1.0, "top_p": 1.5}]


@pytest.mark.parametrize("options", BAD_SAMPLING, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_sample_refuses_what_generate_refuses(options):
    """minillm.sample is public. generate() checks its settings (check_sampling); sample() must too,
    or temperature=-1 silently picks the *least* likely tokens and top_k=0 is an IndexError."""
    with pytest.raises(MiniLLMError):
        check_sampling(options["temperature"], options.get("top_k"), options.get("top_p"))
    with pytest.raises(MiniLLMError):
        sample(np.array([0.0, 5.0, 1.0]), **options, rng=np.random.default_rng(0))


@settings(max_examples=20, deadline=None)
@given(model=models(min_ctx=3), data=st.data())
def test_a_forked_cache_continues_like_the_original_and_is_independent(model, data):
    """cache.fork() copies the filled positions: decoding from the fork gives the original's logits,
    and writing into the fork leaves the original untouched."""
    ids = data.draw(token_lists(model, max_size=model.config.n_ctx - 2))
    token = data.draw(st.integers(0, model.config.vocab_size - 1))
    _, cache = model.prefill(ids)
    fork = cache.fork()
    assert fork.length == cache.length and fork.k is not cache.k
    before = cache.k.copy()
    from_fork = model.decode_step(token, fork)
    np.testing.assert_array_equal(cache.k, before)          # the original did not see the fork's write
    assert cache.length == len(ids) and fork.length == len(ids) + 1
    from_original = model.decode_step(token, cache)
    assert_logits_close(from_fork, from_original, np.abs(from_original).max())
