"""Speculative decoding: a cheap draft guesses k tokens, the target checks all k in one pass.

A decode step reads every weight to make one token, so a step over k+1 tokens costs about what a
step over one does while decode is memory-bound. Speculative decoding spends that slack:

    draft    d1 .. dk              k guesses: k steps of a small model, or a lookup in the text so
                                   far (n-gram: the continuation of the latest earlier match)
    verify   [last, d1 .. dk]      ONE target step over k+1 tokens: its weights read once, logits
                                   at every position (p1 .. pk+1)
    accept   d1 .. da              the longest prefix the target agrees with, then one token of the
                                   target's own: the correction at a+1, or a bonus from pk+1
    roll back                      both caches forget every position past the kept tokens

Each round keeps a+1 tokens (1 to k+1) for one weight read of the target. Greedy: a guess is
agreed when it is the target's argmax, so the tokens are plain greedy's. Sampling: guess d with
draft probability q(d) is accepted with probability min(1, p(d)/q(d)); a rejection draws from
max(0, p - q), renormalised (Leviathan et al. 2023; Chen et al. 2023). Every kept token is then
distributed exactly as the target's sampler would draw it; only the random stream differs from
plain sampling, so a seed gives other (equally likely) tokens than `generate` without a draft.

Invariant between rounds: the target's cache holds every token but the last one; the draft's holds
a prefix of them.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import MiniLLMError, PromptError
from .. import meter
from .sampling import check_fits, draw
from .sequence import SamplingParams

MAX_K = 16


# -- drafts ---------------------------------------------------------------------------------------

class NgramDraft:
    """Prompt lookup: find the longest suffix of the text so far (max_n tokens down to min_n) that
    occurred earlier, and guess the k tokens that followed its latest occurrence (the latest with k
    tokens after it, if any). No model, no
    weights: its guesses cost nothing but are right only where the text repeats itself."""

    name = "ngram"

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise MiniLLMError(f"n-gram draft: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.max_n, self.min_n = max_n, min_n

    def begin(self, prompt: np.ndarray, room: int) -> None:
        pass

    def propose(self, tokens: list[int], k: int, sampling: SamplingParams, rng) -> tuple[list[int], list]:
        """Up to k guesses (maybe none), and their draft probabilities: None, a certainty (q = 1)."""
        t = np.asarray(tokens)
        for n in range(min(self.max_n, t.size - 1), self.min_n - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(t[:-1], n)    # every earlier n-gram
            hits = np.flatnonzero((windows == t[-n:]).all(axis=1))
            if hits.size:
                # the latest match with k tokens after it; else the earliest (the longest continuation:
                # in a loop of period p the latest match has only p tokens after it)
                room = t.size - (hits + n)
                full = hits[room >= k]
                start = int(full[-1] if full.size else hits[0]) + n
                guess = [int(x) for x in t[start:start + k]]
                return guess, [None] * len(guess)
        return [], []

    def keep(self, n: int) -> None:
        pass


class ModelDraft:
    """A smaller model guesses: k decode steps over its own KV cache (its steps are metered as
    "draft"). It must share the target's vocabulary."""

    def __init__(self, model) -> None:
        self.model = model
        self.name = model.name
        self.cache = None

    def begin(self, prompt: np.ndarray, room: int) -> None:
        """A fresh cache. The draft holds at most prompt + room - 2 positions (it never sees the last
        token, and guesses stop one short of the end), and runs only when room >= 3."""
        n_ctx = self.model.config.n_ctx
        if room >= 3 and prompt.size + room - 2 > n_ctx:
            fits = n_ctx - prompt.size + 2
            how = (f"ask for at most {fits} new tokens" if fits >= 3 else
                   f"the prompt alone ({prompt.size} tokens) is too long for it")
            raise PromptError(f"the draft {self.model.name}'s context is {n_ctx} tokens: {how}, "
                              "or draft with ngram")
        self.cache = self.model.new_cache()

    def propose(self, tokens: list[int], k: int, sampling: SamplingParams, rng) -> tuple[list[int], list]:
        if k == 0:
            return [], []
        chunk = np.asarray(tokens[self.cache.length:], dtype=np.intp)      # what it has not seen yet (>= 1)
        guesses, qs = [], []
        for _ in range(k):
            self.cache.reserve(chunk.size)
            with meter.label("draft"):
                (logits,) = self.model.step([(chunk, self.cache)])
            if sampling.greedy:
                d, q = int(np.argmax(logits)), None
            else:                                   # draw the guess from q itself: one sort, not two
                q = sampling.distribution(logits)
                d = draw(q, rng)
            guesses.append(d)
            qs.append(q)
            chunk = np.array([d], dtype=np.intp)
        return guesses, qs

    def keep(self, n: int) -> None:
        """The first n tokens of the sequence are right: forget any cached position past them."""
        if self.cache.length > n:
            self.cache.truncate(n)


