"""Model shapes by name, for the chip calculator: weights and KV bytes per token from the shape, not
only from a parameter count. Grouped-query attention shows up here: Llama-3-8B keeps 8 KV heads of
its 32, so each token costs a quarter of the KV bytes Llama-2-7B's does, at about the same size.

The shapes are the published config.json values of each model (layers, heads, KV heads, head width,
hidden width, MLP width, vocabulary, tied head). Three more ways to keep the KV cache small are
described by a few extra fields of `shape()`'s dict:

    window, local_layers   sliding-window attention: `local_layers` of the layers (all, in Mistral-7B
                           v0.1) keep only the last `window` positions; the others keep every one
                           (Gemma 2: half the layers local, window 4,096; Gemma 3: five in six, 1,024;
                           gpt-oss: half, 128)
    kv_latent              multi-head latent attention (DeepSeek-V2/V3): each layer caches one latent
                           vector of kv_latent values per token (512 + 64 rope), not K and V per head
    kv_layers, state_values  a hybrid (Qwen3.5, models/qwen35.py): only `kv_layers` of the n_layer
                           layers (the full-attention ones) keep K and V; the others keep a fixed
                           state per sequence, `state_values` values in all, whatever the context

A mixture of experts (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3: measure/experts.py) also has
`n_active`, the parameters one token multiplies (`n_params` is the total memory holds), and its
experts (`n_expert`, `top_k`, `expert_params`, `sparse_layers`): a decode step reads the active
weights at batch 1 and the union of its tokens' experts past it (`experts.params_read`).

`capacity` is the one answer to "how many sequences of T tokens fit in M bytes": memory × the stated
utilisation − the weights, divided by one sequence's KV bytes (a hybrid's: its state plus its full
layers' KV). Lessons 5 and 12, `minillm hardware
--shape` (and `--fit`) and `minillm diagnose` all call it.
"""

from __future__ import annotations

import difflib
import math

from ..models.llama import LlamaConfig

from ..models.gpt2 import GPT2_SIZES
from ..errors import MiniLLMError
from ..models import gemma3
from ..models.qwen35 import FULL, LINEAR, Qwen35Config
from .experts import PUBLISHED, held_bytes, moe_shape, read_bytes


def _llama(L, H, Hkv, hd, d, F, V, tied=False, ctx=4096, arch="llama") -> LlamaConfig:
    return LlamaConfig(n_layer=L, n_head=H, n_kv_head=Hkv, head_dim=hd, n_embd=d, n_ctx=ctx, vocab_size=V,
                       ffn=F, arch=arch, tied=tied, qkv_bias=arch == "qwen2")


SHAPES: dict[str, LlamaConfig] = {
    "smollm2-135m": _llama(30, 9, 3, 64, 576, 1536, 49152, tied=True, ctx=8192),
    "llama-2-7b": _llama(32, 32, 32, 128, 4096, 11008, 32000),
    "llama-2-13b": _llama(40, 40, 40, 128, 5120, 13824, 32000),
    "llama-3-8b": _llama(32, 32, 8, 128, 4096, 14336, 128256, ctx=8192),
    "llama-3-70b": _llama(80, 64, 8, 128, 8192, 28672, 128256, ctx=8192),
    "mistral-7b": _llama(32, 32, 8, 128, 4096, 14336, 32000, ctx=32768),
    "qwen2.5-7b": _llama(28, 28, 4, 128, 3584, 18944, 152064, ctx=32768, arch="qwen2"),
}


# Attention that caps the KV cache (published config.json values): the sliding window, and how many of
# the layers use it. Mistral-7B v0.1 slides on every layer; later Mistral releases dropped the window.
WINDOWS: dict[str, tuple[int, int]] = {   # name: (window, local layers)
    "mistral-7b": (4096, 32),
    "gemma-2-9b": (4096, 21),        # 42 layers, local and global alternating
    "gemma-3-12b": (1024, 40),       # 48 layers, five local to one global
    "gpt-oss-20b": (128, 12),        # 24 layers, banded and dense alternating
}

SHAPES.update({
    "gemma-2-9b": _llama(42, 16, 8, 256, 3584, 14336, 256000, tied=True, ctx=8192),
    "gemma-3-12b": _llama(48, 16, 8, 256, 3840, 15360, 262208, tied=True, ctx=131072),
})

