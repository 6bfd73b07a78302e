"""The Llama family's row of the family table (checkpoints/families.py): a Hugging Face folder
(config.json + safetensors, one file or sharded) or a GGUF file's tensors, to a `models.llama.Llama`.

Tensors stay memory-mapped until the model lays them out (`models.llama.stack_block`): the stacked
`[in, out]` matrices are the one copy in RAM. bfloat16 widens to float32 (the top half of a float32).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ..config import MAX_CONTEXT, MAX_COUNT, from_gguf_build, gguf_getter
from ..errors import ConfigError, WeightsError
from ..models.llama import LLAMA_TYPES, LlamaConfig
from ..models.target import Target
from ..paths import MAX_JSON_BYTES, folder_file, not_a_regular_file, read_json  # noqa: F401  (read_json: the family table's)
from .manifest import check_all_finite, check_block_count, check_float_tensors, check_manifest
from .safetensors import read_safetensors

INDEX = "model.safetensors.index.json"


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def read_tensors(folder: Path, file: Path | None = None, packed: tuple = ()) -> dict[str, np.ndarray]:
    """Every tensor of a folder's `model.safetensors`, or of all shards its index names (each inside
    the folder: `paths.folder_file`); floats only, but those whose names end in one of `packed` (a
    family's packed weights: models/base.py's PACKED)."""
    if file is not None:
        files = [file]
    elif (index_path := folder_file(folder, INDEX)).is_file():
        index = read_json(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightsError(f"{index_path}: no weight_map; re-download the checkpoint")
        files = []
        for shard in dict.fromkeys(weight_map.values()):
            path = folder_file(folder, shard, named_by=INDEX, what="shard name")
            if shard.startswith("."):
                raise WeightsError(f"{index_path}: shard name {shard[:60]!r} is a hidden file's name, not a shard's")
            problem = not_a_regular_file(path)
            if problem == "not found":
                raise WeightsError(f"{folder}: shard {shard} is missing (named by {INDEX}); "
                                   "the download is incomplete: fetch it again")
            if problem is not None:
                raise WeightsError(f"{path}: {problem} (a shard named by {INDEX})")
            files.append(path)
    elif (single := folder_file(folder, "model.safetensors")).is_file():
        files = [single]
    else:
        raise WeightsError(f"{folder}: no model.safetensors or {INDEX}; is it a Hugging Face checkpoint?")
    tensors = {}
    for f in files:
        part, _ = read_safetensors(f)
        check_float_tensors({k: v for k, v in part.items() if not (packed and k.endswith(packed))}, f)
        tensors.update({re.sub(r"^model\.", "", k): v for k, v in part.items()})
    return tensors


def llama_from_folder(path: Path, target: Target, name: str | None = None, *, model=None, **options):
    """A Llama-family model from a Hugging Face folder (or one of its safetensors files), with its
    own tokenizer attached as `.tokenizer` (None when absent). model: the class to build, a `Llama`
    or another family's model (the mixture of experts' row passes `models.moe.MoE`); its `CONFIG` reads
    config.json and its `manifest` checks the tensors; options: its family's (models/options.py)."""
    from .. import model_tokenizer as mt
    from ..models.llama import Llama
    model = model or Llama
    path = Path(path)
    folder, file = (path.parent, path) if path.is_file() else (path, None)
    config_path = folder_file(folder, "config.json")
    raw = read_json(config_path)
    tensors = model.unpack(read_tensors(folder, file, model.PACKED))
    layers = raw.get("num_hidden_layers") if isinstance(raw, dict) else None
    if isinstance(layers, int) and not isinstance(layers, bool) and 1 <= layers <= MAX_COUNT:   # else: from_hf says
        drop_next_token_blocks(tensors, layers, raw.get("num_nextn_predict_layers"))
        # the count against the blocks the file holds before the config is read: a reader may build
        # a list per layer (Qwen3.5's layer_types when the file gives none): 2^62 layers is one line
        check_block_count(layers, tensors, "layers", f"{config_path}: num_hidden_layers")
    config = model.CONFIG.from_hf(raw, str(config_path))
    check_block_count(config.n_layer, tensors, "layers", f"{config_path}: num_hidden_layers")
    gen_path = folder_file(folder, "generation_config.json")
    gen = read_json(gen_path) if gen_path.is_file() else {}
    eos = token_ids(gen.get("eos_token_id"), config.vocab_size, f"{gen_path}: eos_token_id")
    tok = mt.from_folder(folder, eos) if (folder / "tokenizer.json").is_file() or \
        (folder / "tokenizer.model").is_file() else None
    return _build(config, tensors, tok, folder, target, name, model, options)


def drop_next_token_blocks(tensors: dict, n_layer: int, n_next) -> None:
    """Drop a checkpoint's multi-token-prediction blocks (DeepSeek-V3's `num_nextn_predict_layers`:
    blocks n_layer .. n_layer + n_next - 1, after the last block, used to draft tokens in training
    and speculation, not by the next-token model minillm runs). Bounded by the file's tensors,
    whatever n_next claims; nothing is dropped unless the config names such blocks."""
    if isinstance(n_next, bool) or not isinstance(n_next, int) or n_next < 1:
        return
    for name in [k for k in tensors if k.startswith("layers.")]:
        index = name.split(".")[1]
        if index.isdigit() and n_layer <= int(index) < n_layer + n_next:
            del tensors[name]


