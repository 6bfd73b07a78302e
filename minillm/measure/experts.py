"""Mixtures of experts on paper: the published shapes (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3) and
their arithmetic, shared by lesson 15, `minillm hardware --shape` and `minillm diagnose`.

    total   = embedding + head + L · attention + dense MLPs + per sparse layer (router + E experts + shared)
    active  = the same with k experts per sparse layer instead of E (what one token multiplies)
    KV      = 2 · L · Hkv · hd values per token (GQA); MLA caches one latent, L · (kv_lora + rope)

The numbers are each model's config.json on the Hugging Face hub (`repo`). DeepSeek-V3's attention is
MLA (`attention_params`); it runs one shared expert every token uses, and its first 3 layers are dense.

Each is sized **as released** (`released`): the bytes per weight of the files its makers publish
(config.json's torch_dtype and quantization_config). Mixtral and Qwen3 ship bf16, 2 bytes a weight.
DeepSeek-V3 ships its matrices in FP8 (E4M3, 1 byte) with one float32 scale per 128×128 tile, 1 +
4/16,384 bytes a weight, and keeps the embedding, the head, the routers and the norms in bf16
(`kept_params`); in bf16 throughout (an upcast, what some runtimes load) it is twice the bytes.
A random model's own arithmetic is its config's (`models.moe.MoEConfig.n_params`, `active_params`);
what a step of B tokens reads is the model's `step_weight_bytes(B)`.
"""

from __future__ import annotations

import numpy as np

from ..models.mixture import expected_distinct_experts

SOURCE = "config.json on the Hugging Face hub"
PUBLISHED = {
    "Mixtral-8x7B": dict(repo="mistralai/Mixtral-8x7B-v0.1", layers=32, d=4096, heads=32, kv_heads=8, head_dim=128,
                         vocab=32000, E=8, k=2, expert_ffn=14336, shared=0, dense_layers=0, dense_ffn=0,
                         n_ctx=32768, said=(46.7e9, 12.9e9)),
    "Qwen3-30B-A3B": dict(repo="Qwen/Qwen3-30B-A3B", layers=48, d=2048, heads=32, kv_heads=4, head_dim=128,
                          vocab=151936, E=128, k=8, expert_ffn=768, shared=0, dense_layers=0, dense_ffn=0,
                          n_ctx=40960, said=(30.5e9, 3.3e9)),
    "DeepSeek-V3": dict(repo="deepseek-ai/DeepSeek-V3", layers=61, d=7168, heads=128, vocab=129280, E=256, k=8,
                        expert_ffn=2048, shared=1, dense_layers=3, dense_ffn=18432, n_ctx=163840,
                        said=(671e9, 37e9), mla=dict(q_lora=1536, kv_lora=512, nope=128, rope=64, v=128)),
}

FP8_TILE = 1 + 4 / (128 * 128)   # FP8 E4M3 weights with one float32 scale per 128×128 tile, bytes a weight
# name: (the format in words, bytes a weight of the matrices); what is not in that format is kept in bf16
RELEASED = {"Mixtral-8x7B": ("bf16", 2.0), "Qwen3-30B-A3B": ("bf16", 2.0),
            "DeepSeek-V3": ("fp8 + 128×128 tile scales", FP8_TILE)}


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


def kept_params(s: dict) -> int:
    """Parameters a release keeps in bf16 when its matrices are in a smaller format: the embedding
    and the head, the routers, and every norm (DeepSeek-V3's q and kv latent norms too)."""
    d, L = s["d"], s["layers"]
    norms = d + 2 * d * L + (L * (s["mla"]["q_lora"] + s["mla"]["kv_lora"]) if "mla" in s else 0)
    return 2 * s["vocab"] * d + (L - s["dense_layers"]) * d * s["E"] + norms




def moe_shape(name: str) -> dict:
    """A published mixture (a key of PUBLISHED) in the fields `measure.shapes.shape` gives every named
    model: its attention (GQA's KV heads, or MLA's latent as `kv_latent`), `n_params` (the total, what
    memory holds) and `n_active` (what one token multiplies), and its experts: `n_expert` (E),
    `top_k` (k), `expert_params` (one routed expert) and `sparse_layers`."""
    s = PUBLISHED[name]
    total, active = published_params(s)
    label, bpw = RELEASED[name]
    out = {"n_layer": s["layers"], "n_head": s["heads"], "n_params": total, "n_active": active, "n_ctx": s["n_ctx"],
           "n_expert": s["E"], "top_k": s["k"], "expert_params": 3 * s["d"] * s["expert_ffn"],
           "sparse_layers": s["layers"] - s["dense_layers"], "n_embd": s["d"],
           "untied_embedding": s["vocab"] * s["d"],
           "released": label, "bytes_per_weight": bpw, "kept_params": kept_params(s) if bpw != 2.0 else 0}
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
    adds to the k: E·(1 − (1 − k/E)^B) in all (`models.moe.expected_distinct_experts`). An untied
    embedding table (`untied_embedding`, not the head) is not read whole: B of its rows are."""
    table = s.get("untied_embedding", 0)
    rows = B * s.get("n_embd", 0) if table else 0
    if "n_active" not in s:
        return s["n_params"] - table + rows
    if B == 1:
        return s["n_active"] - table + rows
    extra = expected_distinct_experts(s["n_expert"], s["top_k"], B) - s["top_k"]
    return s["n_active"] - table + rows + s["sparse_layers"] * extra * s["expert_params"]


def held_bytes(s: dict, bytes_per_weight: float | None = None) -> float:
    """The bytes memory holds for a shape's weights: `bytes_per_weight` for every one, or (None) as
    released: the matrices at the release's bytes a weight, what it keeps in bf16 at 2."""
    if bytes_per_weight is not None:
        return s["n_params"] * bytes_per_weight
    kept = s.get("kept_params", 0)
    return (s["n_params"] - kept) * s.get("bytes_per_weight", 2.0) + 2.0 * kept


def read_bytes(s: dict, B: int = 1, bytes_per_weight: float | None = None) -> float:
    """The weight bytes a decode step of B tokens reads (`params_read`), every weight at
    `bytes_per_weight`, or (None) as released: the kept bf16 part (the head, routers, norms; the
    embedding table but its rows) at 2 bytes, the rest at the release's bytes a weight."""
    p = params_read(s, B)
    if bytes_per_weight is not None:
        return p * bytes_per_weight
    kept = s.get("kept_params", 0)
    kept_read = max(0, kept - s.get("untied_embedding", 0)) if kept else 0
    return (p - kept_read) * s.get("bytes_per_weight", 2.0) + 2.0 * kept_read


def uniform_busiest(rng, rows: int, E: int, k: int) -> float:
    """The busiest expert's rows ÷ the mean, when `rows` rows each pick k distinct experts at random."""
    picks = np.argsort(rng.random((rows, E)), axis=1)[:, :k]
    load = np.bincount(picks.ravel(), minlength=E)
    return load.max() / load.mean()
