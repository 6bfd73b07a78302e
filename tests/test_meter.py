"""The counters against their closed forms (the README's "The counters"), exactly, over random small GPT-2 shapes.

Every prefill, decode, naive and plain-forward record is checked byte for byte and FLOP for FLOP
against the formulas in the README ("The counters"), in float32 (b = 4) and float64 (b = 8). The
activations and "other" FLOPs are pinned exactly for batched steps in tests/test_batch_meter.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm import meter
from minillm.models.gpt2 import random_params
from minillm.cli import main
from minillm.models import ops

CHECKED = ("weights", "kv_read", "kv_write", "matmul", "attention")


def closed_forms(config: minillm.GPT2Config, b: int, *, tokens: int, keys: int,
                 lm_rows: int = 1, cached: bool = True) -> dict[str, int]:
    """The README's "The counters": the bytes and FLOPs one step must report, as exact integers.

    One step runs `tokens` tokens through the blocks; each attends over `keys` keys (the t of
    the closed forms: positions so far, the step's own included); the LM head runs on `lm_rows` rows;
    `cached` says whether the step writes and reads a KV cache. With L layers, width d, vocab V:

        weights    (12·L·d² + 13·L·d + 2·d + V·d)·b  +  2·tokens·d·b   (gathered rows of wte and wpe)
        kv_read    2·L·keys·d·b                      (0 without a cache)
        kv_write   2·L·tokens·d·b                    (0 without a cache)
        matmul     tokens·24·L·d²  +  lm_rows·2·d·V
        attention  4·L·tokens·keys·d                 (the full score matrix, masked half included)

    A decode step is tokens=1, keys=t: the closed forms' `24·L·d² + 2·d·V` and `4·L·t·d`. A prefill of
    T tokens from an empty cache is tokens=keys=T: `T·24·L·d²` (+ LM head) and `4·L·T²·d`.
    """
    L, d, V = config.n_layer, config.n_embd, config.vocab_size
    return {
        "weights": (12 * L * d * d + 13 * L * d + 2 * d + V * d) * b + 2 * tokens * d * b,
        "kv_read": 2 * L * keys * d * b if cached else 0,
        "kv_write": 2 * L * tokens * d * b if cached else 0,
        "matmul": tokens * 24 * L * d * d + lm_rows * 2 * d * V,
        "attention": 4 * L * tokens * keys * d,
    }


def decode_forms(config: minillm.GPT2Config, b: int, t: int) -> dict[str, int]:
    """One cached decode step attending over t keys (the decode closed forms)."""
    return closed_forms(config, b, tokens=1, keys=t)


def counted(record: meter.StepRecord) -> dict[str, int]:
    """The record's values for the quantities the closed forms cover."""
    return {"weights": record.bytes["weights"], "kv_read": record.bytes["kv_read"],
            "kv_write": record.bytes["kv_write"], "matmul": record.flops["matmul"],
            "attention": record.flops["attention"]}


def assert_matches(record: meter.StepRecord, expected: dict[str, int], where: str) -> None:
    got = counted(record)
    for k, v in got.items():
        assert type(v) is int, f"{where}: {k} is {type(v).__name__}, not a Python int"
    diff = {k: (got[k], expected[k]) for k in CHECKED if got[k] != expected[k]}
    assert not diff, f"{where}: (counted, closed form) differ for {diff}"


# -- random small models -----------------------------------------------------------------------

@st.composite
def cases(draw, max_new: int = 8):
    """A random small config, a dtype, a seed, a prompt and a number of tokens that fit the context."""
    n_head = draw(st.integers(1, 4))
    config = minillm.GPT2Config(
        n_layer=draw(st.integers(1, 3)),
        n_head=n_head,
        n_embd=n_head * draw(st.integers(4, 16)),
        n_ctx=draw(st.integers(2, 64)),
        vocab_size=draw(st.integers(50, 300)),
    )
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    P = draw(st.integers(1, min(config.n_ctx - 1, 24)))
    n = draw(st.integers(1, min(config.n_ctx - P, max_new)))
    prompt = draw(st.lists(st.integers(0, config.vocab_size - 1), min_size=P, max_size=P))
    seed = draw(st.integers(0, 2**16))
    return config, dtype, seed, np.array(prompt), n


def build(config, dtype, seed) -> minillm.GPT2:
    return minillm.GPT2(config, random_params(config, seed, dtype=dtype))


def itemsize(dtype) -> int:
    return np.dtype(dtype).itemsize


EXAMPLES = settings(max_examples=40, deadline=None)


# -- KV-cached generation: one prefill, then n-1 decode steps ---------------------------------

@EXAMPLES
@given(cases())
def test_cached_generation_matches_closed_forms(case):
    config, dtype, seed, prompt, n = case
    model, b, P = build(config, dtype, seed), itemsize(dtype), prompt.size
    with minillm.Meter() as m:
        new = minillm.generate(model, prompt, n, kv_cache=True)
    assert len(new) == n
    assert [s.kind for s in m.steps] == ["prefill"] + ["decode"] * (n - 1)

    prefill = m.steps[0]
    assert (prefill.position, prefill.n_tokens, prefill.attended) == (0, P, P)
    # The LM head runs on the last prompt position only; attention reads the cache it just filled.
    assert_matches(prefill, closed_forms(config, b, tokens=P, keys=P), f"prefill of {P}")

    for i, step in enumerate(m.steps[1:]):
        t = P + i + 1   # keys attended once this step's token is appended
        assert (step.position, step.n_tokens, step.attended) == (P + i, 1, t)
        assert_matches(step, decode_forms(config, b, t), f"decode step {i} (t={t})")


@EXAMPLES
@given(cases())
def test_naive_generation_matches_closed_forms(case):
    config, dtype, seed, prompt, n = case
    model, b, P = build(config, dtype, seed), itemsize(dtype), prompt.size
    with minillm.Meter() as m:
        minillm.generate(model, prompt, n, kv_cache=False)
    assert [s.kind for s in m.steps] == ["prefill"] + ["decode"] * (n - 1)
    for i, step in enumerate(m.steps):
        S = P + i   # the whole sequence so far, recomputed from position 0
        assert (step.position, step.n_tokens, step.attended) == (0, S, S)
        assert_matches(step, closed_forms(config, b, tokens=S, keys=S, cached=False), f"naive step {i} (S={S})")


@EXAMPLES
@given(cases(max_new=1))
def test_forward_all_logits_matches_closed_forms(case):
    config, dtype, seed, ids, _ = case
    model, b, T = build(config, dtype, seed), itemsize(dtype), ids.size
    with minillm.Meter() as m:
        logits = model.forward(ids)
    assert logits.shape == (T, config.vocab_size)
    [record] = m.steps
    assert (record.kind, record.position, record.n_tokens) == ("forward", 0, T)
    assert_matches(record, closed_forms(config, b, tokens=T, keys=T, lm_rows=T, cached=False), f"forward of {T}")


@settings(max_examples=15, deadline=None)
@given(cases(), st.integers(1, 8))
def test_prefill_into_a_filled_cache(case, extra):
    """A second prefill chunk at position pos attends over pos + T keys (the general form)."""
    config, dtype, seed, prompt, _ = case
    P = prompt.size
    extra = min(extra, config.n_ctx - P)   # at least 1: the prompt leaves room for a token
    model, b = build(config, dtype, seed), itemsize(dtype)
    chunk = np.arange(extra) % config.vocab_size
    with minillm.Meter() as m:
        _, cache = model.prefill(prompt)
        model.prefill(chunk, cache)
    second = m.steps[1]
    assert (second.kind, second.position, second.n_tokens, second.attended) == ("prefill", P, extra, P + extra)
    assert_matches(second, closed_forms(config, b, tokens=extra, keys=P + extra), "second prefill chunk")


# -- how the steps grow ----------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(cases(max_new=10))
def test_naive_grows_cached_stays_flat(case):
    config, dtype, seed, prompt, n = case
    if n < 3:
        n = min(3, config.n_ctx - prompt.size)
    model = build(config, dtype, seed)
    with minillm.Meter() as naive:
        minillm.generate(model, prompt, n, kv_cache=False)
    with minillm.Meter() as cached:
        minillm.generate(model, prompt, n, kv_cache=True)

    naive_flops = [s.total_flops for s in naive.steps]
    assert all(a < b for a, b in zip(naive_flops, naive_flops[1:])), naive_flops

    decodes = cached.of_kind("decode")
    assert len({s.flops["matmul"] for s in decodes}) <= 1
    attention = [s.flops["attention"] for s in decodes]
    step = 4 * config.n_layer * config.n_embd
    assert all(b - a == step for a, b in zip(attention, attention[1:])), (attention, step)


# -- derived fields, serialization, sanity ------------------------------------------------------

@settings(max_examples=10, deadline=None)
@given(cases())
def test_derived_fields(case):
    config, dtype, seed, prompt, n = case
    model = build(config, dtype, seed)
    with minillm.Meter() as m:
        minillm.generate(model, prompt, n)
    for s in m.steps:
        assert s.total_bytes == sum(s.bytes.values()) == sum(s.bytes[k] for k in meter.BYTE_KINDS)
        assert s.total_flops == sum(s.flops.values()) == sum(s.flops[k] for k in meter.FLOP_KINDS)
        assert set(s.bytes) == set(meter.BYTE_KINDS) and set(s.flops) == set(meter.FLOP_KINDS)
        assert s.seconds > 0
        assert s.intensity == s.total_flops / s.total_bytes
        assert s.gbps == s.total_bytes / s.seconds / 1e9
        assert s.gflops == s.total_flops / s.seconds / 1e9
        # Not in the closed forms, but reported.
        assert s.bytes["activations"] > 0
        assert s.flops["other"] > 0
        d = json.loads(json.dumps(s.as_dict()))
        assert d["bytes"] == s.bytes and d["flops"] == s.flops
        assert (d["kind"], d["position"], d["n_tokens"]) == (s.kind, s.position, s.n_tokens)
        assert (d["total_bytes"], d["total_flops"]) == (s.total_bytes, s.total_flops)
    assert m.total("total_bytes") == sum(s.total_bytes for s in m.steps)


def test_step_record_of_nothing_is_zero():
    r = meter.StepRecord("decode", 0, 1)
    assert (r.total_bytes, r.total_flops, r.intensity, r.gbps, r.gflops) == (0, 0, 0.0, 0.0, 0.0)


# -- who is listening ----------------------------------------------------------------------------

def small_model(dtype=np.float32) -> minillm.GPT2:
    config = minillm.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=32, vocab_size=64)
    return build(config, dtype, 0)


