"""The mixture-of-experts family (models/moe.py) against transformers' fixtures (Mixtral, Qwen3-MoE),
and its invariants on random configs: E and k, dense layers (decoder_sparse_step, mlp_only_layers),
renormalised or not, Llama or Qwen3 attention, float64 and float32, float and quantized experts.
The meter's weight bytes against their closed form: k experts per sparse layer at one token, the
union of the rows' choices for a step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.errors import ConfigError, WeightsError
from minillm.models import moe
from minillm.checkpoints.families import random_model
from minillm.models.moe import SHAPES as MOE_PRESETS, MoE, MoEConfig, random_params, routes, step_weight_bytes
from minillm.models.target import Target

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = ("mixtral-tiny", "qwen3moe-tiny")
ATOL = 1e-4


@pytest.fixture(scope="module", params=NAMES)
def fixture(request):
    path = FIXTURES / request.param
    return minillm.load(path), np.load(path / "expected.npz")


def test_fixture_logits_match_transformers(fixture):
    model, e = fixture
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(model.forward(ids), e["logits"], rtol=0, atol=ATOL)


@pytest.mark.parametrize("kv_cache", [True, False])
def test_fixture_greedy_matches_transformers(fixture, kv_cache):
    model, e = fixture
    assert minillm.generate(model, e["input_ids"], len(e["greedy_ids"]), kv_cache=kv_cache) == e["greedy_ids"].tolist()


def test_fixture_prefill_and_decode_rows(fixture):
    model, e = fixture
    P = len(e["input_ids"])
    logits, cache = model.prefill(e["input_ids"])
    np.testing.assert_allclose(logits, e["logits"][P - 1], rtol=0, atol=ATOL)
    for i, t in enumerate(e["greedy_ids"][:8]):
        np.testing.assert_allclose(model.decode_step(int(t), cache), e["logits"][P + i], rtol=0, atol=ATOL)


def test_fixture_configs_read_as_written(fixture):
    model, _ = fixture
    c = model.config
    if c.model_type == "mixtral":
        assert (c.n_expert, c.top_k, c.expert_ffn, c.norm_topk, c.qk_norm, c.tied) == (4, 2, 96, True, False, False)
    else:
        assert (c.n_expert, c.top_k, c.expert_ffn, c.norm_topk, c.qk_norm, c.tied) == (8, 2, 48, True, True, True)
    assert c.sparse_layers == (0, 1) and c.theta == 1e6
    assert model.n_params() == c.n_params()


def copy_fixture(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def edit_config(folder, drop=(), **changes):
    cfg = json.loads((folder / "config.json").read_text())
    for k in drop:
        cfg.pop(k)
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_older_config_spellings_read_the_same(tmp_path):
    """Qwen3-MoE files from before transformers 5 say `num_experts` and keep `rope_theta` at the top."""
    folder = copy_fixture(tmp_path, "qwen3moe-tiny")
    edit_config(folder, drop=("num_local_experts", "rope_parameters"), num_experts=8, rope_theta=1e6)
    e = np.load(folder / "expected.npz")
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(minillm.load(folder).forward(ids), e["logits"], rtol=0, atol=ATOL)


def test_bad_configs_and_weights_get_one_clear_line(tmp_path):
    folder = copy_fixture(tmp_path, "mixtral-tiny")
    edit_config(folder, num_experts_per_tok=5)
    with pytest.raises(ConfigError, match="top_k=5 experts but a layer has only 4"):
        minillm.load(folder)
    edit_config(folder, drop=("num_local_experts",), num_experts_per_tok=2)
    with pytest.raises(ConfigError, match="missing num_local_experts"):
        minillm.load(folder)
    edit_config(folder, num_local_experts=4, sliding_window=16)
    with pytest.raises(ConfigError, match="sliding_window=16"):
        minillm.load(folder)
    edit_config(folder, sliding_window=None, num_local_experts=3)      # the file has 4 experts a layer
    with pytest.raises(WeightsError, match=r"gate.weight has shape \[4, 64\] but the config needs \[3, 64\]"):
        minillm.load(folder)
    with pytest.raises(WeightsError, match="expert FFN 48 not a multiple of 32"):
        minillm.load(FIXTURES / "qwen3moe-tiny", weights="q8_0")


# -- the expert layer against each row alone ---------------------------------------------------------

def rows_alone(x, p, c):
    """The mixture as the paper writes it, one row at a time: every expert's output for the row, then
    the k with the largest router probability, weighted. No grouping, no shared code but the experts."""
    logits = x @ p["router.weight"]                                      # [N, E]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for n in range(x.shape[0]):
        top = sorted(range(c.n_expert), key=lambda e: (-probs[n, e], e))[:c.top_k]
        w = probs[n, top] / (probs[n, top].sum() if c.norm_topk else 1.0)
        for e, we in zip(top, w):
            gu = x[n] @ p[f"experts.{e}.gate_up.weight"]                 # [2F]
            g, u = gu[:c.expert_ffn], gu[c.expert_ffn:]
            out[n] += we * ((g / (1 + np.exp(-g)) * u) @ p[f"experts.{e}.down_proj.weight"])
    return out


# -- random configs ------------------------------------------------------------------------------------

@st.composite
def configs(draw, width=None):
    E = draw(st.sampled_from([2, 3, 4, 6]))
    L = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(["mixtral", "qwen3_moe"]))
    step = draw(st.sampled_from([1, 2])) if kind == "qwen3_moe" else 1
    dense = tuple(draw(st.sets(st.integers(0, L - 1), max_size=1))) if kind == "qwen3_moe" else ()
    n_kv = draw(st.sampled_from([1, 2]))
    w = width or draw(st.sampled_from([16, 32]))
    return MoEConfig(n_layer=L, n_head=2 * n_kv, n_kv_head=n_kv, head_dim=width // 2 // n_kv if width else 8,
                     n_embd=w, n_ctx=64, vocab_size=97, ffn=width or draw(st.sampled_from([24, 40])),
                     eps=1e-6, theta=1e4, arch="qwen3" if kind == "qwen3_moe" else "llama",
                     qk_norm=kind == "qwen3_moe", tied=draw(st.booleans()), n_expert=E,
                     top_k=draw(st.integers(1, min(E, 3))), expert_ffn=width or draw(st.sampled_from([8, 16])),
                     norm_topk=True if kind == "mixtral" else draw(st.booleans()), sparse_step=step,
                     dense_layers=dense, model_type=kind)


def build(c, dtype=np.float64, seed=0, weights="float32"):
    return MoE(c, random_params(c, seed=seed, std=0.3, dtype=np.float64), Target.numpy(dtype, weights))


TOL = {np.float64: 1e-9, np.float32: 2e-4}
DTYPES = st.sampled_from([np.float64, np.float32])


@settings(max_examples=10)
@given(c=configs(), seed=st.integers(0, 10**6))
def test_grouped_experts_equal_each_row_alone(c, seed):
    model = build(c)
    x = np.random.default_rng(seed).standard_normal((9, c.n_embd))
    for i in c.sparse_layers:
        p = model.blocks[i]
        np.testing.assert_allclose(moe.experts_mlp(x.copy(), p, c), rows_alone(x, p, c), rtol=0, atol=1e-12)


@settings(max_examples=10)
@given(c=configs(), dtype=DTYPES, seed=st.integers(0, 10**6))
def test_cached_equals_naive(c, dtype, seed):
    model = build(c, dtype)
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, 10)
    full = model.forward(ids)                                      # [10, V], no cache
    logits, cache = model.prefill(ids[:4])
    np.testing.assert_allclose(logits, full[3], rtol=0, atol=TOL[dtype])
    for i in range(4, 10):
        np.testing.assert_allclose(model.decode_step(int(ids[i]), cache), full[i], rtol=0, atol=TOL[dtype])


@settings(max_examples=6)
@given(c=configs(width=32), fmt=st.sampled_from(["q8_0", "q4_0"]), seed=st.integers(0, 10**6))
def test_quantized_cached_equals_naive(c, fmt, seed):
    model = build(c, np.float32, weights=fmt)
    assert model.weights == fmt and all(w.fmt.name == fmt for w in model.matrices(head=False))
    ids = np.random.default_rng(seed).integers(0, c.vocab_size, 8)
    full = model.forward(ids)
    _, cache = model.prefill(ids[:3])
    for i in range(3, 8):
        np.testing.assert_allclose(model.decode_step(int(ids[i]), cache), full[i], rtol=0, atol=2e-4)


@settings(max_examples=6)
@given(c=configs(), seed=st.integers(0, 10**6))
def test_batched_equals_alone_and_paged_equals_contiguous(c, seed):
    model = build(c)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, c.vocab_size, n).tolist() for n in (3, 7, 1)]
    alone = [minillm.generate(model, p, 5) for p in prompts]
    assert minillm.generate_batch(model, prompts, 5, cache="paged", block_size=4) == alone
    assert minillm.generate_batch(model, prompts, 5, cache="contiguous") == alone


# -- the meter against the closed form ---------------------------------------------------------------

def counted(model, batch):
    """One CausalLM.step of `batch` under a meter: (its weight bytes, each sparse layer's chosen experts)."""
    with minillm.Meter() as m, routes() as r:
        model.step(batch)
    (s,) = m.steps
    return s.bytes["weights"], r


@settings(max_examples=10)
@given(c=configs(width=32), fmt=st.sampled_from(["float32", "float64", "q8_0", "q4_0"]),
       B=st.integers(1, 6), seed=st.integers(0, 10**6))
def test_meter_reads_the_chosen_experts_once(c, fmt, B, seed):
    """At one token a step reads k experts per sparse layer; B sequences' decode step reads the
    union of their choices, each expert once: the meter equals the closed form."""
    dtype = np.float64 if fmt == "float64" else np.float32
    model = build(c, dtype, weights="float32" if fmt == "float64" else fmt)
    b, w = np.dtype(dtype).itemsize, "float32" if fmt == "float64" else fmt
    rng = np.random.default_rng(seed)
    caches = []
    for _ in range(B):
        _, cache = model.prefill(rng.integers(0, c.vocab_size, 3))
        cache.reserve(1)
        caches.append(cache)
    one, r = counted(model, [(np.array([5]), caches[0])])
    assert [len(set(a.ravel())) for a in r] == [c.top_k] * len(c.sparse_layers)
    assert one == step_weight_bytes(c, [c.top_k] * len(c.sparse_layers), 1, b, w)
    for cache in caches:
        cache.reserve(1)
    step, r = counted(model, [(rng.integers(0, c.vocab_size, 1), cache) for cache in caches])
    union = [len(set(a.ravel())) for a in r]
    assert all(c.top_k <= n <= min(c.n_expert, B * c.top_k) for n in union)
    assert step == step_weight_bytes(c, union, B, b, w)


def test_dense_layers_and_expert_count_spelling_load_from_a_folder(tmp_path):
    """A Qwen3-MoE folder whose decoder_sparse_step and mlp_only_layers keep layers 0, 1 and 3 of 4
    dense (their MLP under the dense names), its expert count spelled `num_experts`: loaded, it
    computes what the model built from the same tensors computes."""
    from minillm.checkpoints.safetensors import write_safetensors
    c = MoEConfig(n_layer=4, n_head=2, n_kv_head=1, head_dim=16, n_embd=32, n_ctx=32, vocab_size=50, ffn=40,
                  eps=1e-6, theta=1e6, arch="qwen3", qk_norm=True, tied=False, n_expert=4, top_k=2,
                  expert_ffn=16, norm_topk=False, sparse_step=2, dense_layers=(3,), model_type="qwen3_moe")
    assert c.sparse_layers == (1,)
    params = random_params(c, seed=3, std=0.3)
    write_safetensors(tmp_path / "model.safetensors", {"model." + k: v for k, v in params.items()})
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3_moe", "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 16, "hidden_size": 32, "max_position_embeddings": 32, "vocab_size": 50,
        "intermediate_size": 40, "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "decoder_sparse_step": 2, "mlp_only_layers": [3],
        "norm_topk_prob": False, "tie_word_embeddings": False}))
    model = minillm.load(tmp_path)
    assert model.config == c and model.config.sparse_layers == (1,)
    assert "gate_up.weight" in model.blocks[3] and "router.weight" in model.blocks[1]
    ids = np.arange(12) % 50
    np.testing.assert_allclose(model.forward(ids), MoE(c, params).forward(ids), rtol=0, atol=0)


