"""`minillm loadgen`: an open-loop load generator for `minillm serve`.

The requests are `minillm serve-sim`'s workloads (the same seed gives the same requests, so a real
server's figures sit beside the simulator's), sent at their arrival times whatever the server's pace (open loop: a slow
server builds a queue, as real traffic does), each one streaming, each in its own thread. The
client measures what a user feels: time to first token (request sent -> first text), time between
tokens, end-to-end latency, and output tokens per second over the run. Before and after, it reads
the server's /metrics, so the report can say where the server's time went: prefill or decode.
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

from ..errors import MiniLLMError
from .metrics import goodput, request_tpot
from .prom import parse
from .workloads import WorkItem, load_workload


@dataclass
class Result:
    sent: float
    status: int = 0
    error: str = ""
    first: float | None = None
    gaps: list = field(default_factory=list)
    end: float | None = None
    tokens: int = 0


def one(host: str, port: int, item: WorkItem, result: Result, timeout: float) -> None:
    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        body = {"prompt": item.prompt, "max_tokens": item.max_tokens, "temperature": item.temperature,
                "stream": True, "stream_options": {"include_usage": True}}
        body |= {k: v for k, v in (("top_k", item.top_k), ("top_p", item.top_p), ("seed", item.seed)) if v is not None}
        body = json.dumps(body)
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        result.status = r.status
        if r.status != 200:
            result.error = r.read().decode(errors="replace")[:200]
            return
        last = None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            now = time.perf_counter()
            if chunk.get("usage"):
                result.tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["text"]:
                if result.first is None:
                    result.first = now
                else:
                    result.gaps.append(now - last)
                last = now
        result.end = time.perf_counter()
    except (OSError, http.client.HTTPException, ValueError) as e:
        result.error = f"{e.__class__.__name__}: {e}"


def slo_figures(results: list[Result], wall: float, slo: dict | None) -> dict:
    """TPOT per request ((last token - first) / (tokens - 1), tokens as the text chunks streamed),
    and with targets, goodput over the run's wall time (serving/metrics.py's definitions)."""
    rows = []
    for r in results:
        done = r.status == 200 and r.end is not None and r.first is not None
        ttft = r.first - r.sent if r.first is not None else None
        tpot = request_tpot(r.first, r.first + sum(r.gaps), len(r.gaps) + 1) if r.first is not None else None
        rows.append((ttft, tpot, done))
    tpots = [t for _, t, _ in rows if t is not None]
    out = {"tpot_p50_s": pct(tpots, 50), "tpot_p95_s": pct(tpots, 95)}
    return out | (goodput(rows, wall, slo) if slo else {})


def server_metrics(host: str, port: int) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/metrics")
    return parse(conn.getresponse().read().decode())


def pct(values, q):
    return float(np.percentile(values, q)) if values else None


def run_load(url: str, workload: str, rate: float, n: int, seed: int = 0, timeout: float = 300.0,
             slo: dict | None = None) -> dict:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise MiniLLMError(f"--url {url!r}: expected http://HOST:PORT (the address minillm serve printed)")
    host, port = parts.hostname, parts.port or 80
    if rate <= 0 or n < 1:
        raise MiniLLMError("--rate must be > 0 and --requests at least 1")
    try:
        before = server_metrics(host, port)
    except OSError as e:
        raise MiniLLMError(f"no server at {host}:{port} ({e.strerror or e}): start one with `minillm serve`") from None
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", "/v1/models")
    n_ctx = json.loads(conn.getresponse().read())["data"][0].get("max_model_len", 1024)
    items = load_workload(workload, rate=rate, n=n, seed=seed, n_ctx=n_ctx)
    results, threads = [], []
    t0 = time.perf_counter()
    for item in items:
        delay = t0 + item.arrival - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        res = Result(sent=time.perf_counter())
        results.append(res)
        th = threading.Thread(target=one, args=(host, port, item, res, timeout), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
    wall = time.perf_counter() - t0
    after = server_metrics(host, port)
    ok = [r for r in results if r.status == 200 and r.end is not None]
    ttft = [r.first - r.sent for r in ok if r.first is not None]
    tbt = [g for r in ok for g in r.gaps]
    e2e = [r.end - r.sent for r in ok]
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    prefill_s = delta.get('minillm_step_seconds_total{phase="prefill"}', 0.0)
    decode_s = delta.get('minillm_step_seconds_total{phase="decode"}', 0.0)
    return slo_figures(results, wall, slo) | {
        "url": f"http://{host}:{port}", "workload": workload, "rate": rate, "requests": len(items), "ok": len(ok),
        "errors": {str(r.status or r.error.split(':')[0]): sum(1 for x in results if x.status == r.status)
                   for r in results if r not in ok},
        "wall_s": wall, "output_tokens": sum(r.tokens for r in ok),
        "output_tokens_per_s": sum(r.tokens for r in ok) / wall,
        "ttft_p50_s": pct(ttft, 50), "ttft_p95_s": pct(ttft, 95), "tbt_p50_s": pct(tbt, 50), "tbt_p95_s": pct(tbt, 95),
        "e2e_p50_s": pct(e2e, 50), "e2e_p95_s": pct(e2e, 95),
        "server": {"prefill_s": prefill_s, "decode_s": decode_s,
                   "weights_bytes": delta.get('minillm_bytes_total{kind="weights"}', 0),
                   "kv_read_bytes": delta.get('minillm_bytes_total{kind="kv_read"}', 0),
                   "flops": sum(v for k, v in delta.items() if k.startswith("minillm_flops_total")),
                   "prefill_tokens": delta.get('minillm_tokens_processed_total{phase="prefill"}', 0),
                   "decode_tokens": delta.get('minillm_tokens_processed_total{phase="decode"}', 0),
                   "preemptions": after.get("minillm_preemptions", 0) - before.get("minillm_preemptions", 0),
                   "bottleneck": "prefill" if prefill_s > decode_s else "decode"},
    }
