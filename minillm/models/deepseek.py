"""The DeepSeek-V3 family (DeepSeek-V3/R1's architecture): multi-head latent attention and DeepSeek's
mixture of experts, read like the papers (DeepSeek-V2, arXiv 2405.04434; DeepSeek-V3, 2412.19437).

    x = embed[ids]
    for each block:
        x = x + mla(rms_norm(x))                       # multi-head latent attention
        x = x + ffn(rms_norm(x))                       # a dense SwiGLU MLP in the first
                                                       # `first_k_dense` blocks, then DeepSeek's mixture
    logits = rms_norm(x) @ head

Multi-head latent attention is an attention kind of its own (models/mla.py: the latent, the two
ways of attending, `MLAShape`); this module assembles it, with DeepSeek's mixture, into blocks. The
config.json and the checkpoint's tensors are read in models/deepseek_config.py.

Rotary positions. `rope_interleave` (DeepSeek's files: true) turns the coordinate pairs (2i, 2i + 1);
ops.rope turns (i, i + dr/2). A permutation applied to both q and k leaves q·k unchanged, so the
rotary rows of the query and latent projections are reordered once at load (even ones first), and
then ops.rope computes exactly transformers' interleaved rotation.

DeepSeek's mixture (`mixture`):

    s      = sigmoid(x @ router)                       # [E]: each expert's affinity, in float32
    choice = s + bias                                  # e_score_correction_bias: balances the load;
                                                       # it picks the experts, it never weighs them
    groups: the E experts in n_group groups, a group scored by its top two choices; only the best
            topk_group groups may be picked from (with experts on n_group nodes: fewer nodes a token)
    top    = the k largest choices among those groups
    w      = s[top] / sum(s[top]) (norm_topk_prob) · routed_scaling_factor
    y      = Σ_j w_j · expert_{top_j}(x) + shared(x)   # n_shared_experts always-on experts, one
                                                       # SwiGLU of width n_shared · moe_ffn
"""

from __future__ import annotations

from functools import partial

import numpy as np

from . import ops
from .base import RANDOM_SEED, CausalLM
from .deepseek_config import DeepSeekConfig, manifest, rope_rows
from .deepseek_config import GGUF_BLOCK_NAMES, MODEL_TYPES, deinterleave  # noqa: F401  (the row and tests read them here)
from .factory import make_weight, on_device
from .blocks import mlp, norm_head
from .mixture import dispatch, expected_distinct_experts, expert, grouped_route as route  # noqa: F401  (route: its router)
from .mla import MLA_DECODE, MLA_OPTION, WAYS, mla  # noqa: F401  (MLA_DECODE: the family's ways)
from .quant import FORMATS
from .target import Target, cpu_only
from .weights import check_blocks, label, stored


# -- DeepSeek's mixture -----------------------------------------------------------------------------

def mixture(x: np.ndarray, p: dict, c: DeepSeekConfig, act=ops.swiglu) -> np.ndarray:
    """DeepSeek's mixture: k routed experts per row (models/moe.py's `dispatch`: each chosen expert
    once on all its rows), plus the shared expert every row uses. [N, d] -> [N, d]."""
    experts, weights = route(x, p["router.weight"], p["router.bias"], c)   # [N, k] each
    y = dispatch(x, experts, weights, p, act)                               # [N, d]
    if c.n_shared:
        y = ops.add(y, mlp(x, {"gate_up.weight": p["shared.gate_up.weight"],
                               "down_proj.weight": p["shared.down_proj.weight"]}, act))
    return y


# -- the model ----------------------------------------------------------------------------------------

