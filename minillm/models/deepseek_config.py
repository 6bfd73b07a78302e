"""DeepSeek-V3's config.json and checkpoint (the family is models/deepseek.py): `DeepSeekConfig`,
read and checked by `from_hf`, every tensor's name and shape (`manifest`), llama.cpp's names, and
the reorder of the rotary rows at load (`rope_rows`: why, at models/deepseek.py's top)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..config import Layout, MAX_CONTEXT, MAX_COUNT, check_positive, hf_model_type, hf_rope, whole
from ..errors import ConfigError
from .mla import MLAShape

MODEL_TYPES = ("deepseek_v3",)
# -- the config -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeepSeekConfig(Layout):
    n_layer: int                      # L: blocks
    n_head: int                       # H: query heads (each with its own key and value, decompressed)
    n_embd: int                       # d
    n_ctx: int                        # longest sequence (`max_position_embeddings`)
    vocab_size: int                   # V
    ffn: int                          # F: the dense blocks' MLP width (`intermediate_size`)
    kv_lora_rank: int = 512           # r: the latent's width
    q_lora_rank: int | None = 1536    # r_q: the query's bottleneck; None: q_proj straight from x
    qk_nope_head_dim: int = 128       # dn: a head's key and query outside the rotation
    qk_rope_head_dim: int = 64        # dr: the rotated part, one key shared by all heads
    v_head_dim: int = 128             # dv: a head's value
    n_expert: int = 256               # E: routed experts per sparse block (`n_routed_experts`)
    top_k: int = 8                    # k: routed experts a token uses (`num_experts_per_tok`)
    expert_ffn: int = 2048            # F_e: an expert's width (`moe_intermediate_size`)
    n_shared: int = 1                 # always-on experts, run as one MLP of width n_shared·F_e
    n_group: int = 8                  # expert groups
    topk_group: int = 4               # groups a token may pick from
    routed_scale: float = 2.5         # routed_scaling_factor
    norm_topk: bool = True            # norm_topk_prob: the k weights renormalised to sum to 1
    first_k_dense: int = 3            # first_k_dense_replace: blocks 0..first_k_dense-1 are dense
    eps: float = 1e-6                 # RMS-norm epsilon
    theta: float = 10000.0            # RoPE base
    rope_interleave: bool = True      # rotary pairs (2i, 2i+1) in the file's layout (see the top)
    attention_bias: bool = False      # biases on q_a (or q_proj), kv_a and o
    tied: bool = False                # the LM head is the token embedding

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "n_ctx", "vocab_size", "ffn", "kv_lora_rank",
                     "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_expert", "top_k", "expert_ffn",
                     "n_group", "topk_group"):
            whole(getattr(self, name), name, "config", MAX_CONTEXT if name == "n_ctx" else MAX_COUNT)
        if self.q_lora_rank is not None:
            whole(self.q_lora_rank, "q_lora_rank", "config")
        for name in ("n_shared", "first_k_dense"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"config {name}={value!r}: must be an integer, 0 or more")
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"config qk_rope_head_dim={self.qk_rope_head_dim}: the rotary embedding turns "
                              "pairs, it must be even")
        E, G = self.n_expert, self.n_group
        if E % G:
            raise ConfigError(f"config: {E} routed experts do not split into n_group={G} equal groups")
        if self.topk_group > G:
            raise ConfigError(f"config topk_group={self.topk_group}: there are only n_group={G} groups")
        if self.top_k > self.topk_group * (E // G):
            raise ConfigError(f"config: each token uses top_k={self.top_k} experts but its {self.topk_group} "
                              f"group(s) of {E // G} hold only {self.topk_group * (E // G)}")
        check_positive(self, ("eps", "theta", "routed_scale"))

    # -- what the KV cache reads (config.ModelConfig): one row of r + dr values a token a layer --

    @property
    def n_kv_head(self) -> int:
        """The KV cache holds one "head" a token a layer: the latent and the rotary key, side by side."""
        return 1

    @property
    def head_dim(self) -> int:
        """The cache's row: r + dr values (576 at DeepSeek-V3's shape)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def values_in_keys(self) -> int:
        """The cache keeps no separate values: they are the row's first r entries (the latent)."""
        return self.kv_lora_rank

    model_type = "deepseek_v3"        # (a class attribute: config.json's name of the family)

    @property
    def scale(self) -> float:
        """Attention's scale, 1/√(dn + dr), either way (absorbed too: not 1/√ of the r + dr it multiplies)."""
        return self.qk_head_dim ** -0.5

    @property
    def mla(self) -> MLAShape:
        """What its latent attention reads (models/mla.py)."""
        return MLAShape(self.n_head, self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim,
                        self.v_head_dim, self.q_lora_rank, self.eps)

    @property
    def qk_head_dim(self) -> int:
        """dn + dr: a head's query and key as attention scores them (the scale is 1/√ of this)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def kv_bytes_per_token(self, itemsize: int = 4) -> int:
        """L·(r + dr)·b: what every position costs in the KV cache (61·576·2 = 70,272 for DeepSeek-V3)."""
        return self.n_layer * self.head_dim * itemsize

    def is_sparse(self, layer: int) -> bool:
        return layer >= self.first_k_dense

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        return tuple(range(self.first_k_dense, self.n_layer))

    # -- parameter counts --

    def attention_params(self) -> int:
        """One block's attention: the query path, kv_a, its norm, kv_b, o (and their biases)."""
        d, H, r, dr = self.n_embd, self.n_head, self.kv_lora_rank, self.qk_rope_head_dim
        rq, b = self.q_lora_rank, self.attention_bias
        q = d * H * self.qk_head_dim if rq is None else d * rq + rq * b + rq + rq * H * self.qk_head_dim
        kv = d * (r + dr) + (r + dr) * b + r + r * H * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + H * self.v_head_dim * d + d * b

    def expert_params(self) -> int:
        return 3 * self.n_embd * self.expert_ffn

    def n_params(self) -> int:
        """Every parameter (what memory holds; a tied head counted once)."""
        d, L, S = self.n_embd, self.n_layer, len(self.sparse_layers)
        blocks = L * (self.attention_params() + 2 * d) + (L - S) * 3 * d * self.ffn
        sparse = S * (d * self.n_expert + self.n_expert + (self.n_expert + self.n_shared) * self.expert_params())
        return self.vocab_size * d * (1 if self.tied else 2) + blocks + sparse + d

    def active_params(self) -> int:
        """What one token multiplies by: k routed experts (and the shared ones) instead of all E."""
        return self.n_params() - len(self.sparse_layers) * (self.n_expert - self.top_k) * self.expert_params()

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "DeepSeekConfig":
        """Read a Hugging Face config.json of model_type deepseek_v3."""
        hf_model_type(cfg, source, MODEL_TYPES, "is not a DeepSeek-V3 config.json")
        need = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size",
                "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
                "num_experts_per_tok", "moe_intermediate_size")
        missing = [k for k in need if k not in cfg and not (k == "n_routed_experts" and "num_local_experts" in cfg)]
        if missing:
            raise ConfigError(f"{source}: missing {', '.join(missing)}; is this a deepseek_v3 config.json?")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{source}: hidden_act={act!r}; minillm implements SwiGLU with silu")
        quant = cfg.get("quantization_config")
        if quant:
            method = quant.get("quant_method") if isinstance(quant, dict) else quant
            raise ConfigError(f"{source}: the weights are quantized ({str(method)[:20]}: DeepSeek-V3 ships FP8 "
                              "with a scale per 128x128 tile); minillm reads float32, float16 and bfloat16 "
                              "checkpoints: convert the weights to bfloat16 first")
        theta = hf_rope(cfg, source)[1]                         # the default rotation only (one line otherwise)
        method = cfg.get("topk_method", "noaux_tc")
        score = cfg.get("scoring_func", "sigmoid")
        if method != "noaux_tc" or score != "sigmoid":
            raise ConfigError(f"{source}: topk_method={method!r}, scoring_func={score!r}; minillm implements "
                              "DeepSeek-V3's router (noaux_tc, sigmoid)")
        try:
            return cls(
                n_layer=cfg["num_hidden_layers"], n_head=cfg["num_attention_heads"], n_embd=cfg["hidden_size"],
                n_ctx=cfg.get("max_position_embeddings", 4096), vocab_size=cfg["vocab_size"],
                ffn=cfg["intermediate_size"], kv_lora_rank=cfg["kv_lora_rank"], q_lora_rank=cfg.get("q_lora_rank"),
                qk_nope_head_dim=cfg["qk_nope_head_dim"], qk_rope_head_dim=cfg["qk_rope_head_dim"],
                v_head_dim=cfg["v_head_dim"], n_expert=cfg.get("n_routed_experts", cfg.get("num_local_experts")),
                top_k=cfg["num_experts_per_tok"], expert_ffn=cfg["moe_intermediate_size"],
                n_shared=cfg.get("n_shared_experts") or 0, n_group=cfg.get("n_group") or 1,
                topk_group=cfg.get("topk_group") or 1, routed_scale=float(cfg.get("routed_scaling_factor", 1.0)),
                norm_topk=bool(cfg.get("norm_topk_prob", True)), first_k_dense=cfg.get("first_k_dense_replace") or 0,
                eps=float(cfg.get("rms_norm_eps", 1e-6)), theta=float(theta),
                rope_interleave=bool(cfg.get("rope_interleave", True)),
                attention_bias=bool(cfg.get("attention_bias", False)),
                tied=bool(cfg.get("tie_word_embeddings", False)))
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        except (TypeError, ValueError, OverflowError) as e:
            raise ConfigError(f"{source}: a field has the wrong type ({e}); re-download the checkpoint") from None


