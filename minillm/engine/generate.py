"""Generation of one sequence: the two decode loops side by side (the sampler is in sampling.py).

    naive   every step runs forward() over the whole sequence again, then picks one token
    cached  prefill() the prompt once, then decode_step() one token per step over the KV cache

Both loops share the sampler and its random stream, so with the same seed they pick the same
tokens whenever their logits agree (the property tests prove it).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .. import meter
from ..errors import MiniLLMError
from .speculative import speculative_generate
from . import sampling
from .sampling import check_fits, check_sampling


def naive_step(model, seq: list[int], kind: str) -> np.ndarray:
    """forward() over the whole sequence, scoring its last position, recorded by the meter as a
    prefill or decode step (what it stands in for). -> logits [V]."""
    with meter.label(kind):
        return model.forward(seq, last_only=True)[0]


def generate(model, ids, max_new_tokens: int, *, kv_cache: bool = True, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             on_token: Callable[[int], None] | None = None, draft=None, speculate_k: int = 4,
             stop_ids=()) -> list[int]:
    """Generate `max_new_tokens` tokens after the prompt `ids`; returns the new tokens.

    kv_cache=True: prefill the prompt, then one decode_step per token.
    kv_cache=False: the naive loop, recomputing the whole sequence every step (the LM head on the
    last position only, as nanoGPT does at inference).
    draft: speculative decoding (speculative.py): "ngram" or a smaller model guesses `speculate_k`
    tokens a round and one step of this model checks them all. Greedy tokens are the same as
    without a draft; sampled ones follow the same distribution.
    `on_token(id)` is called as each token is chosen (the CLI streams text with it).
    stop_ids: end-of-turn ids (a chat model's `eos_ids`): generation stops after the first of them,
    which is kept as the last new token.
    A model loaded with kernels="batch-invariant" gives here the tokens and logits
    `generate_batch` gives this prompt in any batch, with or without the cache.
    """
    if draft is not None:
        if not kv_cache:
            raise MiniLLMError("speculative decoding (a draft) needs the KV cache: it rolls the cache back "
                               "past rejected guesses; drop kv_cache=False (--no-cache) or the draft")
        new, _ = speculative_generate(model, ids, max_new_tokens, draft=draft, k=speculate_k, temperature=temperature,
                                      top_k=top_k, top_p=top_p, seed=seed, on_token=on_token)
        return new
    ids = model.check_ids(ids)
    check_sampling(temperature, top_k, top_p, seed)
    check_fits(ids.size, max_new_tokens, model.config.n_ctx)
    rng = np.random.default_rng(seed)
    new: list[int] = []

    def pick(logits: np.ndarray) -> int:
        token = sampling.pick(logits, temperature, top_k, top_p, rng)      # the settings were checked above
        new.append(token)
        if on_token is not None:
            on_token(token)
        return token

    stop = frozenset(int(t) for t in stop_ids)
    if max_new_tokens == 0:
        return new
    if kv_cache:
        logits, cache = model.prefill(ids)                     # the prompt, once
        token = pick(logits)
        for _ in range(max_new_tokens - 1):
            if token in stop:
                break
            token = pick(model.decode_step(token, cache))      # one token, reading the cache
    else:
        seq = list(ids)
        seq.append(pick(naive_step(model, seq, "prefill")))
        for _ in range(max_new_tokens - 1):                    # the whole sequence, every step
            if seq[-1] in stop:
                break
            seq.append(pick(naive_step(model, seq, "decode")))
    return new
