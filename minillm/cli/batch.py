"""`minillm generate-batch`: many prompts in shared batched steps, and what that buys."""

from __future__ import annotations

import json
import sys
import statistics
import time
from pathlib import Path

from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from ..engine.batch import generate_batch
from ..engine.generate import generate
from ..engine.sampling import check_sampling
from ..errors import MiniLLMError, PromptError
from ..bpe import tokenizer
from .. import closeness
from ..measure.comparisons import comparison_threads
from ..threads import blas_threads, limited
from .common import (add_model, add_sampling, at_least_one, err, kernels_label, load_model, model_options,
                     note_if_busy, out)


def add_arguments(p) -> None:
    p.add_argument("file", metavar="FILE",
                   help="prompts, one per line (blank lines skipped), or JSON lines "
                        '{"prompt": ..., "max_new_tokens": ..., "seed": ...}; - reads standard input')
    add_model(p)
    p.add_argument("--max-new-tokens", type=int, default=50, help="tokens per prompt unless a line says (default 50)")
    add_sampling(p)
    p.add_argument("--block-size", type=int, default=16, help="positions per KV-cache block (default 16)")
    p.add_argument("--compare", action="store_true",
                   help="also generate each prompt alone, one after another: same tokens? how much faster?")
    p.add_argument("--repeats", type=int, default=2, metavar="N",
                   help="with --compare: rounds of each, interleaved; ranked only when the rounds agree beyond "
                        "their spread (default 2)")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt instead of text panels")


def read_prompts(path: str, default_new: int, default_seed) -> list[tuple[str, int, int | None]]:
    """[(prompt, max_new_tokens, seed)] from a text or JSON-lines file (or '-')."""
    if path == "-":
        text, name = sys.stdin.read(), "standard input"
    else:
        p = Path(path)
        if not p.is_file():
            raise MiniLLMError(f"{path}: no such file (give a text file with one prompt per line)")
        try:
            text, name = p.read_text(encoding="utf-8"), path
        except (OSError, UnicodeDecodeError) as e:
            raise MiniLLMError(f"{path}: cannot be read as UTF-8 text ({e.__class__.__name__})") from None
    rows = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                obj = json.loads(line)
                prompt = obj["prompt"]
                n = obj.get("max_new_tokens", default_new)
                seed = obj.get("seed", default_seed)
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise MiniLLMError(f"{name}, line {no}: expected a JSON object with a \"prompt\" string") from None
            if not isinstance(prompt, str) or not isinstance(n, int) or not (seed is None or isinstance(seed, int)):
                raise MiniLLMError(f"{name}, line {no}: \"prompt\" must be a string, \"max_new_tokens\" and "
                                   "\"seed\" integers")
            if n < 1:
                raise MiniLLMError(f"{name}, line {no}: \"max_new_tokens\" {n}: must be at least 1")
            rows.append((prompt, n, seed, no))
        else:
            rows.append((line, default_new, default_seed, no))
    if not rows:
        raise MiniLLMError(f"{name}: no prompts in it (one prompt per line)")
    return rows


def run(args) -> int:
    check_sampling(args.temperature, args.top_k, args.top_p, args.seed)
    at_least_one(args, "max_new_tokens", "block_size")
    rows = read_prompts(args.file, args.max_new_tokens, args.seed)
    model = load_model(args.model, args.weights, args.device, getattr(args, "kernels", None),
                       options=model_options(args))
    enc = tokenizer(model)
    ids = [enc.encode(p, allowed_special={"<|endoftext|>"}) for p, *_ in rows]
    limits = [n for _, n, _, _ in rows]
    seeds = [s for _, _, s, _ in rows]
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    at_least_one(args, "repeats")
    threads, why = comparison_threads(getattr(args, "threads", None), default=blas_threads())
    if args.compare and why:                  # every side on one thread count: one, when busy
        err.print(f"[yellow]note:[/] {escape(why)}", soft_wrap=False)
    else:
        note_if_busy(args)
        threads = getattr(args, "threads", None)
    steps = []
    batched_s, alone_rounds, alone = [], [], None
    for r in range(args.repeats if args.compare else 1):
        with limited(threads), err.status(f"{len(rows)} prompts in shared steps…") as status:
            def on_step(seqs):
                if r == 0:
                    steps.append(len(seqs))
                status.update(f"{len(rows)} prompts in shared steps: step {len(steps)}, {len(seqs)} sequences")
            t0 = time.perf_counter()
            try:
                out_r = generate_batch(model, ids, limits, seed=seeds, cache="paged", block_size=args.block_size,
                                       on_step=on_step, **sampling)
            except PromptError as e:
                raise PromptError(_line_of(str(e), rows)) from None
            batched_s.append(time.perf_counter() - t0)
        if r == 0:
            new = out_r
        if args.compare:
            with limited(threads), err.status("the same prompts one at a time…"):
                t0 = time.perf_counter()
                got = [generate(model, i, n, seed=s, **sampling) for i, n, s in zip(ids, limits, seeds)]
                alone_rounds.append(time.perf_counter() - t0)
            alone = alone if alone is not None else got
    seconds = statistics.median(batched_s)
    alone_s = statistics.median(alone_rounds) if alone_rounds else None
    n_tokens = sum(len(t) for t in new)
    if args.json:
        for (prompt, *_), tokens in zip(rows, new):
            print(json.dumps({"prompt": prompt, "text": enc.decode(tokens), "tokens": tokens}))
        return 0
    for i, ((prompt, *_), tokens) in enumerate(zip(rows, new)):
        out.print(Panel(Text(prompt + enc.decode(tokens)), title=f"{i}", title_align="left"))
    out.print(f"[bold]{len(rows)} prompts, {n_tokens} new tokens in {seconds:.2f} s "
              f"({n_tokens / seconds:.1f} tokens/s)[/], {len(steps)} batched steps of up to {max(steps, default=0)} "
              f"sequences, model {escape(model.name)}, {kernels_label(model)}")
    if alone is not None:
        same = sum(a == b for a, b in zip(alone, new))
        side = closeness.apart(alone_rounds, batched_s)
        how = (f"faster, every round beyond the other's spread ({closeness.holds_for(threads)})" if side > 0 else
               f"slower, every round beyond the other's spread ({closeness.holds_for(threads)})" if side < 0 else
               f"no winner ({closeness.why_not(alone_rounds, batched_s)})")
        out.print(f"one at a time: {alone_s:.2f} s ({n_tokens / alone_s:.1f} tokens/s), medians of "
                  f"{len(alone_rounds)} interleaved rounds: batching took {seconds / alone_s:.2f}× the time, {how}; "
                  f"identical tokens for {same} of {len(rows)} prompts"
                  + ("" if same == len(rows) else
                     " (a batched product sums in another order: in float32 a near-tie between two tokens can flip)"))
    return 0


def _line_of(message: str, rows) -> str:
    """'prompt 3: ...' from generate_batch, said with the file's line number."""
    if message.startswith("prompt "):
        head, _, rest = message.partition(": ")
        try:
            return f"line {rows[int(head.split()[1])][3]}: {rest}"
        except (ValueError, IndexError):
            pass
    return message