def test_random_presets_build_and_read_what_they_should(monkeypatch):
    """random_model on small stand-ins for the presets: the mixture's one-token step reads what its
    dense twin's reads, but the routers."""
    small = dict(n_layer=2, n_head=2, n_kv_head=1, head_dim=16, n_embd=32, n_ctx=64, vocab_size=64, tied=True)
    monkeypatch.setitem(MOE_PRESETS, "random-moe-16x2", MoEConfig(**small, ffn=32, n_expert=8, top_k=2))
    monkeypatch.setitem(MOE_PRESETS, "random-moe-16x2-dense", moe.DecoderConfig(**small, ffn=64))
    mix, dense = random_model("random-moe-16x2"), random_model("random-moe-16x2-dense")
    assert isinstance(mix, MoE) and not isinstance(dense, MoE)
    read = []
    for model in (mix, dense):
        _, cache = model.prefill([1, 2, 3])
        with minillm.Meter() as m:
            model.decode_step(4, cache)
        read.append(m.steps[0].bytes["weights"])
    assert read[0] == mix.step_weight_bytes() == read[1] + 2 * 4 * 32 * 8      # + two routers [32, 8]
    with pytest.raises(minillm.MiniLLMError, match="unknown preset"):
        random_model("random-moe-3x1")


def test_expected_distinct_experts():
    assert moe.expected_distinct_experts(8, 2, 1) == pytest.approx(2)
    assert moe.expected_distinct_experts(8, 8, 3) == pytest.approx(8)
    # against an exact count: B = 2 tokens, each 2 of 4 experts, all 6·6 pairs of choices equally likely
    from itertools import combinations
    pairs = list(combinations(range(4), 2))
    exact = np.mean([len(set(a) | set(b)) for a in pairs for b in pairs])
    assert moe.expected_distinct_experts(4, 2, 2) == pytest.approx(exact)


