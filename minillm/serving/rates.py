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


def rate_engines(model, rates: list[float], *, workload: str = "poisson", n: int = 32, seed: int = 0,
                 threads: int | None = None, **engine_kw) -> list:
    """The same seeded workload at each rate (arrivals scaled, the same prompts and lengths), one engine
    per rate on `threads` BLAS threads, all stepped in turn until done. -> the engines, in rate order."""
    if workload not in WORKLOADS:
        raise MiniLLMError(f"--rates sweeps a generated workload ({', '.join(WORKLOADS)}): a trace's arrival "
                           "times are fixed")
    c = model.config
    engines = []
    for r in rates:
        items = generate_workload(workload, rate=r, n=n, seed=seed, vocab_size=c.vocab_size, n_ctx=c.n_ctx)
        engines.append(engine_for(model, items, **engine_kw))
    run_interleaved([OnThreads(e, threads) for e in engines])
    return engines


def rate_summaries(engines: list, rates: list[float], slo: dict) -> list[dict]:
    """One summary per rate's engine against the targets `slo`, with `rate` and `attainment` (the share
    of requests that met every target)."""
    out = []
    for r, e in zip(rates, engines):
        s = summarize(e, f"{r:g}/s", slo=slo)
        s["rate"] = r
        s["attainment"] = s["slo_met"]["all"]
        out.append(s)
    return out


def rate_sweep(model, rates: list[float], slo: dict, *, workload: str = "poisson", n: int = 32, seed: int = 0,
               threads: int | None = None, **engine_kw) -> list[dict]:
    """`rate_engines`, then `rate_summaries` against `slo`: one summary per rate."""
    if not slo:
        raise MiniLLMError("--rates needs latency targets to meet: add --slo ttft=S,tpot=S (either alone)")
    engines = rate_engines(model, rates, workload=workload, n=n, seed=seed, threads=threads, **engine_kw)
    return rate_summaries(engines, rates, slo)


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


def token_prices(run: dict, kv_bytes_per_token: float, bandwidth_gbs: float) -> dict:
    """What a token costs at one run's load, in engine-seconds per million (multiply by a price per
    hour ÷ 3,600 for money), the way providers price them apart:

        input          the steps' seconds that went to prompt tokens (each step split by its FLOPs),
                       over the prompt tokens;
        output         the rest of the steps' seconds, over the output tokens;
        cached input   a prompt token found in a prefix cache costs no prefill: reloading its KV bytes
                       at `bandwidth_gbs` instead (the reload of an offloaded prefix, lesson 10).

    The engine is paid for while it idles too: each phase carries its share of the idle time
    (duration ÷ busy seconds)."""
    busy = run.get("busy_seconds") or 0.0
    scale = run["duration_s"] / busy if busy > 0 else 1.0
    pre_s = run.get("prefill_seconds", 0.0)
    dec_s = max(0.0, busy - pre_s)
    per_m = lambda s, n: s * scale / n * 1e6 if n else None  # noqa: E731
    cached = kv_bytes_per_token / (bandwidth_gbs * 1e9) * scale * 1e6
    return {"input_s_per_mtok": per_m(pre_s, run.get("prefill_tokens", 0)),
            "cached_input_s_per_mtok": cached,
            "output_s_per_mtok": per_m(dec_s, run.get("output_tokens", 0)), "idle_scale": scale}


def price_lines(p: dict, price_per_hour: float | None) -> list[str]:
    """The three prices in words: engine-hours per million tokens, and money at `price_per_hour`."""
    def each(key):
        s = p[key]
        if s is None:
            return "—"
        hours = s / 3600
        money = price_per_hour * hours if price_per_hour else None
        return f"{hours:.3g} engine-hours" + ("" if money is None else f" (${money:,.2f})" if money >= 0.01
                                              else f" (${money:.2g})")
    lines = [f"  Per million tokens at that load: input {each('input_s_per_mtok')}, cached input "
             f"{each('cached_input_s_per_mtok')}, output {each('output_s_per_mtok')}."]
    if p["input_s_per_mtok"] and p["output_s_per_mtok"]:
        x = lambda v: f"{v:,.0f}×" if v >= 100 else f"{v:.3g}×"  # noqa: E731
        lines.append(f"  An output token costs {x(p['output_s_per_mtok'] / p['input_s_per_mtok'])} an input token "
                     f"here; an input token {x(p['input_s_per_mtok'] / p['cached_input_s_per_mtok'])} a cached one "
                     "(its KV reloaded at this machine's bandwidth, not computed).")
    return lines


def capacity_words(h: dict, slo_text: str, price_per_hour: float | None = None,
                   priced: str | None = None) -> list[str]:
    """The capacity plan in sentences, from `highest_rate`'s figures. priced: the runs' clock words when
    each step was priced from counts (`metrics.RooflineClock`): a lower rate that missed is then the
    schedule's doing, the same every run, not noise."""
    share = f"{h['attainment']:.0%}"
    if h["rate"] is None:
        return [f"No swept rate kept {share} of requests within {slo_text}: the capacity is below the lowest "
                "rate swept (sweep lower rates, or relax the targets)."]
    lines = [f"Capacity: {h['rate']:g} requests/s is the highest swept rate at which {share} of requests met "
             f"{slo_text} ({h['run']['attainment']:.0%} did)"
             + ("; every rate swept met it, so the capacity may be higher: sweep higher rates." if h["all_met"]
                else ".")]
    if h["below"]:
        missed = "  A lower rate missed it (" + ", ".join(f"{r:g}/s" for r in h["below"]) + "): "
        lines.append(missed + ("the runs are noisy here; treat the capacity as approximate." if priced is None
                               else f"on {priced} every run is the same, so this is how the arrivals fell "
                               "at that rate, not noise; attainment need not fall steadily with the rate."))
    if h["engine_s_per_mtok"]:
        hours = h["engine_s_per_mtok"] / 3600
        cost = f", ${price_per_hour * hours:,.2f} at ${price_per_hour:g} an hour" if price_per_hour else ""
        lines.append(f"  There one engine made {h['tokens_per_s']:.1f} output tokens/s: a million output tokens "
                     f"take {hours:.3g} engine-hours{cost}. A load of L requests/s within the targets needs "
                     f"about L ÷ {h['rate']:g} engines like this one.")
    return lines
