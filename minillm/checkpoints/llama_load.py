"""Load a Llama-family model: a Hugging Face folder (config.json + safetensors, one file or sharded)
or a GGUF file. `minillm.load` calls `sniff` to tell the format and architecture by itself.

Tensors stay memory-mapped until the model lays them out (`models.llama.fuse_block`): the fused
`[in, out]` matrices are the one copy in RAM. bfloat16 widens to float32 (the top half of a float32).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..config import LLAMA_TYPES, LlamaConfig
from ..errors import ConfigError, WeightsError
from ..paths import not_a_regular_file
from .checkpoint import check_finite
from .safetensors import read_safetensors

MAX_JSON_BYTES = 1 << 24
INDEX = "model.safetensors.index.json"


def read_json(path: Path) -> dict:
    problem = not_a_regular_file(path)
    if problem is not None:
        raise WeightsError(f"{path}: {problem}")
    try:
        if path.stat().st_size > MAX_JSON_BYTES:         # checked first: reading is then exactly the file
            raise ConfigError(f"{path}: over {MAX_JSON_BYTES:,} bytes, too big for this JSON file")
        raw = path.read_bytes()
        value = json.loads(raw.decode("utf-8"))
    except OSError as e:
        raise WeightsError(f"{path}: cannot be read ({e.strerror})") from None
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{path}: not valid JSON ({str(e)[:80]}); re-download the checkpoint") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def sniff(path: Path) -> str | None:
    """'gguf', 'llama' (a Llama-family folder or safetensors beside such a config.json), or None (GPT-2's
    loader decides). An unknown model_type is refused here, naming the supported ones."""
    if path.is_file():
        if path.suffix == ".gguf" or is_gguf(path):
            return "gguf"
        path = path.parent
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        return None
    cfg = read_json(cfg_path)
    kind = cfg.get("model_type", "gpt2" if "n_embd" in cfg else None)
    if kind in LLAMA_TYPES:
        return "llama"
    if kind != "gpt2":
        raise ConfigError(f"{cfg_path}: model_type {kind!r} is not supported; minillm runs gpt2, "
                          f"{', '.join(LLAMA_TYPES)}")
    return None


def read_tensors(folder: Path, file: Path | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a folder's `model.safetensors`, or of all shards its index names."""
    if file is not None:
        files = [file]
    elif (folder / INDEX).is_file():
        index = read_json(folder / INDEX)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightsError(f"{folder / INDEX}: no weight_map; re-download the checkpoint")
        files = []
        for shard in dict.fromkeys(weight_map.values()):
            if not isinstance(shard, str) or "/" in shard or "\\" in shard or shard.startswith("."):
                raise WeightsError(f"{folder / INDEX}: shard name {str(shard)[:60]!r} is not a file name")
            if not (folder / shard).is_file():
                raise WeightsError(f"{folder}: shard {shard} is missing (named by {INDEX}); "
                                   "the download is incomplete: fetch it again")
            files.append(folder / shard)
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    else:
        raise WeightsError(f"{folder}: no model.safetensors or {INDEX}; is it a Hugging Face checkpoint?")
    tensors = {}
    for f in files:
        part, _ = read_safetensors(f)
        tensors.update({re.sub(r"^model\.", "", k): v for k, v in part.items()})
    return tensors


def load_llama(path: Path, dtype=np.float32, *, name: str | None = None, weights: str = "float32"):
    """A Llama-family model, with its own tokenizer attached as `.tokenizer` (None when absent).
    weights: "float32", "native" (a GGUF's quantized matrices kept as the file has them), or a
    format to quantize every matrix to ("q8_0", "q4_0", "q4_1"); see `models.llama.Llama`."""
    from ..models.llama import Llama, check_tensors
    from ..models.quant import QuantMatrix
    from .. import model_tokenizer as mt
    path = Path(path)
    if path.is_file() and (path.suffix == ".gguf" or is_gguf(path)):
        from .gguf_file import load_gguf
        config, tensors, md = load_gguf(path, keep_quantized=weights == "native")
        check_tensors(tensors, config, str(path))
        tok = mt.from_gguf_metadata(md, path)
        where = path
    else:
        folder, file = (path.parent, path) if path.is_file() else (path, None)
        config = LlamaConfig.from_hf(read_json(folder / "config.json"), str(folder / "config.json"))
        tensors = read_tensors(folder, file)
        check_tensors(tensors, config, str(folder))
        gen = read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
        eos = gen.get("eos_token_id")
        eos = eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []
        tok = mt.from_folder(folder, eos) if (folder / "tokenizer.json").is_file() or \
            (folder / "tokenizer.model").is_file() else None
        where = folder
    for k, v in tensors.items():
        for a in (v.d, v.m) if isinstance(v, QuantMatrix) else (v,):     # quantized: its scales
            if a is not None:
                check_finite(a, f"{where}: tensor {k}")
    if tok is not None and tok.n_vocab > config.vocab_size:
        raise WeightsError(f"{where}: the tokenizer has {tok.n_vocab:,} ids but the model only "
                           f"{config.vocab_size:,}: they do not belong together")
    model = Llama(config, tensors, name=name or where.name, dtype=dtype,
                  eos_ids=tok.eos_ids if tok is not None else (), weights=weights)
    model.tokenizer = tok
    return model