def test_presets_total_beyond_the_cache_and_active_a_fraction():
    """Config arithmetic only (building the presets takes seconds): the mixture holds more than four
    times a 32 MiB cache, a token reads under a third of it, and the dense preset reads what one token
    of the mixture reads, but the routers."""
    c, dense = MOE_PRESETS["random-moe-16x2"], MOE_PRESETS["random-moe-16x2-dense"]
    total, active = 4 * c.n_params(), 4 * c.active_params()
    assert total > 4 * 32 * 2**20 and active < total / 3
    assert 4 * dense.n_params() == active - 4 * c.n_layer * c.n_embd * c.n_expert      # the routers
    assert step_weight_bytes(c, [c.top_k] * c.n_layer) == active + 4 * c.n_embd     # + the token's embedding row


# -- the family-independent engine, unchanged ---------------------------------------------------------

@pytest.fixture(scope="module")
def mixtral():
    return minillm.load(FIXTURES / "mixtral-tiny")


def test_seeded_sampling_is_reproducible_alone_and_batched(mixtral):
    prompts = [[3, 14, 15], [9, 2, 6, 5, 35]]
    alone = [minillm.generate(mixtral, p, 8, temperature=0.9, top_k=50, seed=7) for p in prompts]
    assert alone == [minillm.generate(mixtral, p, 8, temperature=0.9, top_k=50, seed=7) for p in prompts]
    assert minillm.generate_batch(mixtral, prompts, 8, temperature=0.9, top_k=50, seed=7) == alone


