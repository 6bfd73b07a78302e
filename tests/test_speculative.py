"""Speculative decoding changes nothing but the cost: greedy tokens are plain greedy's for every k
and both drafts, the caches after a rejection are the caches of a run that never saw the rejected
guesses, sampled tokens follow the target's distribution (a chi-square test), and each round is
counted (one weight read of the target for k+1 tokens).

Models are the random float64 GPT-2s of test_properties (ties in an argmax are then out of reach,
so "the same tokens" can be asserted exactly). A draft that is a noisy copy of the target agrees
often but not always, so runs have both accepted and rejected guesses.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.models.gpt2 import GPT2Config
from minillm.engine import speculative
from minillm.engine.sampling import distribution
from minillm.engine.sequence import SamplingParams
from minillm.engine.speculative import NgramDraft, speculative_generate
from minillm.errors import MiniLLMError, PromptError
from minillm.meter import Meter

from test_properties import assert_logits_close, configs, random_model


def noisy_copy(model, noise: float, seed: int) -> minillm.GPT2:
    """The same architecture with every weight nudged: a draft that agrees with the target often."""
    rng = np.random.default_rng(seed)
    params = {name: p + noise * rng.standard_normal(p.shape) for name, p in model.params.items()
              if name != "wte.weight"}
    params["wte.weight"] = model.wte + noise * rng.standard_normal(model.wte.shape)
    return minillm.GPT2(model.config, params, name="noisy-draft")


@st.composite
def pairs(draw):
    """(target, draft, prompt): the draft a noisy copy of the target or an unrelated model."""
    config = draw(configs(min_ctx=24))
    target = random_model(config, seed=draw(st.integers(0, 2**31)), std=draw(st.floats(0.1, 0.5)))
    if draw(st.booleans()):
        draft = noisy_copy(target, draw(st.sampled_from([0.01, 0.05, 0.2])), draw(st.integers(0, 99)))
    else:
        small = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=config.n_ctx, vocab_size=config.vocab_size)
        draft = random_model(small, seed=draw(st.integers(0, 2**31)))
    # a prompt over a few ids, so the n-gram draft finds matches
    alphabet = st.integers(0, draw(st.integers(1, config.vocab_size - 1)))
    prompt = draw(st.lists(alphabet, min_size=1, max_size=12))
    return target, draft, prompt


@settings(max_examples=25, deadline=None)
@given(pairs(), st.integers(1, 8), st.booleans(), st.data())
def test_greedy_speculative_tokens_are_plain_greedy(pair, k, use_model, data):
    target, draft, prompt = pair
    n = data.draw(st.integers(1, target.config.n_ctx - len(prompt)), label="new tokens")
    plain = minillm.generate(target, prompt, n)
    new, stats = speculative_generate(target, prompt, n, draft=draft if use_model else "ngram", k=k)
    assert new == plain
    assert 1 + stats.kept == n                              # the prefill gives the first token
    assert all(r.drafted <= k and 0 <= r.accepted <= r.drafted for r in stats.rounds)
    assert minillm.generate(target, prompt, n, draft="ngram", speculate_k=k) == plain   # the user's call


@settings(max_examples=20, deadline=None)
@given(pairs(), st.integers(1, 8), st.booleans(), st.sampled_from([0.0, 1.0]), st.integers(0, 99))
def test_after_every_round_the_caches_hold_exactly_the_kept_tokens(pair, k, use_model, temperature, seed):
    """The caches after a roll-back equal the caches of a run that never saw the rejected guesses:
    the length is every kept token but the last (the target) or a prefix of them (the draft), and
    each cached position's keys and values are a plain prefill's of those tokens."""
    target, draft, prompt = pair
    n = min(20, target.config.n_ctx - len(prompt))
    seen = []

    def check(r, cache, drafter):
        tokens = prompt + new_so_far
        assert cache.length == len(tokens) - 1
        for model, c in [(target, cache)] + ([(draft, drafter.cache)] if use_model else []):
            assert c.length <= len(tokens) - 1
            if c.length == 0:
                continue
            _, fresh = model.prefill(tokens[:c.length])
            scale = float(np.abs(fresh.k[:, :, :c.length]).max())
            assert_logits_close(c.k[:, :, :c.length], fresh.k[:, :, :c.length], scale, "keys")
            assert_logits_close(c.v[:, :, :c.length], fresh.v[:, :, :c.length], scale, "values")
        seen.append(r.drafted - r.accepted)

    new_so_far: list[int] = []
    speculative_generate(target, prompt, n, draft=draft if use_model else "ngram", k=k, temperature=temperature,
                         seed=seed, on_token=new_so_far.append, on_round=check)
    assert len(new_so_far) == n


def test_rejections_happen_and_are_rolled_back():
    """The property above is not vacuous: this pair rejects guesses, and the run still matches."""
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=64, vocab_size=40)
    target = random_model(config, seed=3)
    draft = noisy_copy(target, 0.2, 0)
    new, stats = speculative_generate(target, [1, 2, 3], 40, draft=draft, k=4)
    rejected = sum(r.drafted - r.accepted for r in stats.rounds)
    assert stats.accepted > 0 and rejected > 0
    assert new == minillm.generate(target, [1, 2, 3], 40)


# -- sampling: the distribution is the target's ---------------------------------------------------

def chi_square_p_value(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's chi-square test; cells expected below 5 are pooled into one. The p-value is from
    the Wilson-Hilferty cube-root approximation of the chi-square distribution (good to a few
    percent of p at these degrees of freedom: no SciPy needed)."""
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    x = float(((obs - exp) ** 2 / exp).sum())
    dof = obs.size - 1
    z = ((x / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def target_distribution(model, prompt, n, sampling) -> np.ndarray:
    """P(t1 .. tn) of the target's own sampler, over every sequence of n tokens: [V ** n]."""
    V = model.config.vocab_size
    probs = np.ones(1)
    for depth in range(n):
        rows = []
        for flat in range(V ** depth):
            prefix = [int(c) for c in np.unravel_index(flat, (V,) * depth)] if depth else []
            logits = model.forward(prompt + prefix, last_only=True)[0]
            rows.append(distribution(logits, *sampling))
        probs = (probs[:, None] * np.array(rows)).ravel()
    return probs


def sampled_counts(target, draft, prompt, n, k, sampling, draws):
    V = target.config.vocab_size
    counts = np.zeros(V ** n)
    for seed in range(draws):
        new, _ = speculative_generate(target, prompt, n, draft=draft, k=k, temperature=sampling[0],
                                      top_k=sampling[1], top_p=sampling[2], seed=seed)
        counts[np.ravel_multi_index(new, (V,) * n)] += 1
    return counts


TINY = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=16, vocab_size=4)
DRAWS = 6000
ALPHA = 1e-3   # the false-alarm rate: a correct sampler fails a given test with probability 0.1%


@pytest.mark.parametrize("use_model, sampling", [
    (True, (1.0, None, None)),
    (True, (0.7, 3, None)),
    (False, (1.0, None, 0.9)),
])
def test_sampled_tokens_follow_the_targets_distribution(use_model, sampling):
    """4 new tokens on a 4-token vocabulary (256 outcomes), 6,000 seeded runs with k = 2, against
    the exact product of the target's own sampling distributions. Seeds 0..5,999 are fixed, so the
    test is deterministic; under a fresh set of seeds a correct sampler would fail it 0.1% of the
    time (ALPHA), a sampler that skips the acceptance rule fails it (the next test)."""
    target, draft = random_model(TINY, seed=11, std=0.5), random_model(TINY, seed=12, std=0.5)
    prompt = [1, 2, 1, 2]
    expected = target_distribution(target, prompt, 4, sampling) * DRAWS
    observed = sampled_counts(target, draft if use_model else "ngram", prompt, 4, 2, sampling, DRAWS)
    assert observed.sum() == DRAWS
    assert chi_square_p_value(observed, expected) > ALPHA


def test_the_chi_square_test_catches_a_sampler_that_accepts_every_guess(monkeypatch):
    """Break the acceptance rule on purpose (keep every guess): the output is then the draft's
    distribution, and the same test must reject it."""
    monkeypatch.setattr(speculative, "judge", lambda *a: None)
    target, draft = random_model(TINY, seed=11, std=0.5), random_model(TINY, seed=12, std=0.5)
    sampling = (1.0, None, None)
    expected = target_distribution(target, [1, 2, 1, 2], 4, sampling) * DRAWS
    observed = sampled_counts(target, draft, [1, 2, 1, 2], 4, 2, sampling, DRAWS)
    assert chi_square_p_value(observed, expected) < ALPHA


# -- counted like everything else -----------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 3, 8])
def test_a_verify_step_reads_the_weights_once_for_k_plus_1_tokens(k):
    """Closed forms: a verify step over k+1 tokens reads what one decode step reads, plus the k
    more embedding rows it gathers (wte and wpe); its matmul FLOPs are k+1 decode steps'."""
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=64, vocab_size=50)
    target = random_model(config, seed=5)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 3]
    with Meter() as m:
        new, stats = speculative_generate(target, prompt, 12, draft=noisy_copy(target, 0.01, 1), k=k)
    with Meter() as plain:
        minillm.generate(target, prompt, 2)
    decode = plain.of_kind("decode")[0]
    full = [r for r in stats.rounds if r.drafted == k]
    assert full, "no round drafted k guesses"
    d, b = config.n_embd, target.dtype.itemsize
    for r in full:
        v = r.verify_step
        assert v.kind == "verify" and v.n_tokens == k + 1
        assert v.bytes["weights"] == decode.bytes["weights"] + 2 * k * d * b
        assert v.flops["matmul"] == (k + 1) * decode.flops["matmul"]
        assert [s.kind for s in r.draft_steps] == ["draft"] * k
    assert len(m.of_kind("verify")) + len(m.of_kind("decode")) == len(stats.rounds)
    assert stats.kept == len(new) - 1
    assert stats.acceptance_rate == stats.accepted / stats.drafted
    assert stats.bytes_per_token == (stats.draft_bytes + stats.target_bytes) / stats.kept


