"""A run's numbers, as serving benchmarks report them, from the engine's requests and steps.

    output_tokens_per_s   output tokens / the run's duration (first arrival to last token)
    ttft                  time to first token: arrival -> the end of the step that sampled it
                          (queueing and the whole prefill included)
    tbt                   time between tokens of one request (every gap, all requests pooled)
    tbt                   ...; p95/p99: the gap that 95% / 99% of gaps are no longer than
    tpot                  time per output token, per request: (last token - first token) / (tokens - 1),
                          the mean gap of one request (a request of one token has none)
    e2e                   arrival -> last token
    goodput               requests per second that met every latency target given (--slo
                          ttft=0.5,tpot=0.05; either alone), over the same duration as throughput;
                          `slo_met` is the share of requests that met each target, and all of them.
                          A request of one token meets any TPOT target; an aborted one meets none
    worst_stall           the step that kept running sequences waiting longest for their next token
                          because prompt tokens ran in it: its index, time, prompt tokens and the
                          decode tokens (sequences) that waited
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
    clock                 "measured" (each step advances the simulated clock by its measured duration)
                          or "roofline" (by its price: RooflineClock); on the roofline clock
                          `measured_model_s` is what the model steps really took, and
                          `roofline_share` the priced seconds over them (how near this machine's
                          steps came to its roofline)
"""

from __future__ import annotations

import numpy as np

from ..engine.engine import Engine
from ..errors import MiniLLMError
from ..meter import totals

OTHER_BLOCK_SIZES = (1, 8, 16, 32, 64)


class RooflineClock:
    """A step's price on the roofline: max(its counted bytes ÷ bandwidth, its counted FLOPs ÷ peak), at
    a machine's two measured figures (`Hardware`). Given to an engine as `step_time`, it advances the
    simulated clock instead of the step's measured duration: the steps still run (the tokens are
    real, the meter counts every byte), but when a request arrives relative to a step, and so every
    schedule, latency and ranking drawn from the run, depends on counts, not on what else the
    machine did. A busy machine cannot change it; a run served twice is the same run.

    What it leaves out, and says: the time a step spends outside the roofline (Python, dispatch,
    the scheduler, kernels below peak). `roofline_share` in a run's summary gives that gap: the
    priced seconds over the measured ones."""

    def __init__(self, hw) -> None:
        if not hw.peak_gflops or not hw.bandwidth_gbs:
            raise MiniLLMError(f"the roofline clock needs a bandwidth and a FLOP/s peak; {hw.name} has "
                               f"{'no peak' if not hw.peak_gflops else 'no bandwidth'}")
        self.hw = hw

    def __call__(self, info) -> float:
        r = info.record
        return self.hw.roofline(r.total_bytes, r.total_flops).seconds

    def copy_gbps(self) -> float:
        """A link priced as a copy in this machine's memory: every byte read once and written once, at
        the measured bandwidth (in gigabits per second, as links are quoted)."""
        return self.hw.bandwidth_gbs * 8 / 2

    def words(self) -> str:
        """'the roofline clock (21.4 GB/s, 204 GFLOP/s)'."""
        return f"the roofline clock ({self.hw.bandwidth_gbs:.3g} GB/s, {self.hw.peak_gflops:.3g} GFLOP/s)"


SLO_KEYS = {"ttft": "time to first token", "tpot": "time per output token"}


def pct(values, q: float) -> float | None:
    """The q-th percentile of the values (numpy's linear interpolation); None when there are none."""
    return float(np.percentile(values, q)) if len(values) else None


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=0.5,tpot=0.05' -> {'ttft': 0.5, 'tpot': 0.05} (seconds; either alone); None -> {}."""
    if text is None:
        return {}
    example = "write targets in seconds, e.g. --slo ttft=0.5,tpot=0.05 (either alone)"
    out: dict[str, float] = {}
    for part in text.split(","):
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or not key:
            raise MiniLLMError(f"--slo {text!r}: {part.strip()!r} is not NAME=SECONDS; {example}")
        if key.lower() not in SLO_KEYS:
            raise MiniLLMError(f"--slo {text!r}: unknown target {key!r}; the targets are ttft and tpot")
        key = key.lower()
        if key in out:
            raise MiniLLMError(f"--slo {text!r}: {key} is given twice")
        try:
            v = float(value.removesuffix("s"))
        except ValueError:
            raise MiniLLMError(f"--slo {text!r}: {key}={value!r} is not a number of seconds") from None
        if not (v > 0 and np.isfinite(v)):
            raise MiniLLMError(f"--slo {text!r}: {key} must be a number of seconds above 0")
        out[key] = v
    return out


