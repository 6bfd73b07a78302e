"""The sampler: from logits to one token id, greedy or with temperature, top-k and top-p, and the
checks on those settings that every entry point shares."""

from __future__ import annotations

import numpy as np

from ..backend import to_host
from ..errors import ContextFull, MiniLLMError, PromptError


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
        raise ContextFull(
            f"the prompt has {n_prompt} tokens and {max_new_tokens} new tokens were asked for: that is beyond "
            f"the context of {n_ctx}; at most {n_ctx - n_prompt} new tokens fit"
        )


def sample(logits: np.ndarray, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, rng: np.random.Generator | None = None) -> int:
    """Pick the next token from logits [V].

    temperature 0 is greedy (argmax). Otherwise: divide by the temperature, keep the top_k most
    likely, keep the smallest set whose probability reaches top_p (nucleus), renormalise, draw one.
    Limits, for every finite temperature: a temperature so small that logits/temperature overflows
    is greedy (ties split evenly); logits of +inf take all the probability, shared evenly; -inf ones
    get none. NaN logits, or all -inf, leave no distribution to draw from: a MiniLLMError.
    """
    check_sampling(temperature, top_k, top_p)
    return pick(logits, temperature, top_k, top_p, rng if rng is not None else np.random.default_rng())


def pick(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
         rng: np.random.Generator) -> int:
    """`sample` with settings already checked (a sequence's were checked once, when it was made)."""
    logits = check_logits(logits)
    if temperature == 0:
        return int(np.argmax(logits))
    order, p = sorted_distribution(logits, temperature, top_k, top_p)
    return int(order[draw(p, rng)])


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """An index drawn with probability p[i] / p.sum() (one uniform number from rng)."""
    i = int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"))
    return min(i, p.size - 1)


def distribution(logits: np.ndarray, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None) -> np.ndarray:
    """The probabilities `sample` draws from, as a float64 vector [V] (temperature 0: all on the
    argmax), settings already checked (as `pick`'s). Speculative decoding compares the target's and
    the draft's with it, once per guess."""
    logits = check_logits(logits)
    out = np.zeros(logits.shape[-1])
    if temperature == 0:
        out[int(np.argmax(logits))] = 1.0
        return out
    order, p = sorted_distribution(logits, temperature, top_k, top_p)
    out[order[:p.size]] = p
    return out


def check_logits(logits) -> np.ndarray:
    """The logits as a NumPy array (a GPU's copied to the host: the sampler's last step runs there),
    or one clear line when there is nothing to pick from."""
    logits = to_host(logits)
    if np.isnan(logits).any() or not (logits > -np.inf).any():
        what = "NaN" if np.isnan(logits).any() else "-inf for every token"
        raise MiniLLMError(f"the model's logits are {what}: there is no next token to pick; "
                           "its weights (or a computation) went non-finite: check the checkpoint")
    return logits


def sorted_distribution(logits: np.ndarray, temperature: float, top_k: int | None,
                        top_p: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, most likely first; their probabilities p, summing to 1), p possibly shorter
    than the ids: the tokens past it have probability 0. temperature > 0."""
    order = np.argsort(-logits, kind="stable")            # token ids, most likely first
    top = logits[order[0]]
    if top == np.inf:                                     # certain: draw among the +inf tokens only
        order = order[:np.count_nonzero(logits == np.inf)]
        z = np.zeros(order.size)
    else:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            z = logits[order] / temperature               # (in float32 a tiny temperature rounds to 0, a huge one to inf)
            if not np.isfinite(z[0]) or np.isnan(z[-1]):  # overflowed, or -inf/inf: shift first, in float64
                z = (logits[order].astype(np.float64) - top) / np.float64(temperature)  # top 0, rest <= 0
    if top_k is not None:
        z = z[:top_k]
    p = np.exp(z - z[0])
    p /= p.sum()
    if top_p is not None:
        keep = int(np.searchsorted(np.cumsum(p), top_p)) + 1   # smallest prefix reaching top_p
        p = p[:keep] / p[:keep].sum()
    return order, p
