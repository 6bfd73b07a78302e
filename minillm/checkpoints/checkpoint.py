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

from ..config import GPT2Config
from ..errors import ConfigError, WeightsError
from ..checkpoints.safetensors import read_safetensors, write_safetensors
from ..models.gpt2 import GPT2, expected_shapes, iter_expected, random_params  # noqa: F401  (GPT-2's manifest)
from ..paths import _alive, atomic_write, folder_file, not_a_regular_file, read_capped

BLOCK_TENSORS = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")


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


MAX_CONFIG_BYTES = 1 << 20  # a GPT-2 config.json is under 1 KB


def read_config(path: Path) -> GPT2Config:
    problem = not_a_regular_file(path)
    if problem == "not found":
        raise WeightsError(f"{path}: not found; a checkpoint directory needs config.json beside model.safetensors")
    if problem is not None:
        raise WeightsError(f"{path}: {problem}; it should be the checkpoint's config.json file")
    try:
        raw = read_capped(path, MAX_CONFIG_BYTES)
        if raw is None:
            raise ConfigError(f"{path}: over {MAX_CONFIG_BYTES:,} bytes, too big for a config.json; "
                              "re-download or re-save the checkpoint")
        cfg = json.loads(raw.decode("utf-8"))
    except OSError as e:
        raise WeightsError(f"{path}: cannot be read ({e.strerror}); it should be the checkpoint's config.json file") from None
    except (ValueError, RecursionError) as e:           # bad JSON, bad UTF-8, nested too deep
        raise ConfigError(f"{path}: not valid JSON ({e}); re-download or re-save the checkpoint") from None
    return GPT2Config.from_hf(cfg, str(path))


def load_checkpoint(source: str | os.PathLike, dtype=np.float32) -> tuple[GPT2Config, dict[str, np.ndarray]]:
    """Read a checkpoint directory or .safetensors file -> (config, params in `dtype`, canonical names)."""
    path = Path(source)
    if path.is_dir():
        file, config = folder_file(path, "model.safetensors"), None
        if not file.is_file():
            raise WeightsError(f"{path}: no model.safetensors in this directory; is it a Hugging Face GPT-2 checkpoint?")
        config = read_config(folder_file(path, "config.json"))
    elif path.is_file():
        file = path
        beside = folder_file(path.parent, "config.json")   # a lone file inside a checkpoint directory
        config = read_config(beside) if beside.is_file() else None
    elif path.exists():
        raise WeightsError(f"{path}: {not_a_regular_file(path)}; pass a checkpoint directory or a .safetensors file")
    else:
        raise WeightsError(f"{path}: no such file or directory")
    raw, metadata = read_safetensors(file)
    tensors = canonical_names(raw, file)
    check_float_tensors(tensors, file)
    if config is None:
        config = infer_config(tensors, metadata, file)
    for name, shape in iter_expected(config):                 # stops at the first missing: bounded by the file
        if name not in tensors:
            n_want = 12 * config.n_layer + 4
            more = (f"; the config's {config.n_layer} layers need {n_want:,} tensors and the file holds "
                    f"{len(tensors):,}" if n_want > len(tensors) else "")
            raise WeightsError(f"{file}: tensor {name} is missing (expected shape {list(shape)}){more}; "
                               "is the file complete, and the config the one for it?")
        if tuple(tensors[name].shape) != shape:
            raise WeightsError(
                f"{file}: tensor {name} has shape {list(tensors[name].shape)} but the config "
                f"({config.n_layer} layers, width {config.n_embd}, vocab {config.vocab_size}, context {config.n_ctx}) "
                f"needs {list(shape)}; is config.json the one for these weights? "
                "re-download or re-save the checkpoint"
            )
    want = expected_shapes(config)
    extra = sorted(set(tensors) - set(want))
    if extra:
        raise WeightsError(f"{file}: unexpected tensor {extra[0]} (and {len(extra) - 1} more) for a {config.n_layer}-layer GPT-2")
    params = {}
    for name in want:
        params[name] = np.array(tensors[name], dtype=dtype, copy=True)  # off the mmap, into RAM
        check_finite(params[name], f"{file}: tensor {name}")
    return config, params


def check_float_tensors(tensors: dict, where) -> None:
    """Every tensor stored as floats (F64, F32, F16, BF16): weights stored as integers or booleans
    (I8, U8, BOOL, ...) would be widened to floats without their scales: refused in one line."""
    for name, a in tensors.items():
        if isinstance(a, np.ndarray) and a.dtype.kind != "f":
            raise WeightsError(f"{where}: tensor {name} is stored as {a.dtype.name}, not as floats; minillm reads "
                               "safetensors weights in F32, F16 or BF16 (quantized weights come as GGUF: "
                               "`minillm quantize` writes them)")


