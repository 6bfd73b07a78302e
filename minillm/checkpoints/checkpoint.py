"""Checkpoints: read and write the Hugging Face GPT-2 layout, and build GPT-2-shaped random weights.

A checkpoint is a directory with `model.safetensors` + `config.json`, or a lone `.safetensors` file
(the config is then read from the file's metadata, or inferred from the tensor shapes). Names are
accepted with or without the `transformer.` prefix, with or without the `h.{i}.attn.bias` causal-mask
buffers, with or without a tied `lm_head.weight`; float16 and bfloat16 load as float32.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np

from ..config import MAX_CONTEXT, from_gguf_build, gguf_getter
from ..errors import ConfigError, WeightsError
from ..models.gpt2 import GPT2, GPT2Config, expected_shapes, iter_expected
from ..models.target import Target
from ..paths import _alive, atomic_write, not_a_regular_file, read_json
from .manifest import check_all_finite, check_block_count, check_finite, check_manifest
from .safetensors import read_safetensors, write_safetensors


_MASK_BUFFER = re.compile(r"h\.\d+\.attn\.(masked_)?bias$")


def canonical_names(tensors: dict[str, np.ndarray], path: Path) -> dict[str, np.ndarray]:
    """Drop the `transformer.` prefix and the mask buffers; check a tied `lm_head.weight` is wte."""
    out: dict[str, np.ndarray] = {}
    lm_head = None
    for name, t in tensors.items():
        name = name.removeprefix("transformer.")
        if _MASK_BUFFER.match(name):
            continue                     # the causal mask is a constant, not a parameter
        if name == "lm_head.weight":
            lm_head = t
            continue
        out[name] = t
    if lm_head is not None and "wte.weight" in out:
        wte = out["wte.weight"]
        if lm_head.shape != wte.shape or not np.array_equal(lm_head, wte):
            raise WeightsError(f"{path}: lm_head.weight differs from wte.weight; minillm implements GPT-2's tied LM head")
    return out


def infer_config(tensors: dict[str, np.ndarray], metadata: dict, path: Path) -> GPT2Config:
    """The config of a lone .safetensors file: from its metadata if minillm wrote it, else from shapes."""
    if "config" in metadata:
        try:
            return GPT2Config.from_hf(json.loads(metadata["config"]), f"{path} (metadata)")
        except (json.JSONDecodeError, RecursionError):
            pass
    if "wte.weight" not in tensors or "wpe.weight" not in tensors:
        raise WeightsError(f"{path}: no wte.weight/wpe.weight tensors; is this a GPT-2 checkpoint?")
    for name in ("wte.weight", "wpe.weight"):
        if tensors[name].ndim != 2:
            raise WeightsError(f"{path}: tensor {name} has shape {list(tensors[name].shape)}; GPT-2's is a matrix "
                               "[rows, width]; is this a GPT-2 checkpoint?")
    V, d = tensors["wte.weight"].shape
    n_ctx = tensors["wpe.weight"].shape[0]
    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"h\.(\d+)\.", k))}
    if d % 64:
        raise WeightsError(
            f"{path}: cannot infer the number of heads for width {d} (GPT-2 uses 64 per head); "
            "put a config.json beside it and load the directory"
        )
    config = GPT2Config(n_layer=len(layers), n_head=d // 64, n_embd=d, n_ctx=n_ctx, vocab_size=V)
    print(f"minillm: {path} has no config; inferred {config.n_layer} layers, {config.n_head} heads of 64 "
          "(GPT-2's head width) from the tensor shapes; put a config.json beside it if that is wrong",
          file=sys.stderr)
    return config


def read_config(path: Path) -> GPT2Config:
    """A GPT-2 checkpoint's config.json (one line naming the file if it is missing or not one)."""
    problem = not_a_regular_file(path)
    if problem == "not found":
        raise WeightsError(f"{path}: not found; a checkpoint directory needs config.json beside model.safetensors")
    return GPT2Config.from_hf(read_json(path, what="a config.json"), str(path))


def load_checkpoint(source: str | os.PathLike, dtype=np.float32) -> tuple[GPT2Config, dict[str, np.ndarray]]:
    """Read a checkpoint directory or .safetensors file -> (config, params in `dtype`, canonical names)."""
    path = Path(source)
    if path.is_dir():
        file, config = path / "model.safetensors", None
        if not file.is_file():
            raise WeightsError(f"{path}: no model.safetensors in this directory; is it a Hugging Face GPT-2 checkpoint?")
        config = read_config(path / "config.json")
    elif path.is_file():
        file = path
        beside = path.with_name("config.json")           # a lone file inside a checkpoint directory
        config = read_config(beside) if beside.is_file() else None
    elif path.exists():
        raise WeightsError(f"{path}: {not_a_regular_file(path)}; pass a checkpoint directory or a .safetensors file")
    else:
        raise WeightsError(f"{path}: no such file or directory")
    raw, metadata = read_safetensors(file)
    tensors = canonical_names(raw, file)
    if config is None:
        config = infer_config(tensors, metadata, file)
    check_manifest(tensors, iter_expected(config), file, f"a {config.n_layer}-layer GPT-2 of width {config.n_embd}, "
                   f"vocab {config.vocab_size}, context {config.n_ctx}",
                   fix="is config.json the one for these weights? re-download or re-save the checkpoint",
                   count=(f"{config.n_layer} layers", 12 * config.n_layer + 4))
    want = expected_shapes(config)
    params = {}
    for name in want:
        params[name] = np.array(tensors[name], dtype=dtype, copy=True)  # off the mmap, into RAM
        check_finite(params[name], f"{file}: tensor {name}")
    return config, params


