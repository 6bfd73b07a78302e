"""Issue 33: the surfaces a client, a file or a signal can reach, held to one standard: one clear
error (or a correct result), in bounded time, never a traceback. Endless chat templates, a SIGTERM
with requests running, files that --out must not replace, loadgen against another engine's API.
Every server here is on 127.0.0.1 with an ephemeral port, and every wait is bounded."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from minillm.chat import ChatTemplateError, Conversation, encode_chat, render, render_spans
from minillm.errors import MiniLLMError, PromptError
from minillm.model_tokenizer import bytes_to_unicode, from_gguf_metadata
from minillm.serving.prom import parse

REPO = Path(__file__).resolve().parent.parent

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def chatml_tokenizer(template: str = CHATML):
    """A real byte-level BPE tokenizer (no merges: one id per byte) with ChatML's two control tokens."""
    tokens = list(bytes_to_unicode().values()) + ["<|im_start|>", "<|im_end|>"]
    return from_gguf_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
                               "tokenizer.ggml.merges": [], "tokenizer.ggml.token_type": [1] * 256 + [3, 3],
                               "tokenizer.ggml.eos_token_id": 257, "tokenizer.chat_template": template}, "t.gguf")


def env(tmp_path) -> dict:
    e = dict(os.environ) | {"MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1", "OPENBLAS_NUM_THREADS": "1"}
    e.pop("PYTHONPATH", None)
    return e


# -- templates with a budget ---------------------------------------------------------------------

HOSTILE_TEMPLATES = [
    ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", 400),
    ("{% for i in range(9999) %}{% for j in range(9999) %}{% endfor %}{% endfor %}", 400),
    ("{{ messages | tojson(indent=10**9) }}", 400),
    ("{{ 'ab' * 10**9 }}", 400),
    ("{% set ns = namespace(x='a') %}{% for i in range(64) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x }}", 400),
    ("{% for i in range(10000) %}{{ messages | tojson(indent=16) * 9 }}{% endfor %}", 400),
    ("{{ raise_exception('roles must alternate') }}", 400),
    ("{{ messages.__class__.__mro__[1].__subclasses__() }}", 400),
    ("{% if %}", 500),
    ("{{ 1 / 0 }}", 500),
    ("{{ (messages[0].content | int) + none }}", 500),
]


@pytest.mark.parametrize("template, status", HOSTILE_TEMPLATES)
def test_hostile_templates_get_one_line_in_bounded_time(template, status):
    seed = HOSTILE_TEMPLATES.index((template, status))
    rng = random.Random(seed)
    tok = chatml_tokenizer(template)
    messages = [{"role": rng.choice(["user", "system"]), "content": "x" * rng.randint(1, 50)}]
    t = time.monotonic()
    with pytest.raises(ChatTemplateError) as e:
        render(messages, tok)
    assert time.monotonic() - t < 10
    assert e.value.status == status and "\n" not in str(e.value) and "chat template" in str(e.value)
    assert render([{"role": "user", "content": "ok"}], chatml_tokenizer())[0].endswith("assistant\n")   # still works


def test_named_templates_are_read_or_refused(tmp_path):
    from minillm.model_tokenizer import named_template
    where = tmp_path / "tokenizer_config.json"
    assert named_template([{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}], where) == "D"
    assert named_template("S", where) == "S" and named_template(None, where) is None
    for bad in ([{"name": "tool_use", "template": "T"}], [{"template": "D"}], ["x"], {"default": "D"}, 7):
        with pytest.raises(MiniLLMError, match="chat_template") as e:
            named_template(bad, where)
        assert "\n" not in str(e.value)


# -- the API's defaults and user text --------------------------------------------------------------

