"""`minillm serve` over real HTTP on 127.0.0.1 (an ephemeral port, every wait bounded): concurrent
streaming clients get exactly `minillm.generate`'s tokens, a client that leaves frees its blocks,
every bad request gets its status and an OpenAI-style JSON error, the server keeps serving, the
official `openai` client works against it, and the command starts and stops cleanly.

The model is a random float64 GPT-2 with the real vocabulary (so text round-trips through the
tokenizer): in float64 a batched step's logits equal a lone sequence's to rounding, so the tokens
are exactly equal (tests/test_batch.py proves it on its own).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm.models.gpt2 import GPT2Config
from minillm.engine.sequence import EOT
from minillm.serving.http import Limits, Server
from minillm.serving.loop import EngineLoop
from minillm.serving.prom import parse

from test_properties import random_model

REPO = Path(__file__).resolve().parent.parent
CONFIG = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=96, vocab_size=50257)


@pytest.fixture(scope="module")
def model():
    m = random_model(CONFIG, 3, std=0.3)
    m.name = "test-model"
    return m


def start(model, limits=None, api_key=None, metrics_key=False, **kw):
    loop = EngineLoop(model, kv_memory=kw.pop("kv_memory", 4 << 20), block_size=4, **kw)
    server = Server(("127.0.0.1", 0), loop, model.name, limits=limits, api_key=api_key, metrics_key=metrics_key)
    loop.start()
    server.start()
    return server, loop


@pytest.fixture(scope="module")
def served(model):
    server, loop = start(model, max_seqs=8)
    yield server
    server.shutdown()
    server.server_close()
    loop.stop(grace=1)


def request(server, method, path, body=None, raw: bytes | None = None, headers=None, timeout=30):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.status, r.headers, r.read()
    conn.close()
    return out


def stream_text(server, body, timeout=60):
    """POST with stream: true; the concatenated text, the finish reason and the usage chunk."""
    status, _, raw = request(server, "POST", "/v1/completions", {**body, "stream": True,
                                                                  "stream_options": {"include_usage": True}},
                             timeout=timeout)
    assert status == 200, raw
    events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    return text, finish, chunks[-1]["usage"]


def alone(model, prompt, n, temperature, seed):
    enc = minillm.tokenizer()
    ids = minillm.generate(model, enc.encode(prompt), n, temperature=temperature, seed=seed)
    if EOT in ids:
        ids = ids[:ids.index(EOT)]
        return enc.decode(ids), "stop"
    return enc.decode(ids), "length"


def metrics(server) -> dict:
    return parse(request(server, "GET", "/metrics")[2].decode())


def test_concurrent_streaming_clients_get_generate_alone(served, model):
    cases = [(f"ROMEO {i}:", 6 + 3 * i, 0.0 if i % 2 else 0.9, i) for i in range(6)]
    results = [None] * len(cases)

    def client(i, prompt, n, temperature, seed):
        results[i] = stream_text(served, {"prompt": prompt, "max_tokens": n, "temperature": temperature, "seed": seed})

    threads = [threading.Thread(target=client, args=(i, *c)) for i, c in enumerate(cases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for (prompt, n, temperature, seed), (text, finish, use) in zip(cases, results):
        assert (text, finish) == alone(model, prompt, n, temperature, seed)
        assert use["prompt_tokens"] == len(minillm.tokenizer().encode(prompt))
        assert use["total_tokens"] == use["prompt_tokens"] + use["completion_tokens"]
    m = metrics(served)
    assert m["minillm_kv_blocks_used"] == 0 and m["minillm_requests_running"] == 0
    assert m['minillm_bytes_total{kind="weights"}'] > 0 and m['minillm_step_seconds_total{phase="decode"}'] > 0


def test_a_plain_reply_and_token_id_prompts(served, model):
    status, _, raw = request(served, "POST", "/v1/completions",
                             {"prompt": [464, 2068, 7586], "max_tokens": 5, "temperature": 0, "user": "x"})
    body = json.loads(raw)
    assert status == 200 and body["object"] == "text_completion"
    enc = minillm.tokenizer()
    want = minillm.generate(model, [464, 2068, 7586], 5)
    assert body["choices"][0]["text"] == enc.decode(want[:want.index(EOT)] if EOT in want else want)
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": body["usage"]["completion_tokens"],
                             "total_tokens": 3 + body["usage"]["completion_tokens"]}


def test_stop_strings_cut_the_text(served, model):
    text, _, _ = stream_text(served, {"prompt": "a", "max_tokens": 30, "temperature": 0})
    if len(text) < 4:
        pytest.skip("the random model's greedy text is too short to cut")
    stop = text[2:4]
    cut, finish, _ = stream_text(served, {"prompt": "a", "max_tokens": 30, "temperature": 0, "stop": [stop]})
    assert finish == "stop" and cut == text[:text.index(stop)]


def test_a_client_that_leaves_frees_its_blocks(served):
    host, port = served.server_address[:2]
    s = socket.create_connection((host, port), timeout=10)
    body = json.dumps({"prompt": "long", "max_tokens": 90, "temperature": 1.0, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while b"data: " not in got:
        chunk = s.recv(4096)
        assert chunk, "the server closed the stream before its first token"
        got += chunk
    deadline = time.time() + 10
    while metrics(served)["minillm_kv_blocks_used"] == 0 and time.time() < deadline:
        time.sleep(0.01)
    s.close()
    deadline = time.time() + 20
    while time.time() < deadline:
        m = metrics(served)
        if m["minillm_kv_blocks_used"] == 0 and m["minillm_requests_running"] == 0:
            break
        time.sleep(0.05)
    assert m["minillm_kv_blocks_used"] == 0, "the disconnected client's blocks are still held"
    assert m["minillm_requests_cancelled_total"] >= 1


@pytest.mark.parametrize("body, status, param", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"max_tokens": 3}).encode(), 400, "prompt"),
    (json.dumps({"prompt": 5}).encode(), 400, "prompt"),
    (json.dumps({"prompt": ["a", "b"]}).encode(), 400, "prompt"),
    (json.dumps({"prompt": [1, 99999999]}).encode(), 400, "prompt"),
    (json.dumps({"prompt": "a", "max_tokens": "3"}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "a", "max_tokens": 0}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "a", "max_tokens": 500}).encode(), 400, "max_tokens"),
    (json.dumps({"prompt": "word " * 200}).encode(), 400, "prompt"),
    (json.dumps({"prompt": "a", "temperature": -1}).encode(), 400, "temperature"),
    (json.dumps({"prompt": "a", "top_p": 0}).encode(), 400, "top_p"),
    (json.dumps({"prompt": "a", "seed": -3}).encode(), 400, "seed"),
    (json.dumps({"prompt": "a", "stop": [1]}).encode(), 400, "stop"),
    (json.dumps({"prompt": "a", "stream": "yes"}).encode(), 400, "stream"),
    (json.dumps({"prompt": "a", "n": 2}).encode(), 400, "n"),
    (json.dumps({"prompt": "a", "logprobs": 3}).encode(), 400, "logprobs"),
    (json.dumps({"prompt": "a", "logit_bias": {"50256": -100}}).encode(), 400, "logit_bias"),
    (json.dumps({"prompt": "a", "repetition_penalty": 1.2}).encode(), 400, "repetition_penalty"),
    (json.dumps({"prompt": "a", "min_tokens": 4}).encode(), 400, "min_tokens"),
    (json.dumps({"prompt": "a", "ignore_eos": True}).encode(), 400, "ignore_eos"),
    (json.dumps({"prompt": "a", "best_of": 3}).encode(), 400, "best_of"),
    (json.dumps({"prompt": "a", "suffix": "z"}).encode(), 400, "suffix"),
    (json.dumps({"prompt": "a", "presence_penalty": 0.5}).encode(), 400, "presence_penalty"),
    (json.dumps({"prompt": "a", "max_token": 5}).encode(), 400, "max_token"),          # a typo is not a default
    (json.dumps({"prompt": "a", "stream_options": {"include_usage": "yes"}}).encode(), 400, "stream_options"),
    # numbers that used to reach the engine or raise inside the server
    (b'{"prompt": "a", "max_tokens": 1e309}', 400, "max_tokens"),
    (b'{"prompt": "a", "temperature": 1' + b"0" * 400 + b"}", 400, "temperature"),
    (b'{"prompt": "a", "seed": 1' + b"0" * 30 + b"}", 400, "seed"),
    (b'{"prompt": "a", "top_k": 1' + b"0" * 30 + b"}", 400, "top_k"),
    (b'{"prompt": "a", "max_tokens": 1' + b"0" * 5000 + b"}", 400, None),               # over 4,300 digits
    (b'{"prompt": "a", "temperature": NaN}', 400, None),
    (b"[" * 100_000 + b"]" * 100_000, 400, None),                                        # nested 100,000 deep
    (b'{"prompt": "\xff"}', 400, None),                                                  # not UTF-8
])
def test_bad_requests_get_400_naming_the_field(served, body, status, param):
    got, headers, raw = request(served, "POST", "/v1/completions", raw=body)
    err = json.loads(raw)["error"]
    assert got == status and err["param"] == param and err["message"], err
    assert headers["Content-Type"] == "application/json"


def test_routes_methods_and_sizes(served):
    assert request(served, "GET", "/nope")[0] == 404
    status, headers, raw = request(served, "GET", "/v1/completions")
    assert status == 405 and headers["Allow"] == "POST" and json.loads(raw)["error"]["code"] == 405
    assert request(served, "DELETE", "/v1/models")[0] == 405
    status, _, raw = request(served, "POST", "/v1/completions", raw=b"{}",
                             headers={"Content-Length": str(10 << 20), "Content-Type": "application/json"})
    assert status == 413 and "at most" in json.loads(raw)["error"]["message"]
    assert json.loads(request(served, "GET", "/v1/models")[2])["data"][0] | {"created": 0} == {
        "id": "test-model", "object": "model", "created": 0, "owned_by": "minillm", "max_model_len": 96}
    assert json.loads(request(served, "GET", "/health")[2]) == {"status": "ok"}
    status, _, raw = request(served, "POST", "/v1/completions", {"prompt": "still here", "max_tokens": 2})
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] >= 1


def test_a_full_queue_gets_429_with_retry_after(model):
    server, loop = start(model, max_waiting=0)
    try:
        status, headers, raw = request(server, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2})
        assert status == 429 and headers["Retry-After"] == "1"
        assert json.loads(raw)["error"]["type"] == "rate_limit_error"
    finally:
        server.shutdown()
        server.server_close()
        loop.stop(grace=0)
    assert not loop.thread.is_alive()


def test_preemption_under_a_tiny_kv_budget_keeps_the_tokens(model):
    """A pool of a few blocks: sequences are preempted and recomputed; their tokens do not change."""
    server, loop = start(model, kv_memory=12 * 2 * 2 * 16 * 4 * 8, max_seqs=4)   # 12 blocks of 4 positions
    try:
        cases = [(f"p{i}", 20, 0.8, i) for i in range(4)]
        results = [None] * 4
        threads = [threading.Thread(target=lambda i=i, c=c: results.__setitem__(
            i, stream_text(server, {"prompt": c[0], "max_tokens": c[1], "temperature": c[2], "seed": c[3]})))
            for i, c in enumerate(cases)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for c, (text, finish, _) in zip(cases, results):
            assert (text, finish) == alone(model, *c)
        assert loop.preemptions > 0 and loop.pool.allocator.n_free == loop.pool.num_blocks
    finally:
        server.shutdown()
        server.server_close()
        loop.stop(grace=0)


def test_the_official_openai_client(served, model):
    openai = pytest.importorskip("openai")
    host, port = served.server_address[:2]
    client = openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="none", max_retries=0, timeout=60)
    r = client.completions.create(model="test-model", prompt="ROMEO:", max_tokens=6, temperature=0)
    assert (r.choices[0].text, r.choices[0].finish_reason) == alone(model, "ROMEO:", 6, 0.0, None)
    assert r.usage.prompt_tokens == 3 and r.usage.total_tokens == 3 + r.usage.completion_tokens
    parts = list(client.completions.create(model="test-model", prompt="ROMEO:", max_tokens=6, temperature=0,
                                           stream=True, stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices) == r.choices[0].text
    assert parts[-1].usage.completion_tokens == r.usage.completion_tokens
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="test-model", prompt="ROMEO:", max_tokens=-1)
    assert [m.id for m in client.models.list()] == ["test-model"]


def test_the_command_starts_serves_and_stops_on_sigterm(tmp_path):
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1"}
    env.pop("PYTHONPATH", None)
    p = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", "random-tiny", "--port", "0",
                          "--kv-memory", "8MB"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=REPO, env=env)
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), (line, p.stderr.read() if p.poll() else "")
        port = int(line.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "a", "max_tokens": 3}),
                     headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        assert "loopback" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()


@pytest.mark.parametrize("args, words", [
    (["--port", "70000"], ["--port"]),
    (["--kv-memory", "lots"], ["--kv-memory", "256MB"]),
    (["--max-batch", "0"], ["--max-batch"]),
])
def test_the_command_rejects_bad_options_in_one_line(tmp_path, args, words):
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-m", "minillm", "serve", "--model", "random-tiny", *args],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 3
    for w in words:
        assert w in r.stderr


def test_loadgen_against_the_server(served):
    from minillm.serving.loadgen import run_load
    host, port = served.server_address[:2]
    r = run_load(f"http://{host}:{port}", "poisson", rate=50.0, n=6, seed=1, timeout=60)
    assert r["ok"] == 6 and not r["errors"]
    assert r["output_tokens"] > 0 and r["output_tokens_per_s"] > 0
    assert 0 < r["ttft_p50_s"] <= r["ttft_p95_s"] and r["e2e_p95_s"] >= r["ttft_p95_s"]
    s = r["server"]
    assert s["prefill_tokens"] > 0 and s["decode_tokens"] > 0 and s["bottleneck"] in ("prefill", "decode", "neither")
    r2 = run_load(f"http://{host}:{port}", "long-prompt", rate=50.0, n=3, seed=1, timeout=60)
    assert r2["ok"] == 3    # prompts clipped to the model's context, read from /v1/models


def test_loadgen_says_when_no_server_is_there(tmp_path):
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "minillm", "loadgen", "--url", f"http://127.0.0.1:{port}",
                        "--requests", "2"], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert r.returncode == 1 and "no server" in r.stderr and "Traceback" not in r.stderr


def test_the_prefix_cache_serves_shared_prompts_with_the_same_tokens(model):
    server, loop = start(model, prefix_cache=True, max_seqs=4)
    try:
        system = list(range(100, 140))                                   # 40 shared ids: 10 full blocks
        for q in ([7, 8], [9], [10, 11, 12]):
            status, _, raw = request(server, "POST", "/v1/completions",
                                     {"prompt": system + q, "max_tokens": 5, "temperature": 0})
            text = json.loads(raw)["choices"][0]["text"]
            ids = minillm.generate(model, system + q, 5)
            assert status == 200 and text == minillm.tokenizer().decode(ids[:ids.index(EOT)] if EOT in ids else ids)
        assert metrics(server)["minillm_prefix_cache_hit_rate"] > 0.5
    finally:
        server.shutdown()
        server.server_close()
        loop.stop(grace=0)


def test_the_live_view_draws_real_traffic(model):
    import io
    from rich.console import Console
    from minillm.ui.live import LiveView
    buf = io.StringIO()
    view = LiveView(Console(file=buf, force_terminal=True, width=100), title="serve test")
    server, loop = start(model, on_step=view)
    try:
        with view:
            stream_text(server, {"prompt": "ROMEO:", "max_tokens": 8, "temperature": 0})
        assert "KV blocks" in buf.getvalue() and "serve test" in buf.getvalue()
    finally:
        server.shutdown()
        server.server_close()
        loop.stop(grace=0)


# -- issue 21: a server you can leave running ------------------------------------------------------

def raw_exchange(server, data: bytes, timeout: float = 10.0, read_for: float | None = None) -> bytes:
    """Send `data` on a fresh socket; read until the server closes (or `read_for` seconds pass)."""
    s = socket.create_connection(server.server_address[:2], timeout=timeout)
    try:
        s.sendall(data)
        got, end = b"", time.monotonic() + (read_for if read_for is not None else timeout)
        while time.monotonic() < end:
            s.settimeout(max(0.01, end - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        return got
    finally:
        s.close()


def statuses(raw: bytes) -> list[int]:
    """The status of every response in a raw byte stream, each of them parsed whole as JSON."""
    out, rest = [], raw
    while rest:
        head, sep, rest = rest.partition(b"\r\n\r\n")
        assert sep and head.startswith(b"HTTP/1.1 "), f"not a response: {head[:80]!r}"
        lines = head.decode("latin-1").split("\r\n")
        fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        assert fields["content-type"].startswith("application/json"), fields
        n = int(fields["content-length"])
        body, rest = rest[:n], rest[n:]
        err = json.loads(body)["error"]
        assert err["code"] == int(lines[0].split()[1]) and err["message"]
        out.append(err["code"])
    return out


LOCAL = b"Host: 127.0.0.1\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def tight(model):
    """A server with small limits: 8 connections, 1 s to send a request, 1 s idle keep-alive."""
    server, loop = start(model, limits=Limits(max_connections=8, request_timeout=1.0, keep_alive=1.0,
                                              max_header=4096), max_seqs=4)
    yield server, loop
    server.shutdown()
    server.server_close()
    loop.stop(grace=0)


@pytest.mark.parametrize("data, status", [
    (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl", 408),    # half a header
    (b"POST /v1/completions HTTP/1.1\r\n" + LOCAL + b"Content-Length: 1000000\r\n\r\n{\"prompt\"", 408),
    (b"POST /v1/completions HTTP/1.1\r\n" + LOCAL + b"Content-Length: 2000\r\n\r\n" + b" " * 10, 408),
])
def test_a_slow_or_silent_client_is_timed_out(tight, data, status):
    t0 = time.monotonic()
    raw = raw_exchange(tight[0], data, timeout=20)
    assert statuses(raw) == [status] and time.monotonic() - t0 < 15


def test_idle_connections_past_the_cap_do_not_stop_a_client(tight, model):
    server, loop = tight
    host, port = server.server_address[:2]
    # a real client streaming before the idle sockets arrive
    s = socket.create_connection((host, port), timeout=20)
    body = json.dumps({"prompt": "x", "max_tokens": 80, "temperature": 0, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\n" + LOCAL + b"Content-Length: " + str(len(body)).encode()
              + b"\r\n\r\n" + body)
    idle = [socket.create_connection((host, port), timeout=20) for _ in range(20)]    # more than the cap of 8
    try:
        # past the cap a new client is told 503 at once (JSON, Retry-After), not left hanging
        status, headers, raw = request(server, "GET", "/health", timeout=20)
        assert status == 503 and headers["Retry-After"] == "1" and json.loads(raw)["error"]["code"] == 503
        # the streaming client is still served to the end
        got = b""
        while b"data: [DONE]" not in got:
            chunk = s.recv(65536)
            assert chunk, "the streaming client was cut off"
            got += chunk
        # the idle sockets are closed by the server within its request timeout (1 s here)
        for sock in idle:
            sock.settimeout(20)
            assert sock.recv(1) == b""
    finally:
        s.close()
        for sock in idle:
            sock.close()
    status, _, raw = request(server, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2}, timeout=30)
    assert status == 200, raw


def test_a_hundred_clients_at_once_are_all_accepted(served):
    results = []

    def client():
        try:
            results.append(request(served, "GET", "/health", timeout=60)[0])
        except OSError as e:
            results.append(repr(e))

    threads = [threading.Thread(target=client) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert results.count(200) == 100, results
    try:
        out = subprocess.run(["ss", "-ltnH", f"sport = :{served.server_address[1]}"], capture_output=True,
                             text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return
    if len(out) >= 3:                       # Recv-Q Send-Q ...: Send-Q is the listen backlog
        assert int(out[2]) >= min(Limits().backlog, int(Path("/proc/sys/net/core/somaxconn").read_text()))


def test_a_plain_request_whose_client_leaves_is_cancelled(served):
    before = metrics(served)
    s = socket.create_connection(served.server_address[:2], timeout=10)
    body = json.dumps({"prompt": "long", "max_tokens": 90, "temperature": 1.0}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\n" + LOCAL + b"Content-Length: " + str(len(body)).encode()
              + b"\r\n\r\n" + body)
    deadline = time.time() + 10
    while metrics(served)["minillm_kv_blocks_used"] == 0 and time.time() < deadline:
        time.sleep(0.005)
    s.close()
    deadline = time.time() + 20
    while time.time() < deadline:
        m = metrics(served)
        if m["minillm_client_disconnects_total"] > before["minillm_client_disconnects_total"] and \
                m["minillm_kv_blocks_used"] == 0:
            break
        time.sleep(0.02)
    assert m["minillm_client_disconnects_total"] == before["minillm_client_disconnects_total"] + 1
    assert m["minillm_requests_cancelled_total"] >= before["minillm_requests_cancelled_total"] + 1
    assert m["minillm_kv_blocks_used"] == 0 and m["minillm_requests_running"] == 0
    made = m["minillm_generated_tokens_total"] - before["minillm_generated_tokens_total"]
    assert made < 90, "the request ran to the end for nobody"


def test_a_request_expected_to_wait_too_long_is_refused_up_front():
    """Every model step sleeps 20 ms inside the metered step, so the queue's expected wait behind one
    90-token request (~1.8 s) is far over the 0.5 s limit while that request's own first token (one
    step) is far under it, however busy the machine: a second request is refused before it queues."""
    from minillm.models.gpt2 import GPT2
    slow = random_model(CONFIG, 3, std=0.3)
    slow.name = "test-model"
    slow.run = lambda plan: (time.sleep(0.02), GPT2.run(slow, plan))[1]
    server, loop = start(slow, limits=Limits(max_queue_wait=0.5), max_seqs=1)
    try:
        first = threading.Thread(target=stream_text, args=(server, {"prompt": "x", "max_tokens": 90,
                                                                    "temperature": 0}))
        first.start()
        deadline = time.time() + 10
        while metrics(server)["minillm_queue_expected_wait_seconds"] <= 0.5 and time.time() < deadline:
            time.sleep(0.005)
        status, headers, raw = request(server, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 5})
        assert status == 429 and int(headers["Retry-After"]) >= 1, raw
        message = json.loads(raw)["error"]["message"]
        assert re.search(r"expected wait is [1-9][0-9.]* s, over this server's limit of 0.5 s", message), message
        first.join(timeout=60)
        assert not first.is_alive()
        assert metrics(server)['minillm_requests_rejected_total{code="429"}'] == 1
    finally:
        server.shutdown()
        server.server_close()
        loop.stop(grace=0)


def test_a_request_that_cannot_start_in_time_gets_503_not_200(model):
    loop = EngineLoop(model, kv_memory=4 << 20, block_size=4)         # its engine thread never starts
    server = Server(("127.0.0.1", 0), loop, model.name, limits=Limits(max_queue_wait=0.3)).start()
    try:
        for stream in (False, True):
            status, headers, raw = request(server, "POST", "/v1/completions",
                                           {"prompt": "a", "max_tokens": 5, "stream": stream})
            assert status == 503 and int(headers["Retry-After"]) >= 1 and headers["Content-Type"] == \
                "application/json", raw
            assert "without starting" in json.loads(raw)["error"]["message"]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("data, want", [
    # a body the route never reads is discarded, not parsed as the next request
    (b"POST /nope HTTP/1.1\r\n" + LOCAL + b"Content-Length: 41\r\n\r\nGET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
     [404]),
    (b"POST /nope HTTP/1.1\r\n" + LOCAL + b"Transfer-Encoding: chunked\r\n\r\n"
     b"29\r\nGET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n\r\n0\r\n\r\n", [404]),
    (b"POST /v1/completions HTTP/1.1\r\n" + LOCAL + b"Content-Length: 5\r\nContent-Length: 40\r\n\r\n{}",
     [400]),
    (b"POST /nope HTTP/1.1\r\n" + LOCAL + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\nGET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", [400]),
    (b"POST /v1/completions HTTP/1.1\r\n" + LOCAL + "Content-Length: \u00b2\r\n\r\n{}".encode(), [400]),
    (b"POST /v1/completions HTTP/1.1\r\n" + LOCAL + b"Transfer-Encoding: gzip\r\n\r\n", [501]),
    (b"BREW /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", [501]),
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", [414]),
    (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n", [431]),
    (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nbad header\r\n\r\n", [400]),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40, [400]),            # TLS to a plain port
])
def test_no_desync_and_every_error_is_json(tight, data, want):
    server, _ = tight
    got = raw_exchange(server, data, timeout=10, read_for=3)
    assert statuses(got) == want
    assert request(server, "GET", "/health")[0] == 200


def test_the_api_key(model):
    server, loop = start(model, api_key="s3cret")
    try:
        body = {"prompt": "a", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}):
            status, h, raw = request(server, "POST", "/v1/completions", body,
                                     headers={"Content-Type": "application/json", **headers})
            assert status == 401 and h["WWW-Authenticate"] == "Bearer", raw
            assert json.loads(raw)["error"]["type"] == "authentication_error"
        assert request(server, "GET", "/v1/models", headers={})[0] == 401
        auth = {"Content-Type": "application/json", "Authorization": "Bearer s3cret"}
        assert request(server, "POST", "/v1/completions", body, headers=auth)[0] == 200
        assert request(server, "GET", "/v1/models", headers=auth)[0] == 200
        assert request(server, "GET", "/health", headers={})[0] == 200
        assert request(server, "GET", "/metrics", headers={})[0] == 200
        openai = pytest.importorskip("openai")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1", api_key="s3cret",
                               max_retries=0, timeout=60)
        assert client.completions.create(model="m", prompt="a", max_tokens=2).usage.prompt_tokens == 1
    finally:
        server.shutdown()
        server.server_close()
        loop.stop(grace=0)
    server, loop = start(model, api_key="s3cret", metrics_key=True)
    try:
        assert request(server, "GET", "/metrics", headers={})[0] == 401
        assert request(server, "GET", "/metrics", headers={"Authorization": "Bearer s3cret"})[0] == 200
        assert request(server, "GET", "/health", headers={})[0] == 200
    finally:
        server.shutdown()
        server.server_close()
        loop.stop(grace=0)


def test_host_origin_and_content_type_checks(served):
    port = served.server_address[1]
    body = {"prompt": "a", "max_tokens": 2}
    for host in ("evil.example", "evil.example:8000", "10.0.0.1", "127.0.0.1.evil.example"):
        status, _, raw = request(served, "POST", "/v1/completions", body,
                                 headers={"Host": host, "Content-Type": "application/json"})
        assert status == 403 and "Host" in json.loads(raw)["error"]["message"], host
    for origin in ("http://evil.example", "https://attacker.test:8000", "null"):
        status, _, raw = request(served, "POST", "/v1/completions", body,
                                 headers={"Origin": origin, "Content-Type": "application/json"})
        assert status == 403 and "Origin" in json.loads(raw)["error"]["message"], origin
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        status, _, raw = request(served, "POST", "/v1/completions", raw=json.dumps(body).encode(),
                                 headers={"Content-Type": ctype} if ctype else {"Accept": "*/*"})
        assert status == 415 and json.loads(raw)["error"]["code"] == 415
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        assert request(served, "POST", "/v1/completions", body, headers={
            "Host": host, "Origin": f"http://{host}", "Content-Type": "application/json; charset=utf-8"})[0] == 200


def test_metrics_parse_strictly_and_start_at_zero(model):
    from prometheus_client.parser import text_string_to_metric_families
    from minillm.serving.prom import SERIES
    server, loop = start(model)
    try:
        families = {f.name: f for f in text_string_to_metric_families(request(server, "GET", "/metrics")[2].decode())}
        for name, (kind, _, _) in SERIES.items():
            full = f"minillm_{name}".removesuffix("_total") if kind == "counter" else f"minillm_{name}"
            assert full in families and families[full].type == kind, name
        for name in ("minillm_preemptions", "minillm_requests_rejected", "minillm_requests_cancelled",
                     "minillm_client_disconnects", "minillm_bytes"):
            assert families[name].type == "counter", name                       # written as NAME_total
        assert families["minillm_queue_wait_seconds"].type == "histogram"
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in families.values() for s in f.samples}
        assert samples[("minillm_requests_rejected_total", (("code", "429"),))] == 0
        assert samples[("minillm_preemptions_total", ())] == 0
        assert samples[("minillm_requests_cancelled_total", ())] == 0
        request(server, "GET", "/nope")
        stream_text(server, {"prompt": "a", "max_tokens": 4, "temperature": 0})
        text = request(server, "GET", "/metrics")[2].decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        m = parse(text)
        assert m['minillm_requests_rejected_total{code="404"}'] == 1
        assert m["minillm_time_to_first_token_seconds_count"] == 1 == m["minillm_queue_wait_seconds_count"]
        assert m["minillm_time_per_output_token_seconds_count"] <= 1
    finally:
        server.shutdown()
        server.server_close()
        loop.stop(grace=0)


def test_counters_are_exact_and_labels_escaped():
    from minillm.serving.prom import Registry
    from prometheus_client.parser import text_string_to_metric_families
    r = Registry()
    r.inc("bytes_total", 12345678901234567, kind="weights")
    r.inc("step_seconds_total", 0.1 + 0.2, phase="decode")
    r.inc("odd_total", 1, what='a"b\\c\nd')
    text = r.render()
    assert 'minillm_bytes_total{kind="weights"} 12345678901234567' in text
    assert f'minillm_step_seconds_total{{phase="decode"}} {0.1 + 0.2!r}' in text
    (fam,) = [f for f in text_string_to_metric_families(text) if f.name == "minillm_odd"]
    assert fam.samples[0].labels == {"what": 'a"b\\c\nd'}


def test_log_lines_escape_control_characters(model):
    from minillm.serving.http import printable
    assert printable("a\x1b[31mb\r\n") == "a\\x1b[31mb\\r\\n"
    lines = []
    loop = EngineLoop(model, kv_memory=4 << 20, block_size=4)
    server = Server(("127.0.0.1", 0), loop, model.name, log=lines.append).start()
    try:
        raw_exchange(server, b"GET /%1b[2J\x1b HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", read_for=2)
        request(server, "GET", "/%1b%5b2J")
        time.sleep(0.2)
        assert lines and all(line.isprintable() for line in lines), lines
    finally:
        server.shutdown()
        server.server_close()


def test_the_command_refuses_a_public_address_without_a_key(tmp_path):
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    env.pop("MINILLM_API_KEY", None)
    r = subprocess.run([sys.executable, "-m", "minillm", "serve", "--model", "random-tiny", "--host", "0.0.0.0",
                        "--port", "0"], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert r.returncode == 1 and "--api-key" in r.stderr and "--insecure-no-key" in r.stderr
    assert "Traceback" not in r.stderr


def test_loadgen_never_counts_a_cut_off_stream_as_ok(model):
    from minillm.serving.loadgen import run_load
    server, loop = start(model, max_seqs=2)
    out = {}
    try:
        t = threading.Thread(target=lambda: out.update(run_load(
            f"http://127.0.0.1:{server.server_address[1]}", "long-answer", rate=100.0, n=4, seed=2, timeout=60)))
        t.start()
        deadline = time.time() + 30
        while metrics(server)["minillm_generated_tokens_total"] < 5 and time.time() < deadline:
            time.sleep(0.005)
        for r in list(loop.live.values()):      # what a shutdown does to requests still running
            loop.cancel(r)
        t.join(timeout=90)
    finally:
        server.shutdown()
        server.server_close()
        loop.stop(grace=0)
    assert out["ok"] + sum(out["errors"].values()) == 4
    assert out["errors"].get("error-event", 0) >= 1 and out["ok"] < 4, out


def test_monitor_rows_from_a_live_server(served, tmp_path):
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1"}
    env.pop("PYTHONPATH", None)
    url = f"http://127.0.0.1:{served.server_address[1]}"
    p = subprocess.Popen([sys.executable, "-m", "minillm", "monitor", url, "--count", "2", "--interval", "1",
                          "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    before = metrics(served)
    deadline = time.time() + 120
    while p.poll() is None and time.time() < deadline:      # traffic for as long as the monitor watches
        stream_text(served, {"prompt": "ROMEO:", "max_tokens": 20, "temperature": 0})
    out, errs = p.communicate(timeout=120)
    assert p.returncode == 0, errs
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 2 and all(r["server"] == "minillm" for r in rows)
    seen = sum(r["decode_tok_s"] * r["interval_s"] for r in rows)
    made = metrics(served)['minillm_tokens_processed_total{phase="decode"}'] - \
        before['minillm_tokens_processed_total{phase="decode"}']
    assert 0 < seen <= made + 1e-6
    assert any(r["gb_s"] > 0 and 0 < r["bandwidth_share"] for r in rows)
    p = subprocess.run([sys.executable, "-m", "minillm", "monitor", url, "--count", "1", "--interval", "0.2"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert p.returncode == 0 and all(len(line) <= 80 for line in p.stdout.splitlines()), p.stdout
    assert p.stdout.splitlines()[-1].split()[-1] in ("idle", "decode/mem", "prefill/cmp", "decode/cmp", "prefill/mem")


def test_monitor_reads_vllm_and_llama_cpp_metrics():
    from minillm.cli.monitor import flavour, quantities, row
    vllm = parse('vllm:num_requests_running{model_name="m"} 3\nvllm:num_requests_waiting{model_name="m"} 1\n'
                 'vllm:prompt_tokens_total{model_name="m"} 1000\nvllm:generation_tokens_total{model_name="m"} 50\n'
                 'vllm:kv_cache_usage_perc{model_name="m"} 0.25\nvllm:num_preemptions_total{model_name="m"} 0\n'
                 'vllm:request_prefill_time_seconds_sum{model_name="m"} 1.0\n'
                 'vllm:request_decode_time_seconds_sum{model_name="m"} 2.0\n')
    later = dict(vllm) | {'vllm:generation_tokens_total{model_name="m"}': 250,
                          'vllm:request_decode_time_seconds_sum{model_name="m"}': 6.0}
    assert flavour(vllm) == "vllm"
    r = row(quantities(vllm, "vllm"), quantities(later, "vllm"), 2.0, 10.0, 100.0)
    assert r["decode_tok_s"] == 100 and r["prefill_tok_s"] == 0 and r["kv_used_pct"] == 25
    assert r["gb_s"] is None and r["waits_on"] == "decode" and r["running"] == 3
    cpp = parse("llamacpp:prompt_tokens_total 10\nllamacpp:tokens_predicted_total 7\n"
                "llamacpp:prompt_seconds_total 0.5\nllamacpp:tokens_predicted_seconds_total 0.1\n"
                "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n")
    assert flavour(cpp) == "llama.cpp"
    r = row(quantities(cpp, "llama.cpp"), quantities(cpp | {"llamacpp:prompt_tokens_total": 110,
                                                            "llamacpp:prompt_seconds_total": 1.5}, "llama.cpp"),
            1.0, 10.0, 100.0)
    assert r["prefill_tok_s"] == 100 and r["waits_on"] == "prefill" and r["preemptions"] is None
