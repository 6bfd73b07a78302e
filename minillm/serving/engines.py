"""Other engines' /metrics, read by their own names: what `minillm monitor` and `minillm loadgen`
know of minillm serve, vLLM and llama.cpp's llama-server.

  minillm serve      minillm_tokens_processed_total{phase}, minillm_step_seconds_total{phase}, bytes
                     and FLOPs (minillm_bytes_total, minillm_flops_total), running, waiting, KV blocks,
                     preemptions, refused requests
  vLLM               vllm:prompt_tokens_total, vllm:generation_tokens_total; the phases' seconds from
                     vllm:request_prefill_time_seconds_sum and vllm:request_decode_time_seconds_sum;
                     running, waiting, KV use (vllm:kv_cache_usage_perc, or gpu_cache_usage_perc),
                     preemptions. No bytes or FLOPs.
  llama.cpp          llamacpp:prompt_tokens_total, llamacpp:tokens_predicted_total; the phases'
                     seconds from llamacpp:prompt_seconds_total and tokens_predicted_seconds_total;
                     running (requests_processing), waiting (requests_deferred), KV use where it exports
                     llamacpp:kv_cache_usage_ratio. No bytes, FLOPs or preemptions.

A quantity a server does not export is None, never 0: a verdict is only ever read from numbers the
server gave (`phase_verdict`).
"""

from __future__ import annotations

from ..closeness import CLOSE, figures_apart    # the one closeness rule

NO_TIMINGS = "no phase timings exposed by this server"

# What each engine's phase seconds are. minillm's are its engine thread's step seconds: a batched
# step counts once, so they add up to at most the wall time. vLLM's (request_*_time_seconds_sum) and
# llama.cpp's (prompt_seconds_total, tokens_predicted_seconds_total) are each request's own seconds
# summed over the requests: requests that run together each count the same second, so the sum can
# pass the wall time (decode 44.65 s in a 15.9 s run). Only a comparison of the two phases is read
# from them, never a share of the server's time.
SUMMED_PER_REQUEST = {"vllm", "llama.cpp"}


def seconds_kind(kind: str | None) -> str:
    """"per_request_sum" (each request's seconds, added up) or "step" (the server's own step time)."""
    return "per_request_sum" if kind in SUMMED_PER_REQUEST else "step"


def total(m: dict, name: str, **labels) -> float | None:
    """The sum of every series of metric `name` whose labels include `labels`; None if there is none."""
    found, s = False, 0.0
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for key, value in m.items():
        base = key.split("{", 1)[0]
        if base == name and all(w in key for w in want):
            found, s = True, s + value
    return s if found else None


def flavour(m: dict) -> str | None:
    """Which engine wrote these metrics (by their names), or None."""
    names = " ".join(m)
    if "minillm_" in names:
        return "minillm"
    if "vllm:" in names:
        return "vllm"
    if "llamacpp:" in names:
        return "llama.cpp"
    return None


def quantities(m: dict, kind: str | None) -> dict:
    """The cumulative and current quantities of one scrape (None: not exported)."""
    if kind == "minillm":
        return {"prefill_tokens": total(m, "minillm_tokens_processed_total", phase="prefill"),
                "decode_tokens": total(m, "minillm_tokens_processed_total", phase="decode"),
                "bytes": total(m, "minillm_bytes_total"), "flops": total(m, "minillm_flops_total"),
                "weights_bytes": total(m, "minillm_bytes_total", kind="weights"),
                "kv_read_bytes": total(m, "minillm_bytes_total", kind="kv_read"),
                "prefill_s": total(m, "minillm_step_seconds_total", phase="prefill"),
                "decode_s": total(m, "minillm_step_seconds_total", phase="decode"),
                "running": total(m, "minillm_requests_running"), "waiting": total(m, "minillm_requests_waiting"),
                "kv_used": total(m, "minillm_kv_blocks_used"), "kv_free": total(m, "minillm_kv_blocks_free"),
                "kv_pct": None, "preemptions": total(m, "minillm_preemptions_total"),
                "rejected": total(m, "minillm_requests_rejected_total"),
                "cancelled": total(m, "minillm_requests_cancelled_total")}
    none = dict.fromkeys(("prefill_tokens", "decode_tokens", "bytes", "flops", "weights_bytes", "kv_read_bytes",
                          "prefill_s", "decode_s", "running", "waiting", "kv_used", "kv_free", "kv_pct",
                          "preemptions", "rejected", "cancelled"))
    if kind == "vllm":
        kv = total(m, "vllm:kv_cache_usage_perc")
        kv = total(m, "vllm:gpu_cache_usage_perc") if kv is None else kv
        return none | {"prefill_tokens": total(m, "vllm:prompt_tokens_total"),
                       "decode_tokens": total(m, "vllm:generation_tokens_total"),
                       "prefill_s": total(m, "vllm:request_prefill_time_seconds_sum"),
                       "decode_s": total(m, "vllm:request_decode_time_seconds_sum"),
                       "running": total(m, "vllm:num_requests_running"),
                       "waiting": total(m, "vllm:num_requests_waiting"),
                       "kv_pct": None if kv is None else 100 * kv,
                       "preemptions": total(m, "vllm:num_preemptions_total")}
    if kind == "llama.cpp":
        kv = total(m, "llamacpp:kv_cache_usage_ratio")
        return none | {"prefill_tokens": total(m, "llamacpp:prompt_tokens_total"),
                       "decode_tokens": total(m, "llamacpp:tokens_predicted_total"),
                       "prefill_s": total(m, "llamacpp:prompt_seconds_total"),
                       "decode_s": total(m, "llamacpp:tokens_predicted_seconds_total"),
                       "running": total(m, "llamacpp:requests_processing"),
                       "waiting": total(m, "llamacpp:requests_deferred"),
                       "kv_pct": None if kv is None else 100 * kv}
    return none


def difference(before: dict, after: dict) -> dict:
    """after - before for each quantity both scrapes have (None where either lacks it)."""
    return {k: None if after.get(k) is None or before.get(k) is None else max(0.0, after[k] - before[k])
            for k in after}


TIE = 1 + CLOSE    # phase seconds within the rule's band of each other: neither phase is said to have taken the time


def phase_verdict(delta: dict) -> str | None:
    """"prefill" or "decode": the phase whose seconds grew more, by over TIE; "neither" within it;
    None when the server exports no phase timings, or they did not move (nothing to read a verdict from)."""
    pre, dec = delta.get("prefill_s"), delta.get("decode_s")
    if pre is None and dec is None or not (pre or dec):
        return None
    pre, dec = pre or 0.0, dec or 0.0
    side = figures_apart(pre, dec)       # one run's shares: ranked only beyond the closeness rule's band
    return "prefill" if side > 0 else "decode" if side < 0 else "neither"
