"""GPT-2's byte-pair tokenizer, built offline from the bundled merge ranks `weights/gpt2.tiktoken`."""

from __future__ import annotations

import base64
from functools import lru_cache
from pathlib import Path

import tiktoken

from .errors import MiniLLMError
from .paths import package_weights_dir

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


@lru_cache(maxsize=1)
def tokenizer() -> tiktoken.Encoding:
    """The GPT-2 tokenizer (50,257 ids; `<|endoftext|>` = 50256). Never touches the network."""
    ranks = load_ranks(package_weights_dir() / "gpt2.tiktoken")
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": ENDOFTEXT},
        explicit_n_vocab=50257,
    )
