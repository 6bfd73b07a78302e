"""The KV cache: every layer's keys and values for every position so far, preallocated to n_ctx.

Layout [L, H, n_ctx, hd]: for one layer, the keys of all heads are one [H, t, hd] view
`k[layer, :, :t]`, so a decode step attends over every head in one batched product, with no
per-step concatenation and no copy of what the cache already holds. The arrays are allocated
once (the pages are touched only as positions fill), and a step writes only its own position.
"""

from __future__ import annotations

import numpy as np

from ..measure import meter
from ..config import GPT2Config
from ..errors import PromptError


class KVCache:
    def __init__(self, config: GPT2Config, dtype=np.float32) -> None:
        shape = (config.n_layer, config.n_head, config.n_ctx, config.head_dim)
        self.config = config
        self.k = np.zeros(shape, dtype=dtype)   # [L, H, n_ctx, hd]
        self.v = np.zeros(shape, dtype=dtype)   # [L, H, n_ctx, hd]
        self.length = 0                         # positions filled so far

    @property
    def n_ctx(self) -> int:
        return self.config.n_ctx

    def bytes_per_token(self) -> int:
        """K and V, every layer: 2·L·d·b (72 KiB for GPT-2 small in float32)."""
        L, H, _, hd = self.k.shape
        return 2 * L * H * hd * self.k.itemsize

    def nbytes_used(self) -> int:
        return self.length * self.bytes_per_token()

    def check_room(self, n_new: int) -> None:
        if self.length + n_new > self.n_ctx:
            raise PromptError(
                f"the KV cache holds {self.length} of {self.n_ctx} positions; {n_new} more do not fit "
                f"(the model's context is {self.n_ctx} tokens): shorten the prompt or generate fewer tokens"
            )

    def write(self, layer: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store keys and values [H, T, hd] of positions pos .. pos+T-1 for one layer, in place."""
        T = k.shape[1]
        self.k[layer, :, pos:pos + T] = k
        self.v[layer, :, pos:pos + T] = v
        m = meter.ACTIVE
        if m is not None:
            m.count("kv_write", kv_write=k.nbytes + v.nbytes)

    def fork(self) -> "KVCache":
        """A new cache holding a copy of the positions filled so far (a shared prompt prefix, say).
        Only the filled positions are copied; the rest of the new cache is fresh, untouched memory."""
        other = KVCache(self.config, self.k.dtype)
        other.k[:, :, :self.length] = self.k[:, :, :self.length]
        other.v[:, :, :self.length] = self.v[:, :, :self.length]
        other.length = self.length
        return other

    def read(self, layer: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Views (no copy) of the keys and values of the first t positions of one layer: [H, t, hd] each."""
        return self.k[layer, :, :t], self.v[layer, :, :t]
