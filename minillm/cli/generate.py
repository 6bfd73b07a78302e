"""`minillm generate`: continue a prompt, streaming the text."""

from __future__ import annotations

import sys
import time

from rich.markup import escape

from ..engine.generate import generate
from ..engine.sampling import check_sampling
from ..engine.speculative import check_k, speculative_generate
from ..errors import MiniLLMError, PromptError
from ..paths import expand_user, read_named_file
from ..trace import check_path, trace_line, traced
from .common import (add_model, add_sampling, add_speculative, add_trace, encode_prompt, err, kernels_label,
                     load_draft, load_model, model_options, note_if_busy, TextStream)


MAX_PROMPT_BYTES = 16 << 20  # far beyond any context (1,024 tokens are ~4 KB of text)


def add_arguments(p) -> None:
    p.add_argument("prompt", metavar="PROMPT", nargs="?", help="the text to continue (or use --prompt-file)")
    p.add_argument("--prompt-file", metavar="FILE", default=None,
                   help="read the prompt from a UTF-8 text file, or from standard input if FILE is -")
    add_model(p)
    p.add_argument("--max-new-tokens", type=int, default=100, help="how many tokens to generate (default 100)")
    add_sampling(p)
    add_trace(p, " (the generation's steps; the meter's counting adds its small cost to them)")
    p.add_argument("--no-cache", action="store_true", help="naive decode: recompute the whole sequence every step")
    add_speculative(p)
    p.add_argument("--chat", action="store_true",
                   help="PROMPT is a user's message: render it with the model's chat template and print "
                        "only the answer, stopping at the end of the turn")
    p.add_argument("--system", metavar="TEXT", default=None, help="with --chat: a system message first")


def read_prompt(args) -> str:
    """PROMPT, or the text of --prompt-file (a regular file, or - for standard input): exactly one of them."""
    if (args.prompt is None) == (args.prompt_file is None):
        which = "not both" if args.prompt is not None else "one of them is needed"
        raise PromptError(f"give the prompt as PROMPT or with --prompt-file FILE (- for standard input): {which}")
    if args.prompt is not None:
        return args.prompt
    name = args.prompt_file
    if name == "-":
        name, raw = "standard input", sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1)
    else:
        raw = read_named_file(expand_user(name), MAX_PROMPT_BYTES, PromptError, f"--prompt-file {name}",
                              "give a UTF-8 text file, or - for standard input")
    if raw is None or len(raw) > MAX_PROMPT_BYTES:
        raise PromptError(f"{name}: over {MAX_PROMPT_BYTES >> 20} MiB, far more than any context holds")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PromptError(f"{name}: not UTF-8 text (bad byte 0x{raw[e.start]:02x} at byte {e.start})") from None


def run(args) -> int:
    check_sampling(args.temperature, args.top_k, args.top_p, args.seed)
    check_k(args.speculate_k, "--speculate-k")   # before loading anything
    if args.no_cache and args.draft not in (None, "none"):
        raise MiniLLMError("--draft needs the KV cache (it rolls the cache back past rejected guesses): "
                           "drop --no-cache or --draft")
    prompt = read_prompt(args)
    if args.trace is not None:
        check_path(args.trace)                   # before loading anything
    if args.system is not None and not args.chat:
        raise PromptError("--system goes with --chat")
    model = load_model(args.model, args.weights, args.device, getattr(args, "kernels", None),
                       options=model_options(args))
    stop = ()
    if args.chat:
        from ..chat import render
        from ..bpe import tokenizer
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
            [{"role": "user", "content": prompt}]
        shown, prompt = "", None
        text, note = render(messages, tokenizer(model))
        if note:
            err.print(f"[dim]{escape(note)}[/]")
        ids = encode_prompt(model, text, args.max_new_tokens)
        stop = tuple(model.eos_ids)
    else:
        ids = encode_prompt(model, prompt, args.max_new_tokens)
        shown = prompt
    draft = load_draft(args.draft, model, getattr(args, "weights", None))
    note_if_busy(args)
    sys.stdout.write(shown)
    sys.stdout.flush()
    t0 = time.perf_counter()
    stream = TextStream(model, skip=stop)
    stats = None
    with traced(args.trace, f"minillm generate: {model.name}, {model.kernels} kernels") as tm:
        if draft is None:
            new = generate(model, ids, args.max_new_tokens, kv_cache=not args.no_cache, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, seed=args.seed, on_token=stream, stop_ids=stop)
        else:
            new, stats = speculative_generate(model, ids, args.max_new_tokens, draft=draft, k=args.speculate_k,
                                              temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                              seed=args.seed, on_token=stream)
    stream.close()
    seconds = time.perf_counter() - t0
    sys.stdout.write("\n")
    sys.stdout.flush()
    how = "naive (no KV cache)" if args.no_cache else "KV-cached"
    if stats is not None and not stats.drafted:
        how = f"speculative, draft {escape(stats.draft)}, k {stats.k}: no guesses were made"
    elif stats is not None:
        how = (f"speculative, draft {escape(stats.draft)}, k {stats.k}: {stats.accepted} of {stats.drafted} guesses "
               f"accepted ({stats.acceptance_rate:.0%}), {stats.tokens_per_round:.2f} tokens per step of the model")
        if args.temperature > 0:
            how += ("; sampled with the acceptance rule: each token follows the model's own distribution, but the "
                    "draws, and so the text, differ from the same seed without a draft")
    err.print(f"[dim]{len(new)} tokens in {seconds:.2f} s ({len(new) / seconds:.1f} tokens/s), "
              f"{how}, model {escape(model.name)}, {kernels_label(model)}[/]", soft_wrap=False)
    if tm is not None:
        err.print(f"[dim]{escape(trace_line(args.trace, [tm]))}[/]", soft_wrap=False)
    return 0