def request_tpot(first: float | None, last: float | None, n_tokens: int) -> float | None:
    """(last token - first token) / (tokens - 1); None for a request of fewer than two tokens."""
    if first is None or last is None or n_tokens < 2:
        return None
    return (last - first) / (n_tokens - 1)


def goodput(per_request: list[tuple], duration: float, slo: dict[str, float]) -> dict:
    """per_request: (ttft or None, tpot or None, finished) for every request sent. Goodput: requests
    that finished and met every target, per second of `duration`; and the share that met each."""
    n = len(per_request)

    def meets(ttft, tpot, finished, key):
        if not finished:
            return False
        if key == "ttft":
            return ttft is not None and ttft <= slo["ttft"]
        return tpot is None or tpot <= slo["tpot"]          # one token: no gap to miss the target by

    each = {k: sum(meets(*r, k) for r in per_request) for k in slo}
    good = sum(all(meets(*r, k) for k in slo) for r in per_request)
    return {"slo": dict(slo), "good_requests": good,
            "goodput_rps": good / duration if duration > 0 else 0.0,
            "slo_met": {**{k: v / n if n else 0.0 for k, v in each.items()}, "all": good / n if n else 0.0}}


def latency(per_request: list[tuple], duration: float, slo: dict[str, float]) -> dict:
    """TTFT, TPOT and TBT figures from each request's (arrival, token times, finished); with goodput
    when targets are given."""
    ttft = [t[0] - a for a, t, _ in per_request if t]
    tpot = [x for x in (request_tpot(t[0], t[-1], len(t)) if t else None for _, t, _ in per_request)
            if x is not None]
    tbt = [b - a for _, t, _ in per_request for a, b in zip(t, t[1:])]
    out = {"ttft_p50_s": pct(ttft, 50), "ttft_p95_s": pct(ttft, 95),
           "tpot_p50_s": pct(tpot, 50), "tpot_p95_s": pct(tpot, 95),
           "tbt_p50_s": pct(tbt, 50), "tbt_p95_s": pct(tbt, 95), "tbt_p99_s": pct(tbt, 99)}
    if slo:
        rows = [(t[0] - a if t else None, request_tpot(t[0], t[-1], len(t)) if t else None, done)
                for a, t, done in per_request]
        out |= goodput(rows, duration, slo)
    return out


def per_request(rows: list[tuple], ids: list) -> list[dict]:
    """Each request's view: its arrival, TTFT, TPOT, its longest gap and the time of every token."""
    out = []
    for rid, (a, t, done) in zip(ids, rows):
        gaps = [y - x for x, y in zip(t, t[1:])]
        out.append({"id": rid, "arrival_s": a, "finished": bool(done), "tokens": len(t),
                    "ttft_s": t[0] - a if t else None, "tpot_s": request_tpot(t[0], t[-1], len(t)) if t else None,
                    "max_gap_s": max(gaps, default=None), "token_times_s": list(t)})
    return out


def worst_stall(steps) -> dict | None:
    """The step with prompt tokens that held the most decoding sequences longest: seconds x decode
    tokens waiting in it (each running sequence waits the whole step for its next token)."""
    best, score = None, 0.0
    for i, s in enumerate(steps):
        if s.prefill_tokens and s.decode_tokens and s.seconds * s.decode_tokens > score:
            best, score = (i, s), s.seconds * s.decode_tokens
    if best is None:
        return None
    i, s = best
    return {"step": i, "start_s": s.start, "seconds": s.seconds, "prefill_tokens": s.prefill_tokens,
            "decode_tokens": s.decode_tokens}


