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

For a mixture of experts (models/moe.py) each row also has the experts its router chose (mean per
sparse layer) beside uniform routing's union E·(1 − (1 − k/E)^B) and that union's closed-form bytes.

With `prefill=True`, each sample also times the B prompts' prefill again, so that two kernel sets
of one model (`minillm bench --batch --kernels fused,batch-invariant`: the batch-invariant set's
cost) compare on both phases, on the same machine in the same minutes.

The critical batch is where decode turns compute-bound: the smallest B whose step needs more time
for its FLOPs than for its bytes (`critical_batch`: FLOPs and bytes besides the weights linear in B
between the counted steps, the weights by the model's closed form, not linear for a mixture).
`run_batch_benches` measures several models in the same interleaved rounds (`time_steps`).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from ..cache.paged import PagedKVPool, reserve_step
from .. import closeness
from ..closeness import round_order
from ..engine.runner import run_step
from ..engine.sequence import Sequence
from ..errors import MiniLLMError
from ..models import ops
from .bench import decode_weights, head_array, matvec_pass, matvec_pass_out_in
from ..meter import Meter
from ..models.mixture import expected_distinct_experts, routes


def bare_pass(mats: list[np.ndarray], head: np.ndarray, B: int, shaped: bool) -> float:
    """Seconds for B rows through every weight: `x @ W` as is, or the engine's `ops.matmul`.
    (A mixture's: the experts its step chose, each with all B rows.)"""
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
    pool = PagedKVPool(model.config, B * PagedKVPool.blocks_for_positions(model.config, context + steps + 1),
                       16, model.dtype, model.xp)
    seqs = [Sequence(rng.integers(0, c.vocab_size, context), steps + 1) for _ in range(B)]
    for s in seqs:
        s.cache = pool.sequence()
    step(model, seqs)
    return seqs


def prefill_again(model, seqs: list[Sequence]) -> float:
    """Seconds for the B prompts' prefill again, as one batched step (the caches emptied first)."""
    for s in seqs:
        del s.output[:]
        s.cache.truncate(0)
    t0 = time.perf_counter()
    step(model, seqs)
    return time.perf_counter() - t0


def decode_steps(model, seqs: list[Sequence], steps: int) -> float:
    """The median seconds of `steps` decode steps of the B sequences."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(model, seqs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rewind(seqs: list[Sequence], context: int) -> None:
    """Back to just after the prefill: one sampled token pending, `context` positions cached."""
    for s in seqs:
        del s.output[1:]
        s.cache.truncate(context)


CRITICAL_BATCH_LIMIT = 1 << 16     # the largest B `critical_batch` looks at


def critical_batch(model, counts: dict, hw, limit: int = CRITICAL_BATCH_LIMIT) -> int | None:
    """The smallest B whose decode step is compute-bound on the roofline: its FLOPs take longer at the
    peak than its bytes at the bandwidth. counts: {B: the meter's record of a step of B sequences},
    two B at least. A step's FLOPs and its bytes besides the weights are taken as linear in B between
    the counted steps (before the first and past the last: on the line through the nearest two); its
    weight bytes are the model's closed form, `model.step_weight_bytes(B)` (a mixture's follows
    uniform routing's union of experts: not linear). A counted B that is bound is taken as counted;
    past the last counted B the search stops at `limit` (None: not bound by then)."""
    Bs = sorted(counts)
    if len(Bs) < 2:
        raise ValueError("critical_batch: give the counts of two batch sizes at least")
    bw, peak = hw.bandwidth_gbs * 1e9, hw.peak_gflops * 1e9

    def at(B, f):                       # f of the counted steps, on the line through the nearest two
        i = min(max(next((j for j, b in enumerate(Bs) if b >= B), len(Bs) - 1), 1), len(Bs) - 1)
        (b1, r1), (b2, r2) = (Bs[i - 1], counts[Bs[i - 1]]), (Bs[i], counts[Bs[i]])
        return f(r1) + (B - b1) * (f(r2) - f(r1)) / (b2 - b1)

    def bound(B):
        flops = at(B, lambda r: r.total_flops)
        other = at(B, lambda r: r.total_bytes - r.bytes["weights"])
        return flops / peak > (model.step_weight_bytes(B) + other) / bw

    def counted_bound(B):
        r = counts[B]
        return r.total_flops / peak > r.total_bytes / bw

    first = next((B for B in Bs if counted_bound(B)), None)
    if first == Bs[0]:
        return first
    if first is not None:                                  # between the counted B before it and it
        before = Bs[Bs.index(first) - 1]
        return next((B for B in range(before + 1, first) if bound(B)), first)
    lo, hi = Bs[-1], Bs[-1]                                # past the sweep: doubling, then halving
    while not bound(hi):
        if hi >= limit:
            return None
        lo, hi = hi, min(2 * hi, limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if bound(mid) else (mid, hi)
    return hi


def time_steps(models: dict, runs: dict, context: int, steps: int, rounds: int, progress=None,
               each=None, prefill: bool = False, settle=None, more=None) -> dict:
    """Seconds per decode step of each (name, B) in `runs` (B sequences of `models[name]`, from
    `start`). In every round each (B, name) runs once in turn (interleaved: a busy moment slows one
    sample of each), the median of `steps` steps each time, then rewinds. `each(name, B)` runs after
    each sample (`minillm bench --batch`'s bare passes); `progress()` after every round.
    -> {(name, B): [seconds, one per round]}. With `prefill`, each sample also times the prompts'
    prefill again, under (name, B, "prefill"). `settle(out)`: after `rounds` rounds, more are run, up
    to closeness.CAP, until it holds (`more()` as each extra round starts, for a progress bar)."""
    out = {key: [] for key in runs}
    if prefill:
        out.update({(*key, "prefill"): [] for key in runs})
    batches = list(dict.fromkeys(B for _, B in runs))
    i = 0
    while i < rounds or (settle and i < closeness.CAP and not settle(out)):
        if i >= rounds and more:
            more()
        for B in batches:
            for name in round_order(list(models), i):      # the order reversed every other round
                model = models[name]
                seqs = runs[name, B]
                if prefill:
                    out[name, B, "prefill"].append(prefill_again(model, seqs))
                t = decode_steps(model, seqs, steps)
                rewind(seqs, context)
                out[name, B].append(t)
                if each:
                    each(name, B)
        if progress:
            progress()
        i += 1
    return out


def growth_settled(models: dict, batches: list[int]):
    """`time_steps`'s `settle` for `minillm bench --batch`: every B's tokens/s against B = 1's, for each
    model, is settled by the closeness rule (`closeness.settled`), the comparison its table prints."""
    def settle(out: dict) -> bool:
        return 1 not in batches or all(
            closeness.settled([B / t for t in out[name, B]], [1 / t for t in out[name, 1]])
            for name in models for B in batches if B != 1)
    return settle


def check_batches(model, batches: list[int], context: int = 16, steps: int = 4) -> None:
    """Refuse batch sizes below 1 and a context that leaves no room for `steps` decode steps."""
    if not batches or any(B < 1 for B in batches):
        raise MiniLLMError("--batch: give batch sizes of at least 1, such as 1,2,4,8")
    if context + steps + 1 > model.config.n_ctx:
        raise MiniLLMError(f"--batch-context {context}: at most {model.config.n_ctx - steps - 1} for this model")


def run_batch_bench(model, batches: list[int], hw, context: int = 16, repeats: int = 5, steps: int = 4,
                    progress=None, prefill: bool = False) -> dict:
    """One model's sweep: `run_batch_benches` with it alone."""
    return run_batch_benches({model.name: model}, batches, hw, context, repeats, steps, progress,
                             prefill)[model.name]


def run_batch_benches(models: dict, batches: list[int], hw, context: int = 16, repeats: int = 5, steps: int = 4,
                      progress=None, prefill: bool = False, more=None) -> dict:
    """The sweep above for each of `models` ({name: model}), all in the same interleaved rounds
    (`progress()` after each; `prefill`: the prompts' prefill timed too). -> {name: its result}.
    `repeats` of at least closeness.MIN_ROUNDS: more rounds, up to closeness.CAP, until each B's tokens/s
    against B = 1's is settled (`growth_settled`; `more()` as each extra round starts); the result's
    "repeats" is the rounds taken, "repeats_asked" the number asked for."""
    for model in models.values():
        check_batches(model, batches, context, steps)
    rng = np.random.default_rng(0)
    runs = {(name, B): start(model, B, context, steps, rng) for name, model in models.items() for B in batches}
    counts, chose = {}, {}
    for (name, B), seqs in runs.items():
        with Meter() as m, routes() as r:
            step(models[name], seqs)
        counts[name, B], chose[name, B] = m.steps[0], [set(a.ravel().tolist()) for a in r]
        rewind(seqs, context)
    mats = {key: decode_weights(models[key[0]], chose[key] or None) for key in runs}   # a mixture: its chosen experts
    heads = {name: head_array(model) for name, model in models.items()}
    layouts = {name: (decode_weights(model), [np.ascontiguousarray(w.T) for w in decode_weights(model)])
               for name, model in models.items()}
    plain, shaped = {key: [] for key in runs}, {key: [] for key in runs}
    layout_io, layout_oi = {name: [] for name in models}, {name: [] for name in models}

    def bare(name, B):
        head = heads[name]
        plain[name, B].append(bare_pass(mats[name, B], head, B, shaped=False))
        shaped[name, B].append(bare_pass(mats[name, B], head, B, shaped=True))
        if B == batches[-1]:                                 # once a round: the two layouts at one row
            io, oi = layouts[name]
            for _ in range(2):
                t0 = time.perf_counter()
                matvec_pass(io, head)
                layout_io[name].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                matvec_pass_out_in(oi, np.ascontiguousarray(head.T))
                layout_oi[name].append(time.perf_counter() - t0)

    settle = growth_settled(models, batches) if repeats >= closeness.MIN_ROUNDS else None
    step_s = time_steps(models, runs, context, steps, repeats, progress, each=bare, prefill=prefill,
                        settle=settle, more=more)
    taken = len(next(iter(step_s.values())))
    return {name: {**_result(model, name, batches, hw, context, taken, steps, counts, chose, step_s, plain, shaped,
                             layout_io[name], layout_oi[name], rng), "repeats_asked": repeats}
            for name, model in models.items()}


def _result(model, name, batches, hw, context, repeats, steps, counts, chose, step_s, plain, shaped,
            layout_io, layout_oi, rng) -> dict:
    med = statistics.median
    rows = []
    for B in batches:
        r, t = counts[name, B], med(step_s[name, B])
        rl = _roofline(r.total_bytes, r.total_flops, hw)
        rows.append({
            "batch": B, "tok_s": B / t, "ms_step": t * 1e3, "bytes": r.total_bytes, "flops": r.total_flops,
            "weight_bytes": r.bytes["weights"],
            "intensity": r.intensity, "gbps": r.total_bytes / t / 1e9, "gflops": r.total_flops / t / 1e9,
            "roofline_ms": rl[0] * 1e3, "bound": rl[1],
            "bare_plain_ms": med(plain[name, B]) * 1e3, "bare_engine_ms": med(shaped[name, B]) * 1e3,
            "spread_ms": [min(step_s[name, B]) * 1e3, max(step_s[name, B]) * 1e3],
            "tok_s_rounds": [B / x for x in step_s[name, B]],           # each round's, for the closeness rule
            "bare_plain_rounds_ms": [x * 1e3 for x in plain[name, B]],
            "bare_engine_rounds_ms": [x * 1e3 for x in shaped[name, B]],
        })
        if model.experts:                                    # a mixture: the union, chosen and uniform
            E, k = model.experts
            rows[-1].update(experts_chosen=statistics.mean(len(x) for x in chose[name, B]),
                            experts_uniform=expected_distinct_experts(E, k, B),
                            uniform_weight_bytes=model.step_weight_bytes(B))
        if (name, B, "prefill") in step_s:                   # the prompts' prefill, same rounds
            rows[-1]["prefill_ms"] = med(step_s[name, B, "prefill"]) * 1e3
    counted = {B: counts[name, B] for B in batches}
    for B in (1, 2):                                         # two points at least, the smallest too
        if len(counted) < 2 and B not in counted:
            counted[B] = _counts_at(model, context, steps, rng, B)
    base = next((row for row in rows if row["batch"] == 1), None)
    bare_io, bare_oi = med(layout_io) * 1e3, med(layout_oi) * 1e3
    return {
        "model": model.name, "context": context, "repeats": repeats, "steps_per_sample": steps,
        "rows": rows, "critical_batch": critical_batch(model, counted, hw),
        "experts": list(model.experts) if model.experts else None,
        "prefill_timed": (name, batches[0], "prefill") in step_s,
        "ridge_flops_per_byte": hw.peak_gflops / hw.bandwidth_gbs,
        "bare_in_out_ms": bare_io, "bare_out_in_ms": bare_oi,
        "bare_rounds_ms": [min(a, b) * 1e3 for a, b in zip(layout_io, layout_oi)],
        "b1_of_bare": (min(bare_io, bare_oi) / base["ms_step"]) if base else None,
    }


def _counts_at(model, context, steps, rng, B):
    seqs = start(model, B, context, steps, rng)
    with Meter() as m:
        step(model, seqs)
    return m.steps[0]


def _roofline(nbytes: int, flops: int, hw) -> tuple[float, str]:
    t_mem, t_cmp = nbytes / (hw.bandwidth_gbs * 1e9), flops / (hw.peak_gflops * 1e9)
    return max(t_mem, t_cmp), "compute" if t_cmp > t_mem else "memory"
