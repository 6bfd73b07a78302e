"""The hand-written backward passes of minillm.training, checked against central finite differences.

Every check runs in float64 on small shapes: for an op y = f(x), pick a random upstream gradient g,
and compare the analytic dL/dx of L = sum(g * y) with (L(x + h) - L(x - h)) / 2h, element by element.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.checkpoints import checkpoint as ckpt
from minillm.cli import train as train_cli
from minillm.training import data as tdata
from minillm.training import model as tmodel
from minillm.training import ops as tops
from minillm.training import optim
from minillm.training import train as tr
from minillm.models.gpt2 import GPT2Config
from minillm.errors import MiniLLMError, WeightsError

FEW = settings(max_examples=6, deadline=None)
H = 1e-6
RTOL, ATOL = 1e-5, 1e-7


def numerical_grad(f, x):
    """d f() / d x by central differences, perturbing x in place one element at a time."""
    grad = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + H
        up = f()
        x[i] = old - H
        down = f()
        x[i] = old
        grad[i] = (up - down) / (2 * H)
    return grad


def check(analytic, numeric):
    np.testing.assert_allclose(analytic, numeric, rtol=RTOL, atol=ATOL)


def rand(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


dims = st.integers(1, 3)


# ------------------------------------------------------------------------------ one op at a time


@FEW
@given(B=dims, T=dims, d=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_layernorm_backward(B, T, d, seed):
    rng = np.random.default_rng(seed)
    x, w, b, g = rand(rng, B, T, d), rand(rng, d), rand(rng, d), rand(rng, B, T, d)
    loss = lambda: float(np.sum(tops.layernorm_forward(x, w, b)[0] * g))
    _, cache = tops.layernorm_forward(x, w, b)
    dx, dw, db = tops.layernorm_backward(g, cache)
    check(dx, numerical_grad(loss, x))
    check(dw, numerical_grad(loss, w))
    check(db, numerical_grad(loss, b))


@FEW
@given(B=dims, T=dims, d=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_gelu_backward(B, T, d, seed):
    rng = np.random.default_rng(seed)
    x, g = rand(rng, B, T, d, scale=2.0), rand(rng, B, T, d)
    loss = lambda: float(np.sum(tops.gelu_forward(x)[0] * g))
    check(tops.gelu_backward(g, tops.gelu_forward(x)[1]), numerical_grad(loss, x))


def test_gelu_is_gpt2s_tanh_form():
    x = np.linspace(-4, 4, 9)
    expected = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(tops.gelu_forward(x)[0], expected, rtol=1e-12)


@FEW
@given(B=dims, T=dims, n_in=st.integers(1, 5), n_out=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_linear_backward(B, T, n_in, n_out, seed):
    rng = np.random.default_rng(seed)
    x, w, b, g = rand(rng, B, T, n_in), rand(rng, n_in, n_out), rand(rng, n_out), rand(rng, B, T, n_out)
    loss = lambda: float(np.sum(tops.linear_forward(x, w, b)[0] * g))
    dx, dw, db = tops.linear_backward(g, tops.linear_forward(x, w, b)[1])
    check(dx, numerical_grad(loss, x))
    check(dw, numerical_grad(loss, w))
    check(db, numerical_grad(loss, b))


@FEW
@given(B=dims, T=st.integers(1, 5), H_=st.integers(1, 3), hd=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_attention_backward(B, T, H_, hd, seed):
    rng = np.random.default_rng(seed)
    d = H_ * hd
    qkv, g = rand(rng, B, T, 3 * d), rand(rng, B, T, d)
    loss = lambda: float(np.sum(tops.attention_forward(qkv, H_)[0] * g))
    dqkv = tops.attention_backward(g, tops.attention_forward(qkv, H_)[1])
    check(dqkv, numerical_grad(loss, qkv))


def test_attention_with_dropout_backward():
    """A fixed seed gives the same dropout mask each call, so the function is differentiable."""
    rng = np.random.default_rng(0)
    qkv, g = rand(rng, 2, 4, 12), rand(rng, 2, 4, 4)
    fwd = lambda: tops.attention_forward(qkv, 2, 0.3, np.random.default_rng(7))
    loss = lambda: float(np.sum(fwd()[0] * g))
    check(tops.attention_backward(g, fwd()[1]), numerical_grad(loss, qkv))


def test_attention_is_causal():
    rng = np.random.default_rng(1)
    qkv = rand(rng, 1, 5, 12)
    y = tops.attention_forward(qkv, 2)[0]
    qkv2 = qkv.copy()
    qkv2[:, 3:] += 1.0  # change the future: the first three outputs must not move
    np.testing.assert_allclose(tops.attention_forward(qkv2, 2)[0][:, :3], y[:, :3], rtol=1e-12)


@FEW
@given(B=dims, T=st.integers(1, 4), V=st.integers(2, 7), d=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_embedding_backward(B, T, V, d, seed):
    rng = np.random.default_rng(seed)
    wte, wpe = rand(rng, V, d), rand(rng, 5, d)
    idx = rng.integers(0, V, (B, T))  # repeats are likely: their gradients must add up
    g = rand(rng, B, T, d)
    loss = lambda: float(np.sum(tops.embedding_forward(wte, wpe, idx)[0] * g))
    dwte, dwpe = tops.embedding_backward(g, idx, wte.shape, wpe.shape)
    check(dwte, numerical_grad(loss, wte))
    check(dwpe, numerical_grad(loss, wpe))


@FEW
@given(N=st.integers(1, 6), V=st.integers(2, 8), seed=st.integers(0, 2**16))
def test_cross_entropy_backward(N, V, seed):
    rng = np.random.default_rng(seed)
    logits, targets = rand(rng, N, V, scale=3.0), rng.integers(0, V, N)
    loss = lambda: tops.cross_entropy_forward(logits, targets)[0]
    check(tops.cross_entropy_backward(tops.cross_entropy_forward(logits, targets)[1]), numerical_grad(loss, logits))


@FEW
@given(N=st.integers(1, 5), V=st.integers(2, 7), d=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_tied_lm_head_backward(N, V, d, seed):
    rng = np.random.default_rng(seed)
    x, wte, g = rand(rng, N, d), rand(rng, V, d), rand(rng, N, V)
    loss = lambda: float(np.sum(tops.lm_head_forward(x, wte)[0] * g))
    dx, dwte = tops.lm_head_backward(g, tops.lm_head_forward(x, wte)[1])
    check(dx, numerical_grad(loss, x))
    check(dwte, numerical_grad(loss, wte))


@FEW
@given(N=st.integers(1, 9), V=st.integers(2, 9), d=st.integers(1, 4), chunk=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_fused_chunked_head_matches_the_plain_pair(N, V, d, chunk, seed):
    """The training path (fused, chunked, in place) gives the plain ops' loss and gradients,
    and its gradients match finite differences."""
    rng = np.random.default_rng(seed)
    x, wte, targets = rand(rng, N, d), rand(rng, V, d), rng.integers(0, V, N)
    loss, dx, dwte = tops.lm_head_cross_entropy(x, wte, targets, chunk)
    logits, head = tops.lm_head_forward(x, wte)
    plain, ce = tops.cross_entropy_forward(logits, targets)
    pdx, pdwte = tops.lm_head_backward(tops.cross_entropy_backward(ce), head)
    assert loss == pytest.approx(plain, rel=1e-12)
    np.testing.assert_allclose(dx, pdx, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(dwte, pdwte, rtol=1e-10, atol=1e-14)
    f = lambda: tops.lm_head_cross_entropy(x, wte, targets, chunk, need_grad=False)[0] / N
    check(dx, numerical_grad(f, x))
    check(dwte, numerical_grad(f, wte))


# ---------------------------------------------------------------------------- the whole model


TINY = GPT2Config(n_layer=2, n_head=2, n_embd=6, n_ctx=5, vocab_size=9)


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_whole_model_backward(dropout):
    """Every parameter of a 2-layer model (tied wte included), end to end, against finite differences."""
    rng = np.random.default_rng(0)
    params = tmodel.init_params(TINY, seed=0, dtype=np.float64)
    for p in params.values():
        p += rand(rng, *p.shape, scale=0.3)  # move off the symmetric init (zero biases, unit gains)
    idx, targets = rng.integers(0, 9, (2, 4)), rng.integers(0, 9, (2, 4))
    fresh = lambda: np.random.default_rng(3) if dropout else None  # the same dropout masks every call
    _, grads = tmodel.loss_and_grads(params, TINY, idx, targets, dropout, fresh(), chunk=3)
    assert set(grads) == set(params)
    loss = lambda: tmodel.forward(params, TINY, idx, targets, dropout, fresh(), need_grad=True, chunk=3)[0]
    for name, p in params.items():
        check(grads[name], numerical_grad(loss, p))


def test_training_is_float32():
    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=8, n_ctx=4, vocab_size=20)
    params = tmodel.init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    idx, targets = rng.integers(0, 20, (2, 4)), rng.integers(0, 20, (2, 4))
    _, grads = tmodel.loss_and_grads(params, cfg, idx, targets, 0.1, rng)
    optim.AdamW(params).step(params, grads, 1e-3)
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float32)}
    assert {p.dtype for p in params.values()} == {np.dtype(np.float32)}


def test_adamw_decays_only_matrices():
    params = {"w": np.ones((2, 2), np.float32), "b": np.ones(2, np.float32)}
    zero = {k: np.zeros_like(v) for k, v in params.items()}
    optim.AdamW(params, weight_decay=0.5).step(params, zero, lr=0.1)
    np.testing.assert_allclose(params["w"], 0.95)  # shrunk by lr * wd
    np.testing.assert_allclose(params["b"], 1.0)   # biases and layer norms are not decayed


def test_clip_and_schedule():
    grads = {"a": np.full(4, 3.0, np.float32)}  # norm 6
    assert optim.clip_grad_norm(grads, 1.0) == pytest.approx(6.0)
    assert math.sqrt(float(np.sum(grads["a"] ** 2))) == pytest.approx(1.0, rel=1e-5)
    assert optim.lr_at(0.0, 0, 1.0, 10) == pytest.approx(0.1)
    assert optim.lr_at(0.0, 10, 1.0, 10) == pytest.approx(1.0)
    assert optim.lr_at(1.0, 99, 1.0, 10) == pytest.approx(0.1)


# ------------------------------------------------------------------------------ data and training


TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n") * 8


def test_evaluate_reads_non_overlapping_windows():
    cfg = GPT2Config(n_layer=1, n_head=1, n_embd=4, n_ctx=4, vocab_size=10)
    params = tmodel.init_params(cfg, seed=1, dtype=np.float64)
    tokens = np.random.default_rng(0).integers(0, 10, 11)  # windows [0:4]->[1:5], [4:8]->[5:9], [8:10]->[9:11]
    total = 0.0
    for s, e in [(0, 4), (4, 8), (8, 10)]:
        logits = tmodel.forward(params, cfg, tokens[None, s:e], tokens[None, s + 1:e + 1], need_grad=False)[0]
        total += logits
    assert tdata.evaluate(params, cfg, tokens) == pytest.approx(total / 10, rel=1e-12)


def test_training_lowers_the_loss(tmp_path):
    data = tmp_path / "tiny.txt"
    data.write_text(TEXT, encoding="utf-8")
    tokens = tdata.load_tokens(data)
    train_tok, heldout = tdata.split_tokens(tokens, 16)
    kwargs = dict(layers=1, heads=2, width=16, context=16)
    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=16, n_ctx=16)
    before = tdata.evaluate(tmodel.init_params(cfg, seed=3), cfg, train_tok)
    summary = tr.train(data, out=tmp_path / "ck", batch=4, steps=30, lr=1e-2, warmup=5, seed=3, eval_every=0,
                       log=lambda *a: None, progress=False, **kwargs)
    assert summary["steps"] == 30
    assert summary["train_eval"] < before - 2.0
    assert summary["final_heldout"] < before - 2.0
    assert sorted(os.listdir(tmp_path / "ck")) == ["config.json", "model.safetensors"]
    again = tdata.heldout_loss(data, tmp_path / "ck")  # float16 on disk: close, not equal
    assert again == pytest.approx(summary["final_heldout"], abs=0.02)


def test_bad_data_raises_clear_errors(tmp_path):
    with pytest.raises(MiniLLMError, match="not found"):
        tdata.load_tokens(tmp_path / "missing.txt")
    short = tmp_path / "short.txt"
    short.write_text("To be or not to be", encoding="utf-8")
    with pytest.raises(MiniLLMError, match="too short"):
        tr.train(short, steps=1, log=lambda *a: None, progress=False)


def test_checkpoint_is_atomic(tmp_path, monkeypatch):
    """A save that fails half-way leaves the previous checkpoint intact and no stray files."""
    import minillm.checkpoints.safetensors as sf

    cfg = GPT2Config(n_layer=1, n_head=1, n_embd=4, n_ctx=4, vocab_size=10)
    params = tmodel.init_params(cfg, seed=0)
    out = tmp_path / "ck"
    ckpt.save_checkpoint(out, params, cfg, dtype="float16")
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}

    real, calls = sf._little_endian_bytes, []

    def fail_on_third_tensor(array):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(array)

    monkeypatch.setattr(sf, "_little_endian_bytes", fail_on_third_tensor)
    changed = {k: v + 1.0 for k, v in params.items()}
    with pytest.raises(WeightsError, match="cannot save the checkpoint there \\(disk full\\)"):
        ckpt.save_checkpoint(out, changed, cfg, dtype="float16")
    assert len(calls) == 3  # it did fail part-way through the data
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before


@settings(max_examples=10, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_training_forward_is_the_engines_forward(B, T, seed):
    """The training forward (kept for backward) computes the same GPT-2 as the inference engine:
    its loss equals the cross-entropy of `GPT2.forward`'s logits, in float64."""
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=16, vocab_size=40)
    params = tmodel.init_params(cfg, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed)
    for name, p in params.items():                  # make biases and gains matter
        if name.endswith(".bias") or ".ln_" in name or name.startswith("ln_"):
            p += 0.3 * rng.standard_normal(p.shape)
    idx = rng.integers(0, cfg.vocab_size, (B, T))
    targets = rng.integers(0, cfg.vocab_size, (B, T))
    loss_sum, _ = tmodel.forward(params, cfg, idx, targets, need_grad=False)
    model = minillm.GPT2(cfg, {k: v.copy() for k, v in params.items()})
    expected = 0.0
    for b in range(B):
        logits = model.forward(idx[b])                                   # [T, V]
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        expected += float((logz - logits[np.arange(T), targets[b]]).sum())
    assert loss_sum == pytest.approx(expected, rel=1e-10)


