"""Tokenizers: `tokenizer(model)`, a model's own (`minillm.tokenizer`), and GPT-2's byte-pair tokenizer,
built offline from the bundled merge ranks `weights/gpt2.tiktoken`."""

from __future__ import annotations

import base64
from functools import lru_cache
from pathlib import Path

import tiktoken

from .errors import MiniLLMError, WeightsError
from .paths import not_a_regular_file, package_weights_dir, printable_name

ENDOFTEXT = 50256  # the id of <|endoftext|>, GPT-2's only special token

# GPT-2's pre-tokenizer: contractions, runs of letters, runs of digits, runs of other symbols
# (each with an optional leading space), and whitespace. BPE merges happen inside these pieces only.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def load_ranks(path: Path) -> dict[bytes, int]:
    """Read a `.tiktoken` file: one `base64(token bytes) rank` pair per line."""
    if not path.is_file():
        raise MiniLLMError(f"{path}: tokenizer ranks not found; reinstall minillm (the file ships in weights/)")
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(path.read_text(encoding="ascii").splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
        except ValueError as e:
            raise MiniLLMError(f"{path}:{n}: not a `base64 rank` line ({e}); reinstall minillm") from None
    return ranks


def tokenizer(model=None):
    """A model's own tokenizer. No argument (or a GPT-2 model): GPT-2's (50,257 ids; `<|endoftext|>`
    = 50256), never touching the network. A Llama-family model, or its name or path: its own
    (`model_tokenizer.ModelTokenizer`: encode, decode, eos_ids, chat_template)."""
    if model is None:
        return gpt2_tokenizer()
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        return _tokenizer_of(str(model))
    own = model.tokenizer                     # the model's own, attached by the loader (GPT-2: None)
    if own is not None:
        return own
    if model.OWN_TOKENIZER:                   # its tokenizer comes with its checkpoint, and did not
        raise MiniLLMError(f"{model.name}: this model has no tokenizer attached; "
                           "load it from a folder with tokenizer.json or from a GGUF file")
    return gpt2_tokenizer()


def _tokenizer_of(source: str):
    """The tokenizer of a model name or path, without building the model where that can be avoided."""
    from .checkpoints.families import family_of
    if source == "smollm2-135m":
        from .checkpoints import smollm
        where = smollm.find()
        if where is None:
            raise MiniLLMError("smollm2-135m is not downloaded yet; fetch it with: minillm download smollm2-135m")
        source = str(where)
    path = Path(source).expanduser()
    problem = not_a_regular_file(path)
    if problem is not None and problem.startswith("cannot"):   # a NUL in the name, a loop of links, no permission
        raise WeightsError(f"{printable_name(source, 200)}: {problem}")
    own = family_of(path).tokenizer(path) if path.exists() else None
    return own if own is not None else gpt2_tokenizer()


@lru_cache(maxsize=1)
def gpt2_tokenizer() -> tiktoken.Encoding:
    """The GPT-2 tokenizer (50,257 ids; `<|endoftext|>` = 50256). Never touches the network."""
    ranks = load_ranks(package_weights_dir() / "gpt2.tiktoken")
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": ENDOFTEXT},
        explicit_n_vocab=50257,
    )
