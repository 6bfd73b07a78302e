"""`minillm.load(source)`: one function that finds a model's source, of any family, and builds it
for one target (models/target.py: device, dtype, weights, kernels, chosen here once). The family
comes from the file's own metadata, or from a preset's name (checkpoints/families.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import ModelNotFoundError, WeightsError
from ..models.base import CausalLM
from ..models.target import Target
from .families import hf_types, load_path, presets, random_model
from ..paths import expand_user, not_a_regular_file, package_weights_dir, printable_name

DOWNLOADABLE = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
LLAMA_DOWNLOADABLE = ("smollm2-135m",)   # a Llama-family chat model (checkpoints/smollm.py)

# The bundled models, trained here on the bundled text: name -> (folder under weights/, model name)
BUNDLED = {"small": ("", "minillm-shakespeare"), "large": ("large", "minillm-shakespeare-large")}


def model_names() -> list[str]:
    return ["default or small (the bundled model)", "large (the bundled 8-layer model)", *presets(),
            *DOWNLOADABLE, *LLAMA_DOWNLOADABLE, f"a Hugging Face {'/'.join(t for t in hf_types() if t != 'gpt2')} folder",
            "a .gguf file"]


def bundled_dir(which: str = "small") -> Path:
    return package_weights_dir() / BUNDLED[which][0]


def has_bundled() -> bool:
    return (bundled_dir() / "model.safetensors").is_file()


def load(source: str | Path | None = None, *, dtype=None, quiet: bool = False,
         weights: str = "float32", device="cpu", kernels: str | None = None,
         options: dict | None = None) -> CausalLM:
    """Load a model, of any family, from any of its sources.

    source: None or "default" or "small" (the bundled Shakespeare model), "large" (the bundled
    8-layer one, beyond the CPU's last-level cache in float32), a random preset ("random-124m" /
    "random-355m" / "random-774m" / "random-1558m": GPT-2-shaped random weights, seeded, std 0.02;
    "random-tiny"; "random-moe-16x2", a mixture of 16 experts, top-2, and "random-moe-16x2-dense", a
    Llama with its active bytes: models/moe.py; "random-mla", DeepSeek-V3's shape of parts at width
    1,024: models/deepseek.py, and "random-mla-gqa", its GQA twin: models/moe.py; "random-hybrid" and
    "random-hybrid-full", Qwen3.5's hybrid and its all-attention twin: models/qwen35.py), a downloaded "gpt2", "gpt2-medium",
    "gpt2-large", "gpt2-xl" or "smollm2-135m" (`minillm download NAME` fetches them), a checkpoint folder
    or .safetensors file (GPT-2 or a Hugging Face llama/qwen2/qwen3/mixtral/qwen3_moe/deepseek_v3 folder), or a .gguf
    file. The family comes from the file's own metadata (checkpoints/families.py).
    weights: "float32", "native" (as the checkpoint has them: a GGUF's Q8_0 / Q4_0 / Q4_1 matrices stay
    quantized, float checkpoints stay float), or "q8_0", "q4_0", "q4_1": quantized at load as GGUF
    defines them (models/quant.py), kept quantized in memory. "float64" is float32's spelling for
    dtype=np.float64 (a model's own `weights` label, passed back, gives the same kind of model).
    dtype: float32 (the CPU's default) or float64 for exactness checks; on a GPU float16 (its
    default: half the bytes a step streams) or float32 (to compare tokens with the CPU).
    device: "cpu" (NumPy) or "cuda" (CuPy on an NVIDIA GPU: `pip install 'minillm[gpu]'`); the
    weights are made on the host, then moved once. No usable GPU: one DeviceError line.
    kernels: the name of a kernel set, a row of models/target.py's KERNEL_SETS (`kernel_sets.described()`
    says each: numpy, the reference every other set is tested against; fused; batch-invariant; int8);
    None (default): `kernel_sets.default_described()` (CuPy's on a GPU). A set that cannot run as
    asked is one line saying why.
    options: the family's options (models/options.py), name -> value, e.g. {"mla_decode": "decompressed"}
    for a DeepSeek-V3-family model: checked against the family's row, handed to the constructor; one
    its family lacks, or a value outside its choices, is one line.
    """
    target = Target.resolve(device, dtype, weights, kernels)
    if source == "large":
        if not (bundled_dir("large") / "model.safetensors").is_file():
            raise ModelNotFoundError(f"the large bundled model is not installed (no {bundled_dir('large')}/"
                                     "model.safetensors); reinstall minillm, or choose another model")
        return load_path(bundled_dir("large"), target, BUNDLED["large"][1], options)
    if source is None or source in ("default", "small"):
        if has_bundled():
            return load_path(bundled_dir(), target, BUNDLED["small"][1], options)
        if not quiet:
            print("minillm: no bundled model is installed; using a small random model (random-tiny)", file=sys.stderr)
        return random_model("random-tiny", target, options=options)
    source_str = str(source)
    if source_str in presets():
        return random_model(source_str, target, options=options)
    if source_str.startswith("random-"):
        raise ModelNotFoundError(f"unknown model {source_str!r}; choose one of: {', '.join(model_names())}")
    if source_str in (*DOWNLOADABLE, *LLAMA_DOWNLOADABLE):
        return load_path(downloaded(source_str), target, source_str, options)
    path = expand_user(source_str)
    problem = not_a_regular_file(path)
    if problem == "not found":
        raise ModelNotFoundError(
            f"{source_str}: no such file or directory, and not a model name; choose a checkpoint path or one of: "
            f"{', '.join(model_names())}"
        )
    if problem is not None and problem.startswith("cannot"):   # a name too long, a loop of links, no permission
        raise WeightsError(f"{printable_name(source_str, 200)}: {problem}; choose a checkpoint path or one of: "
                           f"{', '.join(model_names())}")
    return load_path(path, target, options=options)


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