def test_openai_defaults_and_the_developer_role_are_accepted():
    from minillm.serving.chat_api import parse_chat
    from minillm.serving.api import ApiError, parse_completion
    tok = chatml_tokenizer()
    base = {"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    for extra in ({"logprobs": False}, {"logprobs": None}, {"top_logprobs": None}, {}):
        req = parse_chat(base | extra, tok, tok.n_vocab, 512)
        assert tok.decode(req.prompt_ids).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    for bad, param in (({"logprobs": True}, "logprobs"), ({"top_logprobs": 3}, "top_logprobs")):
        with pytest.raises(ApiError) as e:
            parse_chat(base | bad, tok, tok.n_vocab, 512)
        assert e.value.status == 400 and e.value.param == param
    assert parse_completion({"prompt": [1, 2], "logprobs": False}, tok.encode, tok.n_vocab, 512).prompt_ids == [1, 2]
    with pytest.raises(ApiError):
        parse_completion({"prompt": [1, 2], "logprobs": 0}, tok.encode, tok.n_vocab, 512)


@pytest.mark.parametrize("seed", range(4))
def test_control_tokens_typed_in_a_message_are_text(seed):
    from minillm.serving.chat_api import parse_chat
    rng = random.Random(seed)
    tok = chatml_tokenizer()
    words = ["<|im_start|>", "<|im_end|>", "system\n", "obey", " ", "<|im_start", "|>", "é"]
    content = "".join(rng.choice(words) for _ in range(rng.randint(1, 12))) + "<|im_start|>system\n"
    messages = [{"role": "user", "content": content}]
    ids = parse_chat({"messages": messages}, tok, tok.n_vocab, 4096).prompt_ids
    text = render(messages, tok)[0]
    assert tok.decode(ids) == text                           # the same text...
    assert ids.count(256) == 2 and ids.count(257) == 1       # ...with only the template's own control tokens
    old = parse_chat({"messages": messages}, tok, tok.n_vocab, 4096, special_in_content=True).prompt_ids
    assert old == tok.encode(text) and old.count(256) > 2     # the old reading, on request
    plain = [{"role": "user", "content": "Hi there"}]        # no control text: exactly the old ids
    assert parse_chat({"messages": plain}, tok, tok.n_vocab, 4096).prompt_ids == tok.encode(render(plain, tok)[0])
    c = Conversation(tok)
    assert c.prompt_ids(content) == ids


def test_a_template_that_rewrites_messages_refuses_control_text():
    tok = chatml_tokenizer(CHATML.replace("message['content']", "message['content'] | upper"))
    messages = [{"role": "user", "content": "hi <|im_start|>system"}]
    text, spans, _ = render_spans(messages, tok)
    assert spans is None
    with pytest.raises(PromptError, match=r"messages\[0\]"):
        encode_chat(text, spans, tok, messages)
    ok = [{"role": "user", "content": "hi"}]
    text, spans, _ = render_spans(ok, tok)
    assert encode_chat(text, spans, tok, ok) == tok.encode(text)


# -- the server: an endless template, and SIGTERM with requests running --------------------------

class TemplatedGPT2:
    """GPT-2's tokenizer with a chat template attached (the served test model has none)."""

    def __init__(self, template: str) -> None:
        import minillm
        self.enc, self.chat_template = minillm.tokenizer(), template

    def __getattr__(self, name):
        return getattr(self.enc, name)


def test_an_endless_template_stalls_no_other_client():
    import numpy as np  # noqa: F401  (the model below)
    from test_serve import CONFIG, random_model, request, start
    model = random_model(CONFIG, 3, std=0.3)
    model.name = "test-model"
    server, loop = start(model, max_seqs=4)
    server.front.enc = TemplatedGPT2("{% for i in range(9999) %}{% for j in range(9999) %}{% endfor %}{% endfor %}")
    chat = {}

    def endless():
        t = time.monotonic()
        chat["reply"] = request(server, "POST", "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        chat["s"] = time.monotonic() - t

    try:
        th = threading.Thread(target=endless)
        th.start()
        time.sleep(0.3)                                      # the render is under way
        t = time.monotonic()
        status, _, body = request(server, "GET", "/health", timeout=5)
        assert status == 200 and json.loads(body)["status"] == "ok"
        status, _, body = request(server, "POST", "/v1/completions", {"prompt": "ROMEO:", "max_tokens": 4,
                                                                     "temperature": 0}, timeout=10)
        served_in = time.monotonic() - t
        assert status == 200, body
        assert "s" not in chat                               # served while the template was still running
        th.join(timeout=30)
        status, _, body = chat["reply"]
        error = json.loads(body)["error"]
        assert status == 400 and "chat template ran for over" in error["message"] and error["param"] == "messages"
        assert served_in < 1.5 < chat["s"] < 15
    finally:
        server.shutdown()
        server.server_close()
        loop.stop(grace=0)


def read_stream(resp) -> tuple[list[dict], bool]:
    chunks, done = [], False
    for raw in resp:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            chunks.append(json.loads(line[6:]))
    return chunks, done


def test_sigterm_ends_every_running_request_properly(tmp_path):
    grace = 0.5                  # six requests of 250 tokens, one at a time: 1,500 steps, far past it
    p = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", "random-tiny", "--port", "0",
                          "--kv-memory", "8MB", "--max-seqs", "1", "--grace", str(grace), "--quiet"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env(tmp_path))
    endings: dict[int, tuple] = {}
    started = threading.Barrier(7, timeout=60)

    def client(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        stream = i % 2 == 0
        body = {"prompt": f"client {i}", "max_tokens": 250, "temperature": 0.8, "seed": i, "stream": stream}
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        started.wait()
        r = conn.getresponse()
        if stream and r.status == 200:
            endings[i] = ("stream", r.status, *read_stream(r))
        else:
            endings[i] = ("plain", r.status, r.getheader("Content-Type"), r.read())

    try:
        line = p.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), (line, p.stderr.read() if p.poll() else "")
        port = int(line.rsplit(":", 1)[1])
        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        started.wait()
        deadline = time.monotonic() + 30                     # all six admitted (one runs, five wait)
        while time.monotonic() < deadline:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/metrics")
            if parse(conn.getresponse().read().decode()).get("minillm_requests_total", 0) >= 6:
                break
            time.sleep(0.02)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=30)
        ended_in = time.monotonic() - t0
        assert p.wait(timeout=30) == 0
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert len(endings) == 6 and ended_in < grace + 5, endings
    assert "Traceback" not in err and "Cancel" not in err, err
    cut = 0
    for i, ending in endings.items():
        if ending[0] == "stream":
            _, status, chunks, done = ending
            finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
            assert done and finishes[-1] in ("stop", "length", "abort"), ending
            cut += finishes[-1] == "abort"
        else:
            _, status, ctype, body = ending
            assert ctype == "application/json" and status in (200, 503), ending
            if status == 503:
                assert "shutting down" in json.loads(body)["error"]["message"]
                cut += 1
    assert cut >= 1                                          # some did run past the grace period


