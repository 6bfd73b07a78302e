"""Lesson 19: A state that does not grow. Qwen3.5 keeps a KV cache in one layer of four; the other
three (Gated DeltaNet) fold the past into a fixed-size state per sequence. Its two forms on one
example (chunked for a prompt, recurrent for decode: the same numbers, compute against memory); a
decode step's time and bytes against the context for a hybrid and an all-attention model of the same
width and depth, counted and timed; how many sequences fit at 32k; a long prefill's FLOPs against the
twin's; what a fixed state forgets; what it costs.

Run:  python lessons/19_state.py        (or: minillm learn 19)
"""

from __future__ import annotations

from minillm.lessons._common import (Lesson, Timing, faster_words, fmt_x, plural, priced_words, roofline_clock,
                                     run_lesson, time_interleaved)

import numpy as np
from rich import box
from rich.table import Table

import minillm
from minillm.cache.state import NoRollback
from minillm.engine.engine import Engine
from minillm.errors import MiniLLMError
from minillm.measure.chips import get_chip
from minillm.measure.contexts import run_context_sweep
from minillm.measure.shapes import HYBRID_SHAPES, UTILISATION, capacity, shape, shape_of, state_bytes
from minillm.models import deltanet, qwen35
from minillm.models.qwen35 import FULL, LINEAR, Qwen35Config, decode_step_bytes
from minillm.ui.report import fmt_bytes, fmt_flops, fmt_kib, fmt_time

TITLE = "A state that does not grow"
MINUTES = 15  # 2,911 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "chunked == recurrent, decode bytes against context, capacity at 32k"

HYBRID, FULL_NAME = "random-hybrid", "random-hybrid-full"


# -- the models: the one place they are built ---------------------------------------------------------
#
# Fast mode runs small stand-ins of the same pattern (three linear layers to one full; all full);
# full mode builds the presets by name, as `minillm bench --context-sweep` does.

_SMALL = dict(n_layer=4, n_head=4, n_kv_head=1, head_dim=32, n_embd=128, n_ctx=8192, vocab_size=1024, ffn=256,
              lin_k_heads=2, lin_v_heads=4, lin_k_dim=32, lin_v_dim=32, conv_kernel=4, rotary_dim=8, theta=1e7)
FAST_PRESETS = {HYBRID: Qwen35Config(**_SMALL, layer_types=(LINEAR, LINEAR, LINEAR, FULL)),
                FULL_NAME: Qwen35Config(**_SMALL, layer_types=(FULL,) * 4)}


def preset(L: Lesson, name: str):
    with L.status(f"building {name}…"):
        if not L.fast:
            return minillm.load(name, quiet=True)
        return qwen35.random(FAST_PRESETS[name], name=f"{name} (small)")


# -- the lesson ---------------------------------------------------------------------------------------

def lesson(L: Lesson) -> None:
    if L.model_name:
        L.note(f"--model {L.model_name} is not used: this lesson compares its two presets, {HYBRID} and "
               f"{FULL_NAME}.")
    L.say("""
        Every model so far keeps a KV cache: each layer stores every position's key and value, and a
        decode step reads all of them. Lesson 6 watched that cache overtake the weights; lessons 8-10
        paged it, shared it, batched beside it. Many models of 2026 keep that cache in only a few
        layers. Qwen3.5 (and Qwen3-Next before it) replaces three attention layers of every four with
        **linear attention** (Gated DeltaNet): a layer that folds everything it has seen into a **state
        of fixed size**, per value head one `[dk, dv]` matrix plus a short convolution's last K − 1
        inputs, whatever the context. Others mix otherwise: Kimi Linear 3:1 with Kimi Delta Attention
        (and MLA in its full layers), Nemotron-H Mamba-2 with attention in under a tenth of its layers,
        Jamba Mamba with one attention layer in eight, MiniMax-01 lightning attention 7:1. The ratio
        trades recall for memory.
    """)
    L.pause()
    hybrid, full = preset(L, HYBRID), preset(L, FULL_NAME)
    two_forms(L, hybrid)
    context_sweep(L, hybrid, full)
    capacity_at_32k(L)
    long_prefill(L, hybrid)
    what_it_forgets(L)
    what_it_costs(L, hybrid)
    the_third_way(L)
    L.try_it(f"""
        `minillm bench --context-sweep --model {HYBRID},{FULL_NAME}` measures this lesson's sweep as a
        command (256 to 16,384 tokens), in interleaved rounds, with the crossover named. The chunk size
        of the prompt's form is `model.chunk` (64 by default): any value gives the same logits.
        `minillm hardware --shape qwen3.5-27b --fit 32768 --memory 80GB` does the capacity arithmetic.
    """)
    L.say(SOURCES)


