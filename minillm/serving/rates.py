"""Goodput against the request rate: the capacity of one engine under latency targets.

Goodput at one offered load says little: a system that meets every target at 1 request/s may miss
most of them at 4. DistServe compares systems by the **highest request rate at which a share of the
requests (say 90%, the attainment target) still meets the latency targets**, found by sweeping the
rate. `rate_sweep` runs the same seeded workload at each rate, every rate's engine stepped in turn
(interleaved, so a passing load on the machine slows a step of each, not one rate's whole run), and
`highest_rate` reads the answer off: the capacity plan (how many requests per second one engine
takes within the targets) and what a token costs there (engine-seconds per output token).
"""

from __future__ import annotations

from ..errors import MiniLLMError
from .disagg import OnThreads, run_interleaved
from .metrics import engine_for, summarize
from .workloads import WORKLOADS, generate_workload

ATTAINMENT = 0.9        # the share of requests that must meet every target (DistServe's usual 90%)


def parse_rates(text: str) -> list[float]:
    """'1,2,4,8' -> [1.0, 2.0, 4.0, 8.0]: request rates per second, each above 0, in increasing order."""
    example = "write request rates per second, e.g. --rates 1,2,4,8"
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MiniLLMError(f"--rates {text!r}: {example}") from None
    if not rates or any(not r > 0 or r != r or r == float("inf") for r in rates):
        raise MiniLLMError(f"--rates {text!r}: every rate must be a number above 0; {example}")
    if len(set(rates)) != len(rates):
        raise MiniLLMError(f"--rates {text!r}: a rate is given twice")
    return sorted(rates)


def rate_sweep(model, rates: list[float], slo: dict, *, workload: str = "poisson", n: int = 32, seed: int = 0,
               threads: int | None = None, **engine_kw) -> list[dict]:
    """The same seeded workload at each rate (arrivals scaled, the same prompts and lengths), every
    engine on `threads` BLAS threads, stepped in turn. One summary per rate, with `rate` and the share
    of requests that met every target (`attainment`)."""
    if not slo:
        raise MiniLLMError("--rates needs latency targets to meet: add --slo ttft=S,tpot=S (either alone)")
    if workload not in WORKLOADS:
        raise MiniLLMError(f"--rates sweeps a generated workload ({', '.join(WORKLOADS)}): a trace's arrival "
                           "times are fixed")
    c = model.config
    engines = []
    for r in rates:
        items = generate_workload(workload, rate=r, n=n, seed=seed, vocab_size=c.vocab_size, n_ctx=c.n_ctx)
        engines.append(engine_for(model, items, **engine_kw))
    run_interleaved([OnThreads(e, threads) for e in engines])
    out = []
    for r, e in zip(rates, engines):
        s = summarize(e, f"{r:g}/s", slo=slo)
        s["rate"] = r
        s["attainment"] = s["slo_met"]["all"]
        out.append(s)
    return out


def highest_rate(runs: list[dict], attainment: float = ATTAINMENT) -> dict:
    """The highest swept rate whose attainment reaches `attainment`, and what follows from it:
    {"rate", "run", "tokens_per_s", "engine_s_per_mtok", "below": rates under it that missed (noise or
    a non-monotone load), "all_met": every swept rate met it (the capacity is above the sweep)}."""
    met = [r for r in runs if r["attainment"] >= attainment]
    if not met:
        return {"rate": None, "run": None, "attainment": attainment, "all_met": False, "below": []}
    best = max(met, key=lambda r: r["rate"])
    tok_s = best["output_tokens_per_s"]
    return {"rate": best["rate"], "run": best, "attainment": attainment,
            "tokens_per_s": tok_s, "engine_s_per_mtok": 1e6 / tok_s if tok_s > 0 else None,
            "below": [r["rate"] for r in runs if r["rate"] < best["rate"] and r["attainment"] < attainment],
            "all_met": len(met) == len(runs)}


def capacity_words(h: dict, slo_text: str, price_per_hour: float | None = None) -> list[str]:
    """The capacity plan in sentences, from `highest_rate`'s figures."""
    share = f"{h['attainment']:.0%}"
    if h["rate"] is None:
        return [f"No swept rate kept {share} of requests within {slo_text}: the capacity is below the lowest "
                "rate swept (sweep lower rates, or relax the targets)."]
    lines = [f"Capacity: {h['rate']:g} requests/s is the highest swept rate at which {share} of requests met "
             f"{slo_text} ({h['run']['attainment']:.0%} did)"
             + ("; every rate swept met it, so the capacity may be higher: sweep higher rates." if h["all_met"]
                else ".")]
    if h["below"]:
        lines.append("  A lower rate missed it (" + ", ".join(f"{r:g}/s" for r in h["below"]) + "): the runs are "
                     "noisy here; treat the capacity as approximate.")
    if h["engine_s_per_mtok"]:
        hours = h["engine_s_per_mtok"] / 3600
        cost = f", ${price_per_hour * hours:,.2f} at ${price_per_hour:g} an hour" if price_per_hour else ""
        lines.append(f"  There one engine made {h['tokens_per_s']:.1f} output tokens/s: a million output tokens "
                     f"take {hours:.3g} engine-hours{cost}. A load of L requests/s within the targets needs "
                     f"about L ÷ {h['rate']:g} engines like this one.")
    return lines
