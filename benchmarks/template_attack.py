"""A benign chat's latency while clients attack with slow chat templates, and the endings of a
SIGTERM that comes while chats wait for their render. Run it on two checkouts to compare them.

The server (random-tiny, GPT-2's tokenizer) gets a chat template that loops once per character of
each message: "hi" renders in milliseconds, a 9,000-character message runs past the 2 s render
budget. Each client has its own source address on 127.0.0.0/8, as separate machines would. Phases,
each on a fresh server:

    alone    the benign client's chats, one at a time, no attack
    burst    100 slow chats sent and reset at once, then the benign client's chats
    attack   24 attackers (24 addresses), each sending slow chats back to back; a benign chat
             starts every --every seconds on its own connection
    sigterm  12 slow chats from 12 addresses, SIGTERM once they are all in: each one's status and
             content type, the seconds to the last answer and to the exit, tracebacks on stderr

Latencies are seconds from sending the benign chat to its whole answer; medians and p90 of each
phase, with the count.

    python benchmarks/template_attack.py [--checkout PATH] [--seconds 40] [--phases alone,burst,attack,sigterm]
    python benchmarks/template_attack.py --json

--checkout: the minillm source tree the server runs (default: this one); e.g. a worktree of an
older commit, to measure the same attack before a change.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
SLOW = ("{% for m in messages %}{% for i in range(m['content']|length) %}{% for j in range(10000) %}{% endfor %}"
        "{% endfor %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
LONG = "x" * 9_000

SERVER = """
import sys, os
sys.path.insert(0, os.getcwd())
import minillm
from minillm.serving.http import Limits, Server
from minillm.serving.loop import EngineLoop
template = sys.argv[1]
class Templated:
    def __init__(self):
        self.enc, self.chat_template = minillm.tokenizer(), template
    def __getattr__(self, name):
        return getattr(self.enc, name)
model = minillm.load("random-tiny", quiet=True)
loop = EngineLoop(model, kv_memory=16 << 20, block_size=16, max_seqs=8)
server = Server(("127.0.0.1", 0), loop, model.name, limits=Limits(grace=float(sys.argv[2])))
server.front.enc = Templated()
loop.start()
import signal                    # uvicorn raises SIGTERM again once it has stopped: exit 0, as `minillm serve`
signal.signal(signal.SIGTERM, lambda signum, frame: None)
print("listening on", server.server_address[1], flush=True)
try:
    server.serve()
finally:
    server.server_close()
    loop.stop(grace=1.0)