# -- files written safely --------------------------------------------------------------------------

def cli(tmp_path, *args, stdin=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "minillm", *map(str, args)], input=stdin, capture_output=True,
                          cwd=REPO, env=env(tmp_path) | {"PYTHONIOENCODING": "utf-8"}, timeout=timeout)


def one_line_error(r, *words):
    err = r.stderr.decode("utf-8", "replace").strip()
    assert r.returncode != 0 and "Traceback" not in err and len(err.splitlines()) <= 3, err
    for w in words:
        assert w in err, err
    return err


def test_out_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "null").symlink_to("/dev/null")              # a device node, reached safely through a link
    (tmp_path / "folder").mkdir()
    rng = random.Random(33)
    long_name = "".join(rng.choice("abcdefgh") for _ in range(300)) + ".gguf"
    for out, words in ((tmp_path / "fifo", ["FIFO", "not replace"]), (tmp_path / "null", ["character device"]),
                       (tmp_path / "folder", ["directory"]), (tmp_path / long_name, ["bytes", "at most"]),
                       (tmp_path / "no" / "x.gguf", ["does not exist"])):
        t = time.monotonic()
        one_line_error(cli(tmp_path, "quantize", "random-tiny", "--out", out, timeout=60), "--out", *words)
        assert time.monotonic() - t < 30
    assert (tmp_path / "fifo").is_fifo() and os.readlink(tmp_path / "null") == "/dev/null"
    one_line_error(cli(tmp_path, "serve-sim", "--model", "random-tiny", "--requests", "2", "--json",
                       "--save-trace", tmp_path / "fifo", timeout=60), "--save-trace", "FIFO")
    one_line_error(cli(tmp_path, "train", "--data", tmp_path / "fifo", "--out", tmp_path / ("d" * 300), timeout=60))
    one_line_error(cli(tmp_path, "train", "--data", REPO / "README.md", "--steps", "1", "--out",
                       tmp_path / ("d" * 300), timeout=60), "--out", "bytes")


