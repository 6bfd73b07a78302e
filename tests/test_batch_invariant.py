"""The batch-invariant kernel set (`kernels="batch-invariant"`, models/kernel_sets.py): every request's
tokens, greedy and seeded, are bit-identical to the same request alone, whatever else shares its
steps, on float32, paged, with prompts chunked by a small step budget and prefixes taken from the cache.

"Alone" is the strongest reference: a fresh engine, the request by itself, its prompt in one step,
no prefix cache. The batched run differs from it in every way the mode must not care about: other
requests in the same steps (prefill, decode and mixed), prompts split at arbitrary chunk borders,
a shared prefix's keys and values computed by another request. Without the mode the same
comparison finds differences with the NumPy set (shown below on a fixed case), so the property is
not empty.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minillm
from minillm.engine import runner
from minillm.engine.engine import Engine
from minillm.engine.sequence import SamplingParams
from minillm.kernels import batch_invariant
from minillm.models import ops
from minillm.models.quant import QuantMatrix
from minillm.models.weights import Dense, fixed_order

pytestmark = pytest.mark.skipif(not minillm.kernels.available(), reason="the batch-invariant kernels need numba")

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent
MODELS = ("gpt2-tiny-a", "llama-tiny", "qwen3-tiny")   # GPT-2; Llama with GQA; Qwen3's per-head norms


@pytest.fixture(scope="module")
def models():
    """Each fixture in the batch-invariant set."""
    return {name: minillm.load(FIXTURES / name, kernels="batch-invariant") for name in MODELS}


@pytest.fixture(scope="module")
def numpy_models():
    """Each fixture in the NumPy reference set (BLAS, blocked attention): not batch-invariant."""
    return {name: minillm.load(FIXTURES / name, kernels="numpy") for name in MODELS}


@contextmanager
def logits_seen():
    """Every logits vector the engine samples from, kept per sequence (by its random stream)."""
    real = runner.pick
    seen: dict = {}

    def pick(logits, temperature, top_k, top_p, rng):
        seen.setdefault(id(rng), []).append(np.array(logits, copy=True))
        return real(logits, temperature, top_k, top_p, rng)

    runner.pick = pick
    try:
        yield seen
    finally:
        runner.pick = real


def run_engine(model, requests, *, block_size=4, budget=None, max_seqs=16, prefix_cache=False, warm=None):
    """Every request [(prompt, n, temperature, seed)] in one engine, all arriving at once; `warm`, a
    prompt run first on the same engine (its blocks stay cached for the others' prefixes). Returns
    each request's tokens, the logits each of its tokens was sampled from, and the prompt positions
    the prefix cache served."""
    need = sum(-(-(len(p) + n) // block_size) for p, n, _, _ in requests) + 8
    e = Engine(model, num_blocks=need + 16, block_size=block_size, prefix_cache=prefix_cache, max_seqs=max_seqs,
               max_batched_tokens=budget or max(sum(len(p) for p, *_ in requests), 1), meter=False)
    if warm is not None:
        e.add_request(warm, 1, SamplingParams())
        e.run()
    reqs = [e.add_request(p, n, SamplingParams(t, None, None, s)) for p, n, t, s in requests]
    with logits_seen() as seen:
        e.run()
    return [r.output for r in reqs], [seen[id(r.seq.rng)] for r in reqs], e.blocks.hit_tokens


def alone(model, request):
    """One request by itself: its tokens and the logits they were sampled from."""
    tokens, logits, _ = run_engine(model, [request])
    return tokens[0], logits[0]


def same_bits(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


@st.composite
def workloads(draw):
    """2-6 requests, some sharing a prefix (a multiple of the block size, so it can be a cache hit),
    each greedy or seeded; a step budget small enough to chunk the prompts; the batch width."""
    V = 512
    tokens = st.integers(0, V - 1)
    block = draw(st.sampled_from([4, 8]))
    prefix = draw(st.lists(tokens, min_size=block, max_size=3 * block))
    prefix = prefix[:len(prefix) // block * block]
    reqs = []
    for _ in range(draw(st.integers(2, 6))):
        own = draw(st.lists(tokens, min_size=1, max_size=24))
        prompt = (prefix if draw(st.booleans()) else []) + own
        temperature = draw(st.sampled_from([0.0, 0.7, 1.0, 1.5]))
        reqs.append((prompt, draw(st.integers(1, 8)), temperature, draw(st.integers(0, 2**16))))
    return dict(requests=reqs, block_size=block, budget=draw(st.integers(3, 40)), max_seqs=draw(st.integers(2, 6)),
                warm=prefix + [0] if prefix else None)


@settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(name=st.sampled_from(MODELS), w=workloads())
def test_batched_chunked_and_cached_tokens_equal_alone_bit_for_bit(models, name, w):
    model = models[name]
    assert model.dtype == np.float32 and model.kernels == "batch-invariant"
    got, logits, _ = run_engine(model, w["requests"], block_size=w["block_size"],
                                budget=w["budget"], max_seqs=w["max_seqs"], prefix_cache=True, warm=w["warm"])
    for req, tokens, lg in zip(w["requests"], got, logits):
        want, want_logits = alone(model, req)
        assert tokens == want, (req, tokens, want)
        assert same_bits(lg, want_logits), req          # not only the tokens: every logit, bit for bit


@pytest.mark.parametrize("name", MODELS)
def test_generate_in_the_set_equals_the_engine_with_and_without_the_cache(models, name):
    """`generate` with the set: its own loop (a contiguous cache, or no cache and the whole sequence
    every step) gives the engine's tokens for the request alone."""
    model = models[name]
    reqs, _ = fixed_case(model, n=4)
    for prompt, n, temperature, seed in reqs:
        want = alone(model, (prompt, n, temperature, seed))[0]
        for kv_cache in (True, False):
            got = minillm.generate(model, prompt, n, temperature=temperature, seed=seed, kv_cache=kv_cache)
            assert got == want


def fixed_case(model, n=16, seed=7):
    """A fixed workload: n requests, half sharing a 16-token prefix, seeded at temperature 1 and greedy."""
    rng = np.random.default_rng(seed)
    V = model.config.vocab_size
    prefix = list(map(int, rng.integers(0, V, 16)))
    reqs = []
    for i in range(n):
        own = list(map(int, rng.integers(0, V, int(rng.integers(2, 30)))))
        reqs.append(((prefix if i % 2 else []) + own, 12, 1.0 if i % 4 else 0.0, 1000 + i))
    return reqs, prefix + [0]


def test_without_the_set_some_request_leaves_its_alone_tokens_with_it_none():
    """The same comparison on a fixed case, both sets, on the bundled model (float32, 50,257 tokens:
    the tiny fixtures' few hundred tokens rarely put a draw near a boundary): the NumPy set (BLAS,
    blocked attention) lets at least one request leave its alone tokens; the batch-invariant set none."""
    kept, bits = {}, {}
    for det in (False, True):
        model = minillm.load("small", quiet=True, kernels="batch-invariant" if det else "numpy")
        reqs, warm = fixed_case(model)
        got, logits, hits = run_engine(model, reqs, block_size=4, budget=24, max_seqs=8,
                                       prefix_cache=True, warm=warm)
        assert hits > 0                                  # the shared prefix really came from the cache
        ref = [alone(model, r) for r in reqs]
        kept[det] = sum(g == a[0] for g, a in zip(got, ref))
        bits[det] = sum(same_bits(lg, a[1]) for lg, a in zip(logits, ref))
    assert kept[True] == bits[True] == len(reqs)
    assert kept[False] < len(reqs) and bits[False] < len(reqs), (kept, bits)


@pytest.mark.parametrize("name", MODELS)
def test_without_the_set_the_logits_differ_on_the_fixtures(numpy_models, name):
    """On each fixture the property test runs, the NumPy set's logits in a batch are not those alone
    (so the property test's bit-for-bit check of the logits would catch a path that is not
    batch-invariant, even where the tokens happen to agree)."""
    model = numpy_models[name]
    reqs, warm = fixed_case(model, n=8)
    _, logits, _ = run_engine(model, reqs, block_size=4, budget=24, max_seqs=8, prefix_cache=True, warm=warm)
    assert sum(same_bits(lg, alone(model, r)[1]) for lg, r in zip(logits, reqs)) < len(reqs)


def test_the_kernels_give_each_row_the_same_bits_in_any_batch():
    """Below the engine: a product's row and an attention query's output are the same bits whatever
    rows come with them, whatever the split of a prompt (a prefill query equals a decode query at
    its position), for float32 and float64; and they equal NumPy's to rounding."""
    rng = np.random.default_rng(0)
    for dtype, tol in ((np.float32, 1e-4), (np.float64, 1e-12)):
        for n_in, n_out in ((96, 600), (97, 300)):              # an odd width: the unrolled loops' tails
            w = fixed_order(Dense(rng.standard_normal((n_in, n_out)).astype(dtype)))
            x = rng.standard_normal((37, n_in)).astype(dtype)
            full = w.matmul(x)
            for T in (1, 2, 3, 5, 8, 37):
                assert np.array_equal(w.matmul(x[:T]), full[:T])
            assert np.array_equal(w.matmul(x[20:21])[0], full[20])
            np.testing.assert_allclose(full, x @ w.a, rtol=tol, atol=tol)
        q = rng.standard_normal((6, 40, 16)).astype(dtype)
        k, v = (rng.standard_normal((2, 170, 16)).astype(dtype) for _ in range(2))
        out, _ = batch_invariant.attention(q, k, v)                  # queries at positions 130..169
        for i0, i1 in ((0, 1), (0, 7), (5, 40), (39, 40)):
            end = 130 + i1
            assert np.array_equal(batch_invariant.attention(q[:, i0:i1], k, v, end)[0], out[:, i0:i1])
        np.testing.assert_allclose(out, ops.attention(q, k, v), rtol=tol, atol=tol)


def test_a_quantized_weight_is_batch_invariant_too():
    """A weight kept as GGUF blocks: widened a tile of rows at a time, the same fixed order."""
    rng = np.random.default_rng(1)
    w = fixed_order(QuantMatrix.quantize(rng.standard_normal((300, 64)).astype(np.float32), "q8_0"))   # [out, in]
    x = rng.standard_normal((9, 64)).astype(np.float32)
    full = w.matmul(x)
    assert np.array_equal(w.matmul(x[3:4])[0], full[3])
    np.testing.assert_allclose(full, x @ w.dequantize().T, rtol=1e-4, atol=1e-4)


def test_every_weight_answers_the_same_fixed_order_product():
    """The weight protocol's `fixed_matmul`: a NumPy Dense, a fused FusedDense (kept [out, in]: its own
    [in, out] copy, made once) and the batch-invariant set's weight give the same bits."""
    from minillm.models.fused import FusedDense
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 200)).astype(np.float32)                   # [in, out]
    x = rng.standard_normal((5, 64)).astype(np.float32)
    ref = Dense(a).fixed_matmul(x)
    fused = FusedDense(a)
    assert np.array_equal(fused.fixed_matmul(x), ref) and np.array_equal(fixed_order(Dense(a)).matmul(x), ref)
    assert fused.in_out(np.float32) is fused.in_out(np.float32)               # one copy, made once