class DeepSeekV3(CausalLM):
    """A DeepSeek-V3-family model: a config and checkpoint tensors (Hugging Face names without `model.`).

    Its KV cache holds one row of r + dr values a token a layer (the config answers the cache as one
    KV head of that width whose first r values are the values too: `values_in_keys`). A prompt
    (prefill, a chunk, a speculative check: any step but a decode) attends decompressed; a decode
    step the way `mla_decode` says: "absorbed" (the default, as serving engines decode) or
    "decompressed". Attention runs NumPy's form whatever the kernel set (the fused kernels take keys
    and values of one width: the set declines its options, ops.AttentionSpec), each sequence over its
    own cache; the products are the set's."""

    CONFIG = DeepSeekConfig
    OPTIONS = (MLA_OPTION,)          # the family's option: how a decode step attends
    ATTENTION_ASKS = frozenset({"scale", "value_width"})      # its own scale, values narrower than keys
    manifest = staticmethod(manifest)
    MATRICES = ("qa_kva.weight", "q_b_proj.weight", "q_proj.weight", "kv_a.weight", "kv_b.weight", "o_proj.weight")

    def __init__(self, config: DeepSeekConfig, tensors: dict, target: Target | None = None, *, name: str = "",
                 eos_ids: tuple[int, ...] = (), mla_decode: str = "absorbed") -> None:
        c = self.config = config
        target = target or Target.numpy()
        self.name = name or f"deepseek-{c.n_layer}x{c.n_embd}-{c.n_expert}e"
        if not target.on_cpu:
            raise cpu_only(f"{self.name}: the DeepSeek-V3 family (its routing and latent attention are NumPy's)",
                           target.device, "use --device cpu")
        self.use_target(target)
        check_blocks({"width": c.n_embd, "attention width H·dv": c.n_head * c.v_head_dim, "FFN": c.ffn,
                      "expert FFN": c.expert_ffn, **({"q_lora_rank": c.q_lora_rank} if c.q_lora_rank else {})},
                     target.weights, self.name)
        self.dtype = target.dtype
        self.mla_decode = MLA_OPTION.check(mla_decode)
        self.shape = c.mla                   # what its latent attention reads (models/mla.py)
        self.eos_ids = tuple(eos_ids)
        self.tokenizer = None
        embed = tensors["embed_tokens.weight"]                                            # [V, d]
        self.head_w = make_weight(embed if c.tied else tensors["lm_head.weight"], target, rows=True)
        self.embed_w = self.head_w if c.tied else make_weight(embed, target, rows=True, contiguous=False)
        self.wte = stored(self.embed_w, rows=True)                                        # [V, d]
        self.norm = on_device(np.asarray(tensors["norm.weight"], dtype=self.dtype), target)
        self.params = {"embed_tokens.weight": self.wte, "norm.weight": self.norm}
        if not c.tied:
            self.params["lm_head.weight"] = stored(self.head_w, rows=True)
        self.blocks = []
        for i in range(c.n_layer):
            p, held = block_params(tensors, i, c, target)
            self.blocks.append(p)
            self.params.update({f"layers.{i}.{k}": v for k, v in held.items()})
        self.weights, self.float_matrices = label(self.matrices(head=False), self.dtype)

    def ffn(self, layer: int):
        """Block `layer`'s MLP: a function (x [N, d], its parameters) -> [N, d]."""
        act = self.kernel_set.swiglu
        return partial(mixture, c=self.config, act=act) if self.config.is_sparse(layer) else partial(mlp, act=act)

    def way(self, plan) -> str:
        """How this step attends: a decode step as `mla_decode` says, any other decompressed."""
        return self.mla_decode if plan.kind == "decode" else "decompressed"

    def run(self, plan) -> np.ndarray:
        """Embeddings, then every block (not the final norm). plan.ids, plan.positions [N] -> x [N, d]."""
        c, K = self.config, self.kernel_set
        x = ops.embedding(self.embed_w, None, plan.ids)                                   # [N, d]
        cos, sin = ops.rope_tables(plan.positions, c.qk_rope_head_dim, c.theta, self.dtype)   # [N, dr/2]
        way = WAYS[self.way(plan)]
        for layer, p in enumerate(self.blocks):
            h = K.rms_norm(x, p["input_layernorm.weight"], c.eps)
            x = ops.add(x, mla(h, p, self.shape, cos, sin, partial(plan.attend, layer), way, K))
            x = ops.add(x, self.ffn(layer)(K.rms_norm(x, p["post_attention_layernorm.weight"], c.eps), p))
        return x

    head = norm_head                   # the final RMS norm and the LM head (models/blocks.py)

    def gathered(self) -> tuple[str, ...]:
        return () if self.config.tied else ("embed_tokens.weight",)

    @property
    def experts(self) -> tuple[int, int]:
        """(E, k): routed experts per sparse layer, and how many each token uses (the shared ones besides)."""
        return self.config.n_expert, self.config.top_k

    def step_weight_bytes(self, n_tokens: int = 1, distinct=None) -> float:
        """The weight bytes a decode step of n_tokens rows (one each of n_tokens sequences) reads when its
        sparse layers' rows chose `distinct` routed experts each (default: uniform routing's
        expectation, exactly k at one token), by `step_weight_bytes` below; decoding decompressed,
        each sequence multiplies kv_b over its own cache."""
        c = self.config
        if distinct is None:
            n = expected_distinct_experts(c.n_expert, c.top_k, n_tokens)
            distinct = [c.top_k if n_tokens == 1 else n] * len(c.sparse_layers)
        return step_weight_bytes(c, distinct, n_tokens, self.dtype.itemsize, self.weights,
                                 kv_b_reads=n_tokens if self.mla_decode == "decompressed" else 1)

    def matrices(self, head: bool = True, chosen=None) -> list:
        """The products a step multiplies, each once (kv_b as the decompressed form multiplies it; the
        absorbed form reads the same bytes as its two per-head halves): attention, dense MLPs, the
        chosen routed experts and the shared ones (default: the first k, a one-token step; "all": every
        expert), then the LM head (head=False: not it). Not the router, kept float."""
        c = self.config
        if chosen is None:
            chosen = [range(c.top_k)] * len(c.sparse_layers)
        elif isinstance(chosen, str):
            chosen = [range(c.n_expert)] * len(c.sparse_layers)
        sets = dict(zip(c.sparse_layers, chosen, strict=True))
        out = []
        for i, p in enumerate(self.blocks):
            out += [p[k] for k in self.MATRICES if k in p]
            if i in sets:
                out += [w for e in sorted(set(sets[i])) for w in expert(p, e).values()]
                out += [p[k] for k in ("shared.gate_up.weight", "shared.down_proj.weight") if k in p]
            else:
                out += [p["gate_up.weight"], p["down_proj.weight"]]
        return out + [self.head_w] if head else out

    def __repr__(self) -> str:
        c = self.config
        q = f"q_lora {c.q_lora_rank}" if c.q_lora_rank else "direct q"
        return (f"DeepSeekV3({self.name!r}: {c.n_layer} layers ({len(c.sparse_layers)} with {c.n_expert} experts, "
                f"top-{c.top_k}, {c.n_shared} shared), MLA {c.n_head} heads, latent {c.kv_lora_rank} + rope "
                f"{c.qk_rope_head_dim}, {q}, width {c.n_embd}, context {c.n_ctx}, vocab {c.vocab_size}, "
                f"{self.n_params():,} params ({c.active_params():,} active), {self.weights}, "
                f"decode {self.mla_decode})")


