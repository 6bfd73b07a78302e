"""What the commands share: the --model, sampling and KV-cache options, loading with a spinner,
prompt checks, the busy-machine note, and streaming text."""

from __future__ import annotations

import argparse
import codecs
import re
import sys

import numpy as np
from rich.markup import escape

from ..backend import get_device
from ..models import kernel_sets
from ..checkpoints.families import all_options
from ..checkpoints.load import load, model_names
from ..engine.sampling import check_fits
from ..engine.speculative import check_draft_model
from ..errors import MiniLLMError, PromptError
from ..measure.busy import busy_note
from ..bpe import tokenizer
from .console import err, out  # noqa: F401  (the consoles every command prints on)

MODEL_HELP = ("checkpoint directory or .safetensors file, or a name: " + ", ".join(model_names()))


WEIGHTS_HELP = ("the weights in memory: float32 (default), q8_0, q4_0 or q4_1 (quantized at load as GGUF "
                "defines them, multiplied without widening the whole matrix), native (as the file has them)")


KERNELS_HELP = (f"the kernel set that computes: {kernel_sets.described()}; default: {kernel_sets.default_described()} "
                "(the reason said once when the model loads)")
DEVICE_HELP = ("where the model runs: cpu (NumPy, default) or cuda (CuPy on an NVIDIA GPU, weights in float16; "
               "pip install 'minillm[gpu]')")


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, metavar="MODEL", help=MODEL_HELP + " (default: the bundled model)")
    add_weights(p)
    add_device(p)


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu", metavar="DEVICE", help=DEVICE_HELP)


def add_weights(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weights", default="float32", metavar="FORMAT", help=WEIGHTS_HELP)
    p.add_argument("--kernels", default=None, choices=kernel_sets.NAMES, help=KERNELS_HELP)
    add_options(p)


def add_options(p: argparse.ArgumentParser, several: bool = False) -> None:
    """One flag per family option, derived from the families' rows (models/options.py): `--mla-decode`
    for DeepSeek's. several: a comparison's flag, taking choices comma-separated (bench)."""
    for o in all_options():
        if several:
            p.add_argument(o.flag, default=None, metavar=",".join(o.choices),
                           help=f"{o.help}; several comma-separated: each side by side")
        else:
            p.add_argument(o.flag, default=None, choices=o.choices, help=o.help)


def model_options(args) -> dict:
    """The family options given on the command line (flags derived from the rows), name -> value."""
    given = vars(args)
    return {o.name: given[o.name] for o in all_options() if given.get(o.name) is not None}


TRACE_HELP = ("write where the time went as a Chrome trace-event file (JSON; open it in ui.perfetto.dev or "
              "chrome://tracing): one slice per operation with its bytes and FLOPs, one per step")


def add_trace(p: argparse.ArgumentParser, what: str = "") -> None:
    p.add_argument("--trace", default=None, metavar="FILE", help=TRACE_HELP + what)


def add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); higher = more random")
    p.add_argument("--top-k", type=int, default=None, help="sample only from the K most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample only from the smallest set reaching probability P")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling: the same seed gives the same text")


def add_speculative(p: argparse.ArgumentParser, default: str | None = None) -> None:
    dflt = f"default {default}" if default else "default: none, plain decode"
    p.add_argument("--draft", default=default, metavar="DRAFT",
                   help="speculative decoding: who guesses the next tokens for the model to check in one step: "
                        "'ngram' (the continuation of an earlier repeat of the text, no model) or a smaller model "
                        f"with the same tokenizer (a name such as small, or a checkpoint); 'none' for plain decode ({dflt})")
    p.add_argument("--speculate-k", type=int, default=4, metavar="K",
                   help="guesses per round, 1 to 16 (default 4): one step of the model checks all K")


def add_kv_options(p: argparse.ArgumentParser) -> None:
    """The paged KV cache's size and block size, as `serve` and `serve-sim` take them."""
    p.add_argument("--kv-memory", default="256MB", metavar="SIZE",
                   help="memory for the paged KV cache: 256MB, 1GB, 512MiB ... (default 256MB)")
    p.add_argument("--block-size", type=int, default=16, help="positions per KV-cache block (default 16)")


def add_batch_limits(p: argparse.ArgumentParser) -> None:
    """The step's limits, as `serve` and `serve-sim` take them (the engine's max_seqs and max_batched_tokens)."""
    p.add_argument("--max-seqs", type=int, default=16, metavar="N",
                   help="most sequences in one step; the static policy's batch size (default 16)")
    p.add_argument("--max-batched-tokens", type=int, default=256, metavar="N",
                   help="token budget of one step: longer prompts are prefilled in chunks (default 256)")


_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_bytes(text: str, option: str = "--kv-memory") -> int:
    """'256MB' -> 256e6; 'MiB', 'GB', 'k' and plain bytes also work. Zero is refused."""
    m = _SIZE.fullmatch(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise MiniLLMError(f"{option} {text!r}: write a size such as 256MB, 1GB or 512MiB")
    size = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if size < 1:
        raise MiniLLMError(f"{option} {text!r}: the KV cache needs some memory: give a size such as 256MB")
    return size


def at_least_one(args, *names: str) -> None:
    """Refuse, with the option's name, any of the integer options `names` that is below 1."""
    for name in names:
        if getattr(args, name) < 1:
            raise MiniLLMError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")


def note_if_busy(args) -> None:
    """Before the first timing: one line on stderr if the machine is busy, with the fix."""
    note = busy_note(getattr(args, "threads", None))
    if note:
        err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=False)


WARM_NOTE_S = 0.5      # a warm-up longer than this compiled something: said, so no one reads it as a step