# Shapes a LlamaConfig cannot describe: the published fields that the KV cache and the weight bytes
# need, with the total parameter count from the model card (gpt-oss-20b: 20.91B, of which 3.6B active
# per token; its experts are not described here, so its weights count whole). The mixtures whose
# experts are (DeepSeek-V3's latent attention too) come from measure/experts.py.
OTHER_SHAPES: dict[str, dict] = {
    "gpt-oss-20b": {"n_layer": 24, "n_head": 64, "n_kv_head": 8, "head_dim": 64, "n_params": 20_910_000_000,
                    "n_ctx": 131072},
}
MOE_SHAPES = {name.lower(): name for name in PUBLISHED}    # mixtral-8x7b, qwen3-30b-a3b, deepseek-v3

# As released: the format of each shape's published weights (config.json's torch_dtype), 2 bytes a
# weight unless said. GPT-2 was released in float32; Llama 2 in fp16; the others in bf16. gpt-oss-20b
# ships its experts in MXFP4 (32 E2M1 values and one E8M0 scale byte: 17/32 bytes a weight) and the
# rest in bf16 (`kept_params`). The mixtures of measure/experts.py carry their own (DeepSeek-V3: FP8).
RELEASED = {"llama-2-7b": "fp16", "llama-2-13b": "fp16"}
GPT_OSS_EXPERTS = 24 * 32 * 3 * 2880 * 2880         # gpt-oss-20b: 24 layers × 32 experts × 3·d·ffn
OTHER_SHAPES["gpt-oss-20b"].update(released="mxfp4 experts, bf16 rest", bytes_per_weight=17 / 32,
                                   kept_params=20_910_000_000 - GPT_OSS_EXPERTS, n_embd=2880,
                                   untied_embedding=201088 * 2880)

# Hybrids of linear and full attention (published config.json values): Qwen3.5-27B, three Gated
# DeltaNet layers to one full attention layer, 16 key and 48 value heads of 128 in the linear ones.
HYBRID_SHAPES: dict[str, Qwen35Config] = {
    "qwen3.5-27b": Qwen35Config(n_layer=64, n_head=24, n_kv_head=4, head_dim=256, n_embd=5120, n_ctx=262144,
                                vocab_size=248320, ffn=17408, layer_types=(LINEAR, LINEAR, LINEAR, FULL) * 16,
                                lin_k_heads=16, lin_v_heads=48, lin_k_dim=128, lin_v_dim=128, conv_kernel=4,
                                rotary_dim=64, theta=1e7),
}
# The dtype a released hybrid keeps its recurrent state in (config.json's "mamba_ssm_dtype", which vLLM
# sizes its state cache by): Qwen3.5-27B's delta-rule matrices in float32, rewritten at every token, so
# kept wider than the KV; the convolution's window stays in the KV's dtype. Bytes a value.
STATE_DTYPE_BYTES: dict[str, int] = {"qwen3.5-27b": 4}

# Families with a window of their own (models/gemma3.py's released shapes, read from their configs).
WINDOWED_SHAPES = dict(gemma3.RELEASED)

UTILISATION = 0.9    # the share of a GPU's memory a server takes: vLLM's gpu_memory_utilization default
KV_DTYPES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0}


def _released_dense(key: str, c) -> dict:
    """A dense shape's release: its format (RELEASED; bf16 by default, GPT-2's float32), and its untied
    embedding table (not the head), of which a decode step reads a row per token."""
    label = "fp32" if key.startswith("gpt2-") else RELEASED.get(key, "bf16")
    tied = c.tied
    return {"released": label, "bytes_per_weight": 4.0 if label == "fp32" else 2.0, "kept_params": 0,
            "n_embd": c.n_embd, "untied_embedding": 0 if tied else c.vocab_size * c.n_embd}




def shape_of(c, name: str = "") -> dict:
    """The shape dict of a model config (GPT-2's, a Llama's, a hybrid's): what the KV and capacity
    formulas read."""
    out = {"name": name, "n_layer": c.n_layer, "n_kv_head": c.n_kv_head, "head_dim": c.head_dim,
           "n_head": c.n_head, "n_params": c.n_params(), "n_ctx": c.n_ctx}
    if c.linear_layers:                                    # a hybrid: a fixed state in its linear layers (config.Layout)
        conv, ssm = (len(c.linear_layers) * math.prod(v) for v in c.state_shapes().values())
        out.update(kv_layers=len(c.full_layers), state_values=c.state_bytes(1), linear_layers=len(c.linear_layers),
                   state_conv_values=conv, state_ssm_values=ssm)
    if c.window_layers:                                    # a sliding window on some layers (config.Layout)
        out.update(window=c.window, local_layers=len(c.window_layers))
    return out