def test_speculative_greedy_equals_plain_greedy(mixtral):
    e = np.load(FIXTURES / "mixtral-tiny" / "expected.npz")
    new, _ = minillm.speculative_generate(mixtral, e["input_ids"], 20, draft="ngram", k=3)
    assert new == e["greedy_ids"][:20].tolist()
    c = mixtral.config
    small = MoEConfig(**{**c.asdict(), "n_layer": 1})
    new, _ = minillm.speculative_generate(mixtral, e["input_ids"], 20, draft=build(small, np.float32, seed=1), k=2)
    assert new == e["greedy_ids"][:20].tolist()


def test_engine_serves_each_request_as_alone(mixtral):
    from minillm.engine.engine import Engine
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 40], [77]]
    alone = [minillm.generate(mixtral, p, 6) for p in prompts]
    engine = Engine(mixtral, num_blocks=32, block_size=4, prefix_cache=True)
    reqs = [engine.add_request(p, 6) for p in prompts]
    engine.run()
    assert [r.output for r in reqs] == alone


@pytest.mark.slow
def test_the_real_presets_read_the_same_bytes_at_one_token():
    """The two presets themselves (~230 MiB and ~60 MiB of float32, seconds to build)."""
    mix, dense = random_model("random-moe-16x2"), random_model("random-moe-16x2-dense")
    c = mix.config
    assert mix.nbytes() == 4 * c.n_params() and dense.nbytes() == 4 * dense.config.n_params()
    read = []
    for model in (mix, dense):
        _, cache = model.prefill([1, 2, 3])
        with minillm.Meter() as m:
            model.decode_step(4, cache)
        read.append(m.steps[0].bytes["weights"])
    assert read[0] == mix.step_weight_bytes() == read[1] + 4 * c.n_layer * c.n_embd * c.n_expert


# -- the family table and the commands ----------------------------------------------------------------

