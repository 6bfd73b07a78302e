"""A sequence: one request's tokens, its sampling settings and its own random stream.

Everything that decides a sequence's next token travels with it, so its tokens do not depend on
what it is batched with: the same prompt, settings and seed give the same tokens alone or in any
batch (up to the float rounding of a batched product, see `engine/batch.py`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from .sampling import check_sampling, distribution, pick

EOT = 50256   # GPT-2's <|endoftext|> (a model's own end ids: `model.eos_ids`)


@dataclass(frozen=True)
class SamplingParams:
    """How a sequence picks its tokens: temperature 0 is greedy; seed None draws fresh entropy."""
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_k, self.top_p, self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def pick(self, logits: np.ndarray, rng: np.random.Generator) -> int:
        """The next token from logits [V] with these settings (checked once, when they were made)."""
        return pick(logits, self.temperature, self.top_k, self.top_p, rng)

    def distribution(self, logits: np.ndarray) -> np.ndarray:
        """The probabilities `pick` draws from: float64 [V] (greedy: all on the argmax)."""
        return distribution(logits, self.temperature, self.top_k, self.top_p)


class Sequence:
    """One request on its way through the engine.

    tokens = prompt + output. The KV cache (`cache`) holds the first `cache.length` of them; the
    rest are pending: a whole prompt, the rest of a prompt after a chunk, or the one token sampled
    last step. A sequence is finished at `max_new_tokens` tokens, or at any token of `stop_ids`
    (none by default, as in `generate`; a server passes the model's end-of-sequence ids).
    """

    _ids = itertools.count()

    def __init__(self, prompt, max_new_tokens: int, sampling: SamplingParams = SamplingParams(), *,
                 stop_ids=(), arrival: float = 0.0, seq_id: int | None = None) -> None:
        self.id = next(self._ids) if seq_id is None else seq_id
        self.prompt = [int(t) for t in prompt]
        self.output: list[int] = []
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.rng = np.random.default_rng(sampling.seed)
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.arrival = arrival
        self.cache = None          # set by whoever runs the sequence: any cache of the protocol

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def __len__(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def n_computed(self) -> int:
        """Positions already in the KV cache."""
        return self.cache.length if self.cache is not None else 0

    @property
    def n_pending(self) -> int:
        return len(self) - self.n_computed

    def pending(self, limit: int | None = None) -> list[int]:
        """The next tokens to run through the model (at most `limit`)."""
        start = self.n_computed
        end = len(self) if limit is None else min(len(self), start + limit)
        return self.tokens[start:end]

    @property
    def stopped(self) -> bool:
        """Ended by a stop token (not by its length)."""
        return bool(self.output) and self.output[-1] in self.stop_ids

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_new_tokens or self.stopped

    def append(self, token: int) -> int:
        """The token sampled for this sequence (engine/runner.py samples it with the sequence's own stream)."""
        self.output.append(int(token))
        return token

    def __repr__(self) -> str:
        return (f"Sequence(id={self.id}, prompt {len(self.prompt)} tokens, {len(self.output)}/"
                f"{self.max_new_tokens} new, {self.n_computed} cached)")