def shape(name: str) -> dict:
    """{n_layer, n_kv_head, head_dim, n_params, n_ctx} of a shape name (gpt2-124m ... or the tables above),
    with `window`/`local_layers` or `kv_latent` where the model's attention caps its KV cache, and the
    release: `released` (its format in words), `bytes_per_weight` (of its matrices) and `kept_params`
    (what a smaller format keeps in bf16): `experts.held_bytes` and `read_bytes` size it as released."""
    key = name.strip().lower()
    if key in SHAPES:
        out = {**shape_of(SHAPES[key], key), **_released_dense(key, SHAPES[key])}
    elif key in HYBRID_SHAPES:
        out = {**shape_of(HYBRID_SHAPES[key], key), **_released_dense(key, HYBRID_SHAPES[key])}
        if key in STATE_DTYPE_BYTES:
            out["ssm_bytes"] = STATE_DTYPE_BYTES[key]
    elif key in WINDOWED_SHAPES:
        out = {**shape_of(WINDOWED_SHAPES[key], key), **_released_dense(key, WINDOWED_SHAPES[key])}
    elif key in MOE_SHAPES:
        out = {"name": key, **moe_shape(MOE_SHAPES[key])}
    elif key in OTHER_SHAPES:
        out = {"name": key, **OTHER_SHAPES[key]}
    elif key.startswith("gpt2-") and key.removeprefix("gpt2-") in GPT2_SIZES:
        c = GPT2_SIZES[key.removeprefix("gpt2-")]
        out = {"name": key, "n_layer": c.n_layer, "n_kv_head": c.n_head, "head_dim": c.head_dim,
               "n_head": c.n_head, "n_params": c.n_params(), "n_ctx": c.n_ctx, **_released_dense(key, c)}
    else:
        out = None
    if out is not None:
        if key in WINDOWS:
            out["window"], out["local_layers"] = WINDOWS[key]
        return out
    names = [*SHAPES, *MOE_SHAPES, *OTHER_SHAPES, *HYBRID_SHAPES, *WINDOWED_SHAPES, *(f"gpt2-{k}" for k in GPT2_SIZES)]
    close = difflib.get_close_matches(key, names, n=1)
    hint = f" Did you mean {close[0]}?" if close else ""
    raise MiniLLMError(f"unknown shape {name!r}.{hint} Known shapes: {', '.join(names)}")


def kv_layers(s: dict) -> int:
    """The layers that keep K and V (a hybrid's full-attention layers; every layer otherwise)."""
    return s.get("kv_layers", s["n_layer"])


def kv_bytes_per_token(s: dict, bytes_per_value: float) -> float:
    """One token's KV bytes in every layer that keeps it: 2·L·Hkv·hd·b (K and V per KV head; a hybrid:
    L its full-attention layers); with latent attention, L·(d_c + d_rope)·b (one latent per layer). A
    sliding window does not change this figure, only how many tokens a layer keeps
    (`kv_bytes_per_sequence`)."""
    if s.get("kv_latent"):
        return s["n_layer"] * s["kv_latent"] * bytes_per_value
    return 2 * kv_layers(s) * s["n_kv_head"] * s["head_dim"] * bytes_per_value


def state_bytes(s: dict, bytes_per_value: float) -> float:
    """A hybrid's fixed state per sequence: its linear layers' convolution windows in the KV cache's
    dtype, and their delta-rule matrices in the release's state dtype (`ssm_bytes`, E23: Qwen3.5 keeps
    them in float32) or the KV's where none is given; 0 for a model without one."""
    if "state_ssm_values" not in s or not s.get("state_values"):
        return s.get("state_values", 0) * bytes_per_value
    return s["state_conv_values"] * bytes_per_value + s["state_ssm_values"] * s.get("ssm_bytes", bytes_per_value)


def kv_bytes_per_sequence(s: dict, context: int, bytes_per_value: float) -> float:
    """The KV bytes of one sequence of `context` tokens: every layer keeps all of them, except the local
    layers of a sliding-window model, which keep the last `window`; a hybrid's linear layers keep
    their fixed state instead (counted here too: it is what the sequence holds besides its KV)."""
    per_layer = kv_bytes_per_token(s, bytes_per_value) / kv_layers(s) if kv_layers(s) else 0.0
    local = s.get("local_layers", 0)
    kept = local * min(context, s.get("window", context)) + (kv_layers(s) - local) * context
    return per_layer * kept + state_bytes(s, bytes_per_value)


