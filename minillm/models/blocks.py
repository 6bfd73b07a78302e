"""What several families' blocks share, besides the ops: the SwiGLU MLP (Llama's, the experts', the
hybrid's), the final RMS norm and LM head, the gates of Qwen3.5's attention and its linear layers,
and a Llama-shaped model's parameters under their checkpoint names. Nothing here is a family: a
family module imports these and never another family's module."""

from __future__ import annotations

import numpy as np

from .. import backend, meter
from . import ops
from .weights import stored


def mlp(x: np.ndarray, p: dict, act=ops.swiglu) -> np.ndarray:
    """SwiGLU. [N, d] -> gate|up [N, 2F] -> silu(gate)·up [N, F] -> [N, d]. act: ops.swiglu, or a
    kernel set's (K.swiglu)."""
    h = ops.linear(x, p["gate_up.weight"], p.get("gate_up.bias"))           # [N, 2F]
    return ops.linear(act(h), p["down_proj.weight"], p.get("down_proj.bias"))   # [N, d]


def norm_head(model, h: np.ndarray) -> np.ndarray:
    """The final RMS norm and the LM head, on the scored rows (a model's `head`: Llama's, Qwen3.5's,
    DeepSeek's). h [S, d] -> logits [S, V]."""
    return ops.lm_head(model.kernel_set.rms_norm(h, model.norm, model.config.eps), model.head_w)


def checkpoint_params(model) -> dict:
    """A Llama-shaped model's parameters as the checkpoint names them (`model.params`): the embedding,
    the final norm, an untied head, and every block's (stacked ones under their stacked names)."""
    params = {"embed_tokens.weight": model.wte, "norm.weight": model.norm}
    if not model.config.tied:
        params["lm_head.weight"] = stored(model.head_w, rows=True)
    for i, p in enumerate(model.blocks):
        params.update({f"layers.{i}.{k}": stored(v) for k, v in p.items()})
    return params


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) as (1 + tanh(x/2)) / 2: never overflows. A new array, x's shape."""
    y = x * 0.5
    backend.namespace(y).tanh(y, out=y)
    y += 1.0
    y *= 0.5
    return y


def output_gate(a: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """a · sigmoid(gate), in place. a, gate [N, H·hd]. Counted: 5 FLOPs an element (the sigmoid's
    4, the product)."""
    a *= sigmoid(gate)
    m = meter.active()
    if m is not None:
        m.count("output_gate", activations=2 * a.nbytes + gate.nbytes, other=5 * a.size)
    return a