def test_no_meter_no_records():
    model = small_model()
    assert meter.active() is None
    minillm.generate(model, [1, 2, 3], 4)
    model.forward([1, 2, 3])
    m = minillm.Meter()
    assert m.steps == []
    with m:
        pass
    assert m.steps == [] and meter.active() is None


def test_nested_meters():
    model = small_model()
    with minillm.Meter() as outer:
        assert meter.active() is outer
        with minillm.Meter() as inner:
            assert meter.active() is inner
            minillm.generate(model, [1, 2, 3], 3)
        assert meter.active() is outer
        assert [s.kind for s in inner.steps] == ["prefill", "decode", "decode"]
        assert outer.steps == []
        model.forward([4, 5])
    assert meter.active() is None
    assert [s.kind for s in outer.steps] == ["forward"]
    assert len(inner.steps) == 3


def test_meter_restored_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with minillm.Meter():
            1 / 0
    assert meter.active() is None


def test_steps_after_an_interrupted_step_are_recorded(monkeypatch):
    model = small_model()
    with minillm.Meter() as m:
        with monkeypatch.context() as patch:
            patch.setattr(ops, "gelu", lambda x, kernel=None: 1 / 0)
            with pytest.raises(ZeroDivisionError):
                model.forward([1, 2])
        model.forward([1, 2, 3])
    assert [(s.kind, s.n_tokens) for s in m.steps] == [("forward", 3)]