def test_the_ngram_draft_guesses_the_continuation_of_the_latest_longest_match():
    d = NgramDraft(max_n=3)
    assert d.propose([5, 6, 7, 8, 9, 6, 7], 3, SamplingParams(), None) == ([8, 9, 6], [None] * 3)
    assert d.propose([1, 2, 9, 1, 2, 8, 1, 2], 2, SamplingParams(), None)[0] == [8, 1]   # latest match
    assert d.propose([1, 2, 3, 4], 2, SamplingParams(), None) == ([], [])                 # no repeat
    assert d.propose([4, 4], 5, SamplingParams(), None)[0] == [4]                        # what there is
    assert d.propose([5] * 6, 8, SamplingParams(), None)[0] == [5, 5, 5]                 # a loop: the longest
    assert d.propose([1, 2] * 4, 8, SamplingParams(), None)[0] == [1, 2, 1, 2]


# -- clear errors ------------------------------------------------------------------------------------

def test_bad_drafts_and_settings_are_one_clear_error():
    target = random_model(GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=32, vocab_size=20), seed=1)
    other_vocab = random_model(GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=32, vocab_size=21), seed=2)
    short = random_model(GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=8, vocab_size=20), seed=2)
    with pytest.raises(MiniLLMError, match="vocabulary"):
        speculative_generate(target, [1], 4, draft=other_vocab)
    with pytest.raises(MiniLLMError, match="itself"):
        speculative_generate(target, [1], 4, draft=target)
    with pytest.raises(MiniLLMError, match="'ngram' or a model"):
        speculative_generate(target, [1], 4, draft="ngrams")
    for k in (0, 17, 2.5, True):
        with pytest.raises(MiniLLMError, match="speculate_k"):
            speculative_generate(target, [1], 4, k=k)
    with pytest.raises(PromptError, match="draft .*context is 8"):
        speculative_generate(target, [1] * 5, 10, draft=short)
    with pytest.raises(MiniLLMError, match="needs the KV cache"):
        minillm.generate(target, [1], 4, kv_cache=False, draft="ngram")


