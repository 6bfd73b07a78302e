"""Generation: the sampler, and the two decode loops side by side.

    naive   every step runs forward() over the whole sequence again, then picks one token
    cached  prefill() the prompt once, then decode_step() one token per step over the KV cache

Both loops share the sampler and its random stream, so with the same seed they pick the same
tokens whenever their logits agree (the property tests prove it).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import MiniLLMError, PromptError


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, seed: int | None = None) -> None:
    if seed is not None and seed < 0:
        raise MiniLLMError(f"seed={seed}: must be a non-negative integer (or unset)")
    if not (temperature >= 0 and np.isfinite(temperature)):
        raise MiniLLMError(f"temperature={temperature}: must be a finite number >= 0 (0 means greedy)")
    if top_k is not None and top_k < 1:
        raise MiniLLMError(f"top_k={top_k}: must be at least 1 (or unset)")
    if top_p is not None and not 0 < top_p <= 1:
        raise MiniLLMError(f"top_p={top_p}: must be in (0, 1] (or unset)")


def check_fits(n_prompt: int, max_new_tokens: int, n_ctx: int) -> None:
    """Prompt + new tokens must fit the context; say how many new tokens would."""
    if max_new_tokens < 0:
        raise PromptError(f"max_new_tokens={max_new_tokens}: must be >= 0")
    if n_prompt + max_new_tokens > n_ctx:
        raise PromptError(
            f"the prompt has {n_prompt} tokens and {max_new_tokens} new tokens were asked for: that is beyond "
            f"the context of {n_ctx}; at most {n_ctx - n_prompt} new tokens fit"
        )


def sample(logits: np.ndarray, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, rng: np.random.Generator | None = None) -> int:
    """Pick the next token from logits [V].

    temperature 0 is greedy (argmax). Otherwise: divide by the temperature, keep the top_k most
    likely, keep the smallest set whose probability reaches top_p (nucleus), renormalise, draw one.
    """
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return int(np.argmax(logits))
    order = np.argsort(-logits, kind="stable")            # token ids, most likely first
    z = logits[order] / temperature
    if top_k is not None:
        z = z[:top_k]
    p = np.exp(z - z[0])
    p /= p.sum()
    if top_p is not None:
        keep = int(np.searchsorted(np.cumsum(p), top_p)) + 1   # smallest prefix reaching top_p
        p = p[:keep] / p[:keep].sum()
    rng = rng if rng is not None else np.random.default_rng()
    i = int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"))
    return int(order[min(i, p.size - 1)])


def generate(model, ids, max_new_tokens: int, *, kv_cache: bool = True, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             on_token: Callable[[int], None] | None = None) -> list[int]:
    """Generate `max_new_tokens` tokens after the prompt `ids`; returns the new tokens.

    kv_cache=True: prefill the prompt, then one decode_step per token.
    kv_cache=False: the naive loop, recomputing the whole sequence every step (the LM head on the
    last position only, as nanoGPT does at inference).
    `on_token(id)` is called as each token is chosen (the CLI streams text with it).
    """
    ids = model.check_ids(ids)
    check_sampling(temperature, top_k, top_p, seed)
    check_fits(ids.size, max_new_tokens, model.config.n_ctx)
    rng = np.random.default_rng(seed)
    new: list[int] = []

    def pick(logits: np.ndarray) -> int:
        token = sample(logits, temperature, top_k, top_p, rng)
        new.append(token)
        if on_token is not None:
            on_token(token)
        return token

    if max_new_tokens == 0:
        return new
    if kv_cache:
        logits, cache = model.prefill(ids)                     # the prompt, once
        token = pick(logits)
        for _ in range(max_new_tokens - 1):
            token = pick(model.decode_step(token, cache))      # one token, reading the cache
    else:
        seq = list(ids)
        logits = model.forward(seq, last_only=True, kind="prefill")[0]
        seq.append(pick(logits))
        for _ in range(max_new_tokens - 1):                    # the whole sequence, every step
            seq.append(pick(model.forward(seq, last_only=True, kind="decode")[0]))
    return new
