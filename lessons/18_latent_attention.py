"""Lesson 18: A KV cache of 576 values. Multi-head latent attention (DeepSeek-V2/V3) caches one small
latent per token and layer instead of every head's keys and values: MHA → GQA → MLA bytes a token,
counted by the meter; the two ways to attend over the latent (every head's K and V rebuilt from it, or
kv_b absorbed into the query and the output), equal, and what each reads and does; where the absorbed
decode sits against the ridge, measured beside a GQA model of the same width; why engines serve MLA
attention data-parallel and the experts expert-parallel; DeepSeek-V3.2's sparse attention over the
cache (a decode step's KV bytes with and without it); published mixtures in their released dtypes.

Run:  python lessons/18_latent_attention.py        (or: minillm learn 18)
"""

from __future__ import annotations

from minillm.lessons._common import (Lesson, Timing, faster_words, fmt_x, plural, priced_words, roofline_clock,
                                     run_lesson)

import dataclasses

import numpy as np
from rich import box
from rich.table import Table

import minillm
from minillm.checkpoints.families import random_model
from minillm.measure.contexts import run_context_sweep
from minillm.measure.chips import CHIPS
from minillm.measure.experts import FP8_TILE, PUBLISHED, held_bytes, published_params, read_bytes
from minillm.measure.shapes import kv_bytes_per_token, shape
from minillm.meter import Meter
from minillm.models import deepseek, moe
from minillm.models.deepseek import DeepSeekConfig, decode_attention_cost
from minillm.models.llama import LlamaConfig
from minillm import closeness
from minillm.ui.report import fmt_bytes, fmt_flops, fmt_kib

TITLE = "A KV cache of 576 values"
MINUTES = 10  # 2,083 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "MHA, GQA and MLA bytes a token; absorbed decode against the ridge"

MLA, GQA = "random-mla", "random-mla-gqa"


def lesson(L: Lesson) -> None:
    bytes_a_token(L)
    two_ways(L)
    L.pause()
    against_the_ridge(L)
    L.pause()
    serving_it(L)
    sparse_over_the_cache(L)
    released(L)
    L.try_it("""
        `minillm bench --context-sweep --model random-mla,random-mla-gqa --contexts 256,1024,4096,8192 --kernels numpy`
        runs this lesson's sweep (a latent model both ways; `--mla-decode absorbed` for one).
        `minillm bench --batch 1,4,16 --model random-mla,random-mla-gqa` batches both. Every command that
        runs a model takes `--mla-decode absorbed|decompressed`; a DeepSeek-V3 checkpoint folder
        (`model_type` deepseek_v3, float32 or bfloat16) loads with `minillm.load(folder)`.
    """)
    L.say(SOURCES)


# W27: what this lesson rests on
SOURCES = ("Sources: DeepSeek-AI, \"DeepSeek-V2\" (2024: multi-head latent attention, its decoupled "
           "rotary key and the absorption); \"DeepSeek-V3 Technical Report\" (2024) and its config.json; "
           "FlashMLA, DeepSeek's decode kernel for the absorbed form; \"DeepSeek-V3.2-Exp: Boosting "
           "Long-Context Efficiency with DeepSeek Sparse Attention\" (2025) and its config.json (index_topk, "
           "index_n_heads, index_head_dim).")


# -- the models: the one place they are built -----------------------------------------------------------
#
# Three models of one width for the bytes a token (one layer count, one head count): MHA, GQA (g = 4),
# MLA. Fast mode shrinks them; the sweep's full mode loads the presets themselves.

def width(L: Lesson) -> dict:
    return L.pick(dict(n_layer=4, n_head=8, d=256), dict(n_layer=2, n_head=4, d=64))


