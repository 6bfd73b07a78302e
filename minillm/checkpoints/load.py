"""`minillm.load(source)`: one function that finds a model's source, of any family, and builds it
(the family from the file's own metadata: checkpoints/families.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..config import GPT2_SIZES, GPT2Config, LlamaConfig
from ..errors import MiniLLMError, ModelNotFoundError, WeightsError
from ..models.base import CausalLM
from ..models.gpt2 import GPT2, random_params
from ..kernels import default as default_kernels
from ..models.weights import FLOATS, check_kernels, check_weights
from ..models.moe import MOE_PRESETS, random_moe
from .. import backend
from .families import load_path
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
            *(f"random-{k}" for k in GPT2_SIZES), "random-tiny", *MOE_PRESETS, *DOWNLOADABLE, *LLAMA_DOWNLOADABLE,
            "a Hugging Face llama/qwen2/qwen3/mixtral/qwen3_moe folder", "a .gguf file"]


def bundled_dir(which: str = "small") -> Path:
    return package_weights_dir() / BUNDLED[which][0]


def has_bundled() -> bool:
    return (bundled_dir() / "model.safetensors").is_file()


def random_model(name, dtype=np.float32, weights: str = "float32", device=None,
                 kernels: str = "numpy") -> CausalLM:
    """A seeded random model: a name ("random-124m", "random-tiny", ...: GPT-2 shapes) or a config
    (a LlamaConfig: the Llama family's shapes, e.g. a 7B-class one for a GPU), on `device` ("cpu",
    "cuda" or a backend.Device; None: the CPU). A Llama shape's matrices are drawn on the GPU itself
    there (a 7B model's 13 GB drawn by NumPy would take a minute)."""
    device = None if device is None else backend.get_device(device)
    on = None if device is None or device.xp is np else device
    dtype = np.dtype(dtype)
    if isinstance(name, LlamaConfig):
        from ..models.llama import Llama, iter_expected, random_params as llama_params
        if on is None:
            params = llama_params(name, seed=RANDOM_SEED, dtype=dtype)
        else:                                     # matrices drawn on the device; norms (1-D) on the host
            rng = on.xp.random.default_rng(RANDOM_SEED)
            host = np.random.default_rng(RANDOM_SEED)
            params = {k: (1.0 + 0.1 * host.standard_normal(s)).astype(dtype) if "norm" in k
                      else (0.02 * rng.standard_normal(s, dtype=np.float32)).astype(dtype)
                      for k, s in iter_expected(name)}
        return Llama(name, params, name=f"random-{name.arch}-{name.n_layer}x{name.n_embd}", dtype=dtype,
                     weights=weights, device=on, kernels=kernels)
    size = name.removeprefix("random-")
    config = TINY if size == "tiny" else GPT2_SIZES[size]
    return GPT2(config, random_params(config, seed=RANDOM_SEED, std=0.02, dtype=dtype), name=name, weights=weights,
                device=on, kernels=kernels)


def load(source: str | Path | None = None, *, dtype=None, quiet: bool = False,
         weights: str = "float32", device="cpu", kernels: str | None = None) -> CausalLM:
    """Load a model, of any family, from any of its sources.

    source: None or "default" or "small" (the bundled Shakespeare model), "large" (the bundled
    8-layer one, beyond the CPU's last-level cache in float32), "random-124m" / "random-355m" /
    "random-774m" / "random-1558m" (GPT-2-shaped random weights, seeded, std 0.02), "random-tiny",
    "random-moe-16x2" (a mixture of 16 experts, top-2) and "random-moe-16x2-dense" (a Llama with its
    active bytes: models/moe.py), a downloaded "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl" or
    "smollm2-135m" (`minillm download NAME` fetches them), a checkpoint folder or .safetensors file
    (GPT-2 or a Hugging Face llama/qwen2/qwen3/mixtral/qwen3_moe folder), or a .gguf file. The family comes from the file's own metadata
    (checkpoints/families.py).
    weights: "float32", "native" (as the checkpoint has them: a GGUF's Q8_0 / Q4_0 / Q4_1 matrices stay
    quantized, float checkpoints stay float), or "q8_0", "q4_0", "q4_1": quantized at load as GGUF
    defines them (models/quant.py), kept quantized in memory. "float64" is float32's spelling for
    dtype=np.float64 (a model's own `weights` label, passed back, gives the same kind of model).
    dtype: float32 (the CPU's default) or float64 for exactness checks; on a GPU float16 (its
    default: half the bytes a step streams) or float32 (to compare tokens with the CPU).
    device: "cpu" (NumPy) or "cuda" (CuPy on an NVIDIA GPU: `pip install 'minillm[gpu]'`); the
    weights are made on the host, then moved once. No usable GPU: one DeviceError line.
    kernels: "numpy" (the reference every other kernel is tested against) or "fused" (minillm/kernels/:
    numba products that read each weight once, attention without a score matrix); None (default):
    fused where numba works here, else NumPy (`kernels.default()` says which and why). A float64
    model, or one on a GPU, always computes with NumPy's (or CuPy's) kernels.
    """
    w = check_weights(weights)
    device = backend.get_device(device)
    kernels = check_kernels(kernels if kernels is not None else default_kernels()[0])
    if w == "float64":
        dtype, w = np.float64, "float32"
    dtype = np.dtype(dtype if dtype is not None else np.float16 if device.is_gpu else np.float32)
    if device.xp is not np and w not in FLOATS:
        raise backend.DeviceError(f"--weights {w}: quantized weights run on the CPU only; on --device {device.name} "
                                  "use --weights float32 (stored in float16 on a GPU by default)")
    if device.xp is np and dtype not in (np.float32, np.float64):
        raise MiniLLMError(f"dtype {dtype}: minillm computes in float32 (default) or float64 (for exactness checks)"
                           + ("; float16 is for --device cuda" if dtype == np.float16 else ""))
    if dtype not in (np.float16, np.float32, np.float64):
        raise MiniLLMError(f"dtype {dtype}: on a GPU minillm computes in float16 (default) or float32")
    on = None if device.xp is np else device
    if source == "large":
        if not (bundled_dir("large") / "model.safetensors").is_file():
            raise ModelNotFoundError(f"the large bundled model is not installed (no {bundled_dir('large')}/"
                                     "model.safetensors); reinstall minillm, or choose another model")
        return load_path(bundled_dir("large"), dtype, w, BUNDLED["large"][1], on, kernels)
    if source is None or source in ("default", "small"):
        if has_bundled():
            return load_path(bundled_dir(), dtype, w, BUNDLED["small"][1], on, kernels)
        if not quiet:
            print("minillm: no bundled model is installed; using a small random model (random-tiny)", file=sys.stderr)
        return random_model("random-tiny", dtype, w, on, kernels)
    source_str = str(source)
    if source_str in MOE_PRESETS:
        return random_moe(source_str, dtype, w, on)
    if source_str.startswith("random-"):
        if source_str.removeprefix("random-") not in (*GPT2_SIZES, "tiny"):
            raise ModelNotFoundError(f"unknown model {source_str!r}; choose one of: {', '.join(model_names())}")
        return random_model(source_str, dtype, w, on, kernels)
    if source_str in (*DOWNLOADABLE, *LLAMA_DOWNLOADABLE):
        return load_path(downloaded(source_str), dtype, w, source_str, on, kernels)
    path = expand_user(source_str)
    problem = not_a_regular_file(path)
    if problem == "not found":
        raise ModelNotFoundError(
            f"{source_str}: no such file or directory, and not a model name; choose a checkpoint path or one of: "
            f"{', '.join(model_names())}"
        )
    if problem is not None and problem.startswith("cannot"):   # a name too long, a loop of links, no permission
        raise WeightsError(f"{source_str}: {problem}; choose a checkpoint path or one of: {', '.join(model_names())}")
    return load_path(path, dtype, w, device=on, kernels=kernels)


def load_float(source: str | Path | None = None, *, dtype=np.float32, quiet: bool = False,
               kernels: str | None = None) -> CausalLM:
    """`load` with the weights in floats (dtype: float32, or float64 for exactness checks)."""
    return load(source, dtype=dtype, quiet=quiet, kernels=kernels)


def downloaded(name: str) -> Path:
    """Where a downloaded model lives; one clear line if it is not downloaded yet."""
    if name in LLAMA_DOWNLOADABLE:
        from ..checkpoints import smollm
        where = smollm.find()
    else:
        from ..checkpoints.download import find_downloaded
        where = find_downloaded(name)
    if where is None:
        raise ModelNotFoundError(f"{name} is not downloaded yet; fetch it with: minillm download {name}")
    return where
