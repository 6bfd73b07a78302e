"""A server left running under overload: `minillm serve` at twice its measured capacity for two
minutes (open loop), with 300 idle connections held open the whole time (re-opened as the server
times them out). Prints replies by status, RSS min/max, threads and descriptors max of the server
process (from /proc), and the KV blocks in use once the load has stopped.

    python benchmarks/serve_soak.py [--seconds 120] [--idle 300] [--model NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

from minillm.serving.loadgen import run_load
from minillm.serving.prom import parse


def proc(pid: int) -> tuple[int, int, int]:
    """RSS bytes, threads, open descriptors of a process."""
    rss = threads = 0
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads, len(os.listdir(f"/proc/{pid}/fd"))


def metrics(port: int) -> dict:
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    return parse(c.getresponse().read().decode())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--idle", type=int, default=300)
    ap.add_argument("--model", default=None)
    ap.add_argument("--workload", default="poisson")
    a = ap.parse_args()
    cmd = [sys.executable, "-m", "minillm", "serve", "--port", "0", "--quiet", "--max-queue-wait", "10"]
    if a.model:
        cmd += ["--model", a.model]
    srv = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    port = int(srv.stdout.readline().rsplit(":", 1)[1])
    url = f"http://127.0.0.1:{port}"
    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            samples.append(proc(srv.pid))
            time.sleep(0.5)

    threading.Thread(target=sample, daemon=True).start()
    # capacity: requests completed per second when the queue never empties (a 30 s burst)
    probe = run_load(url, a.workload, rate=50.0, n=60, seed=7, timeout=120)
    capacity = probe["ok"] / probe["wall_s"]
    rate = 2 * capacity
    n = max(1, int(rate * a.seconds))
    print(f"capacity {capacity:.2f} req/s ({probe['ok']} of 60 in {probe['wall_s']:.1f} s); "
          f"now {n} requests at {rate:.2f} req/s for {a.seconds:.0f} s with {a.idle} idle connections", flush=True)
    idle: list[socket.socket] = []
    reopened = [0]

    def hold():
        while not stop.is_set():
            alive = []
            for s in idle:
                try:
                    s.setblocking(False)
                    if s.recv(1) == b"":
                        s.close()
                        continue
                except BlockingIOError:
                    pass
                except OSError:
                    s.close()
                    continue
                alive.append(s)
            while len(alive) < a.idle:
                try:
                    alive.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                    reopened[0] += 1
                except OSError:
                    break
            idle[:] = alive
            time.sleep(0.5)

    threading.Thread(target=hold, daemon=True).start()
    t0 = time.time()
    r = run_load(url, a.workload, rate=rate, n=n, seed=11, timeout=a.seconds + 120)
    stop.set()
    for s in idle:
        s.close()
    time.sleep(2)
    m = metrics(port)
    rss = [s[0] for s in samples]
    print(json.dumps({
        "seconds": round(time.time() - t0, 1), "requests": r["requests"], "ok": r["ok"], "not_ok": r["errors"],
        "rejected_by_code": {k.split('"')[1]: v for k, v in m.items() if k.startswith("minillm_requests_rejected_total")
                             and v},
        "idle_connections_opened": reopened[0],
        "rss_mb_min_max": [round(min(rss) / 2**20), round(max(rss) / 2**20)],
        "threads_max": max(s[1] for s in samples), "fds_max": max(s[2] for s in samples),
        "kv_blocks_used_after": m["minillm_kv_blocks_used"], "running_after": m["minillm_requests_running"],
        "waiting_after": m["minillm_requests_waiting"], "output_tokens_per_s": round(r["output_tokens_per_s"], 1),
        "ttft_p50_s": r["ttft_p50_s"], "ttft_p95_s": r["ttft_p95_s"]}, indent=1))
    srv.terminate()
    print("server exit code:", srv.wait(timeout=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