# W27: what this lesson rests on
SOURCES = ("Sources: Schlag, Irie and Schmidhuber, \"Linear Transformers Are Secretly Fast Weight "
           "Programmers\" (2021: the delta rule as fast weights); Yang et al., \"Parallelizing Linear "
           "Transformers with the Delta Rule over Sequence Length\" (2024: the chunked form); Yang, Kautz and "
           "Hatamizadeh, \"Gated Delta Networks\" (ICLR 2025); Qwen3.5-27B's config.json.")


def two_forms(L: Lesson, model) -> None:
    L.section("Two forms of one layer")
    c = model.config
    Hv, dk, dv = c.lin_v_heads, c.lin_k_dim, c.lin_v_dim
    L.say(f"""
        For each token t, a linear layer forgets a little (`S = exp(g_t)·S`), then writes the part of the
        value `v_t` that its state does not already recall for the key `k_t`, at strength `beta_t` (the
        **delta rule**: `S += k_t·(beta_t·(v_t − Sᵀk_t))ᵀ`), and reads with the query: `o_t = Sᵀq_t`.
        Run one token at a time, that is the **recurrent form**: read the state, update it, write it
        back. Decode runs it: {Hv} value heads × [{dk}, {dv}] per layer here, the same bytes at token 10
        as at token 10,000.

        A prompt runs the **chunked form** instead: within a chunk of C tokens the C writes are one
        triangular system, solved at once, and outputs and the next state are matrix products; only the
        state crosses from chunk to chunk. Below, both forms on the same inputs, the shapes of one of this
        model's linear layers, under the meter.
    """)
    T = L.pick(512, 256)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((Hv, T, dk)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    q = (rng.standard_normal((Hv, T, dk)) / np.sqrt(dk)).astype(np.float32)
    v = rng.standard_normal((Hv, T, dv)).astype(np.float32)
    g = -rng.uniform(0, 0.5, (Hv, T)).astype(np.float32)
    beta = rng.uniform(0, 1, (Hv, T)).astype(np.float32)
    S0 = np.zeros((Hv, dk, dv), dtype=np.float32)
    forms = {"recurrent": lambda: deltanet.delta_rule_recurrent(q, k, v, g, beta, S0),
             "chunked": lambda: deltanet.delta_rule_chunked(q, k, v, g, beta, S0, deltanet.CHUNK)}
    out, counted = {}, {}
    for name, fn in forms.items():
        with minillm.Meter() as m:
            out[name] = fn()
        counted[name] = m.steps[0]
    diff = max(float(np.abs(out["recurrent"][0] - out["chunked"][0]).max()),
               float(np.abs(out["recurrent"][1] - out["chunked"][1]).max()))
    scale = float(np.abs(out["recurrent"][0]).max())
    L.claim(diff <= 1e-5 * max(1.0, scale), f"over {T} tokens the two forms' outputs and final states differ by "
            f"{diff:.1e} at most (outputs up to {scale:.1f}): float32 rounding")
    times = time_interleaved(forms, L.rounds())
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("form", "FLOPs", "state in and out", "time"):
        t.add_column(col, justify="right", no_wrap=True)
    state = S0.nbytes
    for name in forms:
        traffic = counted[name].bytes["activations"] - sum(a.nbytes for a in (q, k, v, g, beta)) \
            - out[name][0].nbytes
        t.add_row(name, fmt_flops(counted[name].total_flops), fmt_bytes(traffic), times[name].short())
    L.show(t, f"[dim]{Hv} heads, dk = {dk}, dv = {dv}, {T} tokens, chunks of {deltanet.CHUNK}; state in and "
              f"out: the states the meter counts the form reading and writing ({fmt_bytes(state)} each); the "
              f"chunked form's scan also reads and writes S in every chunk, inside its products[/]")
    L.timing_note()
    f_rec, f_chunk = counted["recurrent"].total_flops, counted["chunked"].total_flops
    L.fact(f"the recurrent form does {fmt_flops(f_rec)} in {T} small steps, a few NumPy calls each; the "
           f"chunked form does {fmt_x(f_chunk / f_rec)} those FLOPs as matrix products over "
           f"{plural(-(-T // deltanet.CHUNK), 'chunk')}")
    L.say(f"Here: {faster_words(times['chunked'], times['recurrent'], 'the chunked form', 'the recurrent one')}; "
          f"the recurrent form spent {fmt_time(times['recurrent'].median / T)} a token. On a CPU it loses, "
          f"where it loses, to its many small calls, not to moving the state: a {dk}×{dv} state stays in the "
          "caches. On a GPU a fused recurrent kernel keeps the state on chip for a whole prompt, and loses "
          "to a chain of matrix-vector updates, one token after another, that cannot use the tensor "
          "cores. Decode is memory-bound for its own reason: one token reads S and writes it back, about "
          "7·dk·dv FLOPs for 8·dk·dv bytes in float32, under 1 FLOP a byte, and no batch shares it.")
    ids = np.random.default_rng(1).integers(0, c.vocab_size, L.pick(96, 48))
    P = len(ids) // 2
    naive = model.forward(ids)
    logits, cache = model.prefill(ids[:P])
    rows = [logits] + [model.decode_step(int(tok), cache) for tok in ids[P:-1]]
    gap = float(np.abs(np.array(rows) - naive[P - 1:-1]).max())
    L.claim(gap < 1e-4, f"the whole model: a prefill of {P} tokens (chunked form) and {len(ids) - P - 1} decode "
            f"steps (recurrent form) give the logits of one pass with no cache, within {gap:.1e}")
    L.pause()


def context_sweep(L: Lesson, hybrid, full) -> None:
    L.section("A decode step against the context")
    h, f = hybrid.config, full.config
    L.say(f"""
        Two models of the same width ({h.n_embd}) and depth ({h.n_layer} blocks): `{hybrid.name}` has
        Qwen3.5's pattern, {plural(len(h.linear_layers), 'linear layer')} and {len(h.full_layers)} full;
        `{full.name}` has a full attention layer in every block. Each decode step reads every weight,
        the KV of the layers that keep one, and (the hybrid) each linear layer's state once, writing
        it back. The caches are filled with random keys, values and states: a step's work does not
        depend on what they hold.
    """)
    contexts = L.pick((256, 512, 1024, 2048, 4096, 8192, 16384), (128, 512, 2048, 4096))
    steps = L.pick(4, 2)
    with L.progress("sweeping the context", len(contexts) * L.rounds()) as advance:
        r = run_context_sweep([hybrid, full], contexts, repeats=L.rounds(), steps=steps, progress=advance)
    rows = {(x["model"], x["context"]): x for x in r["rows"]}
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("context", "hybrid", "bytes", "all-attention", "bytes"):
        t.add_column(col, justify="right", no_wrap=True)
    exact = True
    for T in r["contexts"]:
        a, b = rows[(hybrid.name, T)], rows[(full.name, T)]
        for m, x in ((hybrid, a), (full, b)):
            want = decode_step_bytes(m.config, T, m.dtype.itemsize)
            exact &= (x["weights"], x["kv"], x["state"]) == (want["weights"], want["kv"], want["state"])
        t.add_row(f"{T:,}", f"{a['ms']:.1f} ms", fmt_bytes(a["weights"] + a["kv"] + a["state"]),
                  f"{b['ms']:.1f} ms", fmt_bytes(b["weights"] + b["kv"] + b["state"]))
    L.show(t, f"[dim]median of {r['repeats']} interleaved rounds of {steps} decode steps; bytes: weights + KV + "
              "state, counted by the meter (activations aside); float32[/]")
    L.timing_note()
    L.claim(exact, "every row's weights, KV and state bytes, counted by the meter, equal the closed form: "
            "weights once, the full layers' KV of every position so far, each linear layer's state read "
            "once and written once")
    lo, hi = r["contexts"][0], r["contexts"][-1]
    grow = {m.name: rows[(m.name, hi)]["kv"] - rows[(m.name, lo)]["kv"] for m in (hybrid, full)}
    L.claim(rows[(hybrid.name, hi)]["state"] == rows[(hybrid.name, lo)]["state"] > 0
            and grow[hybrid.name] * len(f.full_layers) == grow[full.name] * len(h.full_layers),
            f"from {lo:,} to {hi:,} tokens the hybrid's state stays {fmt_bytes(rows[(hybrid.name, lo)]['state'])} "
            f"a step and its KV grows by {fmt_bytes(grow[hybrid.name])}, "
            f"{share_words(len(h.full_layers), len(f.full_layers))} of the other's {fmt_bytes(grow[full.name])}")
    T_bytes = qwen35.crossover_context(h, f, hybrid.dtype.itemsize)
    L.fact(f"by the closed form the hybrid's step moves fewer bytes from context {T_bytes:,} on: its linear "
           f"layers' extra weights and its state ({fmt_bytes(2 * h.state_bytes(4))} read and written) against "
           f"{fmt_bytes(f.kv_bytes_per_token(4) - h.kv_bytes_per_token(4))} less KV per position")
    L.say(published_crossover())
    # The verdict at the longest context, where the gap is widest, on the two steps' prices (their counted
    # bytes and FLOPs on this machine's roofline: the same every run); the measured ratio beside it. Timed,
    # where the two crossed moved with the machine's load (a busy run ranked the hybrid below from 16,384
    # tokens where a quiet one did from 2,048), and a context picked from a timed sweep is a verdict too.
    hw = roofline_clock(L).hw
    a, b = rows[(hybrid.name, hi)], rows[(full.name, hi)]
    L.say(priced_words(hw.roofline(a["bytes"], a["flops"]).seconds, hw.roofline(b["bytes"], b["flops"]).seconds,
                       f"At {hi:,} tokens the hybrid's step", "the all-attention one's", Timing(tuple(a["ms_rounds"])),
                       Timing(tuple(b["ms_rounds"])), unit=1e-3)
          + f" In bytes, by the closed form, the two cross at {T_bytes:,}.")
    L.pause()


def published_crossover() -> str:
    """M46: "when does a hybrid pay" for the model the lesson names: Qwen3.5-27B against its all-attention
    twin, weights and KV in bf16, its state in float32 as released (E23), by the closed forms: at batch 1
    (its heavier linear layers and its state read and written each step, against the KV it saves) and
    per sequence in a large batch (the weights shared: the state against the KV alone)."""
    c = HYBRID_SHAPES["qwen3.5-27b"]
    twin = Qwen35Config(**{**c.asdict(), "layer_types": (FULL,) * c.n_layer})
    s = shape("qwen3.5-27b")
    fa, fb = qwen35.decode_step_bytes(c, 0, 2), qwen35.decode_step_bytes(twin, 0, 2)
    extra = 2 * s["state_ssm_values"] * (s.get("ssm_bytes", 2) - 2)      # the state wider than bf16
    gap = fa["weights"] + fa["kv_read"] + fa["kv_write"] + extra - (fb["weights"] + fb["kv_read"] + fb["kv_write"])
    slope = twin.kv_bytes_per_token(2) - c.kv_bytes_per_token(2)         # the KV the hybrid saves a position
    one = gap // slope + 1
    many = int(2 * state_bytes(s, 2) // slope) + 1
    return (f"At Qwen3.5-27B's published shape (weights and KV in bf16, its state in float32), by the same "
            f"closed forms: a batch-1 step of the hybrid moves more bytes than its all-attention twin up to "
            f"{one - 1:,} tokens, fewer from {one:,} (its linear layers weigh {fmt_bytes(fa['weights'] - fb['weights'])} "
            f"more and its state, {fmt_bytes(state_bytes(s, 2))}, is read and written each step); in a large "
            f"batch, where the weights are shared, a sequence's step moves fewer from about {many:,} tokens.")


def share_words(a: int, b: int) -> str:
    """W28: a share of layers in words ('a quarter'), the same in fast and full mode (2/8 and 1/4)."""
    from fractions import Fraction
    f = Fraction(a, b)
    names = {Fraction(1, 2): "half", Fraction(1, 4): "a quarter", Fraction(1, 3): "a third",
             Fraction(3, 4): "three quarters", Fraction(1, 8): "an eighth"}
    return names.get(f, f"{f.numerator}/{f.denominator}")


def capacity_at_32k(L: Lesson) -> None:
    L.section("How many sequences fit at 32k")
    c = HYBRID_SHAPES["qwen3.5-27b"]
    twin = Qwen35Config(**{**c.asdict(), "layer_types": (FULL,) * c.n_layer})
    s, t_s = shape("qwen3.5-27b"), shape_of(twin, "every layer full")
    L.say(f"""
        Qwen3.5-27B has {c.n_layer} layers: {len(c.full_layers)} keep K and V ({c.n_kv_head} KV heads of
        {c.head_dim}), {len(c.linear_layers)} keep a state of {c.lin_v_heads} value heads × [{c.lin_k_dim},
        {c.lin_v_dim}]. Beside it, the same shape with a full attention layer in every block (it exists
        only on paper: its attention weights are a little smaller, its KV four times larger). The
        capacity function of lessons 5 and 12 counts a hybrid's state with its KV.
    """)
    ctx, b = 32768, 2
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("bf16", "KV/token", "state", "per 32k seq", "H100 80GB", "H200 141GB"):
        t.add_column(col, justify="right", no_wrap=True)
    fit = {}
    for name, x in (("Qwen3.5-27B", s), ("all full", t_s)):
        caps = [capacity(x, ctx, get_chip(chip).memory_gb * 1e9, bytes_per_weight=b, kv_bytes_per_value=b)
                for chip in ("h100-sxm", "h200")]
        fit[name] = [cap["sequences"] for cap in caps]
        t.add_row(name, fmt_kib(caps[0]["kv_bytes_per_token"]), fmt_bytes(caps[0]["state_bytes_per_sequence"]),
                  fmt_bytes(caps[0]["kv_bytes_per_sequence"]), *(f"{n:,}" for n in fit[name]))
    L.show(t, f"[dim]{ctx:,} tokens a sequence, weights and KV in bf16, the delta rule's state in float32 "
              f"as released (config.json's mamba_ssm_dtype; its convolution window in bf16), {UTILISATION:.0%} "
              "of the memory (vLLM's default); published config[/]")
    per_tok = c.kv_bytes_per_token(b)
    held = state_bytes(s, b)
    L.fact(f"the state costs what {held / per_tok:,.0f} tokens of its full layers' KV cost "
           f"({fmt_bytes(held)} against {fmt_kib(per_tok)} a token): past that context a "
           "sequence's fixed part is the smaller one. It is kept in float32, twice the KV's bytes a value: "
           "it is rewritten at every token, and rounding it to bf16 each time would pile up the error")
    L.claim(all(a > z for a, z in zip(fit["Qwen3.5-27B"], fit["all full"])),
            f"at 32k, {fit['Qwen3.5-27B'][0]} Qwen3.5-27B sequences fit on an H100 beside the weights against "
            f"{fit['all full'][0]} with every layer full; {fit['Qwen3.5-27B'][1]} against {fit['all full'][1]} "
            "on an H200")
    L.pause()


def prefill_rows(contexts=(8192, 32768, 131072)) -> list[dict]:
    """X31: a prefill's FLOPs at Qwen3.5-27B's published shape and its all-attention twin's, by
    qwen35.prefill_flops (closed forms; the linear layers' the count the chunked form reports)."""
    c = HYBRID_SHAPES["qwen3.5-27b"]
    twin = Qwen35Config(**{**c.asdict(), "layer_types": (FULL,) * c.n_layer})
    rows = []
    for T in contexts:
        h, f = qwen35.prefill_flops(c, T), qwen35.prefill_flops(twin, T)
        rows.append({"T": T, "hybrid": h, "twin": f, "h_total": sum(h.values()), "f_total": sum(f.values())})
    return rows


def long_prefill(L: Lesson, model) -> None:
    L.section("A long prompt: linear in T, not quadratic")
    L.say("""
        The state also changes the first token's wait. A full layer compares each of a prompt's T tokens
        with every earlier one: T(T + 1)/2 pairs of 4·H·hd FLOPs, growing with the square of the prompt. The
        chunked form does its quadratic work only inside chunks of C tokens: 6·C·dk + 4·C·dv + 2·C²/3 +
        6·dk·dv FLOPs a token and head, whatever T. Below, a prefill's FLOPs at Qwen3.5-27B's published shape and its
        all-attention twin's, by `qwen35.prefill_flops`: counted, not timed.
    """)
    c = model.config
    T = L.pick(512, 300)
    with minillm.Meter() as m:
        model.prefill(np.arange(T) % c.vocab_size)
    step, want = m.steps[0], qwen35.prefill_flops(c, T)
    counted = {"linear": step.ops["delta_rule"]["flops"], "products": step.flops["matmul"],
               "attention": step.ops["attention"]["flops"]}
    L.claim(counted["linear"] == want["linear"] and abs(counted["products"] / want["products"] - 1) < 0.01
            and counted["attention"] >= want["attention"],
            f"on {model.name}, a {T}-token prefill under the meter: its linear layers counted "
            f"{fmt_flops(counted['linear'])}, the closed form's exactly; its products "
            f"{fmt_flops(counted['products'])} against {fmt_flops(want['products'])} (norms and the "
            f"convolution are not products); its full layers' attention {fmt_flops(counted['attention'])}, "
            f"at least the causal pairs' {fmt_flops(want['attention'])} (NumPy scores whole blocks)")
    rows = prefill_rows()
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("prompt", "products", "attention", "linear", "hybrid", "all full", "ratio"):
        t.add_column(col, justify="right", no_wrap=True)
    pf = lambda n: f"{n / 1e15:,.3g}"
    for x in rows:
        h = x["hybrid"]
        t.add_row(f"{x['T']:,}", pf(h["products"]), pf(h["attention"]), pf(h["linear"]),
                  pf(x["h_total"]), pf(x["f_total"]), fmt_x(x["f_total"] / x["h_total"]))
    c = HYBRID_SHAPES["qwen3.5-27b"]
    L.show(t, f"[dim]PFLOP (10¹⁵). Qwen3.5-27B: its products, its {len(c.full_layers)} full layers' attention, "
              f"its {len(c.linear_layers)} linear layers' chunked delta rule (chunks of {deltanet.CHUNK}), and "
              "their sum; all full: the same shape, every layer full; ratio: all full ÷ hybrid; published "
              "config[/]")
    ratios = [x["f_total"] / x["h_total"] for x in rows]
    L.claim(all(a < b for a, b in zip(ratios, ratios[1:])),
            f"the all-attention twin's prefill costs {fmt_x(ratios[0])} the hybrid's FLOPs at "
            f"{rows[0]['T']:,} tokens and {fmt_x(ratios[-1])} at {rows[-1]['T']:,}: the gap grows with "
            "every longer prompt")
    last = rows[-1]
    L.fact(f"at {last['T']:,} tokens the hybrid's linear layers do "
           f"{last['hybrid']['linear'] / last['h_total']:.1%} of its prefill's FLOPs, its "
           f"{len(c.full_layers)} full layers' attention {last['hybrid']['attention'] / last['h_total']:.0%}: "
           "the quadratic part left is theirs")
    L.pause()


FORGET_DK, FORGET_RATIOS, RECALLED = 64, (0.25, 0.5, 1, 2, 4, 8), 0.5


def forget_rows(dk: int = FORGET_DK, ratios=FORGET_RATIOS, heads: int = 8) -> list[dict]:
    """X30: N random pairs written into a [dk, dk] state by each rule (deltanet.recall_errors), read
    back: the mean relative error, and how many pairs a state recalls within RECALLED, per N/dk."""
    rows = []
    for r in ratios:
        n = int(r * dk)
        row = {"n": n, "ratio": r}
        for rule in deltanet.RULES:
            e = deltanet.recall_errors(n, dk, dk, rule, heads=heads)           # [heads, n]
            row[rule] = {"error": float(e.mean()), "recalled": float((e < RECALLED).sum(-1).mean()),
                         "last": float(e[:, -1].max())}
        rows.append(row)
    return rows


def forget_words(rows: list[dict], dk: int = FORGET_DK) -> str:
    """The sentence that concludes X30, from the rows beside it: where each rule's mean error first
    passes RECALLED, where additive recalls no pair, and the delta rule's range of recalled pairs
    from N = dk on."""
    def first(pred):
        return next((x["ratio"] for x in rows if pred(x)), None)
    a_err = first(lambda x: round(x["additive"]["error"], 2) > RECALLED)       # as the table prints it
    d_err = first(lambda x: round(x["delta"]["error"], 2) > RECALLED)
    a_none = first(lambda x: x["additive"]["recalled"] < 1)
    kept = [x["delta"]["recalled"] for x in rows if x["n"] >= dk]
    said = lambda r: "at no N measured" if r is None else f"from N/dk = {r:g}"
    out = (f"Mean error past {RECALLED}: additive {said(a_err)}, the delta rule {said(d_err)}. "
           f"Additive recalls fewer than one pair a state {said(a_none)}: every write lands on every "
           "other key, and the pile grows with N. ")
    if kept:
        out += (f"From N = dk on, the delta rule still recalls {min(kept):.1f} to {max(kept):.1f} pairs "
                f"(of dk = {dk}): it overwrites, keeping the latest writes and losing the oldest, so "
                "what it holds stays bounded however much it is told.")
    return out


def what_it_forgets(L: Lesson) -> None:
    L.section("What a fixed state forgets")
    dk = FORGET_DK
    L.say(f"""
        A `[dk, dv]` state maps keys to values: at most dk independent directions to file them under.
        Below, N random pairs (unit keys, as the layer makes them) are written into a [{dk}, {dk}]
        state, then every key is read back with the final state (`deltanet.recall_errors`, 8 states,
        seeded): once with the **delta rule** the layer runs (no decay, write strength 1), once with
        plain **additive** linear attention, `S += k·vᵀ`. Error: ||Sᵀk − v|| ÷ ||v||, 0 when recalled
        exactly, 1 when as far off as reading nothing. Counted, not timed: it reads the same each run.
    """)
    rows = forget_rows()
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("N", "N/dk", "delta error", "additive error", "delta recalls", "additive recalls"):
        t.add_column(col, justify="right", no_wrap=True)
    for x in rows:
        d, a = x["delta"], x["additive"]
        t.add_row(f"{x['n']:,}", f"{x['ratio']:g}", f"{d['error']:.2f}", f"{a['error']:.2f}",
                  f"{d['recalled']:.1f}", f"{a['recalled']:.1f}")
    L.show(t, f"[dim]mean relative error over all N pairs; recalls: pairs read back within {RECALLED} "
              f"(mean over 8 states); dk = dv = {dk}; float32[/]")
    L.claim(all(x["delta"]["last"] < 1e-4 for x in rows),
            "the delta rule recalls the last pair it wrote exactly in every state (error under 1e-4): "
            "a write with strength 1 replaces what the state held for that key")
    L.say(forget_words(rows))
    L.say("""
        That is why Qwen3.5 keeps one layer in four full: the linear layers hold a bounded summary, and
        the full layers can still look up any token exactly. The ratio of the two trades recall for
        memory.
    """)
    L.pause()


def what_it_costs(L: Lesson, model) -> None:
    L.section("What a fixed state costs")
    L.say(f"""
        The state is a summary, updated in place: the state after token t is gone once token t + 1 is
        in. Two things every earlier lesson relied on go with it. **Going back**: speculative decoding
        (lesson 11) drops the rejected guesses' positions from the cache; a state cannot drop them.
        That is a price, not a wall: Qwen3-Next and Qwen3.5 ship a multi-token-prediction layer to
        draft for themselves, and vLLM and SGLang verify the drafts on Gated DeltaNet layers by keeping
        a state per draft position (and a convolution window longer by the draft), then keeping the
        accepted one: k + 1 states of {fmt_bytes(state_bytes(shape("qwen3.5-27b"), 2))} a sequence during
        a verify at Qwen3.5-27B's shape. This engine keeps one state, so it refuses instead:
    """)
    _, cache = model.prefill(np.arange(8) % model.config.vocab_size)
    try:
        cache.truncate(4)
        refused = None
    except NoRollback as e:
        refused = str(e)
    L.claim(refused is not None and cache.length == 8, "asked to go back from 8 positions to 4, the cache "
            f"refuses in one line: “{refused}”")
    c = model.config
    block = 16
    kv_block = block * c.kv_bytes_per_token(4)
    q = HYBRID_SHAPES["qwen3.5-27b"]
    q_ratio = state_bytes(shape("qwen3.5-27b"), 2) / (block * q.kv_bytes_per_token(2))
    L.say(f"""
        **Prefix caching** (lesson 10) names every full block of a prompt and lets a later request with
        the same first blocks reuse their keys and values. The linear layers have nothing to reuse at a
        block boundary unless the state was saved there: a snapshot per block. Here a snapshot
        ({fmt_bytes(c.state_bytes(4))}) is {c.state_bytes(4) / kv_block:.0f}× the KV of the
        {block}-position block it would sit beside ({fmt_bytes(kv_block)}); for Qwen3.5-27B in bf16,
        {q_ratio:.0f}× (KV in bf16, its state in float32 as released). vLLM first served such models without prefix caching and later saved states only
        at coarse, aligned boundaries; SGLang keeps one state per node of its prefix tree. minillm
        refuses the prefix cache for this family, in one line:
    """)
    try:
        Engine(model, num_blocks=64, block_size=block, prefix_cache=True)
        said = None
    except MiniLLMError as e:
        said = str(e)
    L.claim(said is not None and "prefix" in said, f"the engine with prefix_cache=True says: “{said}”")
    P = L.pick(1024, 256)
    ids = np.random.default_rng(2).integers(0, c.vocab_size, P)
    _, full_cache = model.prefill(ids)
    times = time_interleaved({"prefill": lambda: model.prefill(ids), "copy": lambda: full_cache.fork().free()},
                             L.rounds(), settle=False)        # a ratio stated, no verdict: no rounds added
    ratio = times["prefill"].median / times["copy"].median
    L.say(f"What a hit would have saved, measured: the prefill of a {P}-token prefix took "
          f"{times['prefill'].short()}, copying its KV and one state (`cache.fork()`) {times['copy'].short()}, "
          f"{fmt_x(ratio)} less. What a prefix cache of states would cost is the memory above.")
    L.timing_note()
    L.takeaway("""
        A linear-attention layer keeps a state of fixed size per sequence: its decode step reads and
        writes the same bytes at any context, and only the full-attention layers' KV grows, here a
        quarter of the all-attention model's (three layers in four keep none). So KV overtakes the weights
        four times later, and more sequences fit at long contexts. The price: going back or reusing a
        prefix needs a copy of the state per draft or per block (this engine keeps one, and refuses
        both), and the state holds a summary of the past, not the past.
    """)


def the_third_way(L: Lesson) -> None:
    L.section("The third way: a window that slides")
    g, o = shape("gemma-3-27b"), shape("gpt-oss-20b")          # the published configs
    L.say(f"""
        Latent attention (lesson 18) makes each position's KV small; a state (above) makes part of it
        fixed. The way most open models take is a **sliding window**: most layers attend to the last
        `window` positions only, so their KV stops growing there; a few **global** layers still see
        everything. Gemma 3 27B slides on {g['local_layers']} of its {g['n_layer']} layers (window
        {g['window']:,}); gpt-oss-20b on {o['local_layers']} of {o['n_layer']} (window {o['window']:,}),
        with a learned **sink** per head: one more logit in each softmax that takes no value, so a head
        can attend to nothing. minillm runs both (models/gemma3.py, gptoss.py).
    """)
    b = 2
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("bf16 KV", "a token", "32k seq", "128k seq", "fit 32k", "fit 128k"):
        t.add_column(col, justify="right", no_wrap=True)
    fit = {}
    for name in ("gemma-3-27b", "gpt-oss-20b"):
        s = shape(name)
        every = {k: v for k, v in s.items() if k not in ("window", "local_layers")}      # no layer slides
        for label, x in ((name, s), ("  all global", every)):
            caps = [capacity(x, ctx, get_chip("h200").memory_gb * 1e9, bytes_per_weight=None, kv_bytes_per_value=b)
                    for ctx in (32768, 131072)]
            fit[(name, label == name)] = [cap["sequences"] for cap in caps]
            t.add_row(label, fmt_bytes(caps[0]["kv_bytes_per_token"]), fmt_bytes(caps[0]["kv_bytes_per_sequence"]),
                      fmt_bytes(caps[1]["kv_bytes_per_sequence"]), *(f"{n:,}" for n in fit[(name, label == name)]))
    L.show(t, f"[dim]sequences that fit on an H200 beside the weights as released, KV in bf16, {UTILISATION:.0%} "
              "of the memory; published configs[/]")
    for name in ("gemma-3-27b", "gpt-oss-20b"):
        s = shape(name)
        L.fact(f"{name}: {s['local_layers']} of {s['n_layer']} layers keep {s['window']:,} positions, so past "
               f"them a token costs only the {s['n_layer'] - s['local_layers']} global layers' KV")
    L.claim(all(fit[(n, True)][i] >= fit[(n, False)][i] for n in ("gemma-3-27b", "gpt-oss-20b") for i in (0, 1))
            and any(fit[(n, True)][1] > fit[(n, False)][1] for n in ("gemma-3-27b", "gpt-oss-20b")),
            f"at 128k, {fit[('gemma-3-27b', True)][1]} Gemma 3 27B sequences fit on an H200 against "
            f"{fit[('gemma-3-27b', False)][1]} with every layer global; gpt-oss-20b: "
            f"{fit[('gpt-oss-20b', True)][1]} against {fit[('gpt-oss-20b', False)][1]}")
    L.say("""
        Why not slide on every layer? A windowed layer cannot see past its window, and information
        from further back reaches a token only hop by hop through the layers; Gemma 3's report found
        that five local layers to one global, with a window of 1,024, kept perplexity where all-global
        had it (Gemma Team 2025, arXiv 2503.19786, §2 and its ablations). Without anything global, a
        window also loses the first tokens, onto which softmax heads pile the attention they have
        nowhere else to put: StreamingLLM kept four of them to fix it (Xiao et al. 2023, arXiv
        2309.17453); gpt-oss learns a sink logit per head instead (OpenAI 2025, arXiv 2508.10925).
        `minillm bench --context-sweep --model random-gemma3,random-gemma3-global` times a windowed
        model's decode step against its all-global twin's.
    """)
    L.pause()


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