# -- the CLI ----------------------------------------------------------------------------------

TINY_ARGS = ["traffic", "--model", "random-tiny", "--prompt-tokens", "5", "--steps", "3", "--json"]   # 3 decode steps after the prefill


def test_cli_traffic_json_matches_closed_forms():
    run = subprocess.run([sys.executable, "-m", "minillm", *TINY_ARGS],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 4
    records = [json.loads(line) for line in lines]
    assert [r["kind"] for r in records] == ["prefill", "decode", "decode", "decode"]
    config = minillm.load("random-tiny").config
    P = 5
    first = records[0]
    assert (first["position"], first["n_tokens"]) == (0, P)
    got = {k: {**first["bytes"], **first["flops"]}[k] for k in CHECKED}
    assert got == closed_forms(config, 4, tokens=P, keys=P)
    for i, r in enumerate(records[1:]):
        assert (r["position"], r["n_tokens"], r["attended"]) == (P + i, 1, P + i + 1)
        got = {k: {**r["bytes"], **r["flops"]}[k] for k in CHECKED}
        assert got == decode_forms(config, 4, P + i + 1), f"decode {i}"
        assert r["total_bytes"] == sum(r["bytes"].values())
        assert r["total_flops"] == sum(r["flops"].values())


def test_cli_traffic_no_cache_grows(capsys):
    assert main([*TINY_ARGS, "--no-cache"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["n_tokens"] for r in records] == [5, 6, 7, 8]
    assert all(r["position"] == 0 for r in records)
    assert all(r["bytes"]["kv_read"] == r["bytes"]["kv_write"] == 0 for r in records)
    config = minillm.load("random-tiny").config
    for r in records:
        S = r["n_tokens"]
        got = {k: {**r["bytes"], **r["flops"]}[k] for k in CHECKED}
        assert got == closed_forms(config, 4, tokens=S, keys=S, cached=False)


@settings(max_examples=8, deadline=None)
@given(T=st.integers(129, 300), cached=st.booleans())
def test_long_prefill_attention_counts_the_query_blocks(T, cached):
    """Past 128 tokens, attention goes in query blocks of 128, each against the keys up to its last
    query: FLOPs 4·L·d·Σ rows·keys over the blocks (less than the full 4·L·T²·d), matmul unchanged."""
    config = minillm.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=320, vocab_size=64)
    model = build(config, np.float32, 0)
    ids = np.arange(T) % config.vocab_size
    with minillm.Meter() as m:
        model.prefill(ids) if cached else model.forward(ids, last_only=True)
    (record,) = m.steps
    L, d = config.n_layer, config.n_embd
    pairs = 0
    for first in range(0, T, 128):                      # rows first .. last-1 see keys 0 .. last-1
        last = min(first + 128, T)
        pairs += (last - first) * last
    assert record.flops["attention"] == 4 * L * d * pairs < 4 * L * T * T * d
    assert record.flops["matmul"] == T * 24 * L * d * d + 2 * d * config.vocab_size


def test_each_thread_counts_into_its_own_meter():
    """Two threads run metered work at once: each meter holds exactly its own steps (the meter used to
    be one process-wide global, so one thread's steps landed in the other's meter)."""
    import threading
    model = small_model()
    start = threading.Barrier(2)
    meters, errors = {}, []

    def work(name, prompt, n):
        try:
            with minillm.Meter() as m:
                start.wait(timeout=10)
                for _ in range(5):
                    minillm.generate(model, prompt, n)
            meters[name] = m
        except Exception as e:     # pragma: no cover - reported below
            errors.append(e)

    a = threading.Thread(target=work, args=("a", [1, 2, 3], 3))
    b = threading.Thread(target=work, args=("b", [4, 5, 6, 7, 8], 6))
    a.start(), b.start(), a.join(), b.join()
    assert not errors
    assert [s.kind for s in meters["a"].steps] == (["prefill"] + ["decode"] * 2) * 5
    assert [s.kind for s in meters["b"].steps] == (["prefill"] + ["decode"] * 5) * 5
    assert {s.n_tokens for s in meters["a"].steps if s.kind == "prefill"} == {3}
    assert {s.n_tokens for s in meters["b"].steps if s.kind == "prefill"} == {5}
    assert meter.active() is None


def test_a_thread_started_inside_a_meter_counts_nothing_into_it():
    import threading
    model = small_model()
    with minillm.Meter() as m:
        t = threading.Thread(target=lambda: minillm.generate(model, [1, 2], 3))
        t.start()
        t.join()
    assert m.steps == []
