"""`minillm bench --batch`: what batching buys decode, measured against the roofline.

For each batch size B, B sequences with `context`-token prompts are prefilled, then decode steps
run all B at once (`engine.runner.run_step`, the paged KV cache: the path `generate_batch` takes).
Interleaved rounds, medians. Beside each B, in the same run:

  - the meter's bytes and FLOPs of one such step, its intensity, and the roofline's step time
    max(bytes / bandwidth, FLOPs / peak) with this machine's measured figures;
  - two bare passes over every weight with B rows: the plain product (`x @ W`, what OpenBLAS does
    with a small batch: the cliff) and the engine's `ops.matmul` (two rows as matrix-vector
    products, 3-63 rows padded to a multiple of 8: the fix);
  - at B = 1, the bare matrix-vector pass in both weight layouts, the ceiling a decode step can reach.

The critical batch is where decode turns compute-bound: the smallest B whose step needs more time
for its FLOPs than for its bytes (from the meter's counts at B = 1 and 2, which grow linearly in B).
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from ..cache.paged import PagedKVPool, reserve_step
from ..engine.runner import run_step
from ..engine.sequence import Sequence
from ..errors import MiniLLMError
from ..models import ops
from .bench import decode_weights, head_array, matvec_pass, matvec_pass_out_in
from ..meter import Meter


def bare_pass(mats: list[np.ndarray], head: np.ndarray, B: int, shaped: bool) -> float:
    """Seconds for B rows through every weight: `x @ W` as is, or the engine's `ops.matmul`."""
    xs = {n: np.ones((B, n), dtype=head.dtype) for n in {w.shape[0] for w in mats} | {head.shape[0]}}
    f = ops.matmul if shaped else np.matmul
    t0 = time.perf_counter()
    for w in mats:
        f(xs[w.shape[0]], w)
    f(xs[head.shape[0]], head)
    return time.perf_counter() - t0


def step(model, seqs: list[Sequence]) -> None:
    """One batched step over the sequences, their blocks reserved first (as the engine's block
    manager would)."""
    reserve_step([(s.cache, s.n_pending) for s in seqs])
    run_step(model, seqs)