def test_the_family_table_reads_both_kinds_and_the_presets_are_names():
    from minillm.checkpoints.families import FAMILIES, family_of
    from minillm.checkpoints.load import model_names
    assert [f.name for f in FAMILIES if f.model is MoE] == ["moe"]
    for name in NAMES:
        assert family_of(FIXTURES / name).name == "moe"
    assert {"random-moe-16x2", "random-moe-16x2-dense"} <= set(model_names())
    with pytest.raises(minillm.MiniLLMError, match="unknown model 'random-moe-3x1'"):
        minillm.load("random-moe-3x1")


REPO = Path(__file__).resolve().parent.parent


def cli(tmp_path, *args, stdin=None, timeout=180):
    import os
    import subprocess
    import sys
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1", "PYTHONIOENCODING": "utf-8",
                              "OPENBLAS_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-m", "minillm", *map(str, args)], input=stdin, capture_output=True,
                       text=True, encoding="utf-8", cwd=REPO, env=env, timeout=timeout)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    return r


@pytest.fixture(scope="module")
def talking(tmp_path_factory):
    """tests/fixtures/mixtral-tiny with a byte-level tokenizer (its 500 ids: 256 bytes, then unused
    ones), so the text commands can run it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from minillm.model_tokenizer import bytes_to_unicode
    dst = tmp_path_factory.mktemp("moe") / "mixtral-talking"
    shutil.copytree(FIXTURES / "mixtral-tiny", dst)
    V = json.loads((dst / "config.json").read_text())["vocab_size"]
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())} | {f"<unused{i}>": i for i in range(256, V)}
    tok = Tokenizer(models.BPE(vocab, [], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(dst / "tokenizer.json"))
    return dst


def test_bench_batch_on_a_mixture_beside_a_dense_model_in_one_run(tmp_path):
    """`minillm bench --batch` on a mixture and a dense model together: each row of the mixture has the
    experts its router chose, between k and min(E, B·k), beside uniform routing's union and its bytes."""
    r = cli(tmp_path, "bench", "--batch", "1,2,4", "--repeats", "1", "--json",
            "--model", f"{FIXTURES / 'mixtral-tiny'},{FIXTURES / 'llama-tiny'}")
    mix, dense = json.loads(r.stdout)["models"]
    assert mix["experts"] == [4, 2] and dense["experts"] is None
    model = minillm.load(FIXTURES / "mixtral-tiny")
    for row in mix["rows"]:
        B = row["batch"]
        assert 2 <= row["experts_chosen"] <= min(4, 2 * B)
        assert row["experts_uniform"] == pytest.approx(moe.expected_distinct_experts(4, 2, B))
        assert row["uniform_weight_bytes"] == pytest.approx(model.step_weight_bytes(B))
        assert row["tok_s"] > 0 and row["weight_bytes"] <= row["bytes"]
    assert mix["rows"][0]["weight_bytes"] == model.step_weight_bytes()
    for res in (mix, dense):
        assert res["critical_batch"] is None or res["critical_batch"] >= 1
    text = cli(tmp_path, "bench", "--batch", "1,2", "--repeats", "1", "--model", FIXTURES / "mixtral-tiny").stdout
    assert "uniform" in text and "E = 4 experts, top-k = 2" in text and "critical batch" in text


def test_text_commands_run_a_mixture(tmp_path, talking):
    """generate (cached, and speculative with the n-gram draft), generate-batch against one at a time,
    serve-sim, and bench --weights: each runs on a mixture's folder."""
    plain = cli(tmp_path, "generate", "Hello", "--model", talking, "--max-new-tokens", "6").stdout
    spec = cli(tmp_path, "generate", "Hello", "--model", talking, "--max-new-tokens", "6", "--draft", "ngram")
    assert spec.stdout == plain and "speculative" in spec.stderr + spec.stdout
    r = cli(tmp_path, "generate-batch", "-", "--model", talking, "--max-new-tokens", "4", "--compare",
            stdin="a b\nhello there\n")
    assert "identical tokens for 2 of 2 prompts" in " ".join(r.stdout.split())
    sim = json.loads(cli(tmp_path, "serve-sim", "--model", talking, "--requests", "4", "--json").stdout)
    assert sim[0]["requests"] == 4 and sim[0]["output_tokens"] > 0 and sim[0]["steps"] > 0
    q = json.loads(cli(tmp_path, "bench", "--weights", "float32,q8_0", "--model", talking, "--repeats", "1",
                       "--contexts", "16", "--json").stdout)
    for row in q["rows"]:
        assert row["weight_bytes"] == row["weights_read"]           # k experts a layer, in each format


