"""The training text that ships with minillm: tinyshakespeare (public domain, ~1.1 MB, stored gzipped).

`minillm train` and `minillm eval` read it when no `--data` is given. The package holds it
compressed (`weights/tinyshakespeare.txt.gz`, installed as package data of `minillm.weights`); the first use writes the plain text once
under `cache_dir()/data/`, and later uses read that copy.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

from .errors import MiniLLMError
from .paths import atomic_write, cache_dir, package_weights_dir

NAME = "tinyshakespeare.txt"
SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"   # of the plain text


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def bundled_text_path() -> Path:
    """The plain-text path of the bundled tinyshakespeare, decompressed on first use (checked by SHA-256)."""
    target = cache_dir() / "data" / NAME
    if target.is_file() and target.stat().st_size == 1115394 and _digest(target) == SHA256:
        return target
    source = package_weights_dir() / (NAME + ".gz")
    try:
        text = gzip.decompress(source.read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise MiniLLMError(f"{source}: the bundled training text cannot be read ({e}); reinstall minillm") from None
    if hashlib.sha256(text).hexdigest() != SHA256:
        raise MiniLLMError(f"{source}: the bundled training text is damaged (SHA-256 differs); reinstall minillm")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(target) as f:
            f.write(text)
    except OSError as e:
        raise MiniLLMError(f"cannot write the bundled training text to {target} ({e}); set MINILLM_HOME "
                           "to a writable folder, or pass --data") from None
    return target


class BundledText(os.PathLike):
    """A path that stands for the bundled text and is decompressed only when first used: the argparse
    default of `--data`, so that a command that never reads the data costs nothing."""

    def __fspath__(self) -> str:
        return str(bundled_text_path())

    def __str__(self) -> str:
        return self.__fspath__()

    def __repr__(self) -> str:
        return f"<bundled {NAME}>"
