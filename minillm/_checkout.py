"""`lessons/` and `weights/` sit beside `minillm/` in the repository and are installed as
`minillm.lessons` and `minillm.weights` (pyproject.toml's package-dir). Run from a checkout, Python
imports the source folder `minillm/`, which does not hold them: this finder, asked last, finds them
in the checkout, so the same import works from a checkout and from an install."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path


class _Checkout(importlib.abc.MetaPathFinder):
    ROOT = Path(__file__).resolve().parents[1]

    def find_spec(self, name, path=None, target=None):
        head, _, tail = name.partition(".")
        folder = self.ROOT / tail
        if head == "minillm" and tail in ("weights", "lessons") and (folder / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                          submodule_search_locations=[str(folder)])
        return None


if not any(isinstance(f, _Checkout) for f in sys.meta_path):
    # First, not last: an editable install of another checkout maps `minillm.lessons` to ITS folder, and
    # this checkout's `minillm/` must not run beside another checkout's lessons.
    sys.meta_path.insert(0, _Checkout())
