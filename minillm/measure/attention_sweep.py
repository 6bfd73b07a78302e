"""`minillm bench --attention`: where a decode step's attention sits as the context grows, for several
models in the same interleaved rounds, a latent-attention model (models/deepseek.py) both ways.

Each model's cache is filled once, to the longest context, by a chunked prefill; a decode step at
context n then runs on the cache cut back to n - 1 positions (`truncate`), and the cache is given its
length back after it (`advance`: the rows are still there; the step wrote its own over one of them),
so every context costs one fill, not one prefill each. At each
context, for each model and way:

    ms/step        the median of `steps` decode steps, per interleaved round, then across rounds
    KV/step        the meter's kv_read: every cached position's keys and values (a latent: its row)
    attn F/B       the attention FLOPs of the step over those KV bytes: where the attention alone sits
                   against the machine's ridge (peak FLOP/s ÷ bandwidth); GQA ≈ g·2/b, MLA absorbed
                   ≈ 2H·(2r + dr)/((r + dr)·b)
    step F/B       the whole step's FLOPs over its bytes (weights included), and the roofline's time
                   for it, max(bytes / bandwidth, FLOPs / peak), with what bounds it

The decompressed way reads the same rows and multiplies kv_b over every one of them each step: its
FLOPs grow with the context as the attention's do, which is why no engine decodes that way.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..errors import MiniLLMError
from ..meter import Meter

FILL_CHUNK = 512        # positions a prefill chunk takes while a cache fills to the longest context


def ways(model, chosen: list[str] | None = None) -> list[str | None]:
    """How a model decodes: a latent-attention model's ways (`mla_decode`: the chosen ones, default
    both), anyone else's one way (None)."""
    from ..models.deepseek import MLA_DECODE
    if not hasattr(model, "mla_decode"):
        return [None]
    return list(chosen or MLA_DECODE)


def fill(model, n: int, rng) -> object:
    """A cache of the model holding n random tokens, prefilled FILL_CHUNK positions at a time."""
    cache = model.new_cache()
    ids = rng.integers(0, model.config.vocab_size, n)
    for i in range(0, n, FILL_CHUNK):
        model.prefill(ids[i:i + FILL_CHUNK], cache)
    return cache


def decode_at(model, cache, n: int, way) -> None:
    """One decode step at context n: the cache cut back to n - 1 positions, the step, then its length back."""
    if way is not None:
        model.mla_decode = way
    full = cache.length
    cache.truncate(n - 1)
    model.decode_step(1, cache)
    cache.advance(full - n)


def run_sweep(models: dict, contexts: list[int], hw, repeats: int = 3, steps: int = 3, chosen=None,
              progress=None) -> dict:
    """models: label -> model; contexts ascending; hw: the machine's figures (bandwidth_gbs,
    peak_gflops). Returns {"rows": [...], "machine": ...}, a row per (context, model, way)."""
    contexts = sorted(set(contexts))
    for label, m in models.items():
        if contexts[-1] >= m.config.n_ctx or contexts[0] < 2:
            raise MiniLLMError(f"--contexts: {label} takes contexts from 2 to {m.config.n_ctx - 1}")
    rng = np.random.default_rng(0)
    caches = {label: fill(m, contexts[-1], rng) for label, m in models.items()}
    runs = [(label, way) for label, m in models.items() for way in ways(m, chosen)]
    counted = {}
    for label, way in runs:
        for n in contexts:
            with Meter() as meter:
                decode_at(models[label], caches[label], n, way)
            counted[label, way, n] = meter.steps[0]
    times = {key: [] for key in counted}
    for _ in range(repeats):                                  # interleaved: every measurement once a round
        for n in contexts:
            for label, way in runs:
                m, cache = models[label], caches[label]
                one = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    decode_at(m, cache, n, way)
                    one.append(time.perf_counter() - t0)
                times[label, way, n].append(statistics.median(one))
        if progress:
            progress()
    bw, peak = hw.bandwidth_gbs * 1e9, hw.peak_gflops * 1e9
    rows = []
    for (label, way, n), rec in counted.items():
        kv, attention = rec.bytes["kv_read"], rec.flops["attention"]
        roof = max(rec.total_bytes / bw, rec.total_flops / peak)
        rows.append({"context": n, "model": label, "way": way, "ms": statistics.median(times[label, way, n]) * 1e3,
                     "rounds_ms": [t * 1e3 for t in times[label, way, n]],
                     "kv_bytes": kv, "attention_flops": attention, "attention_per_byte": attention / kv,
                     "step_bytes": rec.total_bytes, "step_flops": rec.total_flops, "matmul_flops": rec.flops["matmul"],
                     "step_per_byte": rec.total_flops / rec.total_bytes, "roofline_ms": roof * 1e3,
                     "bound": "compute" if rec.total_flops / peak > rec.total_bytes / bw else "memory"})
    rows.sort(key=lambda r: (r["context"], [k for k, _ in runs].index(r["model"]), str(r["way"])))
    return {"rows": rows, "ridge": peak / bw, "repeats": repeats, "steps": steps,
            "models": {label: m.name for label, m in models.items()}}
