"""One capacity function for "how many sequences of T tokens fit in M bytes" (lessons 5 and 12,
`minillm hardware --shape/--fit`, `minillm diagnose`), checked against hand arithmetic on published
shapes; the KV layouts that shrink it (GQA, MLA, sliding windows, 8-bit values); and the int8 KV cache,
whose bytes the meter counts and whose tokens stay those of float32."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.cache.contiguous import KVCache
from minillm.errors import MiniLLMError
from minillm.measure.shapes import capacity, kv_bytes_per_sequence, kv_bytes_per_token, sequences_that_fit, shape


@pytest.mark.parametrize("name, weights, kv_token, expect", [
    # (80e9 × 0.9 − 2·6,738,415,616) ÷ (4,096 × 2·32·32·128·2) = 58,523,168,768 ÷ 2,147,483,648 = 27.25
    ("llama-2-7b", 13_476_831_232, 524_288, 27),
    # (72e9 − 2·8,030,261,248) ÷ (4,096 × 2·32·8·128·2) = 55,939,477,504 ÷ 536,870,912 = 104.2
    ("llama-3-8b", 16_060_522_496, 131_072, 104),
])
def test_capacity_is_the_hand_arithmetic_on_published_shapes(name, weights, kv_token, expect):
    cap = capacity(shape(name), 4096, 80e9)
    assert cap["utilisation"] == 0.9 and cap["usable_bytes"] == 72e9
    assert cap["weight_bytes"] == weights and cap["kv_bytes_per_token"] == kv_token
    assert cap["kv_bytes_per_sequence"] == 4096 * kv_token
    assert cap["sequences"] == expect == (72e9 - weights) // (4096 * kv_token)
    assert sequences_that_fit(shape(name), 4096, 2, 80e9) == expect      # the old name, the same answer


def test_capacity_with_an_int8_kv_cache_and_all_the_memory():
    s = shape("llama-2-7b")
    # (80e9 − 13,476,831,232) ÷ (4,096 × 262,144) = 66,523,168,768 ÷ 1,073,741,824 = 61.96
    assert capacity(s, 4096, 80e9, kv_bytes_per_value=1, utilisation=1.0)["sequences"] == 61
    assert capacity(s, 4096, 10e9)["sequences"] == 0 and not capacity(s, 4096, 10e9)["weights_fit"]
    with pytest.raises(MiniLLMError, match="utilisation"):
        capacity(s, 4096, 80e9, utilisation=1.5)


def test_kv_layouts_mla_and_sliding_windows():
    ds = shape("deepseek-v3")
    assert kv_bytes_per_token(ds, 2) == 61 * (512 + 64) * 2 == 70_272           # "about 70 KB" in bf16
    mistral = shape("mistral-7b")                                               # window 4,096 on all 32 layers
    assert kv_bytes_per_sequence(mistral, 32768, 2) == kv_bytes_per_sequence(mistral, 4096, 2) == 4096 * 131_072
    g3 = shape("gemma-3-12b")                                                   # 40 local (1,024) and 8 global
    assert kv_bytes_per_sequence(g3, 32768, 2) == 8192 * (40 * 1024 + 8 * 32768)
    assert kv_bytes_per_sequence(g3, 512, 2) == 512 * kv_bytes_per_token(g3, 2)  # under the window: all kept


def test_hardware_fit_answers_for_any_shape_and_kv_dtype(capsys):
    from minillm import cli

    assert cli.main(["hardware", "--shape", "llama-2-7b", "--fit", "4096", "--memory", "80GB",
                     "--kv-dtype", "int8"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    n = (80e9 * 0.9 - 13_476_831_232) // (4096 * 262_144)
    assert f"sequences of 4,096 tokens that fit in 80GB: {int(n)}" in out and "× 0.9" in out
    assert cli.main(["hardware", "--shape", "llama-3-8b", "--fit", "4096", "--chip", "a100"]) == 0
    assert "a100-80gb's 80 GB: 104" in " ".join(capsys.readouterr().out.split())
    assert cli.main(["hardware", "--shape", "llama-2-7b", "--fit", "4096"]) == 1      # no memory given
    assert "--memory" in capsys.readouterr().err


# -- the int8 KV cache ---------------------------------------------------------------------------------

def _greedy(model, ids, n, kv_dtype):
    cache = KVCache(model.config, model.dtype, kv_dtype)
    logits, cache = model.prefill(ids, cache)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = model.decode_step(out[-1], cache)
    return out, cache


def test_an_int8_cache_reads_the_bytes_of_its_closed_form():
    model = minillm.load("random-tiny", quiet=True)
    c = model.config
    ids = list(range(1, 20))
    _, cache = _greedy(model, ids, 3, "int8")
    assert cache.bytes_per_token() == 2 * c.n_layer * c.n_kv_head * (c.head_dim + 4)
    with minillm.Meter() as m:
        model.decode_step(7, cache)
    step = m.steps[0]
    t = len(ids) + 3 + 1                                  # positions read by the step, its own included
    assert step.bytes["kv_read"] == t * cache.bytes_per_token()
    assert step.bytes["kv_write"] == cache.bytes_per_token()
    assert step.flops["dequant"] > 0


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_int8_kv_keeps_float32s_logits_close(seed):
    model = minillm.load("random-tiny", quiet=True)
    ids = list(np.random.default_rng(seed).integers(0, model.config.vocab_size, 12))
    l32, c32 = model.prefill(ids, KVCache(model.config, model.dtype))
    l8, c8 = model.prefill(ids, KVCache(model.config, model.dtype, "int8"))
    np.testing.assert_allclose(l8, l32, atol=1e-6 + 0.02 * np.abs(l32).max())   # the prefill's own K, V
    d32, d8 = model.decode_step(3, c32), model.decode_step(3, c8)
    assert np.abs(d8 - d32).max() <= 0.05 * np.abs(d32).max() + 1e-6


def test_int8_kv_gives_float32s_greedy_tokens_on_the_bundled_model():
    model = minillm.load("small", quiet=True)
    ids = minillm.tokenizer().encode("ROMEO: What say you")
    a, _ = _greedy(model, ids, 16, None)
    b, _ = _greedy(model, ids, 16, "int8")
    assert sum(x == y for x, y in zip(a, b)) >= 12, (a, b)


# -- goodput against the request rate (serve-sim --rates) --------------------------------------------

def test_parse_rates():
    from minillm.serving.rates import parse_rates

    assert parse_rates("4,1,2") == [1.0, 2.0, 4.0]
    for bad in ("", "1,x", "0,1", "1,1", "-2"):
        with pytest.raises(MiniLLMError, match="--rates"):
            parse_rates(bad)


def _run(rate, met, tok_s=100.0):
    return {"rate": rate, "attainment": met, "output_tokens_per_s": tok_s, "slo_met": {"all": met}}


def test_highest_rate_is_the_highest_that_meets_the_attainment_target():
    from minillm.serving.rates import capacity_words, highest_rate

    runs = [_run(1, 1.0), _run(2, 0.95, 180.0), _run(4, 0.6), _run(8, 0.1)]
    h = highest_rate(runs, 0.9)
    assert h["rate"] == 2 and h["tokens_per_s"] == 180.0 and not h["all_met"] and h["below"] == []
    assert h["engine_s_per_mtok"] == pytest.approx(1e6 / 180)
    words = " ".join(capacity_words(h, "TTFT≤1 s", price_per_hour=2.0))
    assert "2 requests/s is the highest swept rate" in words and f"${2.0 * 1e6 / 180 / 3600:,.2f}" in words
    assert highest_rate(runs, 0.5)["rate"] == 4
    none = highest_rate(runs, 1.01)
    assert none["rate"] is None and "below the lowest rate" in capacity_words(none, "x")[0]
    noisy = highest_rate([_run(1, 0.8), _run(2, 0.95), _run(4, 0.5)], 0.9)
    assert noisy["rate"] == 2 and noisy["below"] == [1]
    assert highest_rate([_run(1, 1.0), _run(2, 1.0)])["all_met"]


def test_rate_sweep_serves_the_same_requests_faster_or_slower():
    from minillm.serving.rates import highest_rate, rate_sweep

    model = minillm.load("random-tiny", quiet=True)
    runs = rate_sweep(model, [2.0, 1000.0], {"ttft": 0.5}, workload="poisson", n=6, seed=3, threads=1,
                      max_batched_tokens=64)
    assert [r["rate"] for r in runs] == [2.0, 1000.0]
    assert all(r["requests"] == 6 for r in runs) and runs[0]["output_tokens"] == runs[1]["output_tokens"]
    assert runs[1]["duration_s"] < runs[0]["duration_s"]          # the same work, arriving 500× faster
    assert highest_rate(runs, 0.0)["rate"] == 1000.0
    with pytest.raises(MiniLLMError, match="--slo"):
        rate_sweep(model, [1.0], {})