def check_finite(a: np.ndarray, what: str) -> None:
    """Refuse NaN and infinities: one would turn every logit into NaN and the text into "!!!!".

    A finite sum proves every element finite (NaN and inf propagate), in one pass with no temporary;
    only when the sum is not finite (a NaN, or finite values that overflow it) is each element checked."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(a.sum()):
            return
    bad = np.count_nonzero(~np.isfinite(a))
    if bad:
        raise WeightsError(f"{what} holds {bad:,} NaN or infinite value{'s' if bad > 1 else ''}; the checkpoint is "
                           "damaged (or training diverged): re-download it, or use an earlier checkpoint")


def check_block_count(n_layer: int, tensors: dict, prefix: str, field: str) -> None:
    """The config's layer count against the blocks the file holds, before anything loops over layers:
    a count of 2^63 is one line, not a loop that never ends."""
    held = {name.split(".")[1] for name in tensors if name.startswith(prefix + ".") and name.count(".") >= 2}
    if n_layer != len(held):
        raise ConfigError(f"{field} = {n_layer:,} but the file holds {len(held):,} blocks of tensors; "
                          "is the file damaged, or the config the one for these weights?")


def check_all_finite(tensors: dict, where) -> None:
    """No NaN or infinity in any tensor (a quantized one: in its scales and minimums)."""
    from ..models.quant import QuantMatrix
    for k, v in tensors.items():
        for a in (v.d, v.m) if isinstance(v, QuantMatrix) else (v,):
            if a is not None:
                check_finite(a, f"{where}: tensor {k}")


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

def gpt2_from_folder(path: Path, dtype, weights: str, name: str | None = None, device=None, kernels: str = "numpy") -> GPT2:
    """A GPT-2 from a checkpoint directory or .safetensors file."""
    config, params = load_checkpoint(path, dtype)
    return GPT2(config, params, name=name or Path(path).name, weights=weights, device=device, kernels=kernels)


def gpt2_from_gguf(md: dict, tensors: dict, path: Path, dtype, weights: str, name: str | None = None,
                   device=None, kernels: str = "numpy") -> GPT2:
    """A GPT-2 from a GGUF's tensors (checkpoint names, GGUF's [out, in] rows; as `minillm quantize`
    writes them, or llama.cpp's converter): float matrices back to the checkpoint's [in, out]. The
    metadata is checked against the tensors (block count, every shape, nothing extra) before use."""
    from .gguf_gpt2 import gguf_name
    emb = tensors.get("wte.weight")
    if emb is None or len(emb.shape) != 2:
        raise WeightsError(f"{path}: no token_embd.weight matrix; is this a GPT-2 GGUF?")
    config = GPT2Config.from_gguf(md, emb.shape[0], path)
    check_block_count(config.n_layer, tensors, "h", f"{path}: metadata gpt2.block_count")
    params = {}
    for k, shape in iter_expected(config):                         # bounded: stops at the first missing
        if k not in tensors:
            raise WeightsError(f"{path}: tensor {k} is missing; the file is not a whole GPT-2")
        a = tensors[k]
        held = tuple(a.shape)[::-1] if k.endswith(GPT2.MATRICES) else tuple(a.shape)   # GGUF's [out, in]
        if held != shape:
            raise WeightsError(f"{path}: tensor {gguf_name(k)} has shape {list(held)} but the metadata "
                               f"({config.n_layer} layers, width {config.n_embd}, context {config.n_ctx}, "
                               f"vocab {config.vocab_size}) needs {list(shape)}; the metadata disagrees with the tensors: re-download the file")
        if k.endswith(GPT2.MATRICES) and isinstance(a, np.ndarray):
            a = np.ascontiguousarray(a.T)                           # GGUF's [out, in] rows -> [in, out]
        params[k] = np.asarray(a, dtype=dtype) if isinstance(a, np.ndarray) else a
    extra = sorted(set(tensors) - set(params))
    if extra:
        raise WeightsError(f"{path}: unexpected tensor {gguf_name(extra[0])} (and {len(extra) - 1} more) for a "
                           f"{config.n_layer}-layer GPT-2; the metadata disagrees with the tensors")
    check_all_finite(params, path)
    return GPT2(config, params, name=name or Path(path).stem, weights=weights, device=device, kernels=kernels)
