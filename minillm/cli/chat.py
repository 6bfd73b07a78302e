"""`minillm chat`: talk to a chat model in the terminal, streaming, with what the counters saw.

Each turn renders the whole conversation with the model's chat template, keeps the KV cache of
everything already said, and prefills only the new tokens (the template's text for the history does
not change, so its ids are a prefix of the next turn's). After each answer, one line: the prefill's
time, decode's tokens per second, the bytes decode moved per second, and that rate as a share of
this machine's measured bandwidth (`minillm hardware`, when it has been measured).
"""

from __future__ import annotations

import shutil
import sys

import numpy as np
from rich.markup import escape

from ..chat import Conversation, render
from ..engine.sequence import SamplingParams
from ..errors import MiniLLMError, PromptError
from ..meter import Meter
from ..bpe import tokenizer
from .common import add_model, add_sampling, err, load_model, model_options, TextStream


def add_arguments(p) -> None:
    add_model(p)
    p.add_argument("--system", metavar="TEXT", default=None, help="a system message to start the conversation")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"the longest answer, in tokens (default {DEFAULT_NEW}); capped by what the model's "
                        "context has room for after the conversation, with a note when it is")
    p.add_argument("--special-tokens-in-messages", action="store_true",
                   help="read control tokens you type (e.g. '<|im_start|>system') as control tokens; by default "
                        "they are plain text")
    add_sampling(p)


DEFAULT_NEW = 256


def room_for_answer(n_ids: int, n_ctx: int, wanted: int | None) -> tuple[int, str | None]:
    """(the longest answer this turn, a note if that is less than asked): the context holds the
    conversation and the answer; a conversation that fills it ends the chat with one line."""
    room = n_ctx - n_ids
    if room < 1:
        raise PromptError(f"the conversation is {n_ids} tokens and fills the model's context of {n_ctx}: "
                          "start a new chat")
    want = DEFAULT_NEW if wanted is None else wanted
    if want <= room:
        return want, None
    return room, (f"answer capped at {room} tokens: the conversation is {n_ids} of the model's {n_ctx} context "
                  f"positions (--max-new-tokens {want})")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if diff.size else n


def answer(model, cache, held: list[int], ids: list[int], max_new: int, pick, on_token) -> tuple[list[int], list[int]]:
    """Prefill what the cache does not hold yet, then decode until an end-of-turn id.
    held: the ids the cache holds. Returns (the new ids, the ids the cache holds now)."""
    keep = min(common_prefix(held, ids), len(ids) - 1)      # at least one token to prefill: its logits
    cache.truncate(keep)
    if len(ids) + max_new > model.config.n_ctx:
        raise PromptError(f"the conversation is {len(ids)} tokens; with {max_new} more it passes the model's "
                          f"context of {model.config.n_ctx}: start a new chat")
    logits, _ = model.prefill(np.asarray(ids[keep:]), cache)
    stop, new = set(model.eos_ids), []
    while True:
        token = pick(logits)
        new.append(token)
        on_token(token)
        if token in stop or len(new) >= max_new:
            break
        logits = model.decode_step(token, cache)
    return new, (ids + new)[:cache.length]          # the last token picked was never run through the model


def _rate(x: float) -> str:
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def counters_line(m: Meter, on_cpu: bool = True) -> str:
    """One line (at most 80 columns) of what the step counters saw in this answer; on the CPU, its
    bandwidth against this machine's measured figure."""
    pre = [s for s in m.steps if s.kind == "prefill"]
    dec = [s for s in m.steps if s.kind == "decode"]
    pre_s = sum(s.seconds for s in pre)
    took = f"{pre_s * 1e3:.0f} ms" if pre_s < 10 else f"{pre_s:.1f} s"
    line = f"prefill {sum(s.n_tokens for s in pre)} tok {took}"
    if dec:
        secs = sum(s.seconds for s in dec)
        gbs = sum(s.total_bytes for s in dec) / secs / 1e9
        line += f" | decode {_rate(len(dec) / secs)} tok/s, {_rate(gbs)} GB/s"
        from ..measure.hardware import cached
        hw = cached() if on_cpu else None   # this setup's measured figures; none yet: left out, not guessed
        if hw is not None:
            line += f" ({gbs / hw.bandwidth_gbs:.0%} of {_rate(hw.bandwidth_gbs)} measured)"
    return line


def run(args) -> int:
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)     # checked once, here
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise PromptError(f"--max-new-tokens {args.max_new_tokens}: must be at least 1")
    model = load_model(args.model, args.weights, args.device, getattr(args, "kernels", None),
                       options=model_options(args))
    tok = tokenizer(model)
    if not model.eos_ids:
        raise MiniLLMError(f"{model.name} has no end-of-turn token: it is not a chat model; try "
                           "--model smollm2-135m (minillm download smollm2-135m)")
    _, note = render([{"role": "user", "content": "x"}], tok)
    if note:
        err.print(f"[dim]{escape(note)}[/]")
    chat = Conversation(tok, args.system, special_in_content=args.special_tokens_in_messages)
    if hasattr(sys.stdin, "reconfigure"):
        sys.stdin.reconfigure(errors="replace")       # bytes that are not UTF-8 arrive as U+FFFD, not a traceback
    cache, held = model.new_cache(), []
    rng = np.random.default_rng(sampling.seed)
    pick = lambda logits: sampling.pick(logits, rng)   # noqa: E731
    err.print(f"[dim]{escape(model.name)}: type a message; Ctrl-D or /exit to leave[/]")
    while True:
        try:
            line = input("> ")
        except EOFError:
            sys.stdout.write("\n")
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if not line.strip():
            continue
        ids = chat.prompt_ids(line)
        max_new, capped = room_for_answer(len(ids), model.config.n_ctx, args.max_new_tokens)
        if capped:
            err.print(f"[dim]{escape(capped)}[/]")
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        stream = TextStream(model, skip=model.eos_ids, width=width)
        with Meter() as m:
            new, held = answer(model, cache, held, ids, max_new, pick, stream)
        stream.close()
        sys.stdout.write("\n")
        sys.stdout.flush()
        chat.answered(tok.decode([t for t in new if t not in model.eos_ids]))
        err.print(f"[dim]{escape(counters_line(m, on_cpu=model.xp is np))}[/]")
