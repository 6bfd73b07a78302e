"""Mixtures of experts on paper: the published shapes (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3) and
their arithmetic, shared by lesson 15, `minillm hardware --shape` and `minillm diagnose`.

    total   = embedding + head + L · attention + dense MLPs + per sparse layer (router + E experts + shared)
    active  = the same with k experts per sparse layer instead of E (what one token multiplies)
    KV      = 2 · L · Hkv · hd values per token (GQA); MLA caches one latent, L · (kv_lora + rope)

The numbers are each model's config.json on the Hugging Face hub (`repo`). DeepSeek-V3's attention is
MLA (`attention_params`); it runs one shared expert every token uses, and its first 3 layers are dense.
A random model's own arithmetic is its config's (`models.moe.MoEConfig.n_params`, `active_params`);
what a step of B tokens reads is the model's `step_weight_bytes(B)`.
"""

from __future__ import annotations

import numpy as np

from ..models.moe import expected_distinct_experts

SOURCE = "config.json on the Hugging Face hub"
PUBLISHED = {
    "Mixtral-8x7B": dict(repo="mistralai/Mixtral-8x7B-v0.1", layers=32, d=4096, heads=32, kv_heads=8, head_dim=128,
                         vocab=32000, E=8, k=2, expert_ffn=14336, shared=0, dense_layers=0, dense_ffn=0,
                         n_ctx=32768, said=(46.7e9, 12.9e9), released="bf16"),
    "Qwen3-30B-A3B": dict(repo="Qwen/Qwen3-30B-A3B", layers=48, d=2048, heads=32, kv_heads=4, head_dim=128,
                          vocab=151936, E=128, k=8, expert_ffn=768, shared=0, dense_layers=0, dense_ffn=0,
                          n_ctx=40960, said=(30.5e9, 3.3e9), released="bf16"),
    "DeepSeek-V3": dict(repo="deepseek-ai/DeepSeek-V3", layers=61, d=7168, heads=128, vocab=129280, E=256, k=8,
                        expert_ffn=2048, shared=1, dense_layers=3, dense_ffn=18432, n_ctx=163840,
                        said=(671e9, 37e9), mla=dict(q_lora=1536, kv_lora=512, nope=128, rope=64, v=128),
                        released="fp8"),
}

# The dtypes the makers released the weights in: bf16, 2 bytes a weight; DeepSeek-V3's fp8 (E4M3), its
# linear layers at 1 byte a weight plus a float32 scale per 128×128 tile, the embedding, the head, the
# norms and the routers in bf16 (the hub's model.safetensors: `weight_scale_inv` beside each fp8 matrix).
FP8_TILE = 128
RELEASED_BYTES = {"bf16": 2.0, "fp8": 1.0 + 4.0 / FP8_TILE ** 2}


def bf16_params(s: dict) -> tuple[int, int]:
    """(held, read a token) of the parameters an fp8 release keeps in bf16: the embedding and the head,
    every norm, the routers (MLA's two latent norms included)."""
    d, L, sparse = s["d"], s["layers"], s["layers"] - s["dense_layers"]
    norms = d + L * 2 * d + (L * (s["mla"]["q_lora"] + s["mla"]["kv_lora"]) if "mla" in s else 0)
    small = norms + sparse * d * s["E"]
    return 2 * s["vocab"] * d + small, 2 * s["vocab"] * d + small


def released_bytes(s: dict) -> tuple[float, float]:
    """(held, read by a token's step) in bytes, in the dtype the weights were released in (`released`):
    the totals and active counts of `published_params` (the embedding whole, as there)."""
    total, active = published_params(s)
    per = RELEASED_BYTES[s["released"]]
    if s["released"] == "bf16":
        return per * total, per * active
    held16, read16 = bf16_params(s)
    return per * (total - held16) + 2 * held16, per * (active - read16) + 2 * read16