def test_a_draft_context_holds_the_prompt_and_all_but_two_of_the_new_tokens():
    """The draft never sees the last token and stops guessing one short of the end: a draft whose
    context is 32 serves a 2-token prompt and 32 new tokens, and says how many fit past that."""
    target = random_model(GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=64, vocab_size=20), seed=1)
    short = random_model(GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=32, vocab_size=20), seed=2)
    new, _ = speculative_generate(target, [1, 2], 32, draft=short, k=8)
    assert new == minillm.generate(target, [1, 2], 32)
    with pytest.raises(PromptError, match="at most 32 new tokens"):
        speculative_generate(target, [1, 2], 33, draft=short)
    with pytest.raises(PromptError, match="the prompt alone"):
        speculative_generate(target, list(range(20)) * 2, 5, draft=short)


def test_sampling_settings_are_checked_once_per_run_not_once_per_guess(monkeypatch):
    from minillm.engine import sampling, sequence
    calls = []
    real = sampling.check_sampling
    counting = lambda *a: calls.append(a) or real(*a)      # noqa: E731
    monkeypatch.setattr(sampling, "check_sampling", counting)
    monkeypatch.setattr(sequence, "check_sampling", counting)
    target, draft = random_model(TINY, 0), random_model(TINY, 1)
    new, stats = speculative_generate(target, [1, 2, 3], 8, draft=draft, k=3, temperature=0.8, top_k=3, seed=0)
    assert len(new) == 8 and stats.drafted > 1 and len(calls) == 1