def test_serve_answers_from_a_mixture(tmp_path, talking):
    import http.client
    import os
    import signal
    import subprocess
    import sys
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1", "OPENBLAS_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    p = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", str(talking), "--port", "0",
                          "--kv-memory", "8MB", "--no-live"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=REPO, env=env)
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), (line, p.stderr.read() if p.poll() else "")
        conn = http.client.HTTPConnection("127.0.0.1", int(line.rsplit(":", 1)[1]), timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hello", "max_tokens": 5,
                                                                 "temperature": 0}),
                     headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        body = json.loads(reply.read())
        model = minillm.load(talking)
        enc = minillm.tokenizer(model)
        ids = minillm.generate(model, enc.encode("Hello"), 5)
        ids = ids[:next((i for i, t in enumerate(ids) if t in model.eos_ids), len(ids))]
        assert reply.status == 200 and body["choices"][0]["text"] == enc.decode(ids), body
        assert body["usage"]["completion_tokens"] == len(ids) == 5, body          # greedy: no end token here
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()


def test_the_live_view_draws_a_mixtures_engine(mixtral):
    from rich.console import Console
    from minillm.engine.engine import Engine
    from minillm.ui.live import render
    engine = Engine(mixtral, num_blocks=32, block_size=4)
    for p in ([1, 2, 3], [4, 5, 6, 7, 8], [9]):
        engine.add_request(p, 4)
    for _ in range(3):
        engine.step()
    console = Console(record=True, width=80, force_terminal=False)
    console.print(render(engine, "continuous"))
    text = console.export_text()
    assert "running" in text and "KV blocks" in text


@pytest.mark.slow
def test_bench_batch_runs_both_presets_in_one_run(tmp_path):
    r = cli(tmp_path, "bench", "--batch", "1,2", "--repeats", "1", "--json",
            "--model", "random-moe-16x2,random-moe-16x2-dense", timeout=600)
    mix, dense = json.loads(r.stdout)["models"]
    assert mix["experts"] == [16, 2] and dense["experts"] is None
    assert mix["rows"][0]["weight_bytes"] == dense["rows"][0]["weight_bytes"] + 4 * 8 * 512 * 16   # the routers


# -- closed forms every family answers, and the critical batch they feed -------------------------------

@pytest.mark.parametrize("name", ["random-tiny", "llama-tiny", "qwen3moe-tiny"])
def test_a_batched_decode_step_reads_the_closed_form(name):
    """model.step_weight_bytes(B) is what the meter counts for a decode step of B sequences: every
    family's (a mixture's with the experts its router chose)."""
    model = minillm.load(name if name.startswith("random") else FIXTURES / name)
    rng = np.random.default_rng(1)
    caches = []
    for _ in range(5):
        _, cache = model.prefill(rng.integers(0, model.config.vocab_size, 4))
        cache.reserve(1)
        caches.append(cache)
    with minillm.Meter() as m, routes() as r:
        model.step([(np.array([7]), cache) for cache in caches])
    chosen = [len(set(a.ravel())) for a in r]
    closed = model.step_weight_bytes(5, chosen) if model.experts else model.step_weight_bytes(5)
    assert m.steps[0].bytes["weights"] == closed
    assert bool(chosen) == (model.experts is not None)


class Roof:
    bandwidth_gbs, peak_gflops = 20.0, 50.0


def test_critical_batch_is_the_first_bound_batch_of_the_closed_form():
    """batching.critical_batch against a brute-force search on synthetic counts: FLOPs and other
    bytes linear in B, the weights the model's closed form (a mixture's union grows, then saturates)."""
    from minillm.measure.batching import critical_batch
    from minillm.meter import StepRecord
    c = MoEConfig(n_layer=2, n_head=2, n_kv_head=1, head_dim=16, n_embd=32, n_ctx=64, vocab_size=64, ffn=32,
                  n_expert=8, top_k=2, tied=True)
    model = MoE(c, random_params(c))
    bw, peak = Roof.bandwidth_gbs * 1e9, Roof.peak_gflops * 1e9

    def record(B, flops_per_token):
        rec = StepRecord(kind="decode", position=4, n_tokens=B)
        rec.bytes["weights"] = model.step_weight_bytes(B)
        rec.bytes["activations"] = 1000 * B
        rec.flops["matmul"] = flops_per_token * B
        return rec

    for per_token in (1e3, 2e4, 1e5, 1e6):
        counts = {B: record(B, per_token) for B in (1, 2, 4, 8)}
        truth = next((B for B in range(1, 1 << 16)
                      if per_token * B / peak > (model.step_weight_bytes(B) + 1000 * B) / bw), None)
        assert critical_batch(model, counts, Roof) == truth, per_token