def check_k(k, option: str | None = None) -> int:
    """k, the guesses per round, as an int; `option` names the command-line flag it came from."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_K:
        what = f"{option} {k}" if option else f"speculate_k={k!r}"
        raise MiniLLMError(f"{what}: guesses per round must be a whole number from 1 to {MAX_K}")
    return int(k)


def check_draft_model(draft, target) -> None:
    """A model can draft for the target if it shares its vocabulary and is not the target itself
    (the same object, or another load of the same weights: same config, same position table and
    first embedding columns)."""
    if draft.config.vocab_size != target.config.vocab_size:
        raise MiniLLMError(f"the draft {draft.name} has a vocabulary of {draft.config.vocab_size} ids and the "
                           f"model {target.name} one of {target.config.vocab_size}: they must share a tokenizer")
    if draft is target or draft.fingerprint() == target.fingerprint():
        raise MiniLLMError(f"the draft {draft.name} is the model itself: it would guess right every time and "
                           "save nothing (each guess costs a full step); give a smaller model, or ngram")


def make_draft(draft, target):
    """A draft from what the user gave: "ngram", a model (GPT2), or an object with the draft
    protocol (begin, propose, keep)."""
    if isinstance(draft, str):
        if draft == "ngram":
            return NgramDraft()
        raise MiniLLMError(f"draft={draft!r}: give 'ngram' or a model (minillm.load(...))")
    if hasattr(draft, "propose"):
        return draft
    if hasattr(draft, "step") and hasattr(draft, "config"):
        check_draft_model(draft, target)
        return ModelDraft(draft)
    raise MiniLLMError(f"draft={draft!r}: give 'ngram' or a model (minillm.load(...))")


# -- the record of a run ------------------------------------------------------------------------

@dataclass
class Round:
    """One draft-verify round."""
    drafted: int
    accepted: int
    seconds_draft: float
    seconds_verify: float
    seconds: float                                     # the whole round: draft, verify, judge, roll back
    draft_steps: list = field(default_factory=list)    # the meter's records of the draft's steps
    verify_step: object = None                         # ... and of the target's verify step
    guesses: list = field(default_factory=list)        # the draft's tokens (the first `accepted` were kept)
    token: int = -1                                    # the target's own token that ended the round

    @property
    def kept(self) -> int:
        """Tokens this round added: the agreed guesses and one of the target's own."""
        return self.accepted + 1

    @property
    def draft_bytes(self) -> int:
        return sum(s.total_bytes for s in self.draft_steps)

    @property
    def target_bytes(self) -> int:
        return self.verify_step.total_bytes if self.verify_step is not None else 0