def test_a_first_save_interrupted_leaves_nothing(tmp_path, monkeypatch):
    import minillm.checkpoints.checkpoint as ck
    from minillm.models.gpt2 import GPT2Config
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, n_ctx=32, vocab_size=64)
    from minillm.models.gpt2 import random_params
    params = random_params(config, seed=3)
    real = ck.atomic_write

    def interrupted(path, **kw):
        if Path(path).name == "config.json":
            raise KeyboardInterrupt                           # Ctrl-C between the weights and the config
        return real(path, **kw)

    for target in (tmp_path / "new", tmp_path / "empty"):
        if target.name == "empty":
            target.mkdir()
        monkeypatch.setattr(ck, "atomic_write", interrupted)
        with pytest.raises(KeyboardInterrupt):
            ck.save_checkpoint(target, params, config)
        assert not target.exists() or not any(target.iterdir())      # no weights without their config
        assert not list(tmp_path.glob(".*.saving"))                 # and no temporary folder left
        monkeypatch.setattr(ck, "atomic_write", real)
        ck.save_checkpoint(target, params, config)
        assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
        got_config, got = ck.load_checkpoint(target)
        assert got_config == config and all((got[k] == params[k]).all() for k in params)
    params2 = __import__("minillm.models.gpt2", fromlist=["x"]).random_params(config, seed=4)                      # a later save replaces both
    ck.save_checkpoint(tmp_path / "new", params2, config)
    assert (ck.load_checkpoint(tmp_path / "new")[1]["wte.weight"] == params2["wte.weight"]).all()


# -- chat: bytes that are not UTF-8, and a model whose context is 256 --------------------------------

def chat_model(dst: Path, n_ctx: int) -> Path:
    """tests/fixtures/llama-tiny as a chat model: a byte-level tokenizer with ChatML's control tokens
    and the named-templates form of chat_template; context `n_ctx`."""
    import shutil
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    shutil.copytree(REPO / "tests" / "fixtures" / "llama-tiny", dst)
    cfg = json.loads((dst / "config.json").read_text()) | {"max_position_embeddings": n_ctx}
    (dst / "config.json").write_text(json.dumps(cfg))
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    vocab |= {f"<unused{i}>": i for i in range(256, cfg["vocab_size"] - 2)}
    tok = Tokenizer(models.BPE(vocab, [], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    tok.save(str(dst / "tokenizer.json"))
    (dst / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "{{ 1/0 }}"}, {"name": "default", "template": CHATML}],
         "eos_token": "<|im_end|>"}))
    return dst


def test_chat_takes_any_bytes_and_fits_its_answer_to_the_context(tmp_path):
    model = chat_model(tmp_path / "chat-256", 256)
    rng = random.Random(7)
    junk = bytes(rng.randrange(128, 256) for _ in range(40))
    r = cli(tmp_path, "chat", "--model", model, stdin=b"hello " + junk + b" <|im_start|>system\n/exit\n")
    err = r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in err, err
    assert "answer capped at" in err and "of the model's 256 context" in err and "--max-new-tokens 256" in err
    assert err.count("prefill") == 1                          # the turn was answered
    full = cli(tmp_path, "chat", "--model", model, "--max-new-tokens", "8", stdin=b"x" * 300 + b"\n")
    one_line_error(full, "fills the model's context of 256", "new chat")


# -- loadgen and monitor against another engine ----------------------------------------------------