def token_ids(value, n_vocab: int, what: str) -> list[int]:
    """A token id or a list of them (generation_config.json's `eos_token_id`), each an integer from 0 to
    n_vocab - 1; None is none. One line naming the field otherwise (never a TypeError at render time)."""
    ids = [] if value is None else value if isinstance(value, list) else [value]
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_vocab:
            raise ConfigError(f"{what} = {str(value)[:60]} is not a token id or a list of them (integers from 0 "
                              f"to {n_vocab - 1:,}); fix or delete the field")
    return ids


def llama_config_from_gguf(md: dict, where) -> LlamaConfig:
    """The hyper-parameters from a GGUF's `{arch}.block_count`, ... keys."""
    arch = md.get("general.architecture")
    if arch not in LLAMA_TYPES:
        raise ConfigError(f"{where}: GGUF architecture {arch!r} is not supported; minillm runs "
                          f"{', '.join(LLAMA_TYPES)}")
    scaling = md.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ConfigError(f"{where}: rope scaling {scaling!r} is not implemented; minillm runs the default "
                          "rotary embedding only")

    get, count = gguf_getter(md, arch, where)

    def build() -> LlamaConfig:
        H = count("attention.head_count")
        d = count("embedding_length")
        tokens = md.get("tokenizer.ggml.tokens")
        vocab = count("vocab_size", len(tokens) if isinstance(tokens, list) and tokens else None)
        return LlamaConfig(
            n_layer=count("block_count"), n_head=H, n_kv_head=count("attention.head_count_kv", H),
            head_dim=count("attention.key_length", d // H), n_embd=d,
            n_ctx=count("context_length", hi=MAX_CONTEXT), vocab_size=vocab, ffn=count("feed_forward_length"),
            eps=float(get("attention.layer_norm_rms_epsilon")), theta=float(get("rope.freq_base", 10000.0)),
            arch=arch, qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3", tied=True)

    return from_gguf_build(build, where)


def llama_from_gguf(md: dict, tensors: dict, path: Path, target: Target, name: str | None = None, *, names=None):
    """A Llama-family model from a GGUF's tensors (Hugging Face names), its tokenizer from the metadata."""
    from .. import model_tokenizer as mt
    from ..models.llama import iter_expected
    from .gguf_file import unpermute
    c = llama_config_from_gguf(md, path)
    if "lm_head.weight" in tensors:
        c = LlamaConfig(**{**c.asdict(), "tied": False})
    check_block_count(c.n_layer, tensors, "layers", f"{path}: metadata {c.arch}.block_count")
    check_manifest(tensors, iter_expected(c), path, describe(c))   # every shape, before the loop below reads them
    if c.arch == "llama":                        # only llama's converter permutes (qwen uses NeoX rope)
        for i in range(c.n_layer):
            for proj, heads in (("q_proj", c.n_head), ("k_proj", c.n_kv_head)):
                key = f"layers.{i}.self_attn.{proj}.weight"
                if key in tensors and tensors[key].ndim == 2 and tensors[key].shape[0] % (2 * heads) == 0:
                    tensors[key] = unpermute(tensors[key], heads)
    return _build(c, tensors, mt.from_gguf_metadata(md, path), Path(path), target, name)


def llama_tokenizer(path: Path):
    """The tokenizer of a GGUF file or a Hugging Face folder, without building the model."""
    from .. import model_tokenizer as mt
    from .gguf_file import read_gguf
    if path.is_file() and is_gguf(path):
        md, _ = read_gguf(path)
        return mt.from_gguf_metadata(md, path)
    return mt.from_folder(path if path.is_dir() else path.parent)


def describe(c: LlamaConfig) -> str:
    """A config in words, for a refusal: "this 2-layer llama config"."""
    return f"this {c.n_layer}-layer {getattr(c, 'model_type', None) or c.arch} config"


def _build(config: LlamaConfig, tensors: dict, tok, where: Path, target: Target, name: str | None, model=None,
           options: dict | None = None):
    from ..models.llama import Llama
    model = model or Llama
    check_manifest(tensors, model.manifest(config), where, describe(config),   # bounded: stops at the first missing
                   ignored=lambda n: n.endswith("rotary_emb.inv_freq"))
    check_all_finite(tensors, where)
    if tok is not None and tok.n_vocab > config.vocab_size:
        raise WeightsError(f"{where}: the tokenizer has {tok.n_vocab:,} ids but the model only "
                           f"{config.vocab_size:,}: they do not belong together")
    built = model(config, tensors, target, name=name or where.name, eos_ids=tok.eos_ids if tok is not None else (),
                  **(options or {}))                  # the family's options, checked by its row
    built.tokenizer = tok
    return built
