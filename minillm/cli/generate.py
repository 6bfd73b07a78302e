"""`minillm generate`: continue a prompt, streaming the text."""

from __future__ import annotations

import sys
import time

from rich.markup import escape

from ..engine.generate import generate
from ..engine.sampling import check_sampling
from .common import TextStream, add_model, add_sampling, encode_prompt, err, load_model


def add_arguments(p) -> None:
    p.add_argument("prompt", metavar="PROMPT")
    add_model(p)
    p.add_argument("--max-new-tokens", type=int, default=100, help="how many tokens to generate (default 100)")
    add_sampling(p)
    p.add_argument("--no-cache", action="store_true", help="naive decode: recompute the whole sequence every step")


def run(args) -> int:
    check_sampling(args.temperature, args.top_k, args.top_p, args.seed)
    model = load_model(args.model)
    ids = encode_prompt(model, args.prompt, args.max_new_tokens)
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    t0 = time.perf_counter()
    new = generate(model, ids, args.max_new_tokens, kv_cache=not args.no_cache, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p, seed=args.seed, on_token=TextStream())
    seconds = time.perf_counter() - t0
    sys.stdout.write("\n")
    sys.stdout.flush()
    err.print(f"[dim]{len(new)} tokens in {seconds:.2f} s ({len(new) / seconds:.1f} tokens/s), "
              f"{'naive (no KV cache)' if args.no_cache else 'KV-cached'}, model {escape(model.name)}[/]")
    return 0