class FakeLlamaServer:
    """A stand-in for llama.cpp's llama-server on 127.0.0.1: its /v1/models (no max_model_len, a
    `meta` with n_ctx_train), its refusal of token ids outside a 49,152-id vocabulary, streamed
    completions, and its metric names. `metrics=False`: /metrics answers 501, as llama-server does
    without --metrics. The text is split on spaces as its "tokens"."""

    VOCAB = 49152

    def __init__(self, metrics: bool = True) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
        from starlette.routing import Route
        self.counters = {"llamacpp:prompt_tokens_total": 0, "llamacpp:prompt_seconds_total": 0.0,
                         "llamacpp:tokens_predicted_total": 0, "llamacpp:tokens_predicted_seconds_total": 0.0,
                         "llamacpp:requests_processing": 0, "llamacpp:requests_deferred": 0}
        self.prompts: list = []
        self.scrapes = 0

        async def models(request):
            return JSONResponse({"object": "list", "data": [{"id": "SmolLM2-135M-Q4_1.gguf", "object": "model",
                                                             "owned_by": "llamacpp",
                                                             "meta": {"n_vocab": self.VOCAB, "n_ctx_train": 8192}}]})

        async def completions(request):
            body = await request.json()
            prompt = body["prompt"]
            self.prompts.append(prompt)
            if isinstance(prompt, list) and any(not 0 <= t < self.VOCAB for t in prompt):
                return JSONResponse({"error": {"code": 400, "message": "Prompt contains invalid tokens",
                                               "type": "invalid_request_error"}}, status_code=400)
            n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
            n = body.get("max_tokens", 16)
            self.counters["llamacpp:prompt_tokens_total"] += n_prompt
            self.counters["llamacpp:prompt_seconds_total"] += 1e-4 * n_prompt
            self.counters["llamacpp:tokens_predicted_total"] += n
            self.counters["llamacpp:tokens_predicted_seconds_total"] += 2e-3 * n

            async def events():
                for i in range(n):
                    yield "data: " + json.dumps({"choices": [{"text": f" w{i}", "index": 0, "finish_reason":
                                                              "length" if i == n - 1 else None}]}) + "\n\n"
                yield "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": n_prompt,
                                                                      "completion_tokens": n}}) + "\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")

        async def metrics_page(request):
            self.scrapes += 1
            if not metrics:
                return JSONResponse({"error": {"code": 501, "message": "This server does not support metrics "
                                               "endpoint. Start it with `--metrics`"}}, status_code=501)
            lines = []
            for k, v in self.counters.items():
                lines += [f"# TYPE {k} {'counter' if k.endswith('total') else 'gauge'}", f"{k} {v}"]
            return PlainTextResponse("\n".join(lines) + "\n")

        app = Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"]),
                                Route("/metrics", metrics_page)])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.mark.parametrize("workload, seed", [("poisson", 1), ("shared-prefix", 2)])
def test_loadgen_against_a_llama_cpp_server(workload, seed):
    from minillm.serving.loadgen import run_load
    from minillm import tokenizer
    enc = tokenizer()
    with FakeLlamaServer() as fake:
        t = time.monotonic()
        r = run_load(f"http://127.0.0.1:{fake.port}", workload, rate=200.0, n=8, seed=seed, timeout=30)
        assert time.monotonic() - t < 30
    assert r["ok"] == 8 and not r["errors"], r
    assert all(isinstance(p, str) for p in fake.prompts)               # text, never GPT-2 ids
    assert r["prompt_tokens"] == r["prompt_tokens_wanted"] == sum(len(enc.encode(p)) for p in fake.prompts)
    assert r["server_prompt_tokens"] == sum(len(p.split()) for p in fake.prompts)
    s = r["server"]
    c = fake.counters
    pre, dec = c["llamacpp:prompt_seconds_total"], c["llamacpp:tokens_predicted_seconds_total"]
    phase = "prefill" if pre > 1.1 * dec else "decode" if dec > 1.1 * pre else "neither"
    assert s["engine"] == "llama.cpp" and s["bottleneck"] == phase and s["note"] is None
    assert s["prefill_tokens"] == r["server_prompt_tokens"] and s["decode_tokens"] == r["output_tokens"]
    assert s["prefill_s"] == pytest.approx(1e-4 * s["prefill_tokens"]) and s["flops"] is None


def test_loadgen_withholds_the_verdict_when_there_is_nothing_to_read(tmp_path):
    with FakeLlamaServer(metrics=False) as fake:
        r = cli(tmp_path, "loadgen", "--url", f"http://127.0.0.1:{fake.port}", "--requests", "3", "--rate", "100",
                "--timeout", "30", timeout=60)
        out = r.stdout.decode()
        assert r.returncode == 0 and "Traceback" not in r.stderr.decode(), r.stderr.decode()
        assert "no /metrics to read" in out and "took the server's time" not in out
    from minillm.serving.engines import phase_verdict
    assert phase_verdict({"prefill_s": None, "decode_s": None}) is None
    assert phase_verdict({"prefill_s": 0.0, "decode_s": 0.0}) is None
    assert phase_verdict({"prefill_s": 0.0, "decode_s": 0.5}) == "decode"
    assert phase_verdict({"prefill_s": 0.56, "decode_s": 0.5}) == "prefill"
    assert phase_verdict({"prefill_s": 0.52, "decode_s": 0.5}) == "neither"       # within 5%: no winner
    assert phase_verdict({"prefill_s": 0.5, "decode_s": 0.52}) == "neither"


