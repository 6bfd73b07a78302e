"""Many sequences in shared steps: `generate_batch`, the user-facing call, run on the engine (one
batched step over any set of sequences is `runner.run_step`).

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

With a model loaded with kernels="batch-invariant" nothing of that is left: every product and
attention runs in a reduction order fixed per row (kernels/batch_invariant.py), and each sequence's
tokens, greedy and sampled, are bit-identical to its tokens alone (tests/test_batch_invariant.py),
at a cost in throughput.
"""

from __future__ import annotations

import numpy as np

from ..errors import PromptError
from .engine import Engine
from .sampling import check_fits, check_sampling
from .sequence import SamplingParams


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

    prompts: a list of token-id lists. max_new_tokens: an int, or one per prompt (0 gives []).
    seed: an int (every prompt gets the stream `generate(..., seed=seed)` uses alone), or one per
    prompt, or None. cache: "paged" (one pool of `block_size`-position blocks, sized to fit every
    sequence) or "contiguous" (one n_ctx cache per sequence). `on_step(seqs)` is called after each
    step with the sequences that ran in it. A model loaded with kernels="batch-invariant" gives
    every sequence the tokens it gets alone, bit for bit.

    It runs on the engine: every request admitted at once as one static batch, every prompt in the
    first step, then one decode token per unfinished sequence per step. What holds against
    `generate` alone: see this module's docstring.
    """
    if isinstance(prompts, np.ndarray) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise PromptError("prompts: expected a non-empty list of token-id lists")
    n = len(prompts)
    limits = _per_prompt(max_new_tokens, n, "max_new_tokens")
    seeds = _per_prompt(seed, n, "seed")
    check_sampling(temperature, top_k, top_p)
    if cache not in ("paged", "contiguous"):
        raise PromptError(f"cache={cache!r}: 'paged' or 'contiguous'")
    checked = []
    for i, (prompt, limit) in enumerate(zip(prompts, limits)):
        try:
            ids = model.check_ids(prompt)
            if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)):
                raise PromptError(f"max_new_tokens={limit!r}: must be an integer")
            check_fits(ids.size, int(limit), model.config.n_ctx)
        except PromptError as e:
            raise PromptError(f"prompt {i}: {e}") from None
        checked.append((ids, int(limit)))
    per_state = model.POOL.state_blocks_for(model.config, block_size, model.dtype)   # a hybrid's states
    blocks = sum(model.POOL.blocks_for_positions(model.config, ids.size + limit, block_size) + per_state
                 for ids, limit in checked)
    engine = Engine(model, num_blocks=max(blocks, 1), block_size=block_size, cache=cache, policy="static",
                    max_seqs=n, max_batched_tokens=max(sum(ids.size for ids, _ in checked), 1), meter=False,
                    on_step=None if on_step is None else (lambda e, info: on_step(info.sequences)))
    reqs = [engine.add_request(ids, limit, SamplingParams(temperature, top_k, top_p, s))
            for (ids, limit), s in zip(checked, seeds)]
    engine.run()
    return [r.output for r in reqs]
