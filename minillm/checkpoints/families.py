"""The model families minillm runs, one row each: how a file says it holds one, and what builds it.

    family  config       model  Hugging Face model_type  GGUF architecture    reads
    gpt2    GPT2Config   GPT2   gpt2                     gpt2                 checkpoint.py
    llama   LlamaConfig  Llama  llama, qwen2, qwen3      llama, qwen2, qwen3  llama_load.py
    moe     MoEConfig    MoE    mixtral, qwen3_moe       (none yet)           llama_load.py

`minillm.load` finds the source, then `family_of(path)` reads the family from the file's own
metadata (config.json's `model_type`, a GGUF's `general.architecture` through the one bounded GGUF
reader) and the row builds the model. Each row's GGUF names (`GGUFNames`, from the model module's
tables) serve both the reader and `minillm quantize`'s writer. A new family is one model module
(a `CausalLM` with `run`, `head`, `MATRICES`, its manifest and GGUF names), its readers, and a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from ..config import LLAMA_TYPES, GPT2Config, LlamaConfig
from ..errors import ConfigError
from ..models import gpt2, llama, moe
from ..models.base import CausalLM
from ..models.weights import FLOATS
from .checkpoint import gpt2_from_folder, gpt2_from_gguf
from .gguf_file import GGUFNames, checkpoint_tensors, read_gguf
from .llama_load import is_gguf, llama_from_folder, llama_from_gguf, llama_tokenizer, read_json


@dataclass(frozen=True)
class Family:
    name: str
    config: type                   # its config class (a ModelConfig)
    model: type                    # its CausalLM subclass
    hf_types: tuple[str, ...]      # the config.json `model_type`s it reads
    gguf_archs: tuple[str, ...]    # the GGUF `general.architecture`s it reads
    names: GGUFNames               # its tensors' names, checkpoint <-> GGUF
    from_folder: Callable          # (path, dtype, weights, name, device, kernels=) -> model: a Hugging Face checkpoint
    from_gguf: Callable | None     # (metadata, tensors, path, dtype, weights, name, device, kernels=) -> model
    tokenizer: Callable            # (path) -> its own tokenizer, or None: GPT-2's (minillm.tokenizer)


FAMILIES: tuple[Family, ...] = (
    Family("gpt2", GPT2Config, gpt2.GPT2, ("gpt2",), ("gpt2",),
           GGUFNames("h", gpt2.GGUF_BLOCK_NAMES, gpt2.GGUF_TOP_NAMES), gpt2_from_folder, gpt2_from_gguf,
           lambda path: None),
    Family("llama", LlamaConfig, llama.Llama, LLAMA_TYPES, LLAMA_TYPES,
           GGUFNames("layers", llama.GGUF_BLOCK_NAMES, llama.GGUF_TOP_NAMES), llama_from_folder, llama_from_gguf,
           llama_tokenizer),
    Family("moe", moe.MoEConfig, moe.MoE, tuple(moe.MOE_TYPES), (),          # no GGUF reader yet
           GGUFNames("layers", llama.GGUF_BLOCK_NAMES, llama.GGUF_TOP_NAMES), partial(llama_from_folder, model=moe.MoE),
           None, llama_tokenizer),
)


def family(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


def _by(kind: str, value, where) -> Family:
    """The family whose `hf_types` / `gguf_archs` hold value; one clear line naming them all otherwise."""
    what = "model_type" if kind == "hf_types" else "GGUF architecture"
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{where}: {what} {repr(value)[:40]} is not a name; is the file a model's?")
    for f in FAMILIES:
        if value in getattr(f, kind):
            return f
    known = ", ".join(t for f in FAMILIES for t in getattr(f, kind))
    raise ConfigError(f"{where}: {what} {value!r} is not supported; minillm runs {known}")


def is_gguf_path(path: Path) -> bool:
    return path.is_file() and (path.suffix == ".gguf" or is_gguf(path))


def family_of(path: Path) -> Family:
    """The family of a checkpoint, from its own metadata: a GGUF's `general.architecture`, else the
    config.json beside it (`model_type`; GPT-2's older files have none, but `n_embd`). A lone
    safetensors file with no config.json is read as GPT-2 (its shapes say the rest)."""
    if is_gguf_path(path):
        md, _ = read_gguf(path)
        return _by("gguf_archs", md.get("general.architecture"), path)
    cfg_path = (path.parent if path.is_file() else path) / "config.json"
    if not cfg_path.is_file():
        return family("gpt2")
    cfg = read_json(cfg_path)
    return _by("hf_types", cfg.get("model_type", "gpt2" if "n_embd" in cfg else None), cfg_path)


def load_path(path: Path, dtype, weights: str, name: str | None = None, device=None,
              kernels: str = "numpy") -> CausalLM:
    """A model from a checkpoint path of any family: the family read from the file, then its row
    (device: a backend.Device, None for the CPU; kernels: "numpy" or "fused")."""
    if is_gguf_path(path):
        md, raw = read_gguf(path)
        f = _by("gguf_archs", md.get("general.architecture"), path)
        tensors = checkpoint_tensors(raw, f.names, path, keep_quantized=weights not in FLOATS)
        return f.from_gguf(md, tensors, path, dtype, weights, name, device, kernels=kernels)
    return family_of(path).from_folder(path, dtype, weights, name, device, kernels=kernels)