# -- published mixtures as named shapes: hardware --shape and diagnose ---------------------------------

def test_named_mixture_shapes_read_active_bytes_and_the_union():
    from minillm.measure.experts import PUBLISHED, params_read, published_params
    from minillm.measure.shapes import decode_step_bytes, kv_bytes_per_token, shape
    for name, key in (("mixtral-8x7b", "Mixtral-8x7B"), ("qwen3-30b-a3b", "Qwen3-30B-A3B"),
                      ("deepseek-v3", "DeepSeek-V3")):
        s, p = shape(name), PUBLISHED[key]
        assert (s["n_params"], s["n_active"]) == published_params(p)
        table = p["vocab"] * p["d"]                   # the untied embedding table: a step reads one row a token
        assert decode_step_bytes(s, 1, 2)["weights"] == 2 * (s["n_active"] - table + p["d"]) < 2 * s["n_params"]
        assert params_read(s, 1) == s["n_active"] - table + p["d"] < params_read(s, 2) < params_read(s, 64)
        assert params_read(s, 64) <= s["n_params"] - table + 64 * p["d"]
        E, k = p["E"], p["k"]
        assert params_read(s, 32) == pytest.approx(s["n_active"] - table + 32 * p["d"] + (p["layers"] - p["dense_layers"])
                                                   * 3 * p["d"] * p["expert_ffn"] * (moe.expected_distinct_experts(E, k, 32) - k))
    assert kv_bytes_per_token(shape("deepseek-v3"), 2) == 61 * 576 * 2                # MLA's latent
    assert kv_bytes_per_token(shape("mixtral-8x7b"), 2) == 2 * 32 * 8 * 128 * 2