# -- the server ---------------------------------------------------------------------------------

def post(port, body, timeout=300):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.status, json.loads(r.read())
    conn.close()
    return out


def test_serve_batch_invariant_sixteen_concurrent_seeded_clients_equal_alone(tmp_path):
    """`minillm serve --kernels batch-invariant` in a subprocess on 127.0.0.1: 16 seeded clients at once, each
    request's text equal to the same request sent alone afterwards, 16 of 16."""
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1"}
    env.pop("PYTHONPATH", None)
    p = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", "random-tiny", "--port", "0",
                          "--kv-memory", "16MB", "--max-batched-tokens", "32", "--prefix-cache", "--kernels", "batch-invariant",
                          "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), (line, p.stderr.read() if p.poll() else "")
        port = int(line.rsplit(":", 1)[1])
        bodies = [{"prompt": f"To be, or not to be: request {i}" + " again" * (i % 5), "max_tokens": 8 + i % 5,
                   "temperature": 1.0, "seed": i} for i in range(16)]
        together = [None] * 16

        def client(i):
            together[i] = post(port, bodies[i])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        apart = [post(port, b) for b in bodies]
        texts = [[r[1]["choices"][0]["text"] if r and r[0] == 200 else r for r in rs] for rs in (together, apart)]
        assert all(r is not None and r[0] == 200 for r in together), together
        equal = sum(a == b for a, b in zip(*texts))
        assert equal == 16, f"{equal} of 16 equal: {texts}"
    finally:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def test_batch_invariant_without_numba_says_so_in_one_line(tmp_path):
    """numba hidden (a package of that name that fails to import): the command says why, in one line."""
    fake = tmp_path / "fake" / "numba"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no numba here (a test)')\n")
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path), "PYTHONPATH": str(fake.parent)}
    for cmd in (["serve", "--port", "0"], ["serve-sim", "--requests", "2", "--no-live"]):
        r = subprocess.run([sys.executable, "-m", "minillm", *cmd, "--model", "random-tiny", "--kernels",
                            "batch-invariant"],
                           capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
        assert r.returncode != 0 and "Traceback" not in r.stderr
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and "--kernels batch-invariant needs numba, which cannot run here" in lines[0], r.stderr


def test_serve_sim_and_bench_take_the_set(tmp_path):
    """`serve-sim --kernels batch-invariant` runs its engine with the set (and says so in its JSON);
    `bench --kernels fused,batch-invariant` without `--batch` or `--weights` is one line naming what to add."""
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1"}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-m", "minillm", "serve-sim", "--model", "random-tiny", "--requests", "3",
                        "--rate", "50", "--max-batched-tokens", "8", "--kernels", "batch-invariant", "--json"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)
    assert [x["kernels"] for x in runs] == ["batch-invariant"] and runs[0]["requests"] == 3
    r = subprocess.run([sys.executable, "-m", "minillm", "bench", "--model", "random-tiny", "--kernels",
                        "fused,batch-invariant"], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "compares kernel sets with --weights or --batch" in r.stderr.strip().splitlines()[-1]


def test_the_set_equals_over_numpy_and_over_fused_weights(models, name="llama-tiny"):
    """A batch-invariant model's tokens and logits equal, bit for bit, a batch of the same requests
    on each request alone; the fused set's weights answer the same fixed-order product
    (test_every_weight_answers_the_same_fixed_order_product), so no set's weights change the bits."""
    model = models[name]
    reqs, _ = fixed_case(model, n=4, seed=3)
    got, logits, _ = run_engine(model, reqs, budget=12, max_seqs=4)
    for g, lg, r in zip(got, logits, reqs):
        tokens, ref = alone(model, r)
        assert g == tokens and same_bits(lg, ref)
