"""`minillm.load(source)`: one function that finds and builds a model from any of its sources."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..checkpoints.checkpoint import load_checkpoint, random_params
from ..config import PRESETS, GPT2Config
from ..errors import MiniLLMError, ModelNotFoundError, WeightsError
from ..models.gpt2 import GPT2
from ..paths import expand_user, not_a_regular_file, package_weights_dir

RANDOM_SEED = 1234
DOWNLOADABLE = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
LLAMA_DOWNLOADABLE = ("smollm2-135m",)   # a Llama-family chat model (checkpoints/smollm.py)
# A small random model for when no bundled model is installed, and for quick tests.
TINY = GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=256, vocab_size=50257)


# The bundled models, trained here on the bundled text: name -> (folder under weights/, model name)
BUNDLED = {"small": ("", "minillm-shakespeare"), "large": ("large", "minillm-shakespeare-large")}


def model_names() -> list[str]:
    return ["default or small (the bundled model)", "large (the bundled 8-layer model)",
            *(f"random-{k}" for k in PRESETS), "random-tiny", *DOWNLOADABLE, *LLAMA_DOWNLOADABLE,
            "a Hugging Face llama/qwen2/qwen3 folder", "a .gguf file"]


def bundled_dir(which: str = "small") -> Path:
    return package_weights_dir() / BUNDLED[which][0]


def has_bundled() -> bool:
    return (bundled_dir() / "model.safetensors").is_file()


def random_model(name: str, dtype=np.float32) -> GPT2:
    size = name.removeprefix("random-")
    config = TINY if size == "tiny" else PRESETS[size]
    return GPT2(config, random_params(config, seed=RANDOM_SEED, std=0.02, dtype=dtype), name=name)


def load(source: str | Path | None = None, *, dtype=np.float32, quiet: bool = False,
         weights: str = "float32") -> GPT2:
    """Load a model (see `load_float`), its weights as `weights` says: "float32", "native" (as the
    checkpoint has them: a GGUF's Q8_0 / Q4_0 / Q4_1 matrices stay quantized, float checkpoints
    stay float), or "q8_0", "q4_0", "q4_1": quantized at load as GGUF defines them
    (models/quant.py), kept quantized in memory."""
    from ..models.quant import FORMATS, WEIGHTS, quantize_params
    w = str(weights).lower()
    if w not in (*WEIGHTS, *FORMATS, "float64"):
        raise MiniLLMError(f"weights={weights!r}: choose one of {', '.join(WEIGHTS)} or q4_1")
    if w == "float64":
        dtype, w = np.float64, "float32"
    if str(source).endswith(".gguf") and _gguf_arch(expand_user(str(source))) == "gpt2":   # as `quantize` writes
        from .gguf_gpt2 import read_gguf
        path = expand_user(str(source))
        config, params = read_gguf(path, "native" if w in ("native", *FORMATS) else "float32")
        model = GPT2(config, params, name=path.stem)
        if w in FORMATS and model.weights != w:            # another format wanted: from the file's floats
            config, params = read_gguf(path, "float32")
            model = GPT2(config, quantize_params(params, w), name=path.stem)
        return model
    model = _load(source, dtype, quiet, w)           # a Llama-family model takes `w` as it is built
    if w in FORMATS and isinstance(model, GPT2):
        if model.config.n_embd % 32:
            raise WeightsError(f"{model.name}: width {model.config.n_embd} is not a multiple of 32, the "
                               f"block of {w}; use --weights float32")
        model = GPT2(model.config, quantize_params(model.params, w), name=model.name)
    return model


def _gguf_arch(path) -> str | None:
    """general.architecture of a GGUF file, or None if it cannot be read (the loader then says why)."""
    try:
        import gguf
        return gguf.GGUFReader(str(path)).fields["general.architecture"].contents()
    except Exception:      # noqa: BLE001  (any unreadable file: the full loader reports it properly)
        return None


def load_float(source: str | Path | None = None, *, dtype=np.float32, quiet: bool = False) -> GPT2:
    """Load a model, its weights in floats.

    source: None or "default" or "small" (the bundled Shakespeare model), "large" (the bundled
    8-layer one, beyond the CPU's last-level cache in float32), a directory with model.safetensors +
    config.json, a .safetensors file, "random-124m" / "random-355m" / "random-774m" / "random-1558m"
    (GPT-2-shaped random weights, seeded, std 0.02), "random-tiny", or a downloaded "gpt2",
    "gpt2-medium", "gpt2-large", "gpt2-xl" (`minillm download NAME` fetches them).
    dtype: float32 (default) or float64 for exactness checks.
    """
    return _load(source, dtype, quiet, "float32")


def _load(source, dtype, quiet: bool, weights: str):
    """`load_float`, with `weights` passed to a Llama-family model (models/llama.py: "native" keeps a
    GGUF's quantized matrices; a format quantizes every matrix as it is fused)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise MiniLLMError(f"dtype {dtype}: minillm computes in float32 (default) or float64 (for exactness checks)")
    if source == "large":
        if not (bundled_dir("large") / "model.safetensors").is_file():
            raise ModelNotFoundError(f"the large bundled model is not installed (no {bundled_dir('large')}/"
                                     "model.safetensors); reinstall minillm, or choose another model")
        config, params = load_checkpoint(bundled_dir("large"), dtype)
        return GPT2(config, params, name=BUNDLED["large"][1])
    if source is None or source in ("default", "small"):
        if has_bundled():
            config, params = load_checkpoint(bundled_dir(), dtype)
            return GPT2(config, params, name="minillm-shakespeare")
        if not quiet:
            print("minillm: no bundled model is installed; using a small random model (random-tiny)", file=sys.stderr)
        return random_model("random-tiny", dtype)
    source_str = str(source)
    if source_str.startswith("random-"):
        if source_str.removeprefix("random-") not in (*PRESETS, "tiny"):
            raise ModelNotFoundError(f"unknown model {source_str!r}; choose one of: {', '.join(model_names())}")
        return random_model(source_str, dtype)
    if source_str in LLAMA_DOWNLOADABLE:
        from ..checkpoints import smollm
        from ..checkpoints.llama_load import load_llama
        where = smollm.find()
        if where is None:
            raise ModelNotFoundError(f"{source_str} is not downloaded yet; fetch it with: minillm download {source_str}")
        return load_llama(where, dtype, name=source_str, weights=weights)
    if source_str in DOWNLOADABLE:
        from ..checkpoints.download import find_downloaded
        where = find_downloaded(source_str)
        if where is None:
            raise ModelNotFoundError(f"{source_str} is not downloaded yet; fetch it with: minillm download {source_str}")
        config, params = load_checkpoint(where, dtype)
        return GPT2(config, params, name=source_str)
    path = expand_user(source_str)
    problem = not_a_regular_file(path)
    if problem == "not found":
        raise ModelNotFoundError(
            f"{source_str}: no such file or directory, and not a model name; choose a checkpoint path or one of: "
            f"{', '.join(model_names())}"
        )
    if problem is not None and problem.startswith("cannot"):   # a name too long, a loop of links, no permission
        raise WeightsError(f"{source_str}: {problem}; choose a checkpoint path or one of: {', '.join(model_names())}")
    from ..checkpoints.llama_load import load_llama, sniff
    if sniff(path) is not None:                      # a GGUF file, or a llama/qwen2/qwen3 folder
        return load_llama(path, dtype, weights=weights)
    config, params = load_checkpoint(path, dtype)
    return GPT2(config, params, name=path.name)
