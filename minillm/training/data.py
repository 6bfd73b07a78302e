"""Data and the held-out loss.

The text is tokenized with GPT-2's BPE; the first 90% of the *tokens* train, the last 10% are held out.
Training draws random windows of n_ctx+1 tokens (inputs and their next-token targets). The held-out
loss is the mean cross-entropy (nats/token) of predicting every held-out token but the first, read in
non-overlapping windows of n_ctx inputs: window j feeds tokens [j*n_ctx, (j+1)*n_ctx) and predicts
[j*n_ctx+1, (j+1)*n_ctx+1); the last window is shorter. Each token sees only the context inside its own
window (between 0 and n_ctx-1 tokens before it).
"""

from __future__ import annotations

import os

import numpy as np

from ..checkpoints.checkpoint import load_checkpoint
from ..models.gpt2 import GPT2Config
from ..errors import MiniLLMError
from ..paths import expand_user, read_named_file
from ..bpe import tokenizer
from .model import forward

DEFAULT_DATA_SPLIT = 0.9  # first 90% of the tokens train, the last 10% are held out


class DataError(MiniLLMError):
    """A training text that is missing, unreadable or too short."""


MAX_TEXT_BYTES = 1 << 30  # 1 GiB of text is ~250M tokens: days of training at this speed


def load_tokens(text_path) -> np.ndarray:
    """The text at text_path as GPT-2 token ids (int32)."""
    path = expand_user(text_path)
    raw = read_named_file(path, MAX_TEXT_BYTES, DataError, str(path), "pass --data with the path of a UTF-8 text file")
    if raw is None:
        raise DataError(f"{path}: over {MAX_TEXT_BYTES >> 30} GiB; pass a smaller text (or a slice of it)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: cannot read as UTF-8 text ({e})") from None
    return np.asarray(tokenizer().encode_ordinary(text), dtype=np.int32)


def split_tokens(tokens, n_ctx, source="text"):
    """(train, heldout): the first 90% of the tokens and the last 10%. Checks there is enough of each."""
    cut = int(len(tokens) * DEFAULT_DATA_SPLIT)
    train, heldout = tokens[:cut], tokens[cut:]
    if len(train) < n_ctx + 1:
        raise DataError(f"{source}: {len(tokens)} tokens is too short: its first 90% ({len(train)}) must hold "
                        f"one training window of {n_ctx + 1} tokens; use a longer text or a smaller --context")
    if len(heldout) < 2:
        raise DataError(f"{source}: {len(tokens)} tokens leave fewer than 2 held-out tokens; use a longer text")
    return train, heldout


def get_batch(tokens, batch, n_ctx, rng):
    """batch random windows of n_ctx+1 tokens: inputs [B, T] and the next-token targets [B, T]."""
    starts = rng.integers(0, len(tokens) - n_ctx, size=batch)
    windows = np.stack([tokens[s:s + n_ctx + 1] for s in starts]).astype(np.int64)  # [B, T+1]
    return windows[:, :-1], windows[:, 1:]


def evaluate(params, config: GPT2Config, tokens, batch=8, chunk=512) -> float:
    """Mean cross-entropy (nats/token) of predicting tokens[1:], in non-overlapping windows of n_ctx inputs.

    Window j feeds tokens[j*n_ctx : (j+1)*n_ctx] and is scored on the next tokens; the final window is
    shorter. No dropout. This is the held-out loss when `tokens` is the last 10%.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    if len(tokens) < 2:
        raise DataError(f"need at least 2 tokens to evaluate, got {len(tokens)}")
    T = config.n_ctx
    n_full = (len(tokens) - 1) // T
    total, count = 0.0, 0
    for b0 in range(0, n_full, batch):                                        # full windows, batched
        b1 = min(b0 + batch, n_full)
        idx = np.stack([tokens[j * T:(j + 1) * T] for j in range(b0, b1)])      # [b, T]
        tgt = np.stack([tokens[j * T + 1:(j + 1) * T + 1] for j in range(b0, b1)])
        s, _ = forward(params, config, idx, tgt, need_grad=False, chunk=chunk)
        total, count = total + s, count + idx.size
    rest = len(tokens) - 1 - n_full * T                                        # the shorter last window
    if rest:
        start = n_full * T
        s, _ = forward(params, config, tokens[None, start:start + rest], tokens[None, start + 1:start + rest + 1],
                       need_grad=False, chunk=chunk)
        total, count = total + s, count + rest
    return total / count


# ================================================================================ held-out loss


def evaluate_model(model, tokens) -> float:
    """`evaluate`'s loss computed by a loaded model's own forward pass, with its weights and kernel set
    (`minillm eval --kernels`): the same windows, each token scored on its window's logits."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if len(tokens) < 2:
        raise DataError(f"need at least 2 tokens to evaluate, got {len(tokens)}")
    T = model.config.n_ctx
    total, count = 0.0, 0
    for start in range(0, len(tokens) - 1, T):
        ids = tokens[start:min(start + T, len(tokens) - 1)]                   # [t]
        tgt = tokens[start + 1:start + 1 + len(ids)]                           # [t]
        logits = np.asarray(model.forward(ids), dtype=np.float64)             # [t, V]
        m = logits.max(axis=-1, keepdims=True)
        logp = logits - m - np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
        total -= float(logp[np.arange(len(ids)), tgt].sum())
        count += len(ids)
    return total / count


def heldout_loss(text_path, model) -> float:
    """Held-out loss (nats/token) on the last 10% of the tokens of text_path (see `evaluate`).

    model: a checkpoint directory (model.safetensors + config.json), a (params, config) pair in either
    order, or a loaded model (`minillm.load`), scored by its own forward pass (`evaluate_model`).
    """
    own = hasattr(model, "forward") and hasattr(model, "config")
    if own:
        config, params = model.config, None
    elif isinstance(model, (str, os.PathLike)):
        config, params = load_checkpoint(model)
    else:
        a, b = model
        params, config = (a, b) if isinstance(a, dict) else (b, a)
    tokens = load_tokens(text_path)
    cut = int(len(tokens) * DEFAULT_DATA_SPLIT)
    heldout = tokens[cut:]
    if len(heldout) < 2:
        raise DataError(f"{text_path}: {len(tokens)} tokens leave fewer than 2 held-out tokens")
    if heldout.max() >= config.vocab_size:
        raise DataError(f"{text_path}: holds GPT-2 token {int(heldout.max())}, outside this model's vocabulary of "
                        f"{config.vocab_size}; the text is read with GPT-2's tokenizer, so use a model with its "
                        "50,257 tokens")
    loss = evaluate_model(model, heldout) if own else evaluate(params, config, heldout)
    if not np.isfinite(loss):
        raise MiniLLMError(f"the held-out loss is {loss}: the model computes non-finite numbers; check its weights")
    return loss