# -- the checkpoint's tensors -----------------------------------------------------------------------

def manifest(c: DeepSeekConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of a Hugging Face checkpoint of this config (without the `model.` prefix), with its
    shape, one at a time (a check stops at the first missing one). Multi-token-prediction blocks
    (`num_nextn_predict_layers`, after the last block) are not part of it: readers drop them."""
    d, H, r, dr, rq = c.n_embd, c.n_head, c.kv_lora_rank, c.qk_rope_head_dim, c.q_lora_rank
    yield "embed_tokens.weight", (c.vocab_size, d)
    for i in range(c.n_layer):
        h, a = f"layers.{i}.", f"layers.{i}.self_attn."
        yield h + "input_layernorm.weight", (d,)
        if rq is None:
            yield a + "q_proj.weight", (H * c.qk_head_dim, d)
        else:
            yield a + "q_a_proj.weight", (rq, d)
            if c.attention_bias:
                yield a + "q_a_proj.bias", (rq,)
            yield a + "q_a_layernorm.weight", (rq,)
            yield a + "q_b_proj.weight", (H * c.qk_head_dim, rq)
        yield a + "kv_a_proj_with_mqa.weight", (r + dr, d)
        if c.attention_bias:
            yield a + "kv_a_proj_with_mqa.bias", (r + dr,)
        yield a + "kv_a_layernorm.weight", (r,)
        yield a + "kv_b_proj.weight", (H * (c.qk_nope_head_dim + c.v_head_dim), r)
        yield a + "o_proj.weight", (d, H * c.v_head_dim)
        if c.attention_bias:
            yield a + "o_proj.bias", (d,)
        yield h + "post_attention_layernorm.weight", (d,)
        m = h + "mlp."
        if not c.is_sparse(i):
            yield from ((m + "gate_proj.weight", (c.ffn, d)), (m + "up_proj.weight", (c.ffn, d)),
                        (m + "down_proj.weight", (d, c.ffn)))
            continue
        yield m + "gate.weight", (c.n_expert, d)
        yield m + "gate.e_score_correction_bias", (c.n_expert,)
        F = c.expert_ffn
        for e in range(c.n_expert):
            x = m + f"experts.{e}."
            yield from ((x + "gate_proj.weight", (F, d)), (x + "up_proj.weight", (F, d)),
                        (x + "down_proj.weight", (d, F)))
        if c.n_shared:
            Fs = c.n_shared * F
            yield from ((m + "shared_experts.gate_proj.weight", (Fs, d)), (m + "shared_experts.up_proj.weight", (Fs, d)),
                        (m + "shared_experts.down_proj.weight", (d, Fs)))
    yield "norm.weight", (d,)
    if not c.tied:
        yield "lm_head.weight", (c.vocab_size, d)


# llama.cpp's names (its architecture `deepseek2`) for a block's tensors, after `layers.{i}.` (GGUF's
# `blk.{i}.`), without `.weight` / `.bias`. No GGUF reader yet: llama.cpp stacks each layer's experts
# into one 3-D tensor (ffn_gate_exps, ...) and its newer files split kv_b into attn_k_b and attn_v_b.
GGUF_BLOCK_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm", "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa", "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
    "mlp.gate.e_score_correction": "exp_probs_b", "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp", "mlp.shared_experts.down_proj": "ffn_down_shexp",
}


def deinterleave(n: int) -> np.ndarray:
    """The order that takes rotary pairs (2i, 2i + 1) to halves (i, i + n/2): [0, 2, 4, ..., 1, 3, 5, ...]."""
    return np.concatenate([np.arange(0, n, 2), np.arange(1, n, 2)])


def rope_rows(c: DeepSeekConfig, rows: int, heads: int, per_head: int) -> np.ndarray:
    """The row order of a projection whose output is `heads` groups of `per_head` values, each ending in
    dr rotary ones: those put in ops.rope's layout (see the top), the others left alone. [rows]."""
    order = np.arange(rows)
    if c.rope_interleave:
        dr = c.qk_rope_head_dim
        for h in range(heads):
            end = (h + 1) * per_head
            order[end - dr:end] = end - dr + deinterleave(dr)
    return order
