"""The sampler: from logits to one token id, greedy or with temperature, top-k and top-p, and the
checks on those settings that every entry point shares."""

from __future__ import annotations

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