def attention_params(s: dict) -> int:
    """One layer's attention weights (and its two RMSNorms). GQA: q|k|v and o. MLA (DeepSeek): the
    query through a rank-q_lora bottleneck, keys and values from one rank-kv_lora latent (plus a
    shared rope key), o from the heads' values."""
    d, H = s["d"], s["heads"]
    if "mla" in s:
        a = s["mla"]
        q = d * a["q_lora"] + a["q_lora"] + a["q_lora"] * H * (a["nope"] + a["rope"])
        kv = d * (a["kv_lora"] + a["rope"]) + a["kv_lora"] + a["kv_lora"] * H * (a["nope"] + a["v"])
        return q + kv + H * a["v"] * d + 2 * d
    hd = s["head_dim"]
    qk_norm = 2 * hd if "Qwen3" in s["repo"] else 0
    return d * (H + 2 * s["kv_heads"]) * hd + H * hd * d + 2 * d + qk_norm


def published_params(s: dict) -> tuple[int, int]:
    """(total, active) parameters from the config numbers: embedding and head (untied), attention,
    dense MLPs, and per sparse layer a router, E routed experts (k active) and the shared ones."""
    d, L = s["d"], s["layers"]
    one = 3 * d * s["expert_ffn"]
    sparse = L - s["dense_layers"]
    common = 2 * s["vocab"] * d + d + L * attention_params(s) + s["dense_layers"] * 3 * d * s["dense_ffn"]
    common += sparse * (d * s["E"] + s["shared"] * one)
    return common + sparse * s["E"] * one, common + sparse * s["k"] * one


def kv_values_per_token(s: dict) -> int:
    """Values the KV cache holds per token, every layer: keys and values of the KV heads (GQA), or
    MLA's latent and its rope key (DeepSeek: 512 + 64 a layer)."""
    if "mla" in s:
        return s["layers"] * (s["mla"]["kv_lora"] + s["mla"]["rope"])
    return 2 * s["layers"] * s["kv_heads"] * s["head_dim"]


def moe_shape(name: str) -> dict:
    """A published mixture (a key of PUBLISHED) in the fields `measure.shapes.shape` gives every named
    model: its attention (GQA's KV heads, or MLA's latent as `kv_latent`), `n_params` (the total, what
    memory holds) and `n_active` (what one token multiplies), and its experts: `n_expert` (E),
    `top_k` (k), `expert_params` (one routed expert) and `sparse_layers`."""
    s = PUBLISHED[name]
    total, active = published_params(s)
    out = {"n_layer": s["layers"], "n_head": s["heads"], "n_params": total, "n_active": active, "n_ctx": s["n_ctx"],
           "n_expert": s["E"], "top_k": s["k"], "expert_params": 3 * s["d"] * s["expert_ffn"],
           "sparse_layers": s["layers"] - s["dense_layers"]}
    if "mla" in s:
        a = s["mla"]
        out.update(n_kv_head=s["heads"], head_dim=a["nope"] + a["rope"], v_head_dim=a["v"],
                   kv_latent=a["kv_lora"] + a["rope"])
    else:
        out.update(n_kv_head=s["kv_heads"], head_dim=s["head_dim"])
    return out


def params_read(s: dict, B: int = 1) -> float:
    """The weight parameters a decode step of B tokens reads, from a shape dict: a dense model's all of
    them; a mixture's active ones at B = 1, and past it, per sparse layer, the experts uniform routing
    adds to the k: E·(1 − (1 − k/E)^B) in all (`models.moe.expected_distinct_experts`)."""
    if "n_active" not in s:
        return s["n_params"]
    if B == 1:
        return s["n_active"]
    extra = expected_distinct_experts(s["n_expert"], s["top_k"], B) - s["top_k"]
    return s["n_active"] + s["sparse_layers"] * extra * s["expert_params"]


def uniform_busiest(rng, rows: int, E: int, k: int) -> float:
    """The busiest expert's rows ÷ the mean, when `rows` rows each pick k distinct experts at random."""
    picks = np.argsort(rng.random((rows, E)), axis=1)[:, :k]
    load = np.bincount(picks.ravel(), minlength=E)
    return load.max() / load.mean()
