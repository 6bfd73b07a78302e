"""The model families minillm runs, one row each: how a file says it holds one, and what builds it.

    family  module         Hugging Face model_type   GGUF architecture    readers
    gpt2    models/gpt2    gpt2                      gpt2                 checkpoint.py
    llama   models/llama   llama, qwen2, qwen3       llama, qwen2, qwen3  llama_load.py
    moe     models/moe     mixtral, qwen3_moe        (none yet)           llama_load.py
    qwen35  models/qwen35  qwen3_5_text              (none yet)           llama_load.py
    deepseek models/deepseek deepseek_v3           (none yet: deepseek2) llama_load.py
    gemma3  models/gemma3  gemma3_text               (none yet)           llama_load.py
    gptoss  models/gptoss  gpt_oss                   (none yet)           llama_load.py

A family is its model module plus its row. The module owns what the family is: its config class
(`CONFIG`, read by `from_hf`), its model (`MODEL`, a `CausalLM`), its manifest (`MODEL.manifest`:
every checkpoint tensor with its shape), its GGUF names, its random builder (`random(config,
target, name, **options)`), its presets (`SHAPES`: name -> config) and its options (`MODEL.OPTIONS`,
models/options.py: checked against the row at load, handed to the constructor). The row adds how
files name it and which readers build it.

`minillm.load` finds the source, then `family_of(path)` reads the family from the file's own
metadata (config.json's `model_type`, a GGUF's `general.architecture` through the one bounded GGUF
reader) and the row builds the model; a preset's name finds its family the same way, in the rows'
`SHAPES` (`random_model`). Each row's GGUF names (`GGUFNames`) serve both the reader and
`minillm quantize`'s writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Callable

from ..errors import ConfigError, ModelNotFoundError
from ..models import deepseek, gemma3, gpt2, gptoss, llama, moe, qwen35
from ..models.base import CausalLM
from ..models.options import Option, check_options
from ..models.target import Target
from ..paths import folder_file
from .checkpoint import gpt2_from_folder, gpt2_from_gguf
from .gguf_file import GGUFNames, checkpoint_tensors, read_gguf
from .llama_load import is_gguf, llama_from_folder, llama_from_gguf, llama_tokenizer, read_json


@dataclass(frozen=True)
class Family:
    name: str
    module: ModuleType             # the model module: CONFIG, MODEL, SHAPES, random
    hf_types: tuple[str, ...]      # the config.json `model_type`s it reads
    gguf_archs: tuple[str, ...]    # the GGUF `general.architecture`s it reads
    names: GGUFNames               # its tensors' names, checkpoint <-> GGUF
    from_folder: Callable          # (path, target, name) -> model: a Hugging Face checkpoint
    from_gguf: Callable | None     # (metadata, tensors, path, target, name, names=) -> model
    tokenizer: Callable            # (path) -> its own tokenizer, or None: GPT-2's (minillm.tokenizer)

    config = property(lambda self: self.module.CONFIG)
    model = property(lambda self: self.module.MODEL)
    options = property(lambda self: self.module.MODEL.OPTIONS)     # its options (models/options.py)

    def check_options(self, options: dict | None, who: str) -> dict:
        """The options asked of a model of this family, checked against its row (one line otherwise)."""
        return check_options(self.options, options, who, all_options())


FAMILIES: tuple[Family, ...] = (
    Family("gpt2", gpt2, ("gpt2",), ("gpt2",), GGUFNames("h", gpt2.GGUF_BLOCK_NAMES, gpt2.GGUF_TOP_NAMES),
           gpt2_from_folder, gpt2_from_gguf, lambda path: None),
    Family("llama", llama, llama.LLAMA_TYPES, llama.LLAMA_TYPES,
           GGUFNames("layers", llama.GGUF_BLOCK_NAMES, llama.GGUF_TOP_NAMES), llama_from_folder, llama_from_gguf,
           llama_tokenizer),
    Family("moe", moe, tuple(moe.MOE_TYPES), (),          # no GGUF reader yet
           GGUFNames("layers", llama.GGUF_BLOCK_NAMES, llama.GGUF_TOP_NAMES), partial(llama_from_folder, model=moe.MoE),
           None, llama_tokenizer),
    Family("qwen35", qwen35, qwen35.MODEL_TYPES, (), GGUFNames("layers", {}, {}),       # no GGUF reader yet
           partial(llama_from_folder, model=qwen35.Qwen35), None, llama_tokenizer),
    Family("deepseek", deepseek, deepseek.MODEL_TYPES, (),     # llama.cpp's deepseek2: no reader yet
           GGUFNames("layers", deepseek.GGUF_BLOCK_NAMES, llama.GGUF_TOP_NAMES),
           partial(llama_from_folder, model=deepseek.DeepSeekV3), None, llama_tokenizer),
    Family("gemma3", gemma3, gemma3.MODEL_TYPES, (), GGUFNames("layers", {}, {}),       # no GGUF reader yet
           partial(llama_from_folder, model=gemma3.Gemma3), None, llama_tokenizer),
    Family("gptoss", gptoss, gptoss.MODEL_TYPES, (), GGUFNames("layers", {}, {}),       # no GGUF reader yet
           partial(llama_from_folder, model=gptoss.GptOss), None, llama_tokenizer),
)


def family(name: str) -> Family:
    return next(f for f in FAMILIES if f.name == name)


def all_options() -> list[Option]:
    """Every row's options, each once (the CLI derives its flags from them)."""
    found = {}
    for f in FAMILIES:
        for o in f.options:
            found.setdefault(o.name, o)
    return list(found.values())


