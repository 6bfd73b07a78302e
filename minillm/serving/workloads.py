"""Workloads: who asks for what, and when. Seeded generators, and a JSONL trace format for your own.

    poisson        requests arrive at `rate` per second (exponential gaps); prompts 16-128 tokens,
                   answers 16-64
    shared-prefix  every prompt starts with the same 250-token system prompt, then 8-32 tokens of
                   its own; answers 8-24 (what prefix caching is for)
    long-prompt    prompts 384-512 tokens, answers 4-16: prefill dominates
    long-answer    prompts 8-32 tokens, answers 128-256: decode dominates
    mixed          short chats (prompts 16-64 tokens, answers 32-96) and, one request in eight,
                   a long document (prompts 640-900 tokens, answers 8-32; one at a seeded place in
                   each run of eight requests): a long prefill lands
                   among running decodes (what chunked prefill and disaggregation are for)

Lengths are for a 1024-token context and shrink in proportion for a smaller one. Every generator
takes `rate` (requests per second, Poisson arrivals), `n` requests and a `seed`:
the same seed gives the same workload, so policies compare on the same requests. Prompts are
random token ids (the ids matter only to the prefix cache, which compares them exactly).

A trace is one JSON object per line:

    {"arrival": 0.25, "prompt": "ROMEO:", "max_tokens": 32}
    {"arrival": 0.5, "prompt_ids": [464, 2068, 7586], "max_tokens": 8, "temperature": 0.8, "seed": 3}

arrival in seconds from the start (default 0), the prompt as text (GPT-2's tokenizer) or as ids,
max_tokens (default 16), and optionally temperature, top_k, top_p, seed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..engine.sequence import SamplingParams
from ..errors import MiniLLMError
from ..paths import atomic_write

WORKLOADS = ("poisson", "shared-prefix", "long-prompt", "long-answer", "mixed")
MIXED_EVERY = 8   # `mixed`: one long document in each run of this many requests
ID_RANGE = 50000          # prompt ids drawn from 0 .. ID_RANGE-1 (or the vocabulary, if smaller)


@dataclass(frozen=True)
class WorkItem:
    arrival: float
    prompt: list
    max_tokens: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)


def generate_workload(name: str, *, rate: float = 4.0, n: int = 64, seed: int = 0, vocab_size: int = 50257,
                      n_ctx: int = 1024) -> list[WorkItem]:
    """One of WORKLOADS, seeded. Lengths are clipped so every request fits the context."""
    if name not in WORKLOADS:
        raise MiniLLMError(f"workload {name!r}: choose one of {', '.join(WORKLOADS)}, or give a .jsonl trace")
    if n < 1:
        raise MiniLLMError(f"--requests {n}: must be at least 1")
    if not rate > 0:
        raise MiniLLMError(f"--rate {rate}: requests per second must be more than 0")
    rng = np.random.default_rng(seed)
    hi = min(vocab_size, ID_RANGE)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    t = t - t[0]                                  # the first request arrives at 0
    k = min(1.0, n_ctx / 1024)                   # lengths shrink with a smaller context

    def draw(lo, hi_):
        return max(1, int(rng.integers(lo, hi_ + 1) * k))

    system = rng.integers(0, hi, max(1, int(250 * k))).tolist()
    items = []
    for i in range(n):
        if name == "poisson":
            p, a = draw(16, 128), draw(16, 64)
        elif name == "shared-prefix":
            p, a = draw(8, 32), draw(8, 24)
        elif name == "long-prompt":
            p, a = draw(384, 512), draw(4, 16)
        elif name == "mixed":
            if i % MIXED_EVERY == 0:
                at = i + int(rng.integers(0, MIXED_EVERY))
            long = i == at
            p, a = (draw(640, 900), draw(8, 32)) if long else (draw(16, 64), draw(32, 96))
        else:
            p, a = draw(8, 32), draw(128, 256)
        prompt = (system if name == "shared-prefix" else []) + rng.integers(0, hi, p).tolist()
        prompt = prompt[:n_ctx - 1]
        a = int(min(a, n_ctx - len(prompt)))
        items.append(WorkItem(float(t[i]), prompt, a))
    return items


def read_trace(path, tokenizer=None) -> list[WorkItem]:
    """A JSONL trace (see the module's docstring). Errors name the line and the field."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise MiniLLMError(f"cannot read the trace {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise MiniLLMError(f"the trace {path} is not UTF-8 text: give a JSONL file, one request per line") from None
    items = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name} line {no}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise MiniLLMError(f"{where}: not JSON ({e.msg}); write one object per line, "
                               '{"prompt": "...", "max_tokens": 16}') from None
        if not isinstance(obj, dict):
            raise MiniLLMError(f"{where}: expected an object like {{\"prompt\": \"...\", \"max_tokens\": 16}}")
        unknown = set(obj) - {"arrival", "prompt", "prompt_ids", "max_tokens", "temperature", "top_k", "top_p", "seed"}
        if unknown:
            raise MiniLLMError(f"{where}: unknown field {sorted(unknown)[0]!r}; the fields are arrival, prompt or "
                               "prompt_ids, max_tokens, temperature, top_k, top_p, seed")
        if ("prompt" in obj) == ("prompt_ids" in obj):
            raise MiniLLMError(f"{where}: give exactly one of \"prompt\" (text) or \"prompt_ids\" (token ids)")
        if "prompt" in obj:
            if not isinstance(obj["prompt"], str) or not obj["prompt"]:
                raise MiniLLMError(f"{where}: \"prompt\" must be non-empty text")
            if tokenizer is None:
                from ..bpe import tokenizer as get
                tokenizer = get()
            prompt = tokenizer.encode(obj["prompt"], allowed_special={"<|endoftext|>"})
        else:
            ids = obj["prompt_ids"]
            if not isinstance(ids, list) or not ids or not all(isinstance(x, int) and not isinstance(x, bool)
                                                               for x in ids):
                raise MiniLLMError(f"{where}: \"prompt_ids\" must be a non-empty list of integers")
            prompt = ids
        arrival, max_tokens = obj.get("arrival", 0.0), obj.get("max_tokens", 16)
        if not isinstance(arrival, (int, float)) or isinstance(arrival, bool) or not arrival >= 0:
            raise MiniLLMError(f"{where}: \"arrival\" must be a number of seconds ≥ 0")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise MiniLLMError(f"{where}: \"max_tokens\" must be an integer ≥ 1")
        try:
            item = WorkItem(float(arrival), list(prompt), max_tokens, float(obj.get("temperature", 0.0)),
                            obj.get("top_k"), obj.get("top_p"), obj.get("seed"))
            item.sampling
        except (MiniLLMError, TypeError, ValueError) as e:
            raise MiniLLMError(f"{where}: {e}") from None
        items.append(item)
    if not items:
        raise MiniLLMError(f"the trace {path} holds no request: write one JSON object per line")
    return sorted(items, key=lambda w: w.arrival)


def write_trace(items: list[WorkItem], path) -> None:
    """A workload as a trace (prompts as ids), to replay it or edit it; written whole or not at all."""
    try:
        with atomic_write(path, text=True) as f:
            for w in items:
                d = asdict(w)
                d["prompt_ids"] = d.pop("prompt")
                d = {k: v for k, v in d.items() if v is not None and not (k == "temperature" and v == 0.0)}
                f.write(json.dumps(d) + "\n")
    except OSError as e:
        raise MiniLLMError(f"cannot write the trace {path}: {e.strerror or e}") from None


def load_workload(spec: str, **kw) -> list[WorkItem]:
    """A generator's name, or a path to a .jsonl trace."""
    if spec.endswith(".jsonl") or Path(spec).suffix or "/" in spec:
        return read_trace(spec)
    return generate_workload(spec, **kw)
