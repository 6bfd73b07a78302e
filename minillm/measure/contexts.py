"""`minillm bench --context-sweep`: a decode step's time and bytes against the context, for several
models in the same interleaved rounds. What grows with the context is the KV cache of every layer
that keeps one; a hybrid's linear layers keep a fixed state instead (models/qwen35.py), so its step
grows only by its few full layers' KV.

For each context T, ascending, each model gets a cache holding T positions, filled with random keys
and values (and a random state) in one write: a decode step's work does not depend on what the
cache holds, and a real 16k-token prefill of an all-attention model takes minutes here. Then
`repeats` rounds, every model once per round, each time `steps` decode steps (their median). A
step moves the cache on by one position (a fixed state cannot go back), so the row's context is T
to T + repeats·steps. Beside each row, the meter's count of one step at T: weights, KV, state.

A latent-attention model (models/deepseek.py) runs once per way it can decode (`mla_decode`: absorbed
and decompressed, or the chosen ones), on one cache; each row also carries the step's attention FLOPs
and KV read, so their ratio says where its attention sits against the machine's ridge.

`crossover` names where the first model's step becomes cheaper than the second's, measured: the
smallest context from which its median time (or its bytes moved: weights, KV and state, the
activations aside) stays below the other's at every larger context.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..closeness import apart, round_order
from ..errors import MiniLLMError
from ..meter import Meter

CONTEXTS = (256, 512, 1024, 2048, 4096, 8192, 16384)


def fill(model, T: int, rng) -> object:
    """A new cache of `model` holding T positions of random keys and values (and, for a hybrid,
    a random state): what a decode step at position T reads, without the prefill that would make it."""
    cache = model.new_cache()
    cache.reserve(T)
    c, dtype = cache.config, model.dtype
    for layer in range(c.n_layer):
        k = rng.standard_normal((c.n_kv_head, T, c.head_dim), dtype=np.float32).astype(dtype, copy=False)
        v = rng.standard_normal((c.n_kv_head, T, c.head_dim), dtype=np.float32).astype(dtype, copy=False)
        cache.write(layer, 0, k, v)
    state = cache.state                                # (cache protocol: None for a plain cache)
    if state is not None:
        for layer in range(state.pool.layers):
            state.write(layer, *(0.1 * rng.standard_normal(s, dtype=np.float32).astype(dtype, copy=False)
                                 for s in state.pool.shapes.values()))
    cache.advance(T)
    return cache


def decode_ways(model, chosen: dict | None = None) -> list[dict]:
    """How a model decodes, each way a run of the sweep: one per value of each of its family's options
    (models/options.py; `chosen`: name -> the values to run, default every choice), as the options
    to build it with (`with_options`); a model without options runs once ({})."""
    runs = [{}]
    for o in model.OPTIONS:
        values = (chosen or {}).get(o.name) or o.choices
        runs = [{**r, o.name: v} for r in runs for v in values]
    return runs


def check_sweep(models, contexts, repeats: int, steps: int, ways=None) -> None:
    if not contexts:
        raise MiniLLMError("--contexts: give at least one context length")
    for m in models:
        room = m.config.n_ctx - repeats * steps * len(decode_ways(m, ways)) - 1
        bad = [T for T in contexts if not 1 <= T <= room]
        if bad:
            raise MiniLLMError(f"context {bad[0]}: {m.name} holds {m.config.n_ctx:,} positions, so with "
                               f"{repeats}×{steps} decode steps after it the sweep goes up to {room:,}")


def step_counts(model, cache) -> dict:
    """The meter's count of one decode step on `cache`: bytes by kind, the state's apart from the KV's,
    the attention's FLOPs and the KV it read."""
    with Meter() as m:
        model.decode_step(1, cache)
    r = m.steps[0]
    state = sum(r.ops.get(op, {}).get("bytes", 0) for op in ("state_read", "state_write"))
    kv = r.bytes["kv_read"] + r.bytes["kv_write"] - state
    return {"bytes": r.total_bytes, "weights": r.bytes["weights"], "activations": r.bytes["activations"],
            "kv": kv, "state": state, "moved": r.bytes["weights"] + kv + state, "flops": r.total_flops,
            "kv_read": r.bytes["kv_read"], "attention_flops": r.flops["attention"], "matmul_flops": r.flops["matmul"]}


def run_context_sweep(models: list, contexts=CONTEXTS, repeats: int = 5, steps: int = 4, progress=None,
                      seed: int = 0, ways=None) -> dict:
    """Decode-step time and bytes against the context for `models`, interleaved (see the module); a
    latent-attention model once per way (`decode_ways`: `ways`, option name -> values, default every
    choice), its rows named "name way"."""
    contexts = sorted(set(contexts))
    check_sweep(models, contexts, repeats, steps, ways)
    runs = [(m, m.with_options(**opts), " ".join(opts.values()) or None) for m in models
            for opts in decode_ways(m, ways)]                 # (model, the model that way, its way in words)
    runs = [(m, mw, way, m.name if way is None else f"{m.name} {way}") for m, mw, way in runs]
    rng = np.random.default_rng(seed)
    rows = []
    for T in contexts:
        caches = {id(m): fill(m, T, rng) for m in models}
        counts, samples = [], [[] for _ in runs]
        for m, mw, _, _ in runs:
            counts.append(step_counts(mw, caches[id(m)]))
        for r in range(repeats):
            for i in round_order(list(range(len(runs))), r):    # the order reversed every other round
                m, mw, _, _ = runs[i]
                times = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    mw.decode_step(1, caches[id(m)])
                    times.append(time.perf_counter() - t0)
                samples[i].append(statistics.median(times))
            if progress:
                progress()
        for (m, _, way, label), n, s in zip(runs, counts, samples):
            rows.append({"model": label, "way": way, "context": T, "ms": statistics.median(s) * 1e3,
                         "ms_lo": min(s) * 1e3, "ms_hi": max(s) * 1e3, "ms_rounds": [t * 1e3 for t in s], **n})
        for cache in caches.values():
            cache.free()
        del caches
    names = [label for _, _, _, label in runs]
    firsts = [next(label for m2, _, _, label in runs if m2 is m) for m in models]     # each model's first way
    return {"models": names, "contexts": contexts, "repeats": repeats, "steps": steps, "rows": rows,
            "crossover_time": crossover(rows, *firsts[:2], "ms") if len(firsts) > 1 else None,
            "crossover_bytes": crossover(rows, *firsts[:2], "moved") if len(firsts) > 1 else None}


def crossover(rows: list[dict], a: str, b: str, key: str = "ms") -> int | None:
    """The smallest measured context from which `a`'s `key` stays below `b`'s at every larger one;
    None if `a` is not below `b` at the largest. A time ("ms") is below only where the verdict rule
    ranks it so on the paired rounds (closeness.py; C21: a crossover from medians moved from 1,024
    tokens to 256 between two runs); a count ("moved": bytes) is compared as it is."""
    by = {(r["model"], r["context"]): r for r in rows}

    def below(T) -> bool:
        x, y = by[(a, T)], by[(b, T)]
        if key == "ms" and "ms_rounds" in x:
            return apart(x["ms_rounds"], y["ms_rounds"]) < 0
        return x[key] < y[key]
    found = None
    for T in sorted({r["context"] for r in rows}, reverse=True):
        if below(T):
            found = T
        else:
            break
    return found