def save_checkpoint(directory: str | os.PathLike, params: dict[str, np.ndarray], config: GPT2Config,
                    dtype="float32", metadata: dict[str, str] | None = None) -> Path:
    """Write `model.safetensors` + `config.json` in the Hugging Face layout, together or not at all:
    both are written into a temporary folder beside `directory`, which then takes its place in one
    rename when `directory` is new or empty (a first save: never weights without their config). Into a
    folder that already holds files, each file is renamed into place, config.json first and the
    weights last (a reader sees the old checkpoint, a new config.json with the old weights of the same
    model, or the new checkpoint). An interrupted save leaves no half-written file; its temporary
    folder is removed by the next save."""
    directory = Path(directory)
    want = expected_shapes(config)
    missing = [n for n in want if n not in params]
    if missing:
        raise WeightsError(f"cannot save: tensor {missing[0]} is missing from the parameters")
    tensors = {n: np.ascontiguousarray(params[n], dtype=np.dtype(dtype)) for n in want}
    meta = {"format": "pt", "config": json.dumps(config.to_hf())} | (metadata or {})
    tmp = None
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_saves(directory)
        tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.{os.getpid()}-",
                                    suffix=".saving"))
        write_safetensors(tmp / "model.safetensors", tensors, meta)
        with atomic_write(tmp / "config.json", text=True) as f:
            json.dump(config.to_hf(), f, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o755)                              # mkdtemp makes it owner-only
        if not directory.is_dir() or not any(directory.iterdir()):
            os.replace(tmp, directory)                    # one rename: both files appear at once
            tmp = None
        else:
            os.replace(tmp / "config.json", directory / "config.json")
            os.replace(tmp / "model.safetensors", directory / "model.safetensors")
    except OSError as e:                                  # disk full, read-only, ...: nothing half-written
        raise WeightsError(f"{directory}: cannot save the checkpoint there ({e.strerror or e}); "
                           "free some space or choose another folder") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return directory


def _remove_stale_saves(directory: Path) -> None:
    """Temporary folders of saves to `directory` whose process is gone (killed mid-save)."""
    for old in directory.parent.glob(f".{glob.escape(directory.name)}.*.saving"):
        pid = old.name[len(directory.name) + 2:].partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)


# -- GPT-2's row of the family table (checkpoints/families.py) ----------------------------------------

def gpt2_from_folder(path: Path, target: Target, name: str | None = None) -> GPT2:
    """A GPT-2 from a checkpoint directory or .safetensors file."""
    config, params = load_checkpoint(path, target.dtype)
    return GPT2(config, params, target, name=name or Path(path).name)


def gpt2_config_from_gguf(md: dict, vocab_size: int, where) -> GPT2Config:
    """The hyper-parameters from a GGUF's `gpt2.*` keys (vocab_size: the token table's rows)."""
    get, count = gguf_getter(md, "gpt2", where)
    return from_gguf_build(lambda: GPT2Config(
        n_layer=count("block_count"), n_head=count("attention.head_count"),
        n_embd=count("embedding_length"), n_ctx=count("context_length", hi=MAX_CONTEXT),
        vocab_size=int(vocab_size), ln_eps=float(get("attention.layer_norm_epsilon", 1e-5))), where)


def gpt2_from_gguf(md: dict, tensors: dict, path: Path, target: Target, name: str | None = None, *, names) -> GPT2:
    """A GPT-2 from a GGUF's tensors (checkpoint names, GGUF's [out, in] rows; as `minillm quantize`
    writes them, or llama.cpp's converter): float matrices back to the checkpoint's [in, out]. The
    metadata is checked against the tensors (block count, every shape, nothing extra) before use.
    names: the family's GGUFNames (its row's), to name a tensor as the file does."""
    emb = tensors.get("wte.weight")
    if emb is None or len(emb.shape) != 2:
        raise WeightsError(f"{path}: no token_embd.weight matrix; is this a GPT-2 GGUF?")
    config = gpt2_config_from_gguf(md, emb.shape[0], path)
    check_block_count(config.n_layer, tensors, "h", f"{path}: metadata gpt2.block_count")
    matrix = lambda k: k.endswith(GPT2.MATRICES)
    check_manifest(tensors, iter_expected(config), path,
                   f"the metadata's {config.n_layer} layers, width {config.n_embd}, context {config.n_ctx}, "
                   f"vocab {config.vocab_size}", shown=names.to_gguf,
                   held=lambda k, a: tuple(a.shape)[::-1] if matrix(k) else tuple(a.shape),     # GGUF's [out, in]
                   fix="the metadata disagrees with the tensors: re-download the file")
    params = {}
    for k in expected_shapes(config):
        a = tensors[k]
        if matrix(k) and isinstance(a, np.ndarray):
            a = np.ascontiguousarray(a.T)                           # GGUF's [out, in] rows -> [in, out]
        params[k] = np.asarray(a, dtype=target.dtype) if isinstance(a, np.ndarray) else a
    check_all_finite(params, path)
    return GPT2(config, params, target, name=name or Path(path).stem)
