"""The model runner: one batched step over a set of sequences, and each sequence's next token.

The scheduler decides which sequences run and how many of their tokens; the block manager has
reserved their KV blocks; `run_step` lays their pending tokens out as one `model.step` (every weight
read once for all of them) and samples each finished row with the sequence's own settings and
random stream.
"""

from __future__ import annotations

from ..errors import PromptError
from .sampling import pick
from .sequence import Sequence


def run_step(model, seqs: list[Sequence], chunks: list[int] | None = None) -> list[int | None]:
    """One batched step: each sequence runs its pending tokens (or the first chunks[i] of them,
    chunked prefill), and samples a token if that reaches its end. Every cache must have room for
    its chunk already (the engine's block manager reserved it). Returns the sampled token per
    sequence, None where a prompt chunk did not reach the end yet."""
    batch, wants = [], []
    for i, s in enumerate(seqs):
        todo = s.pending(None if chunks is None else chunks[i])
        if not todo:
            raise PromptError(f"{s!r} has nothing to run: finished, or its last token is not sampled yet")
        batch.append((todo, s.cache))
        wants.append("last" if s.n_computed + len(todo) == len(s) else None)
    logits = model.step(batch, scores=wants)
    out = []
    for s, lg in zip(seqs, logits):
        if lg is None:
            out.append(None)
            continue
        p = s.sampling
        out.append(s.append(pick(lg, p.temperature, p.top_k, p.top_p, s.rng)))
    return out
