"""Where minillm finds its files: package data (found through the package, never the cwd) and the cache."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path


def package_weights_dir() -> Path:
    """The bundled `weights/` folder, installed as the `minillm.weights` package."""
    return Path(str(resources.files("minillm.weights")))


def package_lessons_dir() -> Path:
    """The `lessons/` folder, installed as the `minillm.lessons` package."""
    return Path(str(resources.files("minillm.lessons")))


def cache_dir() -> Path:
    """`$MINILLM_HOME`, else `~/.cache/minillm`: downloaded checkpoints and measured hardware figures."""
    home = os.environ.get("MINILLM_HOME")
    return Path(home) if home else Path.home() / ".cache" / "minillm"