@dataclass
class SpeculativeStats:
    """What a speculative run did: its rounds (after the prefill, whose logits give the first token)."""
    draft: str
    k: int
    rounds: list = field(default_factory=list)

    def _sum(self, attr: str):
        return sum(getattr(r, attr) for r in self.rounds)

    @property
    def drafted(self) -> int:
        return self._sum("drafted")

    @property
    def accepted(self) -> int:
        return self._sum("accepted")

    @property
    def kept(self) -> int:
        return self._sum("kept")

    @property
    def acceptance_rate(self) -> float:
        """Guesses the target agreed with / guesses made."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        """Tokens kept per target weight read (plain decode: 1)."""
        return self.kept / len(self.rounds) if self.rounds else 0.0

    @property
    def seconds(self) -> float:
        """Wall time of the rounds (the prefill and first token excluded)."""
        return self._sum("seconds")

    @property
    def draft_bytes(self) -> int:
        return self._sum("draft_bytes")

    @property
    def target_bytes(self) -> int:
        return self._sum("target_bytes")

    @property
    def bytes_per_token(self) -> float:
        """Bytes moved (draft and target, as metered) per token kept. The byte counts and the step
        records come from the meter: run under `with minillm.Meter():`, else they are 0."""
        return (self.draft_bytes + self.target_bytes) / self.kept if self.kept else 0.0


# -- the loop -------------------------------------------------------------------------------------

def speculative_round(model, cache, drafter, tokens: list[int], k: int, sampling: SamplingParams,
                      rng) -> tuple[list[int], Round]:
    """One round: guess, verify, accept, roll back. The target's cache holds every token but the last.
    Returns the tokens kept (the agreed guesses and one of the target's own) and the round's record."""
    n = len(tokens)
    t0 = time.perf_counter()
    guesses, qs = drafter.propose(tokens, k, sampling, rng)                       # guess
    t1 = time.perf_counter()
    chunk = np.array([tokens[-1], *guesses], dtype=np.intp)
    cache.reserve(chunk.size)
    with meter.label("verify" if guesses else "decode"):
        (rows,) = model.step([(chunk, cache)], scores="all")                     # verify: [g+1, V]
    t2 = time.perf_counter()
    kept = []
    for i, d in enumerate(guesses):                                              # accept
        token = judge(rows[i], d, qs[i], sampling, rng)
        kept.append(d if token is None else token)
        if token is not None:                                                    # the target's correction
            break
    else:
        kept.append(sampling.pick(rows[-1], rng))                                # all agreed: the bonus token
    accepted = len(kept) - 1
    cache.truncate(n + accepted)                                                 # roll back the rejected guesses
    drafter.keep(n + accepted)
    t3 = time.perf_counter()
    return kept, Round(len(guesses), accepted, t1 - t0, t2 - t1, t3 - t0, guesses=guesses, token=kept[-1])


def speculative_generate(model, ids, max_new_tokens: int, *, draft="ngram", k: int = 4, temperature: float = 0.0,
                         top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                         on_token: Callable[[int], None] | None = None,
                         on_round: Callable | None = None) -> tuple[list[int], SpeculativeStats]:
    """Generate `max_new_tokens` tokens after `ids` with `model` as the target and `draft` ("ngram",
    a smaller model, or a draft object) guessing `k` tokens per round. Returns (new tokens, stats).
    Run under a `minillm.Meter()`, each round keeps the meter's records of its draft and verify steps.

    `on_round(round, target_cache, draft)` is called after each round's roll-back (tests read the
    caches there)."""
    ids = model.check_ids(ids)
    sampling = SamplingParams(temperature, top_k, top_p, seed)                  # checked once, here
    check_fits(ids.size, max_new_tokens, model.config.n_ctx)
    k = check_k(k)
    drafter = make_draft(draft, model)
    stats = SpeculativeStats(getattr(drafter, "name", type(drafter).__name__), k)
    rng = np.random.default_rng(seed)
    tokens = [int(t) for t in ids]
    new: list[int] = []

    def keep(more: list[int]) -> None:
        for token in more:
            tokens.append(token)
            new.append(token)
            if on_token is not None:
                on_token(token)

    if max_new_tokens == 0:
        return new, stats
    drafter.begin(ids, max_new_tokens)
    logits, cache = model.prefill(ids)                              # the prompt; its logits give token 1
    keep([sampling.pick(logits, rng)])
    m = meter.active()
    while len(new) < max_new_tokens:
        with (m.capture() if m is not None else nullcontext([])) as recs:
            kept, r = speculative_round(model, cache, drafter, tokens, min(k, max_new_tokens - len(new) - 1),
                                        sampling, rng)
        r.draft_steps = [x for x in recs if x.kind == "draft"]
        r.verify_step = next((x for x in recs if x.kind != "draft"), None)
        keep(kept)
        stats.rounds.append(r)
        if on_round is not None:
            on_round(r, cache, drafter)
    return new, stats


def judge(logits: np.ndarray, guess: int, q, sampling: SamplingParams, rng) -> int | None:
    """None if the target accepts the guess, else the token it puts there instead.

    Greedy: accepted when it is the target's argmax, else the argmax. Sampling: accepted with
    probability min(1, p(guess)/q(guess)) (q None: a certain guess, q = 1); else a draw from the
    residual max(0, p - q), renormalised."""
    if sampling.greedy:
        best = int(np.argmax(logits))
        return None if best == guess else best
    p = sampling.distribution(logits)
    q_guess = 1.0 if q is None else q[guess]
    if rng.random() < min(1.0, p[guess] / q_guess):
        return None
    if q is None:
        residual = p.copy()
        residual[guess] = 0.0
    else:
        residual = np.maximum(p - q, 0.0)
    if not residual.sum() > 0:   # p == q: a rejection has probability 0; draw from p if rounding gets here
        residual = p
    return draw(residual, rng)
