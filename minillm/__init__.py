"""minillm: a from-scratch LLM inference engine in pure NumPy (GPT-2, the Llama family, mixtures of
experts; fused numba kernels and a CuPy path beside the NumPy reference) that shows where inference
time goes.

    import minillm
    model = minillm.load()                       # the bundled Shakespeare model
    enc = minillm.tokenizer()
    ids = enc.encode("ROMEO:")
    with minillm.Meter() as m:
        new = minillm.generate(model, ids, 20)   # prefill + 19 cached decode steps
    print(enc.decode(new), m.steps[1].intensity)

The names below load with the first use of any of them (`import minillm` itself is quick, so
`minillm --help` does not wait for NumPy). Each lives in one module, named beside it.
"""

import importlib as _importlib
import os as _os
import sys as _sys

__version__ = "0.2.0"

# OpenBLAS's threads spin after each product, waiting for the next (2^28 cycles by default, about
# 0.1 s): the fused kernels' numba threads that run next then share the cores with two spinning
# threads. Measured on a quiet 2-core Zen 4, GPT-2-124M float32, 2 threads, `minillm bench --weights
# float32 --kernels numpy,fused`, one run each: with 2^28 fused decode 40.9 tokens/s and NumPy's
# 47.7, with 2^10 64.0 and 53.7. OpenBLAS reads this when NumPy first loads it, so it is set before
# minillm imports NumPy; an explicit setting wins (`threads.blas_spin()` reads it back).
if "numpy" not in _sys.modules:             # else OpenBLAS has read its setting already
    _os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "10")
else:
    from . import threads as _threads
    _threads.SPIN_SET_BEFORE_NUMPY = False

# public name -> the module that defines it
_API = {
    "GPT2Config": "models.gpt2", "MiniLLMError": "errors", "PromptError": "errors", "WeightsError": "errors",
    "generate_batch": "engine.batch", "generate": "engine.generate", "sample": "engine.sampling",
    "speculative_generate": "engine.speculative", "KVCache": "cache.contiguous",
    "PagedKVCache": "cache.paged", "PagedKVPool": "cache.paged", "load": "checkpoints.load",
    "Meter": "meter", "GPT2": "models.gpt2",
}
__all__ = sorted([*_API, "tokenizer"])


def __getattr__(name: str):
    if name in _API:
        value = getattr(_importlib.import_module(f"minillm.{_API[name]}"), name)
        globals()[name] = value               # found once; later lookups are plain attributes
        return value
    raise AttributeError(f"module 'minillm' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))


def _starting_the_command() -> bool:
    """Is this import the `minillm` command starting (its console script, or `python -m minillm`)?"""
    first = _os.path.basename(_sys.argv[0]) if _sys.argv else ""
    return first in ("minillm", "-m") or _sys.argv[0].endswith(_os.path.join("minillm", "__main__.py"))


try:
    from .errors import interrupted as _interrupted
    from . import _checkout  # noqa: F401  (lessons/ and weights/ found from a checkout)
    from .bpe import tokenizer       # the function; its module is `minillm.bpe` (no name shadows a module)
except KeyboardInterrupt:          # Ctrl-C while the command is still starting: exit quietly
    if _starting_the_command():
        raise SystemExit(130) from None
    raise
except BaseException as _e:        # ... or Ctrl-C wrapped by Python (errors.interrupted, loaded first)
    if _starting_the_command() and _interrupted(_e):
        raise SystemExit(130) from None
    raise