def step_fit(steps) -> dict | None:
    """Least squares of a step's measured seconds against the tokens in it: seconds = a + b x tokens.
    a is what every step pays whatever its size (the weights read once, the per-step overhead of NumPy,
    Python and the scheduler: on this CPU mostly the overhead, so compare it with the weights' bytes ÷
    bandwidth before calling it a read); b each token's share of the arithmetic. A step of budget B
    takes about a + b x B. r² says how much of the steps' time the token count explains: with a low
    r² or a negative a the fit means nothing (measure.comparisons.fit_problem)."""
    n = np.array([s.n_tokens for s in steps], dtype=float)
    t = np.array([s.seconds for s in steps], dtype=float)
    if len(steps) < 3 or np.ptp(n) == 0:
        return None
    b, a = np.polyfit(n, t, 1)
    pred = a + b * n
    ss = float(((t - t.mean()) ** 2).sum())
    r2 = 1 - float(((t - pred) ** 2).sum()) / ss if ss else 0.0
    return {"fixed_s": float(a), "per_token_s": float(b), "r2": r2, "steps": len(steps),
            "max_tokens": int(n.max())}


def summarize(engine, label: str | None = None, hw=None, slo: dict | None = None) -> dict:
    reqs = [r for r in engine.requests.values() if not r.aborted]
    steps = engine.steps
    out_tokens = sum(len(r.output) for r in reqs)
    start = min((r.arrival for r in reqs), default=0.0)
    end = max((r.finished_at for r in reqs if r.finished_at is not None), default=start)
    duration = end - start
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
    priced = getattr(engine, "step_time", None) is not None
    sched = engine.scheduler
    result = {
        "policy": label or sched.policy,
        "scheduler": sched.policy,
        "requests": len(reqs),
        "prefix_cache": engine.blocks.prefix_cache,
        "kernels": engine.model.kernels,
        "block_size": engine.blocks.block_size,
        "kv_blocks": engine.blocks.num_blocks,
        "max_seqs": sched.max_seqs,
        "max_batched_tokens": sched.max_batched_tokens,
        "duration_s": duration,
        "steps": len(steps),
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / duration if duration > 0 else 0.0,
        **latency([(r.arrival, r.token_times, r.done) for r in reqs], duration, slo or {}),
        "e2e_p50_s": pct(e2e, 50), "e2e_p95_s": pct(e2e, 95),
        "mean_batch": float(np.mean([len(s.seqs) for s in steps])) if steps else 0.0,
        "preemptions": sched.preemptions,
        "prefix_hit_rate": engine.blocks.hit_rate,
        "prefix_hit_tokens": engine.blocks.hit_tokens,
        "prefill_tokens": sum(s.prefill_tokens for s in steps),
        "decode_tokens": sum(s.decode_tokens for s in steps),
        "prefill_flops": int(prefill_flops),
        "prefill_seconds": sum(s.seconds * prefill_share(s) / s.record.total_flops for s in steps
                               if s.record is not None and s.record.total_flops),
        "busy_seconds": sum(s.seconds for s in steps),
        "kv_waste": 1 - used / reserved if reserved else 0.0,
        "kv_waste_contiguous": 1 - total_len / contiguous if contiguous else 0.0,
        "kv_waste_by_block_size": {str(k): v for k, v in by_bs.items()},
        "phases": phases(steps, hw, priced=priced),
        "worst_stall": worst_stall(steps),
        "per_request": per_request([(r.arrival, r.token_times, r.done) for r in reqs], [r.id for r in reqs]),
        "scheduler_overhead_share": 1 - sum(s.model_seconds for s in steps if s.record is not None) / (
            sum(s.seconds for s in steps) or 1.0) if steps and steps[0].record is not None and not priced else None,
        **clock_fields(engine),
    }
    return result