def block_params(t: dict, i: int, c: DeepSeekConfig, target: Target) -> tuple[dict, dict]:
    """Block i's checkpoint tensors -> (the model's parameters, what it holds under checkpoint names).

    Low rank: q_a and kv_a side by side in one [d, r_q + r + dr] product (both read x). The rotary
    rows put in ops.rope's layout (`rope_rows`). kv_b kept once, as [H, dn + dv, r]: `kv_b.weight` is
    that array as the decompressed form multiplies it ([r, H·(dn + dv)], a view), `w_uk` [H, dn, r]
    and `w_uv_t` [H, r, dv] are views of its two halves, as the absorbed form multiplies them (so kv_b
    stays float, NumPy's: one array for both forms). The router and its bias stay float."""
    h, a, m = f"layers.{i}.", f"layers.{i}.self_attn.", f"layers.{i}.mlp."
    H, r, dr, dn, dv = c.n_head, c.kv_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim
    dtype = target.dtype
    f = lambda name: np.asarray(t[name], dtype=dtype)
    mat = lambda parts: make_weight(parts, target, rows=True)
    kv_a = np.asarray(t[a + "kv_a_proj_with_mqa.weight"])[rope_rows(c, r + dr, 1, r + dr)]      # [r + dr, d]
    q_order = rope_rows(c, H * c.qk_head_dim, H, c.qk_head_dim)
    p = {"input_layernorm.weight": f(h + "input_layernorm.weight"),
         "kv_a_layernorm.weight": f(a + "kv_a_layernorm.weight"),
         "o_proj.weight": mat([t[a + "o_proj.weight"]]),                                          # [H·dv, d]
         "post_attention_layernorm.weight": f(h + "post_attention_layernorm.weight")}
    bias = {}
    if c.attention_bias:
        bias["kv_a"] = f(a + "kv_a_proj_with_mqa.bias")[rope_rows(c, r + dr, 1, r + dr)]
        p["o_proj.bias"] = f(a + "o_proj.bias")
    if c.q_lora_rank is None:
        p["q_proj.weight"] = mat([np.asarray(t[a + "q_proj.weight"])[q_order]])                    # [d, H·(dn+dr)]
        p["kv_a.weight"] = mat([kv_a])                                                            # [d, r + dr]
        if c.attention_bias:
            p["kv_a.bias"] = bias["kv_a"]
    else:
        p["qa_kva.weight"] = mat([t[a + "q_a_proj.weight"], kv_a])                                # [d, r_q + r + dr]
        if c.attention_bias:
            p["qa_kva.bias"] = np.concatenate([f(a + "q_a_proj.bias"), bias["kv_a"]])
        p["q_a_layernorm.weight"] = f(a + "q_a_layernorm.weight")
        p["q_b_proj.weight"] = mat([np.asarray(t[a + "q_b_proj.weight"])[q_order]])              # [r_q, H·(dn+dr)]
    kv_b = np.ascontiguousarray(f(a + "kv_b_proj.weight").reshape(H, dn + dv, r))       # [H, dn + dv, r], once
    views = {"kv_b.weight": make_weight(kv_b.reshape(H * (dn + dv), r), target.with_(weights="float32"),
                                        rows=True, contiguous=False),                   # [r, H·(dn + dv)], a view
             "w_uk": kv_b[:, :dn],                                                      # [H, dn, r]
             "w_uv_t": kv_b[:, dn:].transpose(0, 2, 1)}                                 # [H, r, dv]
    if not c.is_sparse(i):
        p["gate_up.weight"] = mat([t[m + "gate_proj.weight"], t[m + "up_proj.weight"]])   # [d, 2F]
        p["down_proj.weight"] = mat([t[m + "down_proj.weight"]])                          # [F, d]
    else:
        p["router.weight"] = make_weight(t[m + "gate.weight"], target.with_(weights="float32"), rows=True)  # [d, E]
        p["router.bias"] = f(m + "gate.e_score_correction_bias")                                        # [E]
        for e in range(c.n_expert):
            x = m + f"experts.{e}."
            p[f"experts.{e}.gate_up.weight"] = mat([t[x + "gate_proj.weight"], t[x + "up_proj.weight"]])   # [d, 2F_e]
            p[f"experts.{e}.down_proj.weight"] = mat([t[x + "down_proj.weight"]])                         # [F_e, d]
        if c.n_shared:
            s = m + "shared_experts."
            p["shared.gate_up.weight"] = mat([t[s + "gate_proj.weight"], t[s + "up_proj.weight"]])
            p["shared.down_proj.weight"] = mat([t[s + "down_proj.weight"]])
    held = {k: stored(v) for k, v in p.items()}
    held["kv_b_proj.weight"] = kv_b                                                     # its bytes once
    return {**p, **views}, held


