"""The checks every reader makes of a file's tensors against its family's manifest (the model
module's `manifest(config)`: every tensor with its shape), before anything loops over them: the
layer count against the blocks held, every shape, nothing extra, no NaN or infinity."""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from ..errors import ConfigError, WeightsError
from ..models.quant import QuantMatrix

FIX = "is the checkpoint complete, and the config the one for it?"


def check_manifest(tensors: dict, expected: Iterator[tuple[str, tuple]], where, what: str, *,
                   held: Callable = lambda name, a: tuple(a.shape), shown: Callable = lambda name: name,
                   fix: str = FIX, ignored: Callable = lambda name: False, count: tuple | None = None) -> None:
    """Every tensor the config needs, with its shape; nothing else. One clear line otherwise.
    expected: the manifest, one (name, shape) at a time (a check stops at the first missing one:
    bounded by the file, whatever the config claims); what: the config in words ("a 2-layer GPT-2");
    held(name, array): the shape the file holds it in, as the manifest states shapes (GGUF's [out, in]
    rows turned back); shown(name): the name the user knows it by (GGUF's); ignored(name): a tensor
    the file may hold beyond the manifest (a rotary table); count: (the config's size in words, the
    tensors it needs), said beside a missing tensor when the file holds fewer ("10,000,000 layers")."""
    want = set()
    for name, shape in expected:
        if name not in tensors:
            more = (f"; the config's {count[0]} need {count[1]:,} tensors and the file holds {len(tensors):,}"
                    if count is not None and count[1] > len(tensors) else "")
            raise WeightsError(f"{where}: tensor {shown(name)} is missing (expected shape {list(shape)}){more}; {fix}")
        have = held(name, tensors[name])
        if tuple(have) != tuple(shape):
            raise WeightsError(f"{where}: tensor {shown(name)} has shape {list(have)} but the config needs "
                               f"{list(shape)} ({what}); {fix}")
        want.add(name)
    extra = sorted(n for n in tensors if n not in want and not ignored(n))
    if extra:
        raise WeightsError(f"{where}: unexpected tensor {shown(extra[0])} (and {len(extra) - 1} more) for {what}; {fix}")


def check_block_count(n_layer: int, tensors: dict, prefix: str, field: str) -> None:
    """The config's layer count against the blocks the file holds, before anything loops over layers:
    a count of 2^63 is one line, not a loop that never ends."""
    held = {name.split(".")[1] for name in tensors if name.startswith(prefix + ".") and name.count(".") >= 2}
    if n_layer != len(held):
        raise ConfigError(f"{field} = {n_layer:,} but the file holds {len(held):,} blocks of tensors; "
                          "is the file damaged, or the config the one for these weights?")


def check_finite(a: np.ndarray, what: str) -> None:
    """Refuse NaN and infinities: one would turn every logit into NaN and the text into "!!!!".

    A finite sum proves every element finite (NaN and inf propagate), in one pass with no temporary;
    only when the sum is not finite (a NaN, or finite values that overflow it) is each element checked."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(a.sum()):
            return
    bad = np.count_nonzero(~np.isfinite(a))
    if bad:
        raise WeightsError(f"{what} holds {bad:,} NaN or infinite value{'s' if bad > 1 else ''}; the checkpoint is "
                           "damaged (or training diverged): re-download it, or use an earlier checkpoint")


def check_all_finite(tensors: dict, where) -> None:
    """No NaN or infinity in any tensor (a quantized one: in its scales and minimums)."""
    for k, v in tensors.items():
        for a in (v.d, v.m) if isinstance(v, QuantMatrix) else (v,):
            if a is not None:
                check_finite(a, f"{where}: tensor {k}")
