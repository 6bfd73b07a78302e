"""Load a mixture-of-experts model (models/moe.py) from a Hugging Face folder in the hub's layout: one
tensor per expert and projection, read as the Llama family's are (checkpoints/llama_load.py: one
file or sharded, bfloat16 widened to float32)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..models.moe import MoE, MoEConfig, check_tensors
from .checkpoint import check_finite
from .llama_load import read_json, read_tensors


def load_moe(path, dtype=np.float32, *, name: str | None = None, weights: str = "float32") -> MoE:
    """A Mixtral or Qwen3-MoE model from a folder (or its .safetensors file). weights: "float32" or a
    format every expert is quantized to ("q8_0", "q4_0", "q4_1"); see `models.moe.MoE`."""
    path = Path(path)
    folder, file = (path.parent, path) if path.is_file() else (path, None)
    config = MoEConfig.from_hf(read_json(folder / "config.json"), str(folder / "config.json"))
    tensors = read_tensors(folder, file)
    check_tensors(tensors, config, str(folder))
    for k, v in tensors.items():
        check_finite(v, f"{folder}: tensor {k}")
    return MoE(config, tensors, name=name or folder.name, dtype=dtype, weights=weights)