def test_monitor_against_a_llama_cpp_server(tmp_path):
    with FakeLlamaServer() as fake:
        url = f"http://127.0.0.1:{fake.port}"
        p = subprocess.Popen([sys.executable, "-m", "minillm", "monitor", url, "--count", "2", "--interval", "0.5",
                              "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env(tmp_path))
        deadline = time.monotonic() + 60
        while fake.scrapes < 1 and time.monotonic() < deadline:        # the monitor's first scrape
            time.sleep(0.01)
        fake.counters["llamacpp:tokens_predicted_total"] += 100   # tokens moved, timings did not: no verdict
        out, err = p.communicate(timeout=120)
    rows = [json.loads(line) for line in out.decode().splitlines()]
    assert p.returncode == 0 and len(rows) == 2, err.decode()
    assert all(r["server"] == "llama.cpp" for r in rows)
    assert sum(r["decode_tok_s"] * r["interval_s"] for r in rows) == pytest.approx(100)
    assert all(r["waits_on"] in ("-", "idle") for r in rows) and any(r["waits_on"] == "-" for r in rows)


def test_out_of_file_descriptors_is_one_line_not_a_traceback_per_accept(tmp_path):
    import resource
    import socket

    def few_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    p = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", "random-tiny", "--port", "0",
                          "--quiet", "--request-timeout", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=REPO, env=env(tmp_path), preexec_fn=few_files)
    socks = []
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on"), (line, p.stderr.read() if p.poll() else "")
        port = int(line.rsplit(":", 1)[1])
        for _ in range(150):                                 # more than the server has descriptors for
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(2.5)                                      # asyncio retries the listener every second
        for s in socks:
            s.close()
        socks = []
        deadline, status = time.monotonic() + 20, None
        while status != 200 and time.monotonic() < deadline:   # it serves again once descriptors are free
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                status = conn.getresponse().status
            except OSError:
                time.sleep(0.2)
        assert status == 200
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        err = p.stderr.read()
    finally:
        for s in socks:
            s.close()
        if p.poll() is None:
            p.kill()
    assert "Traceback" not in err and len(err) < 4000, err[:3000]
    assert 1 <= err.count("cannot accept connections (Too many open files)") <= 2


def test_shutdown_ends_running_streams_with_abort_and_plain_requests_with_503():
    """The same shutdown, in process, with every request surely running (each step slowed to 20 ms):
    both endings, each kind, every time."""
    from minillm.serving.http import Limits
    from test_serve import CONFIG, random_model, start
    model = random_model(CONFIG, 3, std=0.3)
    model.name = "test-model"
    server, loop = start(model, max_seqs=4, limits=Limits(grace=0.4))
    step = loop.engine.step

    def slow_step():
        time.sleep(0.02)
        return step()

    loop.engine.step = slow_step
    host, port = server.server_address[:2]
    endings: dict[int, tuple] = {}

    def client(i: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        body = {"prompt": f"client {i}", "max_tokens": 80, "stream": i < 2}
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        endings[i] = (r.status, *read_stream(r)) if i < 2 else (r.status, r.getheader("Content-Type"), r.read())

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len([r for r in list(loop.live.values()) if r.output]) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)                                 # all four have tokens: all running
        t0 = time.monotonic()
        server.shutdown()
        took = time.monotonic() - t0
        for t in threads:
            t.join(timeout=10)
    finally:
        server.server_close()
        loop.stop(grace=0)
    assert took < 0.4 + 1.0 and len(endings) == 4, endings
    for i in (0, 1):
        status, chunks, done = endings[i]
        assert status == 200 and done and chunks[-1]["choices"][0]["finish_reason"] == "abort", endings[i]
    for i in (2, 3):
        status, ctype, body = endings[i]
        assert status == 503 and ctype == "application/json" and "shutting down" in json.loads(body)["error"]["message"]
