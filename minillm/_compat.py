"""The flat module names of minillm 0.1 (`minillm.model`, `minillm.meter`, ...) still import: each is
the moved module itself (one module object, so `minillm.hardware.X` is the module itself)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

MOVED = {
    "model": "models.gpt2", "ops": "models.ops", "kvcache": "cache.contiguous",
    "generate": "engine.generate", "safetensors": "checkpoints.safetensors",
    "checkpoint": "checkpoints.checkpoint", "load": "checkpoints.load", "download": "checkpoints.download",
    "hardware": "measure.hardware", "bench": "measure.bench",
    "train": "training.train", "learn": "cli.learn", "report": "ui.report",
}
# `minillm.generate` and `minillm.load` are functions in the package namespace: their old module
# names are bound now, so a later `import minillm.generate` cannot replace the function attribute.
for _old in ("generate", "load"):
    sys.modules[f"minillm.{_old}"] = importlib.import_module(f"minillm.{MOVED[_old]}")


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        head, _, tail = name.partition(".")
        if head == "minillm" and tail in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"minillm.{MOVED[spec.name.partition('.')[2]]}")

    def exec_module(self, module):
        pass


class _Checkout(importlib.abc.MetaPathFinder):
    """`weights/` and `lessons/` sit beside `minillm/` in the repository and become `minillm.weights`
    and `minillm.lessons` when the package is installed. Run from the repository root, Python
    imports the source folder `minillm/` instead of the installed package, and those two are not
    in it: this finder, asked last, finds them in the checkout."""

    ROOT = Path(__file__).resolve().parents[1]

    def find_spec(self, name, path=None, target=None):
        head, _, tail = name.partition(".")
        folder = self.ROOT / tail
        if head == "minillm" and tail in ("weights", "lessons") and (folder / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                          submodule_search_locations=[str(folder)])
        return None


if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.append(_Alias())
    sys.meta_path.append(_Checkout())
