"""The GPT-2 being trained: its initialisation, and the forward and backward of the whole network
built from the operation pairs in `ops.py`. A training step is `loss_and_grads`, then the optimiser."""

from __future__ import annotations

import math

import numpy as np

from ..models.gpt2 import random_params
from ..models.gpt2 import GPT2Config
from ..errors import MiniLLMError
from .ops import (attention_backward, attention_forward, dropout_backward, dropout_forward, embedding_backward,
                  embedding_forward, gelu_backward, gelu_forward, layernorm_backward, layernorm_forward,
                  linear_backward, linear_forward, lm_head_cross_entropy)


def init_params(config: GPT2Config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """GPT-2's initialisation: weights N(0, 0.02), the two residual projections N(0, 0.02/sqrt(2L)),
    biases 0, layer-norm weights 1. Named like the Hugging Face checkpoint (no `transformer.` prefix)."""
    return random_params(config, seed, std=0.02, dtype=dtype, residual_std=0.02 / math.sqrt(2 * config.n_layer))


def block_forward(x, p, h, config, dropout=0.0, rng=None):
    """One transformer block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)). x [B, T, d] -> [B, T, d]."""
    eps = config.ln_eps
    a, ln1 = layernorm_forward(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)             # [B, T, d]
    qkv, fc_attn = linear_forward(a, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"])  # [B, T, 3d]
    y, att = attention_forward(qkv, config.n_head, dropout, rng)                             # [B, T, d]
    o, proj_attn = linear_forward(y, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])  # [B, T, d]
    o, drop1 = dropout_forward(o, dropout, rng)
    x = x + o                                                                                 # [B, T, d]
    m, ln2 = layernorm_forward(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)             # [B, T, d]
    f, fc = linear_forward(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"])              # [B, T, 4d]
    g, gelu = gelu_forward(f)                                                                 # [B, T, 4d]
    o, proj = linear_forward(g, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])        # [B, T, d]
    o, drop2 = dropout_forward(o, dropout, rng)
    x = x + o                                                                                 # [B, T, d]
    return x, (ln1, fc_attn, att, proj_attn, drop1, ln2, fc, gelu, proj, drop2)


def block_backward(dx, cache, h, grads):
    """dx [B, T, d] -> dx [B, T, d]; adds this block's parameter gradients to `grads`."""
    ln1, fc_attn, att, proj_attn, drop1, ln2, fc, gelu, proj, drop2 = cache
    # second residual branch: x = x + drop(mlp(ln_2(x)))
    do = dropout_backward(dx, drop2)
    dg, grads[h + "mlp.c_proj.weight"], grads[h + "mlp.c_proj.bias"] = linear_backward(do, proj)
    df = gelu_backward(dg, gelu)
    dm, grads[h + "mlp.c_fc.weight"], grads[h + "mlp.c_fc.bias"] = linear_backward(df, fc)
    dln, grads[h + "ln_2.weight"], grads[h + "ln_2.bias"] = layernorm_backward(dm, ln2)
    dx = dx + dln                                   # the residual passes dx through unchanged
    # first residual branch: x = x + drop(attn(ln_1(x)))
    do = dropout_backward(dx, drop1)
    dy, grads[h + "attn.c_proj.weight"], grads[h + "attn.c_proj.bias"] = linear_backward(do, proj_attn)
    dqkv = attention_backward(dy, att)
    da, grads[h + "attn.c_attn.weight"], grads[h + "attn.c_attn.bias"] = linear_backward(dqkv, fc_attn)
    dln, grads[h + "ln_1.weight"], grads[h + "ln_1.bias"] = layernorm_backward(da, ln1)
    return dx + dln


def forward(params, config, idx, targets, dropout=0.0, rng=None, need_grad=True, chunk=512):
    """Mean next-token loss of idx [B, T] against targets [B, T], and what `backward` needs.

    The fused head computes the loss's gradient with respect to the final hidden state during the
    forward (its logits are never kept), so the cache holds that gradient, not the logits.
    With need_grad=False: (sum of per-token losses, None), used by `evaluate`.
    """
    B, T = idx.shape
    if T > config.n_ctx:
        raise MiniLLMError(f"sequence of {T} tokens is longer than the model's context ({config.n_ctx})")
    x, emb = embedding_forward(params["wte.weight"], params["wpe.weight"], idx)          # [B, T, d]
    x, drop0 = dropout_forward(x, dropout, rng)
    blocks = []
    for i in range(config.n_layer):
        x, c = block_forward(x, params, f"h.{i}.", config, dropout, rng)                 # [B, T, d]
        blocks.append(c)
    xf, lnf = layernorm_forward(x, params["ln_f.weight"], params["ln_f.bias"], config.ln_eps)
    d = config.n_embd
    loss, dxf, dwte_head = lm_head_cross_entropy(xf.reshape(-1, d), params["wte.weight"],  # [N, d] x [V, d]
                                                 targets.reshape(-1), chunk, need_grad)
    if not need_grad:
        return loss, None
    return loss, (emb, drop0, blocks, lnf, dxf.reshape(B, T, d), dwte_head)


def backward(params, config, cache):
    """The gradient of the loss with respect to every parameter: a dict named like `params`."""
    emb, drop0, blocks, lnf, dxf, dwte_head = cache
    grads = {}
    dx, grads["ln_f.weight"], grads["ln_f.bias"] = layernorm_backward(dxf, lnf)
    for i in reversed(range(config.n_layer)):
        dx = block_backward(dx, blocks[i], f"h.{i}.", grads)
    dx = dropout_backward(dx, drop0)
    dwte_emb, grads["wpe.weight"] = embedding_backward(dx, emb, params["wte.weight"].shape,
                                                       params["wpe.weight"].shape)
    grads["wte.weight"] = dwte_head + dwte_emb      # tied: wte is both the embedding and the LM head
    return grads


def loss_and_grads(params, config, idx, targets, dropout=0.0, rng=None, chunk=512):
    loss, cache = forward(params, config, idx, targets, dropout, rng, True, chunk)
    return loss, backward(params, config, cache)
