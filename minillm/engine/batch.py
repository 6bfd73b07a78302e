"""Many sequences in shared steps: `run_step` (one batched step over any set of sequences) and
`generate_batch` (the user-facing call).

    step 1:  every prompt, as one flattened batch     prefill: the weights read once for all prompts
    step 2+: one new token per unfinished sequence     decode: B tokens for one read of the weights

A decode step reads every weight to make one token per sequence; batching B sequences makes B
tokens for about the same read, until the arithmetic (2·params FLOPs per token) catches up with
the memory traffic: `minillm bench --batch` measures where that happens on your machine.

What batching keeps (tests/test_batch_float32.py checks it on the float32 path, 32 sequences x 32
tokens): each sequence samples with its own settings and its own seeded random stream, from its own
rows of each product. But a [B, d] @ [d, out] product sums in another order than a [1, d] one, so in
float32 a sequence's logits in a batch differ from its logits alone in the last bits (about 1e-6
relative). Hence:

    greedy    the same tokens as alone, except where the two best logits tie within that rounding
    sampled   the same distribution as alone; the same tokens except where the uniform number of a
              draw falls within rounding of a boundary of the cumulative distribution, or two tokens
              tie (the bundled model, 32 x 32 at temperature 1: 2 of 32 sequences left their alone
              tokens, each at such a point, and went their own way after it)

In float64 the rounding is far below any gap a test meets, and the property tests find the tokens
equal. Which other sequences share a step is what changes the rounding: a request can get other
sampled tokens under load than alone, from the same distribution.
"""

from __future__ import annotations

import numpy as np

from ..cache.contiguous import KVCache
from ..cache.paged import PagedKVPool
from ..errors import PromptError
from .sampling import check_fits, check_sampling
from .sequence import SamplingParams, Sequence


def run_step(model, seqs: list[Sequence], chunks: list[int] | None = None) -> list[int | None]:
    """One batched step: each sequence runs its pending tokens (or the first chunks[i] of them,
    chunked prefill), and samples a token if that reaches its end. Returns the sampled token per
    sequence, None where a prompt chunk did not reach the end yet."""
    batch, wants = [], []
    for i, s in enumerate(seqs):
        todo = s.pending(None if chunks is None else chunks[i])
        if not todo:
            raise PromptError(f"{s!r} has nothing to run: finished, or its last token is not sampled yet")
        batch.append((todo, s.cache))
        wants.append("last" if s.n_computed + len(todo) == len(s) else None)
    logits = model.step(batch, scores=wants)
    return [None if lg is None else s.append(lg) for s, lg in zip(seqs, logits)]


def _per_prompt(value, n: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise PromptError(f"{name}: {len(value)} values for {n} prompts; give one per prompt, or one for all")
        return list(value)
    return [value] * n


def generate_batch(model, prompts, max_new_tokens, *, temperature: float = 0.0, top_k: int | None = None,
                   top_p: float | None = None, seed=None, cache: str = "paged", block_size: int = 16,
                   on_step=None) -> list[list[int]]:
    """Generate for every prompt at once, in shared batched steps; returns the new tokens per prompt.

    prompts: a list of token-id lists. max_new_tokens: an int, or one per prompt. seed: an int
    (every prompt then samples from the random stream `generate(..., seed=seed)` uses alone: the same
    tokens in float64; in float32 the same greedy tokens except at ties, and sampled tokens from the
    same distribution, equal except where a draw falls within rounding of a boundary: see the
    module's docstring), or one per prompt, or None. cache: "paged" (one pool of `block_size`-position blocks, sized to fit every
    sequence) or "contiguous" (one n_ctx cache per sequence). `on_step(seqs)` is called after each
    step with the sequences that ran in it.
    """
    if isinstance(prompts, np.ndarray) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise PromptError("prompts: expected a non-empty list of token-id lists")
    n = len(prompts)
    limits = _per_prompt(max_new_tokens, n, "max_new_tokens")
    seeds = _per_prompt(seed, n, "seed")
    check_sampling(temperature, top_k, top_p)
    seqs = []
    for i, (prompt, limit, s) in enumerate(zip(prompts, limits, seeds)):
        try:
            ids = model.check_ids(prompt)
            if not isinstance(limit, (int, np.integer)):
                raise PromptError(f"max_new_tokens={limit!r}: must be an integer")
            check_fits(ids.size, int(limit), model.config.n_ctx)
        except PromptError as e:
            raise PromptError(f"prompt {i}: {e}") from None
        seqs.append(Sequence(ids, int(limit), SamplingParams(temperature, top_k, top_p, s)))
    if cache == "paged":
        bs = block_size
        pool = PagedKVPool(model.config, sum(-(-(len(s.prompt) + s.max_new_tokens) // bs) for s in seqs) or 1,
                           bs, model.dtype)
        for s in seqs:
            s.cache = pool.sequence()
    elif cache == "contiguous":
        for s in seqs:
            s.cache = KVCache(model.config, model.dtype)
    else:
        raise PromptError(f"cache={cache!r}: 'paged' or 'contiguous'")

    running = [s for s in seqs if not s.finished]
    while running:
        run_step(model, running)
        if on_step is not None:
            on_step(running)
        for s in running:
            if s.finished:
                s.cache.free()
        running = [s for s in running if not s.finished]
    return [s.output for s in seqs]