def random_params(c: DeepSeekConfig, seed: int = 0, std: float = 0.02, dtype=np.float32) -> dict[str, np.ndarray]:
    """Checkpoint-shaped random weights, seeded: normal(0, std) matrices, norm gains near 1, and a
    router bias of 0.1's order (so that it changes which experts are chosen)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in manifest(c):
        if "norm" in name:
            params[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(dtype)
        elif name.endswith("e_score_correction_bias"):
            params[name] = (0.1 * rng.standard_normal(shape)).astype(dtype)
        else:
            params[name] = (std * rng.standard_normal(shape)).astype(dtype)
    return params

# -- closed forms: what a step reads and does ----------------------------------------------------------

def step_weight_bytes(c: DeepSeekConfig, distinct, n_tokens: int = 1, itemsize: int = 4,
                      weights: str = "float32", kv_b_reads: int = 1) -> int:
    """The weight bytes a step of n_tokens rows reads, from the config alone: every parameter once,
    except the embedding table (its n_tokens rows; a tied one is read whole as the head) and the
    routed experts no row chose. distinct: per sparse layer, how many distinct routed experts the
    rows chose (k at one token); the shared experts are read every step. weights: the products'
    format (quantized: their blocks; kv_b, the router, the norms and biases stay floats in the
    model's dtype). kv_b is read once per layer absorbed (its two per-head halves, for all rows), and
    once per sequence decompressed (each sequence multiplies it over its own cache): kv_b_reads.
    The meter's count equals it."""
    b = itemsize
    per = (lambda values: values * b) if weights not in FORMATS else \
        (lambda values: values * FORMATS[weights].block_bytes // 32)
    d, H, r, dr, rq, bias = c.n_embd, c.n_head, c.kv_lora_rank, c.qk_rope_head_dim, c.q_lora_rank, c.attention_bias
    qk = H * c.qk_head_dim
    q = per(d * qk) if rq is None else per(d * rq) + b * (rq * bias + rq) + per(rq * qk)
    kv_b = b * r * H * (c.qk_nope_head_dim + c.v_head_dim)
    attention = (q + per(d * (r + dr)) + b * ((r + dr) * bias + r) + kv_b_reads * kv_b
                 + per(H * c.v_head_dim * d) + b * d * bias + b * 2 * d)        # ..., kv_b, o, the two block norms
    distinct = list(distinct)
    if len(distinct) != len(c.sparse_layers):
        raise ValueError(f"distinct: one count per sparse layer ({len(c.sparse_layers)}), got {len(distinct)}")
    one = per(c.expert_params())
    sparse = sum(b * (d * c.n_expert + c.n_expert) + n * one + c.n_shared * one for n in distinct)   # router, bias
    blocks = c.n_layer * attention + (c.n_layer - len(distinct)) * per(3 * d * c.ffn) + sparse
    return per(n_tokens * d) + blocks + b * d + per(c.vocab_size * d)     # embedding rows, blocks, norm, head


def decode_attention_cost(c: DeepSeekConfig, T: int, mla: str, itemsize: int = 4) -> dict[str, int]:
    """One decode token's attention at context T (T keys, its own included), every layer, by closed form:
    the KV bytes it reads, its attention FLOPs (scores and the weighted sum), and the product FLOPs
    that depend on T (decompressed: kv_b over all T cached latents; absorbed: none, the query and the
    output pass through kv_b's halves once, 2·H·r·(dn + dv)).

        absorbed       attention 2·H·T·(r + dr) + 2·H·T·r over L·T·(r + dr)·b bytes: 2H·(2r + dr)/((r + dr)·b)
                       FLOPs a byte, ≈ 1.9·H in bf16 at DeepSeek-V3's shape (242)
        decompressed   attention 2·H·T·(dn + dr) + 2·H·T·dv, and kv_b on T rows: 2·T·r·H·(dn + dv)"""
    H, r, dr, dn, dv, L = c.n_head, c.kv_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim, c.n_layer
    kv = L * T * (r + dr) * itemsize
    if mla == "absorbed":
        return {"kv_read": kv, "attention": L * 2 * H * T * (2 * r + dr), "matmul_T": 0,
                "matmul_fixed": L * 2 * H * r * (dn + dv)}
    return {"kv_read": kv, "attention": L * 2 * H * T * (dn + dr + dv), "matmul_T": L * 2 * T * r * H * (dn + dv),
            "matmul_fixed": 0}


# -- random presets: DeepSeek's proportions at a size this machine holds --------------------------------
#
# DeepSeek-V3 is d = 7,168, H = 128 heads, a latent of 512 + 64, 256 experts of which 8 and one shared a
# token, in groups of 32, four of the eight groups open, the first 3 of 61 blocks dense. `random-mla`
# keeps its shape of parts at d = 1,024: 16 heads, a latent of 256 + 32 (a KV row of 288 values),
# 32 experts of 256 in 4 groups (2 open), 4 and one shared a token, the first block dense. In float32
# it holds ~0.9 GB, of which a token reads ~0.25 GB: well past a 32 MiB last-level cache.

SHAPES: dict[str, DeepSeekConfig] = {                 # its GQA twin, random-mla-gqa: models/moe.py
    "random-mla": DeepSeekConfig(n_layer=8, n_head=16, n_embd=1024, n_ctx=16384, vocab_size=8192, ffn=2816,
                                 kv_lora_rank=256, q_lora_rank=384, qk_nope_head_dim=64, qk_rope_head_dim=32,
                                 v_head_dim=64, n_expert=32, top_k=4, expert_ffn=256, n_shared=1, n_group=4,
                                 topk_group=2, routed_scale=2.5, first_k_dense=1, eps=1e-6, theta=1e4),
}


def random(config: DeepSeekConfig, target: Target | None = None, name: str = "", seed: int = RANDOM_SEED,
           **options) -> "DeepSeekV3":
    """A seeded model of this shape with random weights (normal(0, 0.02), norm gains near 1, a router
    bias of 0.1's order), made for the target with the family's options."""
    params = random_params(config, seed, 0.02, (target or Target.numpy()).dtype)
    return DeepSeekV3(config, params, target, name=name or f"random-mla-{config.n_layer}x{config.n_embd}", **options)


CONFIG, MODEL = DeepSeekConfig, DeepSeekV3          # the family's row reads these (checkpoints/families.py)