def decode_step_bytes(s: dict, context: int, bytes_per_value: float | None,
                      kv_bytes_per_value: float | None = None) -> dict:
    """One batch-1 decode step at `context` tokens: every weight once (a mixture's active ones; an untied
    embedding table's one row), the whole KV cache (what the layers keep: a sliding window caps it),
    and a hybrid's state, read and written once (`state`; 0 without one). `bytes_per_value` None: the
    weights as released (`experts.read_bytes`), the KV in 16 bits."""
    weights = read_bytes(s, 1, bytes_per_value)
    kv_b = kv_bytes_per_value if kv_bytes_per_value is not None else bytes_per_value or 2.0
    kv = kv_bytes_per_sequence(s, context, kv_b) - state_bytes(s, kv_b)
    state = 2 * state_bytes(s, kv_b)
    return {"weights": weights, "kv": kv, "state": state, "total": weights + kv + state}


def capacity(s: dict, context: int, memory_bytes: float, *, bytes_per_weight: float | None = 2.0,
             kv_bytes_per_value: float = 2.0, utilisation: float = UTILISATION, kv_only: bool = False) -> dict:
    """How many sequences of `context` tokens fit in `memory_bytes`, beside the weights:

        sequences = ⌊(memory × utilisation − weights) ÷ KV bytes of one sequence⌋   (0 if the weights do not fit)

    (a hybrid's sequence: its fixed state plus its full layers' KV of `context` tokens)

    `utilisation`: the share of the memory the server takes (vLLM's default 0.9); the rest is the
    runtime's (activations, CUDA graphs, fragmentation). `bytes_per_weight` None: the weights as
    released (`experts.held_bytes`). `kv_only`: the memory holds the KV cache alone (the weights
    elsewhere: counted as 0). Returns the figures the answer is made of."""
    for what, v in (("context", context), ("memory", memory_bytes),
                    ("bytes per weight", 2.0 if bytes_per_weight is None else bytes_per_weight),
                    ("KV bytes per value", kv_bytes_per_value)):
        if not v > 0:
            raise MiniLLMError(f"capacity: {what} must be above 0, got {v!r}")
    if not 0 < utilisation <= 1:
        raise MiniLLMError(f"utilisation {utilisation!r}: give a share of the memory above 0 and at most 1 (e.g. 0.9)")
    usable = memory_bytes * utilisation
    weights = 0.0 if kv_only else held_bytes(s, bytes_per_weight)
    per_seq = kv_bytes_per_sequence(s, context, kv_bytes_per_value)
    left = usable - weights
    return {"memory_bytes": memory_bytes, "utilisation": utilisation, "usable_bytes": usable,
            "weight_bytes": weights, "kv_bytes_per_token": kv_bytes_per_token(s, kv_bytes_per_value),
            "kv_bytes_per_sequence": per_seq, "state_bytes_per_sequence": state_bytes(s, kv_bytes_per_value),
            "context": context, "left_bytes": left,
            "sequences": max(0, int(left // per_seq)), "weights_fit": left >= 0}


def gpus_needed(held_bytes: float, memory_bytes: float, utilisation: float = UTILISATION,
                replicated_bytes: float = 0.0) -> int | None:
    """The one capacity rule for "how many GPUs": the fewest G whose memory, at `utilisation` of it (what
    a server takes, as `capacity` and --fit count), holds the weights alone, (held − replicated)/G +
    replicated each; `replicated_bytes`: what every GPU keeps a copy of (expert parallelism's attention,
    served data-parallel), 0 when every weight is split evenly. The KV cache needs room beyond it
    (`capacity` counts the sequences that fit). None: the replicated part alone does not fit one GPU.
    `hardware --shape`'s GPUs column (split evenly) and lesson 15 (as served, with EP) use it."""
    if memory_bytes <= 0:
        raise ValueError("gpus_needed: a GPU with no memory")
    room = memory_bytes * utilisation - replicated_bytes
    if room <= 0:
        return None
    return max(1, math.ceil((held_bytes - replicated_bytes) / room))


def sequences_that_fit(s: dict, context: int, bytes_per_value: float, memory_bytes: float,
                       utilisation: float = UTILISATION) -> int:
    """The KV limit on batch size: `capacity(...)["sequences"]`, weights and KV in the same dtype."""
    return capacity(s, context, memory_bytes, bytes_per_weight=bytes_per_value, kv_bytes_per_value=bytes_per_value,
                    utilisation=utilisation)["sequences"]