def three(L: Lesson) -> dict:
    w = width(L)
    H, d, L_ = w["n_head"], w["d"], w["n_layer"]
    hd = d // H
    def llama_like(n_kv_head: int) -> LlamaConfig:
        return LlamaConfig(n_layer=L_, n_head=H, n_kv_head=n_kv_head, head_dim=hd, n_embd=d, n_ctx=512,
                           vocab_size=512, ffn=2 * d, tied=True)
    mla = DeepSeekConfig(n_layer=L_, n_head=H, n_embd=d, n_ctx=512, vocab_size=512, ffn=2 * d,
                         kv_lora_rank=d // 4, q_lora_rank=d // 2, qk_nope_head_dim=hd, qk_rope_head_dim=hd // 2,
                         v_head_dim=hd, n_expert=4, top_k=2, expert_ffn=d // 2, n_shared=1, n_group=2,
                         topk_group=1, first_k_dense=1, tied=True)
    return {"MHA": llama_like(H), "GQA": llama_like(H // 4), "MLA": mla}


# -- 1. bytes a token ----------------------------------------------------------------------------------

def bytes_a_token(L: Lesson) -> None:
    L.say("""
        Lesson 12 shrank the KV cache by sharing key/value heads (GQA). Multi-head **latent attention**
        (MLA, DeepSeek-V2 and V3, Kimi K2) goes further: each token's keys and values, for every head,
        are made from one small vector, the **latent** `c` of r values (`kv_a` then an RMSNorm), and
        the cache keeps only that, plus one rotary key of dr values that every head shares. A layer
        caches `r + dr` values a token whatever the head count: 512 + 64 = 576 in DeepSeek-V3.

        Below, three random models of one width, differing only in attention, each prefill the same
        prompt into a real minillm cache while the meter counts what the cache took.
    """)
    configs = three(L)
    T = L.pick(64, 16)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("attention", "cached a layer", "bytes/token", "closed form"):
        t.add_column(col, justify="right", no_wrap=True)
    per = {}
    for name, c in configs.items():
        model = random_model(c)
        with Meter() as m:
            _, cache = model.prefill(np.arange(T) % c.vocab_size)
        per[name] = m.steps[0].bytes["kv_write"] // T
        if name == "MLA":
            what, closed = f"{c.kv_lora_rank} + {c.qk_rope_head_dim}", c.n_layer * c.head_dim * 4
        else:
            what, closed = f"2·{c.n_kv_head}·{c.head_dim}", 2 * c.n_layer * c.n_kv_head * c.head_dim * 4
        t.add_row(name, what, f"{per[name]:,}", f"{closed:,}")
        L.claim(per[name] == closed == cache.bytes_per_token(),
                f"{name}: the meter counted {per[name]:,} bytes a token written, {c.n_layer}·({what})·4")
    L.show(t, f"[dim]float32, {configs['MHA'].n_layer} layers, {configs['MHA'].n_head} heads, width "
              f"{configs['MHA'].n_embd}; bytes/token: the meter's kv_write over a {T}-token prefill[/]")
    L.fact(f"here MLA caches {per['MLA'] / per['MHA']:.0%} of MHA's bytes and {per['MLA'] / per['GQA']:.0%} of "
           "GQA's (g = 4)")
    ds, l3, l2 = shape("deepseek-v3"), shape("llama-3-8b"), shape("llama-2-7b")
    s = PUBLISHED["DeepSeek-V3"]["mla"]
    mha_ds = ds["n_layer"] * ds["n_head"] * (s["nope"] + s["rope"] + s["v"]) * 2          # keys and values, bf16
    L.fact(f"in bf16: Llama-2-7B (MHA) {fmt_kib(kv_bytes_per_token(l2, 2))} a token, Llama-3-8B (GQA, g = "
           f"{l3['n_head'] // l3['n_kv_head']}) {fmt_kib(kv_bytes_per_token(l3, 2))}, DeepSeek-V3 "
           f"{ds['n_layer']}·576·2 = {fmt_kib(kv_bytes_per_token(ds, 2))}")
    L.fact(f"DeepSeek-V3 as MHA (128 heads' keys of {s['nope'] + s['rope']} and values of {s['v']}) would cache "
           f"{fmt_kib(mha_ds)} a token: {mha_ds / kv_bytes_per_token(ds, 2):.0f}× its latent")
    L.pause()


# -- 2. two ways to attend -----------------------------------------------------------------------------

def two_ways(L: Lesson) -> None:
    L.section("Two ways to attend over the latent")
    L.say("""
        Attention needs every head's key and value. **Decompressed**, the definition: `kv_b` rebuilds
        them from each cached latent (`k_h = W_UK,h·c`, `v_h = W_UV,h·c`), then attention runs as usual.
        A prompt does this (its T tokens pass through `kv_b` once anyway).

        **Absorbed**, how FlashMLA and FlashInfer decode: since `q·(W_UK c) = (W_UKᵀ q)·c`, each head's
        query moves into the latent instead; then H query heads attend over one key/value head of
        r + dr values whose first r are the values too (multi-query attention), and `W_UV` is applied
        once to each head's output. `kv_b` multiplies the H queries, not every cached token.

        Why the rotary key is apart (DeepSeek-V2, §2.1.3): the absorption moves `W_UKᵀ` from the key
        to the query, which works only if nothing sits between them. RoPE rotates a key by its
        position, a different matrix at every position, so a rotated latent could not be absorbed.
        Hence a small separate key of dr values, rotated and shared by all heads: the "+ 64" of 576.
    """)
    c = three(L)["MLA"]
    P, N = L.pick(48, 12), L.pick(8, 4)
    logits, tokens = {}, {}
    for way in deepseek.MLA_DECODE:
        model = random_model(c, options={"mla_decode": way})
        first, cache = model.prefill(np.arange(P) % c.vocab_size)
        out, toks = [first], []
        for _ in range(N):
            toks.append(int(np.argmax(out[-1])))
            out.append(model.decode_step(toks[-1], cache))
        logits[way], tokens[way] = np.stack(out), toks
    diff = float(np.abs(logits["absorbed"] - logits["decompressed"]).max())
    scale = float(np.abs(logits["decompressed"]).max())
    L.claim(tokens["absorbed"] == tokens["decompressed"] and diff < 1e-4 * scale,
            f"{N} greedy decode steps after a {P}-token prompt: the same tokens either way, logits apart by "
            f"at most {diff:.1e} (of values up to {scale:.1f}: float32 rounding)")
    T = P + N
    rows = {}
    for way in deepseek.MLA_DECODE:
        model = random_model(c, options={"mla_decode": way})
        _, cache = model.prefill(np.arange(T - 1) % c.vocab_size)
        with Meter() as m:
            model.decode_step(1, cache)
        rows[way] = m.steps[0]
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("decode step", "KV read", "attention", "kv_b over T", "FLOPs/KV byte"):
        t.add_column(col, justify="right", no_wrap=True)
    for way, r in rows.items():
        want = decode_attention_cost(c, T, way)
        L.claim(r.bytes["kv_read"] == want["kv_read"] and r.flops["attention"] == want["attention"],
                f"{way}: the meter's KV read ({fmt_bytes(r.bytes['kv_read'])}) and attention FLOPs "
                f"({fmt_flops(r.flops['attention'])}) are the closed forms' at context {T}")
        t.add_row(way, fmt_bytes(r.bytes["kv_read"]), fmt_flops(r.flops["attention"]), fmt_flops(want["matmul_T"]),
                  f"{(r.flops['attention'] + want['matmul_T']) / r.bytes['kv_read']:.1f}")
    L.show(t, f"[dim]one decode step at context {T}, {c.n_head} heads, r + dr = {c.kv_lora_rank} + "
              f"{c.qk_rope_head_dim}, float32; FLOPs/KV byte: attention and kv_b over the context[/]")
    a, d = decode_attention_cost(c, T, "absorbed"), decode_attention_cost(c, T, "decompressed")
    L.fact(f"both read the same {fmt_bytes(a['kv_read'])} of latent; decompressed also multiplies kv_b by all "
           f"{T} rows every step ({fmt_flops(d['matmul_T'])}, growing with the context), absorbed by the "
           f"query and the output once ({fmt_flops(a['matmul_fixed'])})")


# -- 3. against the ridge -------------------------------------------------------------------------------

def against_the_ridge(L: Lesson) -> None:
    L.section("Where the absorbed decode sits against the ridge")
    s = PUBLISHED["DeepSeek-V3"]
    a, H = s["mla"], s["heads"]
    r, dr = a["kv_lora"], a["rope"]
    mla_fb = 2 * H * (2 * r + dr) / ((r + dr) * 2)
    l3 = shape("llama-3-8b")
    g = l3["n_head"] // l3["n_kv_head"]
    L.say("""
        Lesson 8 found decode attention at about g FLOPs a byte in bf16 with GQA (each KV head's
        bytes serve its g query heads: 1 for MHA): far below every GPU's ridge, so the KV read bounds it.
        Absorbed MLA has all H query heads share one KV head: per byte of latent read, scores over
        r + dr values and a weighted sum of r, for every head: `2H·(2r + dr) / ((r + dr)·b)`.
    """)
    ridges = {name: CHIPS[name].ridge for name in ("a100-80gb", "h100-sxm", "h200")}
    L.fact(f"DeepSeek-V3 (H = {H}, r + dr = {r} + {dr}) in bf16: {mla_fb:.0f} FLOPs a KV byte (≈ "
           f"{mla_fb / H:.2f}·H); Llama-3-8B (g = {g}): {g}")
    L.fact("ridges: " + ", ".join(f"{n} {v:.0f}" for n, v in ridges.items()) + " FLOPs a byte (bf16 dense peak "
           "÷ bandwidth)")
    below = [n for n, v in ridges.items() if mla_fb < v]
    above = [n for n, v in ridges.items() if mla_fb >= v]
    L.fact(f"so the absorbed decode's attention is compute-bound on {', '.join(above) or 'none of them'} and "
           f"memory-bound on {', '.join(below) or 'none'}; verifying 2 tokens a step (its multi-token-"
           f"prediction draft) doubles it to {2 * mla_fb:.0f}, past "
           f"{plural(sum(2 * mla_fb >= v for v in ridges.values()), 'ridge')} of {len(ridges)}")
    L.say("""
        Measured here: decode steps of the DeepSeek-shaped preset beside its GQA twin (the same width,
        layers and experts, 4 KV heads of 64), in interleaved rounds, at each context a cache of random
        rows (a step's work does not depend on what they hold).
    """)
    hw = L.machine()
    if L.fast:
        small = dict(n_layer=2, n_expert=8, n_ctx=1024)
        models = {MLA: random_model(dataclasses.replace(deepseek.SHAPES[MLA], **small, n_group=2, topk_group=1)),
                  GQA: random_model(dataclasses.replace(moe.SHAPES[GQA], **small))}
    else:
        with L.status("building the two presets (seconds)…"):
            models = {MLA: minillm.load(MLA, kernels="numpy"), GQA: minillm.load(GQA, kernels="numpy")}
    contexts = L.pick([512, 2048, 8192], [64, 256])
    with L.status(f"{L.rounds()} rounds at {len(contexts)} contexts…"):
        result = run_context_sweep(list(models.values()), contexts, repeats=L.rounds(), steps=L.pick(3, 2))
    ridge = hw.peak_gflops / hw.bandwidth_gbs
    names = {models[MLA].name: "MLA", models[GQA].name: "GQA twin"}
    rows = result["rows"]
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("ctx", "model", "ms/step", "KV read", "attn F/B", "step F/B", "bound"):
        t.add_column(col, justify="right", no_wrap=True)
    for x in rows:
        step_fb = x["flops"] / x["bytes"]
        name = names[x["model"].split(" ")[0]] + (f" {x['way'][:6]}" if x["way"] else "")
        t.add_row(f"{x['context']:,}", name, f"{x['ms']:.1f}", fmt_bytes(x["kv_read"]),
                  f"{x['attention_flops'] / x['kv_read']:.1f}", f"{step_fb:.2f}", bound_cell(x, hw))
    L.show(t, f"[dim]batch 1, float32, caches of random rows; attn F/B: attention FLOPs per KV byte; step "
              f"F/B: the whole step's, weights included; bound: the roof that binds on this machine's "
              f"roofline (ridge {ridge:.1f}) and the share of the measured time it explains; neither: "
              "under half[/]")
    L.timing_note()
    L.roofline(hw, [(f"{names[x['model'].split(' ')[0]]}{' ' + x['way'][:6] if x['way'] else ''} {x['context']:,}",
                     x["flops"] / x["bytes"], x["flops"] / x["ms"] / 1e6) for x in rows])
    by = {(x["context"], x["model"].split(" ")[0], x["way"]): x for x in rows}
    mla, gqa = models[MLA].name, models[GQA].name
    c = models[MLA].config
    absorbed_fb = 2 * c.n_head * (2 * c.kv_lora_rank + c.qk_rope_head_dim) / ((c.kv_lora_rank + c.qk_rope_head_dim) * 4)
    fb = lambda x: x["attention_flops"] / x["kv_read"]
    L.claim(all(abs(fb(by[n, mla, "absorbed"]) - absorbed_fb) < 1e-9 for n in contexts),
            f"absorbed, the attention does {absorbed_fb:.1f} FLOPs a KV byte at every context: "
            f"2H·(2r + dr)/((r + dr)·4) with H = {c.n_head}")
    gc = models[GQA].config
    g_fb = fb(by[contexts[0], gqa, None])
    L.claim(abs(g_fb - gc.n_head / gc.n_kv_head / 2) < 1e-9,
            f"the GQA twin's attention does {g_fb:.1f} (g/2 in float32, g = {gc.n_head // gc.n_kv_head})")
    n, n0 = contexts[-1], contexts[0]
    kv_ratio = by[n, gqa, None]["kv_read"] / by[n, mla, "absorbed"]["kv_read"]
    L.claim(abs(kv_ratio - 2 * gc.n_kv_head * gc.head_dim / (c.kv_lora_rank + c.qk_rope_head_dim)) < 1e-9,
            f"over {n + 1:,} cached tokens the GQA twin reads {kv_ratio:.2f}× the latent's KV bytes (2·4·64 "
            f"values a layer against {c.kv_lora_rank} + {c.qk_rope_head_dim})")
    grew = {way: by[n, mla, way]["matmul_flops"] - by[n0, mla, way]["matmul_flops"] for way in deepseek.MLA_DECODE}
    T0, T1 = by[n0, mla, "decompressed"]["kv_read"] // c.kv_bytes_per_token(4), \
        by[n, mla, "decompressed"]["kv_read"] // c.kv_bytes_per_token(4)
    want = decode_attention_cost(c, T1, "decompressed")["matmul_T"] - decode_attention_cost(c, T0, "decompressed")["matmul_T"]
    L.claim(grew["absorbed"] == 0 and grew["decompressed"] == want > 0,
            f"from {T0:,} to {T1:,} cached rows the absorbed step's products stay as they are; the decompressed "
            f"one's grow by {fmt_flops(grew['decompressed'])}: kv_b over the {T1 - T0:,} more rows")
    a, d = (Timing(tuple(by[n, mla, way]["ms_rounds"])) for way in ("absorbed", "decompressed"))
    L.say(f"Measured: {faster_words(a, d, f'at {n:,} tokens an absorbed decode step', 'a decompressed one')}.")
    L.say(twin_words(by[n, gqa, None], by[n, mla, "absorbed"], n, kv_ratio, absorbed_fb, roofline_clock(L).hw))


def bound_cell(x: dict, hw) -> str:
    """M47: which roof binds a measured step, and how much of its time that roof explains: "memory
    11%" (the bytes at the bandwidth are 11% of the time measured); "neither" under half."""
    mem = x["bytes"] / (hw.bandwidth_gbs * 1e9)
    comp = x["flops"] / (hw.peak_gflops * 1e9)
    share = max(mem, comp) / (x["ms"] / 1e3)
    kind = "memory" if mem >= comp else "compute"
    return f"{kind} {share:.0%}" if share >= 0.5 else f"neither {share:.0%}"


def twin_words(twin: dict, mla: dict, n: int, kv_ratio: float, absorbed_fb: float, hw) -> str:
    """C23: MLA's absorbed step against the GQA twin, priced on the roofline (each step's counted bytes
    and FLOPs at this machine's bandwidth and peak, `hw`: the same every run, where the paired times sat
    at the verdict rule's edge), the measured ratio beside it; and, when the twin's step costs no more
    while reading 1.78× the KV bytes, why, from the counts: the KV's share of a batch-1 step's bytes,
    and the absorbed attention's FLOPs a byte against the ridge."""
    price = {k: hw.roofline(x["bytes"], x["flops"]) for k, x in (("twin", twin), ("mla", mla))}
    times = {k: Timing(tuple(x["ms_rounds"])) for k, x in (("twin", twin), ("mla", mla))}
    head = priced_words(price["twin"].seconds, price["mla"].seconds, f"At {n:,} tokens the GQA twin's step",
                        "MLA's absorbed one", times["twin"], times["mla"], unit=1e-3)
    if closeness.figures_apart(price["twin"].seconds, price["mla"].seconds) > 0:
        return head
    share = mla["kv_read"] / mla["bytes"]
    ridge = hw.peak_gflops / hw.bandwidth_gbs
    return head + (
        f" Why reading {kv_ratio:.2f}× the latent's KV bytes need not cost more: the twin's whole step moves {fmt_bytes(twin['bytes'])} "
        f"against the latent's {fmt_bytes(mla['bytes'])} (at batch 1 the KV is {share:.0%} of the absorbed "
        f"step's bytes; the weights are the rest), and the absorbed attention does {absorbed_fb:.0f} FLOPs a KV "
        f"byte, {'past' if absorbed_fb > ridge else 'below'} this CPU's ridge of {ridge:.1f}. On a GPU the same "
        "absorbed attention does 242 FLOPs a KV byte at DeepSeek-V3's 128 heads, about an H200's ridge of "
        "206: there the saved bytes count.")


# -- 4. serving it --------------------------------------------------------------------------------------

def serving_it(L: Lesson) -> None:
    L.section("Why engines serve MLA attention data-parallel")
    s = PUBLISHED["DeepSeek-V3"]
    ds = shape("deepseek-v3")
    per_token = kv_bytes_per_token(ds, 2)
    gpus, ctx = 8, 32768
    seq = per_token * ctx
    L.say("""
        Tensor parallelism splits attention by heads: with GQA's 8 KV heads on 8 GPUs, each holds one KV
        head of every token. MLA's latent belongs to all 128 heads at once: split by heads, **every GPU
        needs every token's whole latent**, and the cache is held 8 times over. So SGLang and vLLM run
        MLA with **data-parallel attention** (each GPU attends for its own sequences, over its latents)
        and split only the experts, expert-parallel: each GPU holds a share of every layer's experts,
        and each token's hidden state goes to the GPUs of its k experts and back (an all-to-all).
    """)
    L.fact(f"a {ctx:,}-token sequence: {fmt_bytes(seq)} of latent in bf16; over {gpus} GPUs by heads every "
           f"GPU holds all of it ({fmt_bytes(seq * gpus)} in all), data-parallel one GPU does "
           f"({fmt_bytes(seq)} in all)")
    H, r, dr = s["heads"], s["mla"]["kv_lora"], s["mla"]["rope"]
    absorbed = 2 * H * (2 * r + dr) / ((r + dr) * 2)              # FLOPs a bf16 KV byte, absorbed
    L.fact(f"and split by heads each GPU's absorbed attention would read the whole latent for {H // gpus} "
           f"of the {H} heads: {absorbed / gpus:.0f} FLOPs a KV byte instead of {absorbed:.0f}, the "
           "intensity divided by the GPUs, the second reason after the copies")
    E, k, G, open_ = s["E"], s["k"], 8, 4
    L.fact(f"expert-parallel on {gpus} GPUs: {E // gpus} of the {E} routed experts of each layer per GPU; "
           f"routed to its top {k} inside {open_} of {G} groups, a token's experts sit on at most {open_} "
           f"GPUs when a group is a GPU (DeepSeek-V3's node-limited routing, n_group 8, topk_group 4)")


# -- 4b. sparse attention over the cache (X28) ------------------------------------------------------------
#
# DeepSeek-V3.2-Exp (its config.json and report, "DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency with
# DeepSeek Sparse Attention", 2025): V3's MLA and 61 layers, plus a lightning indexer in every layer,
# index_n_heads 64 of index_head_dim 128, whose one 128-value key a token is kept in FP8 with a float32
# scale per 128 values (vLLM's indexer cache: 132 bytes a token and layer); MLA attends over the
# index_topk = 2048 positions it scores highest.

DSA_TOPK, DSA_INDEX_HEADS, DSA_INDEX_DIM = 2048, 64, 128
DSA_INDEX_BYTES = DSA_INDEX_DIM * 1 + (DSA_INDEX_DIM // 128) * 4      # FP8 values + a float32 scale per 128


def dsa_rows(contexts=(32768, 131072)) -> list[dict]:
    """A batch-1 decode step's KV bytes (all 61 layers, one sequence) at each context: MLA reading every
    latent (bf16, as this lesson counts it), and with DeepSeek Sparse Attention: the indexer's FP8 key
    of every cached token, then the latents of the top DSA_TOPK only."""
    ds = shape("deepseek-v3")
    latent, L_ = kv_bytes_per_token(ds, 2), ds["n_layer"]
    rows = []
    for T in contexts:
        index = T * L_ * DSA_INDEX_BYTES
        top = min(T, DSA_TOPK) * latent
        rows.append({"T": T, "dense": T * latent, "index": index, "top": top, "sparse": index + top})
    return rows


def sparse_over_the_cache(L: Lesson) -> None:
    L.section("Reading fewer latents: sparse attention over the cache")
    ds = shape("deepseek-v3")
    L.say(f"""
        The latent makes each token's KV small; a decode step still reads all of it, so its attention
        read grows with the context (lesson 6). DeepSeek-V3.2 adds **sparse attention** (DSA): in each
        layer a small **lightning indexer** ({DSA_INDEX_HEADS} heads of {DSA_INDEX_DIM}, in FP8) scores
        every cached token against the new one, using one {DSA_INDEX_DIM}-value key a token it caches
        beside the latent; MLA then attends over the top {DSA_TOPK:,} positions only. The step still
        touches every token, but through {DSA_INDEX_BYTES} bytes a layer instead of the latent's
        {kv_bytes_per_token(ds, 2) / ds['n_layer']:,.0f}.
    """)
    rows = dsa_rows()
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("context", "MLA, every latent", "indexer keys", f"top {DSA_TOPK:,}", "DSA", "less"):
        t.add_column(col, justify="right", no_wrap=True)
    for x in rows:
        t.add_row(f"{x['T']:,}", fmt_bytes(x["dense"]), fmt_bytes(x["index"]), fmt_bytes(x["top"]),
                  fmt_bytes(x["sparse"]), fmt_x(x["dense"] / x["sparse"]))
    L.show(t, f"[dim]a batch-1 decode step's KV read, one sequence, {ds['n_layer']} layers; latent in bf16 "
              f"({kv_bytes_per_token(ds, 2):,.0f} B a token), indexer key in FP8 + a float32 scale "
              f"({DSA_INDEX_BYTES} B a token and layer); DeepSeek-V3.2-Exp's config.json and report[/]")
    a, b = rows
    grow_dense, grow_sparse = (b["dense"] - a["dense"]), (b["sparse"] - a["sparse"])
    L.fact(f"from {a['T']:,} to {b['T']:,} tokens the full read grows by {fmt_bytes(grow_dense)} and the "
           f"sparse one by {fmt_bytes(grow_sparse)}, all of it the indexer's keys: "
           f"{fmt_x(grow_dense / grow_sparse)} slower growth, the latent's bytes over the key's")
    H, lat = ds["n_head"], ds["kv_latent"]
    index_f, mla_f = 2 * DSA_INDEX_HEADS * DSA_INDEX_DIM, 2 * H * (lat + lat - 64)
    L.say(f"""
        The indexer does {index_f:,} FLOPs a cached token and layer (2·{DSA_INDEX_HEADS}·{DSA_INDEX_DIM},
        in FP8), against {mla_f:,} for absorbed MLA's attention over a token (2·{H}·(576 + 512)):
        {fmt_x(mla_f / index_f)} fewer, on every token instead of the top {DSA_TOPK:,}. Whether the
        top {DSA_TOPK:,} keep the quality is the paper's measurement, not this lesson's.
    """)
    L.pause()


# -- 5. released dtypes ------------------------------------------------------------------------------------

def released(L: Lesson) -> None:
    L.section("Published mixtures, in the dtypes they were released in")
    L.say("""
        Mixtral and Qwen3 ship in bf16 (2 bytes a weight). DeepSeek-V3 ships in **fp8** (E4M3): its
        linear layers at 1 byte a weight plus a float32 scale per 128×128 tile, the embedding, head,
        norms and routers in bf16. What 8 GPUs hold and what a token reads follow from that.
    """)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("model", "dtype", "held", "held/GPU", "read/token", "KV/token"):
        t.add_column(col, justify="right", no_wrap=True)
    got = {}
    for name in PUBLISHED:
        sh = shape(name.lower())
        held, read = got[name] = held_bytes(sh), read_bytes(sh)
        t.add_row(name, sh["released"].split(" ")[0], fmt_bytes(held), fmt_bytes(held / 8), fmt_bytes(read),
                  fmt_kib(kv_bytes_per_token(sh, 2)))
    L.show(t, "[dim]as released (measure/experts.py); held/GPU: over 8 GPUs; read/token: a decode step's "
              "weights at batch 1; KV in bf16[/]")
    s = PUBLISHED["DeepSeek-V3"]
    held, _ = got["DeepSeek-V3"]
    total, _ = published_params(s)
    L.fact(f"DeepSeek-V3 in fp8: {FP8_TILE:.5f} bytes a matrix weight, {fmt_bytes(held)} held; as bf16 "
           f"it would be {fmt_bytes(2 * total)} ({fmt_x(2 * total / held)} as much). held/GPU is an even split; "
           "how many GPUs it needs and what is left for the cache, as served (attention on every GPU), "
           "is lesson 15's one capacity rule")


def main(argv=None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