def presets() -> dict[str, tuple[Family, object]]:
    """Every random preset of every family: name -> (its family, its config)."""
    return {name: (f, c) for f in FAMILIES for name, c in f.module.SHAPES.items()}


def random_model(source, target: Target | None = None, name: str = "", options: dict | None = None) -> CausalLM:
    """A seeded random model: a preset's name ("random-124m", "random-tiny", "random-moe-16x2", ...:
    `presets()`) or a config of any family (its class names the family), made for the target (None:
    the NumPy reference in float32 on the CPU) with the family's options (checked against its row)."""
    if isinstance(source, str):
        found = presets().get(source)
        if found is None:
            raise ModelNotFoundError(f"unknown preset {source!r}; choose one of: {', '.join(presets())}")
        f, config = found
        return f.module.random(config, target, name or source, **f.check_options(options, name or source))
    f = next((f for f in FAMILIES if type(source) is f.config), None)
    if f is None:
        raise ConfigError(f"{type(source).__name__}: not a config of a family minillm runs")
    return f.module.random(source, target, name, **f.check_options(options, name or "this model"))


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


def hf_types() -> list[str]:
    """Every config.json model_type a row reads."""
    return [t for f in FAMILIES for t in f.hf_types]


def is_gguf_path(path: Path) -> bool:
    return path.is_file() and (path.suffix == ".gguf" or is_gguf(path))


def family_of(path: Path) -> Family:
    """The family of a checkpoint, from its own metadata: a GGUF's `general.architecture`, else the
    config.json beside it (`model_type`; GPT-2's older files have none, but `n_embd`). A lone
    safetensors file with no config.json is read as GPT-2 (its shapes say the rest)."""
    if is_gguf_path(path):
        md, _ = read_gguf(path)
        return _by("gguf_archs", md.get("general.architecture"), path)
    cfg_path = folder_file(path.parent if path.is_file() else path, "config.json")
    if not cfg_path.is_file():
        return family("gpt2")
    cfg = read_json(cfg_path)
    return _by("hf_types", cfg.get("model_type", "gpt2" if "n_embd" in cfg else None), cfg_path)


def load_path(path: Path, target: Target, name: str | None = None, options: dict | None = None) -> CausalLM:
    """A model from a checkpoint path of any family, made for the target with the family's options
    (checked against its row before anything is read): the family read from the file, then its row."""
    who = name or Path(path).name
    if is_gguf_path(path):
        md, raw = read_gguf(path)
        f = _by("gguf_archs", md.get("general.architecture"), path)
        opts = f.check_options(options, who)
        tensors = checkpoint_tensors(raw, f.names, path, keep_quantized=not target.floats)
        return f.from_gguf(md, tensors, path, target, name, names=f.names, **opts)
    f = family_of(path)
    return f.from_folder(path, target, name, **f.check_options(options, who))