def clock_fields(engine) -> dict:
    """Which clock a run's times are on and, on the roofline clock, how the steps' measured time
    compares with their price."""
    if getattr(engine, "step_time", None) is None:
        return {"clock": "measured"}
    steps = engine.steps
    priced = sum(s.seconds for s in steps)
    measured = sum(s.model_seconds for s in steps)
    return {"clock": "roofline", "measured_model_s": measured,
            "roofline_share": priced / measured if measured > 0 else None}


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


def phases(steps, hw=None, priced: bool = False) -> dict:
    """Seconds, share of the model's time, bytes, FLOPs and the roofline's verdict, per step kind.
    priced: the steps ran on a priced clock (`RooflineClock`): each kind's seconds, its share and the
    time-weighted bound read the steps' prices (the same every run); GB/s, GFLOP/s and `of_roofline`
    stay measured."""
    def cost(s) -> float:
        return s.seconds if priced else s.record.seconds

    total = sum(cost(s) for s in steps if s.record is not None) or 1.0
    out = {}
    for kind in ("prefill", "mixed", "decode"):
        mine = [s for s in steps if s.record is not None and s.record.kind == kind]
        recs = [s.record for s in mine]
        if not recs:
            continue
        t = totals(recs)
        secs = sum(cost(s) for s in mine)
        d = {"steps": t.steps, "seconds": secs, "share": secs / total, "bytes": t.bytes, "flops": t.flops,
             "intensity": t.intensity, "gbps": t.gbps, "gflops": t.gflops}
        if hw is not None and hw.peak_gflops:
            # the verdict of each step on its own, then time-weighted
            bound = {"memory": 0.0, "compute": 0.0}
            best = 0.0
            for st in mine:
                r = st.record
                rl = hw.roofline(r.total_bytes, r.total_flops)
                bound[rl.bound] += cost(st)
                best += rl.seconds
            d["bound"] = max(bound, key=bound.get)
            d["bound_share"] = bound[d["bound"]] / secs if secs else 0.0
            d["of_roofline"] = best / t.seconds if t.seconds else 0.0
        out[kind] = d
    return out


def engine_for(model, items, **engine_kw) -> Engine:
    """A fresh engine (on simulated time unless `clock=` is given) with a workload's requests (a
    list of WorkItem) queued, not run."""
    engine = Engine(model, **engine_kw)
    for w in items:
        engine.add_request(w.prompt, w.max_tokens, w.sampling, arrival=w.arrival)
    return engine


def serve(model, items, *, label: str | None = None, hw=None, on_step=None, **engine_kw):
    """Run a workload (a list of WorkItem) through a fresh engine on simulated time; returns
    (summary, engine). `serve-sim`, the lessons and the benchmarks all run workloads through here."""
    engine = engine_for(model, items, on_step=on_step, **engine_kw)
    engine.run()
    return summarize(engine, label, hw), engine


# The timed figures of a run: the ones a comparison ranks, kept per round when a workload is served
# several times (`merge_rounds`), so the rankings go through the one closeness rule (closeness.py).
ROUND_KEYS = ("output_tokens_per_s", "duration_s", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s",
              "tbt_p50_s", "tbt_p95_s", "tbt_p99_s", "e2e_p50_s", "e2e_p95_s", "goodput_rps", "mean_batch")


def merge_rounds(summaries: list[dict]) -> dict:
    """One summary of the same configuration served in several rounds: the first round's fields, each
    timed figure (ROUND_KEYS) replaced by its median over the rounds, and `rounds`: {figure: [one value
    per round]}, what a ranking reads its spread from. One round: that round, with one-value lists."""
    first = dict(summaries[0])
    rounds = {}
    for key in ROUND_KEYS:
        values = [s.get(key) for s in summaries]
        if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            rounds[key] = [float(v) for v in values]
            first[key] = float(np.median(values))
    if "slo_met" in first:
        rounds["attainment"] = [s["slo_met"]["all"] for s in summaries]
        rounds["good_requests"] = [int(s["good_requests"]) for s in summaries]   # goodput ranks by this count too
    first["rounds"] = rounds
    first["n_rounds"] = len(summaries)
    return first
