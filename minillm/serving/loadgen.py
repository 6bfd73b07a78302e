"""`minillm loadgen`: an open-loop load generator for `minillm serve`, or any OpenAI-compatible
server (vLLM, SGLang, llama.cpp's llama-server): `--url` and, where the server needs one, an API key.

The requests are `minillm serve-sim`'s workloads (the same seed gives the same requests, so a real
server's figures sit beside the simulator's), sent at their arrival times whatever the server's pace (open loop: a slow
server builds a queue, as real traffic does), each one streaming, each in its own thread. The
client measures what a user feels: time to first token (request sent -> first text), time between
tokens, end-to-end latency, and output tokens per second over the run. Before and after, it reads
the server's /metrics by that engine's own names (minillm, vLLM, llama.cpp: serving/engines.py), so
the report can say which phase took more time (minillm's step seconds; vLLM's and llama.cpp's are
each request's seconds summed, and say so); a server that exports no phase timings gets no verdict.

Prompts are sent as TEXT, so a server of any vocabulary accepts them: each workload id becomes a
word that is one token to the measuring tokenizer (the target model's, when given, else GPT-2's), so
a prompt of n ids is a text of n tokens to it, and prompts that share ids share their text.

A request counts as ok only if its stream ended as the API says a finished one does: a finish_reason
of "stop" or "length" and then `data: [DONE]`. A stream cut off, or ended by an error event, or an
HTTP error status, is an error, whatever the server's counters say; output tokens are the tokens of
the ok requests (the server's usage chunk, or one per text chunk received where it sends none).
"""

from __future__ import annotations

import http.client
import json
import re
from collections import Counter
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..errors import MiniLLMError
from .engines import NO_TIMINGS, difference, flavour, phase_verdict, quantities, seconds_kind
from .metrics import goodput, pct, request_tpot
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
    chunks: int = 0
    finish: str | None = None
    done: bool = False
    prompt_tokens: int | None = None          # as the server counted them (its usage chunk), if it says

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and self.finish in ("stop", "length") and not self.error

    @property
    def kind(self) -> str:
        """What went wrong, in one word: the HTTP status, 'incomplete' (no [DONE] or finish_reason),
        'error-event' (the server ended the stream with an error), or the exception's name."""
        if self.status and self.status != 200:
            return str(self.status)
        if self.error:
            return self.error.split(":")[0]
        if self.finish == "abort":
            return "abort"
        return "incomplete"


@dataclass
class Target:
    host: str
    port: int
    model: str | None = None
    api_key: str | None = None
    prefix: str = ""

    def headers(self) -> dict:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def one(target: Target, item: WorkItem, result: Result, timeout: float, prompt: str | None = None) -> None:
    try:
        conn = http.client.HTTPConnection(target.host, target.port, timeout=timeout)
        body = {"prompt": item.prompt if prompt is None else prompt, "max_tokens": item.max_tokens,
                "temperature": item.temperature,
                "stream": True, "stream_options": {"include_usage": True}}
        if target.model:
            body["model"] = target.model
        body |= {k: v for k, v in (("top_k", item.top_k), ("top_p", item.top_p), ("seed", item.seed)) if v is not None}
        conn.request("POST", target.prefix + "/v1/completions", body=json.dumps(body), headers=target.headers())
        r = conn.getresponse()
        result.status = r.status
        if r.status != 200:
            result.error = r.read().decode(errors="replace")[:200]
            return
        last = None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                result.done = True
                break
            chunk = json.loads(line[6:])
            now = time.perf_counter()
            if "error" in chunk:
                result.error = "error-event: " + str(chunk["error"].get("message", ""))[:160]
                break
            if chunk.get("usage"):
                result.tokens = chunk["usage"]["completion_tokens"]
                result.prompt_tokens = chunk["usage"].get("prompt_tokens")
            if chunk.get("choices"):
                choice = chunk["choices"][0]
                if choice.get("finish_reason"):
                    result.finish = choice["finish_reason"]
                if choice.get("text"):
                    result.chunks += 1
                    if result.first is None:
                        result.first = now
                    else:
                        result.gaps.append(now - last)
                    last = now
        result.end = time.perf_counter()
        if not result.tokens:
            result.tokens = result.chunks
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as e:
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


def server_metrics(target: Target) -> dict:
    """The server's /metrics samples, or {} if it has none (not every server exports them)."""
    try:
        conn = http.client.HTTPConnection(target.host, target.port, timeout=10)
        conn.request("GET", target.prefix + "/metrics", headers=target.headers())
        r = conn.getresponse()
        text = r.read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return {}
    return parse(text) if r.status == 200 else {}


def prompt_words(enc, gpt2=None) -> list[str]:
    """Words (" apple") that are one token each to `enc`, from GPT-2's vocabulary, in its order."""
    if gpt2 is None:
        from ..bpe import tokenizer
        gpt2 = tokenizer()
    words = []
    for i in range(gpt2.n_vocab):
        try:
            piece = gpt2.decode_single_token_bytes(i)
        except KeyError:
            continue
        if re.fullmatch(rb" [a-z]{3,9}", piece) and len(enc.encode(piece.decode())) == 1:
            words.append(piece.decode())
    if len(words) < 16:
        raise MiniLLMError("the measuring tokenizer reads fewer than 16 common English words as one token each: "
                           "loadgen cannot build prompts of known lengths with it")
    return words


