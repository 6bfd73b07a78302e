"""minillm: a from-scratch GPT-2 in pure NumPy that shows where inference time goes.

    import minillm
    model = minillm.load()                       # the bundled Shakespeare model
    enc = minillm.tokenizer()
    ids = enc.encode("ROMEO:")
    with minillm.Meter() as m:
        new = minillm.generate(model, ids, 20)   # prefill + 19 cached decode steps
    print(enc.decode(new), m.steps[1].intensity)
"""

import os as _os
import sys as _sys


def _starting_the_command() -> bool:
    """Is this import the `minillm` command starting (its console script, or `python -m minillm`)?"""
    first = _os.path.basename(_sys.argv[0]) if _sys.argv else ""
    return first in ("minillm", "-m") or _sys.argv[0].endswith(_os.path.join("minillm", "__main__.py"))


try:
    from .config import GPT2Config
    from .errors import MiniLLMError, PromptError, WeightsError
    from .engine.batch import generate_batch
    from .engine.generate import generate
    from .engine.sampling import sample
    from .engine.speculative import speculative_generate
    from .cache.contiguous import KVCache
    from .cache.paged import PagedKVCache, PagedKVPool
    from .checkpoints.load import load
    from .meter import Meter
    from .models.gpt2 import GPT2
    from .tokenizer import tokenizer
except KeyboardInterrupt:          # Ctrl-C while the command is still importing NumPy: exit quietly
    if _starting_the_command():
        raise SystemExit(130) from None
    raise

__all__ = ["GPT2", "GPT2Config", "KVCache", "Meter", "MiniLLMError", "PagedKVCache", "PagedKVPool", "PromptError",
           "WeightsError", "generate", "generate_batch", "load", "sample", "speculative_generate",
           "tokenizer"]
__version__ = "0.1.0"

# Modules keep their old flat names (minillm.model, minillm.meter, ...): see _compat.
try:
    from . import _compat  # noqa: E402,F401
except KeyboardInterrupt:
    if _starting_the_command():
        raise SystemExit(130) from None
    raise
