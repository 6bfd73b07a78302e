"""What every family's config answers (`ModelConfig`: the caches, the step's plan and the tools read
only that), and the checks every config reader shares: counts read from a file (`whole`, the
maxima), a config.json's `model_type`, a GGUF's `{arch}.*` metadata. Each family's own config
class lives in its model module (models/gpt2.py's GPT2Config, models/llama.py's LlamaConfig, ...)."""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

from .errors import ConfigError

DAMAGED = "the file is damaged or not a GGUF file; re-download it"

# Sane maxima, checked before anything is sized by them. The context is the one count no tensor
# bounds (RoPE has no table in the file), so it has its own: 2^24 positions (Llama 4 Scout's 10M fit).
MAX_CONTEXT = 1 << 24
MAX_COUNT = (1 << 63) - 1   # layers, heads, widths, vocabulary: int64 (NumPy's index); each is then
                            # checked against the tensors it describes, before anything loops over it


def whole(value, field: str, source, hi: int = MAX_COUNT) -> int:
    """A count read from a file: an integer from 1 to hi, else one line naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        shown = repr(value)[:40]
        if isinstance(value, int) and len(shown) > 24:
            shown = f"{shown[:12]}... ({len(str(value))} digits)"
        raise ConfigError(f"{source}: {field} = {shown} must be an integer from 1 to {hi:,}; "
                          "is the file damaged or edited by hand?")
    return value


def check_heads(c, hint: str = "num_key_value_heads must divide them") -> None:
    """A rotary grouped-query attention's shape: H query heads split over Hkv, hd even; one line else."""
    if c.n_head % c.n_kv_head:
        raise ConfigError(f"config: {c.n_head} query heads do not split into groups over "
                          f"{c.n_kv_head} key/value heads; {hint}")
    if c.head_dim % 2:
        raise ConfigError(f"config head_dim={c.head_dim}: the rotary embedding turns pairs, it must be even")


def check_positive(c, names) -> None:
    """Each named field of a config a positive finite number (not a bool), else one line naming it."""
    for name in names:
        value = getattr(c, name)
        if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise ConfigError(f"config {name}={value!r}: must be a positive finite number")


class ModelConfig(Protocol):
    """What the caches, the plan and the tools read of any family's config: its counts, and the
    layout of what a sequence keeps (`Layout`'s defaults: a plain KV cache)."""
    n_layer: int             # L: blocks
    n_head: int              # H: query heads
    n_kv_head: int           # Hkv: key/value heads the KV cache holds
    head_dim: int            # hd
    n_embd: int              # d: width of the residual stream
    n_ctx: int               # longest sequence
    vocab_size: int          # V
    eps: float               # the norms' epsilon
    values_in_keys: int      # n > 0: a latent cache, the values the keys' first n columns (0: apart)
    linear_layers: tuple     # the blocks that keep a fixed state instead of KV (a hybrid's)


class Layout:
    """The layout a config declares for what a sequence keeps, with a plain transformer's defaults;
    every family's config class derives from it and overrides what differs:

        values_in_keys   n > 0: each position keeps one row of head_dim values whose first n are its
                         values too (multi-head latent attention, models/deepseek.py); 0: K and V apart
        linear_layers    the blocks that keep a fixed-size state per sequence instead of KV
                         (a hybrid, models/qwen35.py; cache/state.py holds it); () for none
        window_layers    the blocks whose queries see only the last `window` positions (a sliding
                         window: models/gemma3.py, models/gptoss.py); () for none
        state_shapes()   one such layer's state: name -> shape ({} for none)
        state_bytes(b)   a sequence's whole state in bytes at b bytes a value (0 for none)
        kv_bytes_per_token(b)   what one position costs in the KV cache: 2·L·Hkv·hd·b, K and V in
                         every layer (a sliding layer keeps only `window` of them; a latent or a
                         hybrid config overrides it)

    and, for every config (a dataclass), `asdict()`: its fields as a dict.
    """
    values_in_keys = 0
    linear_layers: tuple = ()
    window_layers: tuple = ()
    window: int | None = None

    def state_shapes(self) -> dict:
        return {}

    def state_bytes(self, itemsize: int = 4) -> int:
        return 0

    def kv_bytes_per_token(self, itemsize: int = 4) -> int:
        return 2 * self.n_layer * self.n_kv_head * self.head_dim * itemsize

    def asdict(self) -> dict:
        return dataclasses.asdict(self)


def hf_model_type(cfg, source: str, types, refusal: str) -> str:
    """A Hugging Face config.json's `model_type`, one of `types`; one line otherwise (`refusal` says why)."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: expected a JSON object, found {type(cfg).__name__}")
    kind = cfg.get("model_type")
    if kind not in types:
        raise ConfigError(f"{source}: model_type {kind!r} {refusal}")
    return kind


def hf_rope(cfg: dict, source) -> tuple[dict, float]:
    """A config.json's rotary settings: (its `rope_parameters`, {} where there is none; the base θ, from
    there or the top level, 10,000 by default). Scaling of any kind (`rope_scaling` or a `rope_type`)
    but the default rotation is one line: minillm runs the default rotation only."""
    rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    scaling = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else {}
    kind = scaling.get("rope_type", scaling.get("type")) or rope.get("rope_type", "default")
    if kind not in ("default", None):
        raise ConfigError(f"{source}: rope scaling {kind!r} is not implemented; minillm runs the default "
                          "rotary embedding only")
    return rope, rope.get("rope_theta", cfg.get("rope_theta", 10000.0))


def gguf_getter(md: dict, arch: str, where):
    """get(key, default) of a GGUF's `{arch}.{key}` metadata; a missing one is one clear line. And
    count(key, default, hi): the same, an integer from 1 to hi (`whole`), else one line naming the key."""
    def get(key, default=None):
        value = md.get(f"{arch}.{key}", default)
        if value is None:
            raise ConfigError(f"{where}: metadata {arch}.{key} is missing; {DAMAGED}")
        return value

    def count(key, default=None, hi=MAX_COUNT) -> int:
        return whole(get(key, default), f"metadata {arch}.{key}", where, hi)
    return get, count


def from_gguf_build(build, where):
    """A config built from GGUF metadata; a value of the wrong type is one clear line naming the file."""
    try:
        return build()
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}" if str(where) not in str(e) else str(e)) from None
    except (TypeError, ValueError, OverflowError, ZeroDivisionError) as e:
        raise ConfigError(f"{where}: a metadata value has the wrong type ({e}); {DAMAGED}") from None