def text_prompt(ids: list[int], words: list[str]) -> str:
    """A text of len(ids) words, one token each: equal ids give equal words (shared prefixes stay shared)."""
    return "".join(words[i % len(words)] for i in ids)


def run_load(url: str, workload: str, rate: float, n: int, seed: int = 0, timeout: float = 300.0,
             slo: dict | None = None, api_key: str | None = None, model: str | None = None,
             tokenizer=None, tokenizer_name: str = "GPT-2") -> dict:
    """Send the workload; what clients felt and what the server's /metrics say. `tokenizer` measures
    the prompts (the target model's, when known; None: GPT-2's, named `tokenizer_name` in the report)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise MiniLLMError(f"--url {url!r}: expected http://HOST:PORT (the address the server printed)")
    target = Target(parts.hostname, parts.port or 80, model, api_key, parts.path.rstrip("/").removesuffix("/v1"))
    host, port = target.host, target.port
    if rate <= 0 or n < 1:
        raise MiniLLMError("--rate must be > 0 and --requests at least 1")
    try:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", target.prefix + "/v1/models", headers=target.headers())
        r = conn.getresponse()
        raw = r.read()
    except OSError as e:
        raise MiniLLMError(f"no server at {host}:{port} ({e.strerror or e}): start one with `minillm serve`") from None
    if r.status == 401:
        raise MiniLLMError(f"{url}: the server wants an API key (--api-key or OPENAI_API_KEY)")
    try:
        card = json.loads(raw)["data"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        raise MiniLLMError(f"{url}/v1/models answered {r.status} without a model list: is it an "
                           "OpenAI-compatible server?") from None
    target.model = target.model or card.get("id")
    n_ctx = card.get("max_model_len") or (card.get("meta") or {}).get("n_ctx_train") or 1024
    if not isinstance(n_ctx, int) or n_ctx < 2:
        n_ctx = 1024
    before = server_metrics(target)
    items = load_workload(workload, rate=rate, n=n, seed=seed, n_ctx=n_ctx)
    if tokenizer is None:
        from ..bpe import tokenizer as gpt2_tokenizer
        tokenizer = gpt2_tokenizer()
    words = prompt_words(tokenizer)
    prompts = [text_prompt(item.prompt, words) for item in items]
    measured = [len(tokenizer.encode(p)) for p in prompts]
    results, threads = [], []
    t0 = time.perf_counter()
    for item, prompt in zip(items, prompts):
        delay = t0 + item.arrival - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        res = Result(sent=time.perf_counter())
        results.append(res)
        th = threading.Thread(target=one, args=(target, item, res, timeout, prompt), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
    wall = time.perf_counter() - t0
    after = server_metrics(target)
    ok = [r for r in results if r.ok]
    ttft = [r.first - r.sent for r in ok if r.first is not None]
    tbt = [g for r in ok for g in r.gaps]
    e2e = [r.end - r.sent for r in ok]
    kind = flavour(after) or flavour(before)
    d = difference(quantities(before, kind), quantities(after, kind))
    verdict = phase_verdict(d)
    counted = [r.prompt_tokens for r in results if r.prompt_tokens is not None]
    return slo_figures(results, wall, slo) | {
        "url": f"http://{host}:{port}", "workload": workload, "rate": rate, "requests": len(items), "ok": len(ok),
        "model": target.model,
        "prompt_tokens": sum(measured), "prompt_tokens_wanted": sum(len(item.prompt) for item in items),
        "prompt_tokenizer": tokenizer_name, "server_prompt_tokens": sum(counted) if counted else None,
        "errors": dict(Counter(r.kind for r in results if not r.ok)),
        "cut_off_tokens": sum(r.chunks for r in results if not r.ok),
        "wall_s": wall, "output_tokens": sum(r.tokens for r in ok),
        "output_tokens_per_s": sum(r.tokens for r in ok) / wall,
        "ttft_p50_s": pct(ttft, 50), "ttft_p95_s": pct(ttft, 95), "tbt_p50_s": pct(tbt, 50), "tbt_p95_s": pct(tbt, 95),
        "e2e_p50_s": pct(e2e, 50), "e2e_p95_s": pct(e2e, 95),
        "server": {"engine": kind, "prefill_s": d["prefill_s"], "decode_s": d["decode_s"],
                   "weights_bytes": d["weights_bytes"], "kv_read_bytes": d["kv_read_bytes"], "flops": d["flops"],
                   "prefill_tokens": d["prefill_tokens"], "decode_tokens": d["decode_tokens"],
                   "preemptions": d["preemptions"], "cancelled": d["cancelled"], "bottleneck": verdict,
                   "seconds": seconds_kind(kind),
                   "note": None if verdict else NO_TIMINGS} if after else None,
    }
