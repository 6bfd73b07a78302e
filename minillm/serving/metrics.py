"""A run's numbers, as serving benchmarks report them, from the engine's requests and steps.

    output_tokens_per_s   output tokens / the run's duration (first arrival to last token)
    ttft                  time to first token: arrival -> the end of the step that sampled it
                          (queueing and the whole prefill included)
    tbt                   time between tokens of one request (every gap, all requests pooled)
    e2e                   arrival -> last token
    kv_waste              1 - positions stored / positions reserved, summed over steps: the paged
                          pool as it ran (a shared block counts once), beside what a contiguous
                          cache reserving n_ctx per sequence would have wasted for the same
                          sequences, and paged pools of other block sizes (from the same lengths)
    prefix_hit_rate       prompt positions found in the prefix cache / prompt positions looked up
    prefill_flops         FLOPs of the positions that ran as prompt, from the meter's count per step;
                          a mixed step is split: the LM head's FLOPs by the rows it scored (a
                          decode token, or a prompt's last position), the rest by tokens
    phases                time, bytes and FLOPs by step kind (prefill, decode, mixed) with the
                          roofline's verdict for each: bound by memory or compute, and how close
                          the measured time came to the roofline's best case
    scheduler_overhead_share   the engine's time outside the model (scheduling, sampling, bookkeeping)
"""

from __future__ import annotations

import numpy as np

from ..engine.engine import Engine
from ..meter import totals

OTHER_BLOCK_SIZES = (1, 8, 16, 32, 64)


def pct(values, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def summarize(engine, label: str | None = None, hw=None) -> dict:
    reqs = [r for r in engine.requests.values() if not r.aborted]
    steps = engine.steps
    out_tokens = sum(len(r.output) for r in reqs)
    start = min((r.arrival for r in reqs), default=0.0)
    end = max((r.finished_at for r in reqs if r.finished_at is not None), default=start)
    duration = end - start
    ttft = [r.ttft for r in reqs if r.ttft is not None]
    tbt = [d for r in reqs for d in r.tbt]
    e2e = [r.finished_at - r.arrival for r in reqs if r.finished_at is not None]
    n_ctx = engine.model.config.n_ctx
    used = sum(s.kv_used for s in steps)
    reserved = sum(s.kv_reserved for s in steps)
    lengths = [n for s in steps for n in s.lengths]
    total_len = sum(lengths)
    contiguous = n_ctx * len(lengths)
    by_bs = {bs: 1 - total_len / sum(-(-n // bs) * bs for n in lengths) if total_len else 0.0
             for bs in OTHER_BLOCK_SIZES}
    prefill_flops = sum(prefill_share(s) for s in steps)
    sched = engine.scheduler
    result = {
        "policy": label or sched.policy,
        "requests": len(reqs),
        "prefix_cache": engine.blocks.prefix_cache,
        "block_size": engine.blocks.block_size,
        "kv_blocks": engine.blocks.num_blocks,
        "max_seqs": sched.max_seqs,
        "max_batched_tokens": sched.max_batched_tokens,
        "duration_s": duration,
        "steps": len(steps),
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / duration if duration > 0 else 0.0,
        "ttft_p50_s": pct(ttft, 50), "ttft_p95_s": pct(ttft, 95),
        "tbt_p50_s": pct(tbt, 50), "tbt_p95_s": pct(tbt, 95),
        "e2e_p50_s": pct(e2e, 50), "e2e_p95_s": pct(e2e, 95),
        "mean_batch": float(np.mean([len(s.seqs) for s in steps])) if steps else 0.0,
        "preemptions": sched.preemptions,
        "prefix_hit_rate": engine.blocks.hit_rate,
        "prefix_hit_tokens": engine.blocks.hit_tokens,
        "prefill_tokens": sum(s.prefill_tokens for s in steps),
        "decode_tokens": sum(s.decode_tokens for s in steps),
        "prefill_flops": int(prefill_flops),
        "kv_waste": 1 - used / reserved if reserved else 0.0,
        "kv_waste_contiguous": 1 - total_len / contiguous if contiguous else 0.0,
        "kv_waste_by_block_size": {str(k): v for k, v in by_bs.items()},
        "phases": phases(steps, hw),
        "scheduler_overhead_share": 1 - sum(s.record.seconds for s in steps if s.record is not None) / (
            sum(s.seconds for s in steps) or 1.0) if steps and steps[0].record is not None else None,
    }
    return result


def prefill_share(s) -> float:
    """The FLOPs of a step that belong to its prompt positions."""
    r = s.record
    if r is None or not s.prefill_tokens:
        return 0.0
    if not s.decode_tokens:
        return float(r.total_flops)
    head = r.ops.get("lm_head", {}).get("flops", 0)
    rows = s.prefill_scored + s.decode_tokens
    return (r.total_flops - head) * s.prefill_tokens / s.n_tokens + head * s.prefill_scored / rows


def phases(steps, hw=None) -> dict:
    """Seconds, share of the model's time, bytes, FLOPs and the roofline's verdict, per step kind."""
    total = sum(s.record.seconds for s in steps if s.record is not None) or 1.0
    out = {}
    for kind in ("prefill", "mixed", "decode"):
        recs = [s.record for s in steps if s.record is not None and s.record.kind == kind]
        if not recs:
            continue
        t = totals(recs)
        secs = t.seconds
        d = {"steps": t.steps, "seconds": secs, "share": secs / total, "bytes": t.bytes, "flops": t.flops,
             "intensity": t.intensity, "gbps": t.gbps, "gflops": t.gflops}
        if hw is not None and hw.peak_gflops:
            # the verdict of each step on its own, then time-weighted
            bound = {"memory": 0.0, "compute": 0.0}
            best = 0.0
            for r in recs:
                rl = hw.roofline(r.total_bytes, r.total_flops)
                bound[rl.bound] += r.seconds
                best += rl.seconds
            d["bound"] = max(bound, key=bound.get)
            d["bound_share"] = bound[d["bound"]] / secs if secs else 0.0
            d["of_roofline"] = best / secs if secs else 0.0
        out[kind] = d
    return out


def serve(model, items, *, label: str | None = None, hw=None, on_step=None, **engine_kw):
    """Run a workload (a list of WorkItem) through a fresh engine on simulated time; returns
    (summary, engine). `serve-sim`, the lessons and the benchmarks all run workloads through here."""
    engine = Engine(model, on_step=on_step, **engine_kw)
    for w in items:
        engine.add_request(w.prompt, w.max_tokens, w.sampling, arrival=w.arrival)
    engine.run()
    return summarize(engine, label, hw), engine