def test_hardware_shape_prints_a_mixtures_active_total_and_ceilings(capsys):
    from minillm import cli
    from minillm.cli.hardware import _ms
    from minillm.measure.chips import CHIPS, roofline
    from minillm.measure.experts import read_bytes
    from minillm.measure.shapes import kv_bytes_per_sequence, shape
    assert cli.main(["hardware", "--shape", "mixtral-8x7b", "--chip", "h100", "--context", "4096"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    s, h100 = shape("mixtral-8x7b"), CHIPS["h100-sxm"]
    assert f"{s['n_params'] / 1e9:.2f}B params ({s['n_active'] / 1e9:.2f}B active: top-2 of 8 experts" in said
    assert "(weights bf16, as released; KV bf16)" in said
    assert f"weights held: {2 * s['n_params'] / 1e9:,.2f} GB" in said
    kv = kv_bytes_per_sequence(s, 4096, 2)
    one = roofline(read_bytes(s) + kv, 2 * s["n_active"], h100).seconds
    many = roofline(read_bytes(s, 32) + 32 * kv, 64 * s["n_active"], h100).seconds
    assert f"{h100.name} {_ms(one * 1e3)} {1 / one:,.0f}" in said
    from minillm.measure.shapes import gpus_needed
    gpus = gpus_needed(2 * s["n_params"], h100.memory_gb * 1e9)             # the one capacity rule
    assert f"{_ms(many * 1e3)} {32 / many:,.0f} {gpus}" in said


def test_deepseek_v3_is_sized_as_released_and_fits_eight_h200s(capsys):
    """E18: DeepSeek-V3 ships in FP8 with a float32 scale per 128×128 tile (and its embedding, head,
    routers and norms in bf16): 673 GB, 84 GB a GPU on 8, which fits an H200's 141 GB; in bf16 it is
    twice that and does not. `hardware --shape deepseek-v3` sizes it so by default."""
    from minillm import cli
    from minillm.measure.chips import CHIPS
    from minillm.measure.experts import FP8_TILE, PUBLISHED, held_bytes, kept_params, read_bytes
    from minillm.measure.shapes import shape
    s, p = shape("deepseek-v3"), PUBLISHED["DeepSeek-V3"]
    kept = kept_params(p)
    assert FP8_TILE == 1 + 4 / 16384 and s["kept_params"] == kept
    assert held_bytes(s) == pytest.approx((s["n_params"] - kept) * FP8_TILE + 2 * kept)
    h200 = CHIPS["h200"].memory_gb * 1e9
    assert held_bytes(s) / 8 < h200 < held_bytes(s, 2.0) / 8                   # fits as released, not in bf16
    assert 37e9 < read_bytes(s) < 39e9 < 2 * read_bytes(s)                     # about 38 GB a token in FP8
    assert cli.main(["hardware", "--shape", "deepseek-v3", "--chip", "h200"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "fp8 + 128×128 tile scales, as released" in said
    assert f"weights held: {held_bytes(s) / 1e9:,.2f} GB" in said
    assert f"{held_bytes(s, 2.0) / 1e9:,.2f} GB held, {held_bytes(s, 2.0) / held_bytes(s):.2f}× the release" in said
    assert cli.main(["hardware", "--shape", "deepseek-v3", "--dtype", "bf16", "--chip", "h200"]) == 0
    assert f"weights held: {2 * s['n_params'] / 1e9:,.2f} GB" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("name", ["deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "llama-2-7b",
                                  "gemma-3-12b", "gpt2-124m"])
def test_hardware_shape_stays_within_80_columns(name, capsys):
    """C9: `hardware --shape` printed lines of 248 characters."""
    from minillm import cli
    assert cli.main(["hardware", "--shape", name, "--chip", "h100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and max(len(x) for x in lines) <= 80, max(lines, key=len)


def test_fit_can_count_the_kv_cache_alone(capsys):
    """C9: --fit --kv-only fills the memory with KV alone (the weights elsewhere)."""
    from minillm import cli
    from minillm.measure.shapes import capacity, shape
    assert cli.main(["hardware", "--shape", "llama-3-8b", "--fit", "4096", "--memory", "40GB", "--kv-only"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    n = capacity(shape("llama-3-8b"), 4096, 40e9, kv_only=True)["sequences"]
    assert n == int(40e9 * 0.9 // (4096 * 2 * 32 * 8 * 128 * 2))
    assert f"fit in 40GB: {n:,}" in said and "weights (none: --kv-only): 0.0 GB" in said
    assert cli.main(["hardware", "--shape", "llama-3-8b", "--memory", "40GB", "--kv-only"]) == 1


def test_diagnose_batches_a_mixture_by_the_union(monkeypatch, capsys):
    """diagnose's batched table reads, for a mixture, the model's closed form of B tokens' weights
    (uniform routing's union), and names its active parameters."""
    import argparse
    from minillm.cli import diagnose as d
    from minillm.measure.chips import Hardware, roofline
    gpu = Hardware(name="gpu-x", bandwidth_gbs=2000.0, peak_gflops=300_000.0, memory_gb=24)
    monkeypatch.setattr(d, "get_chip", lambda name: gpu)
    monkeypatch.setattr(d, "one_thread_when_busy", lambda args, stack: None)
    folder = str(FIXTURES / "mixtral-tiny")
    args = argparse.Namespace(prompt_tokens=40, answer_tokens=10, shared_prefix=0, chip="x", model=folder,
                              weights="float32", device="cpu")
    assert d.run(args) == 0
    said = " ".join(capsys.readouterr().out.split())
    model = minillm.load(folder)
    assert f"{model.config.active_params() / 1e6:,.0f}M active per token: top-2 of 4 experts" in said
    _, _, dec, first, _, n = d.measure_workload(model, 40, 10)
    own = dec.fused / n - first.bytes["weights"]          # the answer's mean step, its KV counted (issue 53)
    weights = first.bytes["weights"] + model.step_weight_bytes(32) - model.step_weight_bytes(1)
    r = roofline((weights + 32 * own) * d.FP16, 32 * dec.flops / n, gpu)
    assert f"32 {d._t(r.seconds)} {32 / r.seconds:,.0f}" in said


def test_a_gpu_is_refused_in_one_line():
    """The routing and grouping are NumPy's: a mixture built for a GPU says so before any array moves."""
    import numpy
    from minillm.backend import Device, DeviceError
    gpu = Device("cuda", numpy, "a stand-in GPU")
    c = MoEConfig(n_layer=1, n_head=2, n_kv_head=1, head_dim=16, n_embd=32, n_ctx=16, vocab_size=50, ffn=32,
                  n_expert=4, top_k=2)
    with pytest.raises(DeviceError, match="a mixture of experts .* runs on the CPU only; on --device cuda use --device cpu"):
        MoE(c, random_params(c), Target(gpu, np.dtype(np.float32), "float32", "numpy"))