def warm_up(model, ids, kv_cache: bool = True, engine: bool = False) -> float:
    """Before a timed run: one short generation (prefill and decode) through the same code, so the fused
    kernels' one-time compilation (numba, seconds on the first call) and the first touches of the weights
    are not counted as a step; with `engine`, two short requests through the serving engine too (its
    batched, paged steps). Says so on stderr when it took long enough to have compiled something.
    -> the seconds it took."""
    import time

    from ..engine.generate import generate
    ids = list(ids)[: max(1, min(8, len(ids)))]
    t0 = time.perf_counter()
    generate(model, ids, 2, kv_cache=kv_cache)
    if engine:
        from ..serving.metrics import serve
        from ..serving.workloads import WorkItem
        serve(model, [WorkItem(0.0, ids, 2), WorkItem(0.0, ids[::-1], 2)])
    seconds = time.perf_counter() - t0
    if seconds > WARM_NOTE_S:
        err.print(f"[dim]warm-up: {seconds:.1f} s before timing (compiling the fused kernels on first use, and "
                  "first touches of the weights): not counted as a step[/]", soft_wrap=False)
    return seconds


def load_draft(name, model, weights: str | None = None, kernels: str | None = None):
    """The --draft value: None (or 'none'), 'ngram', or a model loaded like --model (with the same
    --weights as given, e.g. native; else in the format the target ended up in)."""
    if name is None or name == "none":
        return None
    if name == "ngram":
        return "ngram"
    draft = load_model(name, weights or model.weights, model.device,
                       kernels or model.kernels, quiet=True)
    check_draft_model(draft, model)
    return draft


def load_model(source, weights: str = "float32", device="cpu", kernels: str | None = None, quiet: bool = False,
               options: dict | None = None):
    """`load`, with a spinner on stderr while it works (random-1558m takes a while to build); on
    --device cuda without a usable GPU, one DeviceError line before anything is read. kernels None:
    the default (one line on stderr says why it is NumPy's on the CPU, when numba cannot run).
    options: the family's options (`model_options(args)`: --mla-decode, ...), checked by its row at load."""
    device = get_device(device)
    with err.status(f"loading {escape(str(source or 'the bundled model'))}…"):
        model = load(source, weights=weights, device=device, kernels=kernels, options=options)
    if kernels is None and not quiet and model.target.on_cpu and model.kernels == "numpy":
        note = kernel_sets.why_default()
        if note:
            err.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=False)
    return model


def kernels_label(model) -> str:
    """How a model computes, for a command's header: 'fused kernels (numba 0.68.1)', 'NumPy kernels'."""
    declined = model.kernel_set.declines(model.ATTENTION_ASKS)
    return model.kernel_set.about + (f"; attention in NumPy's form (the set's kernel takes no {', '.join(declined)})"
                                     if declined else "")


def encode_prompt(model, prompt: str, max_new_tokens: int) -> np.ndarray:
    """Tokenize a prompt and check, before any work, that it fits the model's vocabulary and context."""
    if not prompt:
        raise PromptError("the prompt is empty: give some text to continue, e.g. \"ROMEO:\"")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:                # bytes that were not UTF-8 arrive as lone surrogates
        bad = prompt[e.start].encode("utf-8", "surrogateescape")
        raise PromptError(f"the prompt is not valid UTF-8 (byte 0x{bad.hex()} at character {e.start}); "
                          "give it as UTF-8 text") from None
    ids = tokenizer(model).encode(prompt, allowed_special={"<|endoftext|>"})
    ids = model.check_ids(ids)
    if max_new_tokens < 1:
        raise PromptError(f"--max-new-tokens {max_new_tokens}: must be at least 1")
    check_fits(ids.size, max_new_tokens, model.config.n_ctx)
    return ids


class TextStream:
    """Print tokens as they come; a character split across tokens is held until it is whole. With
    `width` (a terminal's columns), words are kept whole: a word that would cross the edge starts the
    next line (the terminal would otherwise break it mid-word), so a word prints when it is complete."""

    def __init__(self, model=None, skip=(), width: int | None = None) -> None:
        self.enc = tokenizer(model)
        self.skip = frozenset(skip)          # end-of-turn ids: not printed
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.width = width if width is None or width > 1 else None
        self.column = 0                      # characters on the current line
        self.word = ""                       # the word being received, not yet printed

    def __call__(self, token: int) -> None:
        if token in self.skip:
            return
        self._emit(self.utf8.decode(self.enc.decode_single_token_bytes(token)))
        sys.stdout.flush()

    def _emit(self, text: str) -> None:
        if self.width is None:
            sys.stdout.write(text)
            return
        for ch in text:
            if ch == "\n":
                self._word()
                sys.stdout.write("\n")
                self.column = 0
            elif ch.isspace():
                self._word()
                if self.column + 1 > self.width:
                    sys.stdout.write("\n")
                    self.column = 0
                else:
                    sys.stdout.write(ch)
                    self.column += 1
            else:
                self.word += ch
                if len(self.word) >= self.width:          # longer than a line: it has to be broken
                    self._word()

    def _word(self) -> None:
        if not self.word:
            return
        if self.column > 0 and self.column + len(self.word) > self.width:
            sys.stdout.write("\n")
            self.column = 0
        sys.stdout.write(self.word)
        self.column += len(self.word)
        self.word = ""

    def close(self) -> None:
        """Print what is still held: a last character left incomplete prints as U+FFFD, as `decode` gives."""
        self._emit(self.utf8.decode(b"", final=True))
        if self.width is not None:
            self._word()
        sys.stdout.flush()
