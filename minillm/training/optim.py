"""The optimiser: AdamW, global gradient-norm clipping, and the learning-rate schedule."""

from __future__ import annotations

import math

import numpy as np


def decays(name: str, array: np.ndarray) -> bool:
    """Weight decay applies to the 2-D weights (matrices and embeddings), never to biases or layer norms."""
    return array.ndim == 2


class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter): p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)."""

    def __init__(self, params, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8):
        self.wd, self.b1, self.b2, self.eps = float(weight_decay), float(betas[0]), float(betas[1]), float(eps)
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, params, grads, lr):
        self.t += 1
        lr = float(lr)
        c1 = 1.0 - self.b1 ** self.t                 # bias corrections: m and v start at 0
        c2 = 1.0 - self.b2 ** self.t
        for k, p in params.items():
            g, m, v = grads[k], self.m[k], self.v[k]
            m *= self.b1
            m += (1.0 - self.b1) * g
            v *= self.b2
            v += (1.0 - self.b2) * (g * g)
            if self.wd and decays(k, p):
                p *= 1.0 - lr * self.wd              # decoupled: shrink the weight, not the gradient
            p -= (lr / c1) * m / (np.sqrt(v / c2) + self.eps)


def clip_grad_norm(grads, max_norm):
    """Scale all gradients together so that their global L2 norm is at most max_norm; return the norm."""
    norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
    if max_norm and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads.values():
            g *= scale
    return norm


def lr_at(progress, step, lr, warmup_steps, min_ratio=0.1):
    """Linear warm-up over the first warmup_steps, then cosine from lr down to min_ratio*lr at progress 1."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = min(max(progress, 0.0), 1.0)
    return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