"""


def start(checkout: Path, grace: float = 5.0) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen([sys.executable, "-c", SERVER, SLOW, str(grace)], cwd=checkout, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("listening on"):
        raise SystemExit(f"the server did not start: {line}{p.stderr.read()}")
    return p, int(line.split()[-1])


def stop(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def body(content: str) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 2}).encode()


def chat(port: int, content: str, source: str, timeout: float = 300, errors: list | None = None):
    """(status, seconds, content type) of one chat; status 0 if the connection failed. `errors`: the
    error messages of statuses other than 200 are added to it."""
    t0 = time.monotonic()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))
        conn.request("POST", "/v1/chat/completions", body=body(content), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        conn.close()
        if errors is not None and r.status != 200:
            try:
                errors.append(f"{r.status} {json.loads(raw)['error']['message'][:90]}")
            except (ValueError, KeyError, TypeError):
                errors.append(f"{r.status} {raw[:90]!r}")
        return r.status, time.monotonic() - t0, r.getheader("Content-Type") or ""
    except OSError:
        return 0, time.monotonic() - t0, ""


def reset_chat(port: int, content: str, source: str) -> None:
    s = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    b = body(content)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(b)}\r\n\r\n".encode() + b)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def summary(times: list[float]) -> dict:
    s = sorted(times)
    return {"n": len(s), "p50": s[len(s) // 2] if s else None, "p90": s[int(0.9 * (len(s) - 1))] if s else None}


BENIGN = "127.0.0.1"


def alone(checkout: Path, n: int = 10) -> dict:
    p, port = start(checkout)
    try:
        chat(port, "hi", BENIGN)                                   # warm: the first worker starts
        got = [chat(port, "hi", BENIGN) for _ in range(n)]
    finally:
        stop(p)
    return {"statuses": dict(Counter(s for s, _, _ in got)), **summary([t for _, t, _ in got])}


def burst(checkout: Path, n_slow: int = 100, n: int = 5) -> dict:
    p, port = start(checkout)
    try:
        chat(port, "hi", BENIGN)
        for i in range(n_slow):
            reset_chat(port, LONG, f"127.0.1.{i % 250 + 1}")
        time.sleep(0.5)
        got = [chat(port, "hi", BENIGN) for _ in range(n)]
    finally:
        stop(p)
    return {"first": got[0][1], "statuses": dict(Counter(s for s, _, _ in got)), **summary([t for _, t, _ in got])}


def attackers(port: int, n: int, seconds: float, out) -> None:
    """The attack, in a process of its own (its threads must not slow the benign client's): n
    clients sending slow chats back to back, a refused one trying again at once. -> out: statuses."""
    done, hostile = threading.Event(), Counter()

    def attacker(i: int) -> None:
        while not done.is_set():
            hostile[chat(port, LONG, f"127.0.2.{i + 1}", timeout=120)[0]] += 1

    threads = [threading.Thread(target=attacker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    done.set()
    for t in threads:
        t.join(timeout=120)
    out.put(dict(hostile))


def attack(checkout: Path, seconds: float, n_attackers: int = 24, every: float = 2.0) -> dict:
    import multiprocessing
    p, port = start(checkout)
    benign, errors = [], []
    try:
        chat(port, "hi", BENIGN)
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        attack = ctx.Process(target=attackers, args=(port, n_attackers, seconds + 1.0, out))
        attack.start()
        time.sleep(1.0)                                            # the attack is under way

        def one() -> None:
            benign.append(chat(port, "hi", BENIGN, errors=errors))

        askers, t_end = [], time.monotonic() + seconds
        while time.monotonic() < t_end:
            askers.append(threading.Thread(target=one, daemon=True))
            askers[-1].start()
            time.sleep(every)
        for t in askers:
            t.join(timeout=300)
        hostile = out.get(timeout=300)
        attack.join(timeout=60)
    finally:
        stop(p)
    return {"attackers": n_attackers, "attack_statuses": hostile, "errors": dict(Counter(errors)),
            "statuses": dict(Counter(s for s, _, _ in benign)), **summary([t for _, t, _ in benign])}


def sigterm(checkout: Path, n: int = 12, grace: float = 5.0) -> dict:
    p, port = start(checkout, grace)
    endings: list = []
    chat(port, "hi", BENIGN)
    threads = [threading.Thread(target=lambda i=i: endings.append(chat(port, LONG, f"127.0.3.{i + 1}", timeout=60)))
               for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(1.0)                                                # all sent: four render, the rest wait
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=60)
    answered = time.monotonic() - t0
    try:
        code = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        code = p.wait()
    exited = time.monotonic() - t0
    err = p.stderr.read()
    return {"endings": dict(Counter(f"{s} {ctype.split(';')[0] or '-'}" for s, _, ctype in endings)),
            "answered_s": round(answered, 2), "exited_s": round(exited, 2), "exit_code": code, "grace_s": grace,
            "tracebacks": err.count("Traceback"), "asgi_exceptions": err.count("Exception in ASGI application")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", type=Path, default=HERE, help="the minillm source tree to serve from")
    ap.add_argument("--seconds", type=float, default=40.0, help="length of the attack phase")
    ap.add_argument("--phases", default="alone,burst,attack,sigterm")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = {"checkout": str(a.checkout)}
    for phase in a.phases.split(","):
        t0 = time.monotonic()
        out[phase] = {"alone": lambda: alone(a.checkout), "burst": lambda: burst(a.checkout),
                      "attack": lambda: attack(a.checkout, a.seconds), "sigterm": lambda: sigterm(a.checkout)}[phase]()
        if not a.json:
            print(f"{phase:8} {json.dumps(out[phase])}  ({time.monotonic() - t0:.0f} s)", flush=True)
    if a.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
