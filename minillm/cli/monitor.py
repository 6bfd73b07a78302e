"""`minillm monitor [URL]`: a server's /metrics as one row per interval, like `nvidia-smi dmon`.

Each row is the difference between two scrapes of /metrics, divided by the time between them:
prompt (prefill) and generated (decode) tokens per second; bytes moved and FLOPs done per second,
beside this machine's measured bandwidth and matmul peak (`minillm hardware`); running and waiting
requests, KV blocks in use, preemptions and refused requests in the interval; and the phase the
server is waiting on: the phase that took most of the model's time in the interval, with the
roofline's verdict for the interval's FLOPs per byte (below the machine's ridge: memory; above:
compute), or `KV blocks` when requests wait while no block is free, or `idle`.

It reads minillm serve (everything above), vLLM and llama.cpp's llama-server, each by its own metric
names (serving/engines.py lists them); a column a server does not export shows "-", and so does the
phase when its timings are not exported or did not move while tokens did.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from datetime import datetime
from urllib.parse import urlsplit

from ..errors import MiniLLMError
from ..serving import engines
from ..serving.engines import quantities, total  # noqa: F401  (the names monitor reads, from one place)
from ..serving.prom import parse
from .common import err

HEADER = ("#time   pre/s  dec/s   GB/s %bw GFLOP/s %pk run wait    KV pre  rej waits on",
          "#        tok    tok                                blk")


def add_arguments(p) -> None:
    p.add_argument("url", nargs="?", default="http://127.0.0.1:8000",
                   help="the server: minillm serve, vLLM or llama.cpp's llama-server (default http://127.0.0.1:8000)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between rows (default 1)")
    p.add_argument("--count", type=int, default=None, metavar="N", help="stop after N rows (default: until Ctrl-C)")
    p.add_argument("--json", action="store_true", help="one JSON object per row instead of the table")
    p.add_argument("--api-key", default=os.environ.get("MINILLM_API_KEY"),
                   help="sent as a Bearer token, for a server started with --metrics-key (default: $MINILLM_API_KEY)")


def scrape(host: str, port: int, path: str, key: str | None) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        r = conn.getresponse()
        text = r.read().decode(errors="replace")
    finally:
        conn.close()
    if r.status == 401:
        raise MiniLLMError(f"{path}: the server wants an API key (--api-key or MINILLM_API_KEY)")
    if r.status != 200:
        raise MiniLLMError(f"{path} answered {r.status}: a llama.cpp server needs --metrics to export it")
    return parse(text)


def flavour(m: dict) -> str:
    kind = engines.flavour(m)
    if kind is None:
        raise MiniLLMError("these metrics are not minillm's, vLLM's or llama.cpp's: nothing to show")
    return kind


def server_threads(m: dict) -> int | None:
    """The BLAS threads a minillm server says its steps run on (None when it does not say)."""
    n = total(m, "minillm_blas_threads")
    return int(n) if n and n >= 1 else None


def row(prev: dict, now: dict, dt: float, bandwidth_gbs: float, peak_gflops: float) -> dict:
    def rate(k):
        return None if now[k] is None or prev[k] is None else max(0.0, now[k] - prev[k]) / dt

    def delta(k):
        return None if now[k] is None or prev[k] is None else max(0.0, now[k] - prev[k])

    gbs = None if rate("bytes") is None else rate("bytes") / 1e9
    gflops = None if rate("flops") is None else rate("flops") / 1e9
    pre_s, dec_s = delta("prefill_s"), delta("decode_s")
    busy = (pre_s or 0) + (dec_s or 0)
    if now["waiting"] and now["kv_free"] == 0:
        waits = "KV blocks"
    elif pre_s is None and dec_s is None:
        waits = "-"
    elif busy == 0 and ((delta("prefill_tokens") or 0) + (delta("decode_tokens") or 0)) > 0:
        waits = "-"                  # tokens moved but the timings did not: nothing to read a phase from
    elif busy == 0:
        waits = "idle" if not now["waiting"] else "queue"
    else:
        waits = "prefill" if (pre_s or 0) > (dec_s or 0) else "decode"
        nbytes, flops = delta("bytes"), delta("flops")
        if nbytes:
            ridge = peak_gflops / bandwidth_gbs
            waits += "/mem" if flops / nbytes < ridge else "/cmp"
    return {"time": datetime.now().strftime("%H:%M:%S"), "interval_s": dt,
            "prefill_tok_s": rate("prefill_tokens"), "decode_tok_s": rate("decode_tokens"),
            "gb_s": gbs, "bandwidth_share": None if gbs is None else gbs / bandwidth_gbs,
            "gflop_s": gflops, "peak_share": None if gflops is None else gflops / peak_gflops,
            "running": now["running"], "waiting": now["waiting"], "kv_blocks_used": now["kv_used"],
            "kv_used_pct": now["kv_pct"], "preemptions": delta("preemptions"), "rejected": delta("rejected"),
            "waits_on": waits}


def fmt(r: dict) -> str:
    def n(v, w, d=0):
        return "-".rjust(w) if v is None else f"{v:{w}.{d}f}"

    kv = n(r["kv_blocks_used"], 5) if r["kv_blocks_used"] is not None else (
        "-".rjust(5) if r["kv_used_pct"] is None else f"{r['kv_used_pct']:4.0f}%")
    pct = lambda v: n(None if v is None else 100 * v, 3)  # noqa: E731
    return (f"{r['time']:8} {n(r['prefill_tok_s'], 5)} {n(r['decode_tok_s'], 6, 1)} {n(r['gb_s'], 6, 2)} "
            f"{pct(r['bandwidth_share'])} {n(r['gflop_s'], 7, 1)} {pct(r['peak_share'])} {n(r['running'], 3)} "
            f"{n(r['waiting'], 4)} {kv} {n(r['preemptions'], 3)} {n(r['rejected'], 4)} {r['waits_on']}")


def run(args) -> int:
    if not args.interval > 0:
        raise MiniLLMError(f"--interval {args.interval}: must be more than 0 seconds")
    if args.count is not None and args.count < 1:
        raise MiniLLMError(f"--count {args.count}: must be at least 1")
    parts = urlsplit(args.url if "://" in args.url else f"http://{args.url}")
    if parts.scheme != "http" or not parts.hostname:
        raise MiniLLMError(f"{args.url!r}: expected http://HOST:PORT (the address the server printed)")
    host, port = parts.hostname, parts.port or 80
    path = parts.path.rstrip("/").removesuffix("/v1") + "/metrics"
    try:
        first = scrape(host, port, path, args.api_key)
    except OSError as e:
        raise MiniLLMError(f"no server at {host}:{port} ({e.strerror or e}): start one with `minillm serve`") from None
    kind = flavour(first)
    from ..measure.hardware import machine
    from ..threads import limited
    served = server_threads(first) if kind == "minillm" else None
    with limited(served):            # the figures of the thread count the server runs on, not monitor's own
        hw = machine(progress=not args.json)
    if not args.json:
        print(f"# {kind} at http://{host}:{port}", flush=True)
        on = f" at the server's {served} BLAS thread{'s' if served != 1 else ''}" if served else ""
        print(f"# %bw, %pk: shares of this machine's {hw.bandwidth_gbs:.1f} GB/s and {hw.peak_gflops:.0f} GFLOP/s"
              f"{on}", flush=True)
        if kind != "minillm":
            print(f"# {kind} exports no bytes or FLOPs: those columns show -", flush=True)
        for line in HEADER:
            print(line, flush=True)
    prev, t_prev, shown = quantities(first, kind), time.perf_counter(), 0
    try:
        while args.count is None or shown < args.count:
            time.sleep(max(0.0, t_prev + args.interval - time.perf_counter()))
            try:
                m = scrape(host, port, path, args.api_key)
            except OSError as e:
                err.print(f"[red]minillm monitor:[/] the server at {host}:{port} went away ({e.strerror or e})")
                return 1
            t = time.perf_counter()
            now = quantities(m, kind)
            r = row(prev, now, t - t_prev, hw.bandwidth_gbs, hw.peak_gflops)
            print(json.dumps({"server": kind, **r}) if args.json else fmt(r), flush=True)
            prev, t_prev, shown = now, t, shown + 1
    except KeyboardInterrupt:
        pass
    return 0