def test_cli_glue(tmp_path, capsys):
    import argparse

    data = tmp_path / "tiny.txt"
    data.write_text(TEXT, encoding="utf-8")
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--data", str(data), "--out", str(tmp_path / "ck"), "--layers", "1", "--heads", "1",
                              "--width", "8", "--context", "8", "--batch", "2", "--steps", "3", "--eval-every", "0"])
    assert train_cli.run(args) == 0
    parser = argparse.ArgumentParser()
    train_cli.add_eval_arguments(parser)
    assert train_cli.run_eval(parser.parse_args(["--model", str(tmp_path / "ck"), "--data", str(data)])) == 0
    assert "held-out loss" in capsys.readouterr().out
    bad = argparse.ArgumentParser()
    train_cli.add_arguments(bad)
    with pytest.raises(MiniLLMError, match="--dropout"):
        train_cli.run(bad.parse_args(["--data", str(data), "--dropout", "1.5"]))


def test_a_save_that_fails_does_not_lose_the_run(tmp_path, monkeypatch):
    """Disk full at one save: a warning, training goes on, the next better checkpoint is saved."""
    data = tmp_path / "text.txt"
    data.write_text("to be or not to be, that is the question " * 300)
    real, calls = ckpt.save_checkpoint, []

    def full_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise WeightsError("ck: cannot save the checkpoint there (No space left on device)")
        return real(*args, **kwargs)

    monkeypatch.setattr(tr, "save_checkpoint", full_once)
    lines = []
    tr.train(data, out=tmp_path / "ck", layers=1, heads=1, width=8, context=8, batch=2, steps=40, eval_every=10,
             lr=1e-2, warmup=2, log=lines.append, progress=False)
    assert any("NOT saved" in line for line in lines) and any("warning: ck: cannot save" in line for line in lines)
    assert len(calls) >= 2 and (tmp_path / "ck" / "model.safetensors").is_file()

    def always_full(*args, **kwargs):
        raise WeightsError("ck: full")

    monkeypatch.setattr(tr, "save_checkpoint", always_full)
    with pytest.raises(MiniLLMError, match="could not be saved: ck: full"):
        tr.train(data, out=tmp_path / "ck2", layers=1, heads=1, width=8, context=8, batch=2, steps=10,
                 eval_every=0, log=lines.append, progress=False)