def start(model, B: int, context: int, steps: int, rng) -> list[Sequence]:
    """B sequences, prompts of `context` random tokens, prefilled in one batched step."""
    c = model.config
    pool = PagedKVPool(model.config, B * -(-(context + steps + 1) // 16), 16, model.dtype, model.xp)
    seqs = [Sequence(rng.integers(0, c.vocab_size, context), steps + 1) for _ in range(B)]
    for s in seqs:
        s.cache = pool.sequence()
    step(model, seqs)
    return seqs


def rewind(seqs: list[Sequence], context: int) -> None:
    """Back to just after the prefill: one sampled token pending, `context` positions cached."""
    for s in seqs:
        del s.output[1:]
        s.cache.truncate(context)


def critical_batch(b1: tuple[int, int], b2: tuple[int, int], hw) -> int | None:
    """Smallest B with FLOPs(B) / peak >= bytes(B) / bandwidth, from (bytes, FLOPs) at B = 1 and 2."""
    (y1, f1), (y2, f2) = b1, b2
    db, df = y2 - y1, f2 - f1                       # per extra sequence
    bw, peak = hw.bandwidth_gbs * 1e9, hw.peak_gflops * 1e9
    # (f1 + (B-1)·df) / peak >= (y1 + (B-1)·db) / bw
    gain = df / peak - db / bw
    if gain <= 0:
        return None
    B = 1 + (y1 / bw - f1 / peak) / gain
    return max(1, math.ceil(B))


def check_batches(model, batches: list[int], context: int = 16, steps: int = 4) -> None:
    """Refuse batch sizes below 1 and a context that leaves no room for `steps` decode steps."""
    if not batches or any(B < 1 for B in batches):
        raise MiniLLMError("--batch: give batch sizes of at least 1, such as 1,2,4,8")
    if context + steps + 1 > model.config.n_ctx:
        raise MiniLLMError(f"--batch-context {context}: at most {model.config.n_ctx - steps - 1} for this model")


def run_batch_bench(model, batches: list[int], hw, context: int = 16, repeats: int = 5, steps: int = 4,
                    progress=None, others: dict | None = None) -> dict:
    """The rounds described above for `model`; `others` ({label: model}, e.g. the same weights with
    the other kernels) run in the same rounds, interleaved, each B of each model once per round
    (their rows carry "kernels"; the bare passes and the critical batch are `model`'s)."""
    check_batches(model, batches, context, steps)
    everyone = [(model.kernels, model)] + list((others or {}).items())
    rng = np.random.default_rng(0)
    mats = decode_weights(model)
    mats_t = [np.ascontiguousarray(w.T) for w in mats]
    head = head_array(model)                                 # [d, V]
    wte_vd = np.ascontiguousarray(head.T)
    runs = {(label, B): (mdl, start(mdl, B, context, steps, rng)) for label, mdl in everyone for B in batches}
    all_counts = {}
    for key, (mdl, seqs) in runs.items():
        with Meter() as m:
            step(mdl, seqs)
        all_counts[key] = m.steps[0]
        rewind(seqs, context)
    counts = {B: all_counts[(model.kernels, B)] for B in batches}
    step_s = {key: [] for key in runs}
    plain = {B: [] for B in batches}
    shaped = {B: [] for B in batches}
    layout_io, layout_oi = [], []
    for _ in range(repeats):
        for B in batches:                                    # interleaved: every B (of every model) once per round
            for label, _ in everyone:
                mdl, seqs = runs[(label, B)]
                times = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    step(mdl, seqs)
                    times.append(time.perf_counter() - t0)
                rewind(seqs, context)
                step_s[(label, B)].append(statistics.median(times))
            plain[B].append(bare_pass(mats, head, B, shaped=False))
            shaped[B].append(bare_pass(mats, head, B, shaped=True))
            if progress:
                progress()
        for _ in range(2):
            t0 = time.perf_counter()
            matvec_pass(mats, head)
            layout_io.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            matvec_pass_out_in(mats_t, wte_vd)
            layout_oi.append(time.perf_counter() - t0)
    med = statistics.median
    rows = []
    for (label, B) in runs:
        r, t = all_counts[(label, B)], med(step_s[(label, B)])
        rl = _roofline(r.total_bytes, r.total_flops, hw)
        rows.append({
            "batch": B, "kernels": label, "tok_s": B / t, "ms_step": t * 1e3, "bytes": r.total_bytes, "flops": r.total_flops,
            "intensity": r.intensity, "gbps": r.total_bytes / t / 1e9, "gflops": r.total_flops / t / 1e9,
            "roofline_ms": rl[0] * 1e3, "bound": rl[1],
            "bare_plain_ms": med(plain[B]) * 1e3, "bare_engine_ms": med(shaped[B]) * 1e3,
            "spread_ms": [min(step_s[(label, B)]) * 1e3, max(step_s[(label, B)]) * 1e3],
        })
    one = {}
    if 1 in counts and 2 in counts:
        one = {"critical_batch": critical_batch((counts[1].total_bytes, counts[1].total_flops),
                                                (counts[2].total_bytes, counts[2].total_flops), hw)}
    else:
        b1, b2 = (_counts_at(model, context, steps, rng, B) for B in (1, 2))
        one = {"critical_batch": critical_batch(b1, b2, hw)}
    base = next((row for row in rows if row["batch"] == 1 and row["kernels"] == model.kernels), None)
    bare_io, bare_oi = med(layout_io) * 1e3, med(layout_oi) * 1e3
    return {
        "model": model.name, "context": context, "repeats": repeats, "steps_per_sample": steps,
        "rows": rows, **one,
        "ridge_flops_per_byte": hw.peak_gflops / hw.bandwidth_gbs,
        "bare_in_out_ms": bare_io, "bare_out_in_ms": bare_oi,
        "b1_of_bare": (min(bare_io, bare_oi) / base["ms_step"]) if base else None,
    }


def _counts_at(model, context, steps, rng, B) -> tuple[int, int]:
    seqs = start(model, B, context, steps, rng)
    with Meter() as m:
        step(model, seqs)
    return m.steps[0].total_bytes, m.steps[0].total_flops


def _roofline(nbytes: int, flops: int, hw) -> tuple[float, str]:
    t_mem, t_cmp = nbytes / (hw.bandwidth_gbs * 1e9), flops / (hw.peak_gflops * 1e9)
    return max(t_mem, t_cmp), "compute" if t_cmp > t_mem else "memory"
