"""Lesson 19: A state that does not grow. Qwen3.5 keeps a KV cache in one layer of four; the other
three (Gated DeltaNet) fold the past into a fixed-size state per sequence. Its two forms on one
example (chunked for a prompt, recurrent for decode: the same numbers, compute against memory); a
decode step's time and bytes against the context for a hybrid and an all-attention model of the same
width and depth, counted and timed; how many sequences fit at 32k; what a fixed state costs.

Run:  python lessons/19_state.py        (or: minillm learn 19)
"""

from __future__ import annotations

from minillm.lessons._common import Lesson, fmt_x, plural, run_lesson, time_interleaved

import numpy as np
from rich import box
from rich.table import Table

import minillm
from minillm.measure.contexts import run_context_sweep
from minillm.models import qwen35
from minillm.models.qwen35 import FULL, LINEAR, Qwen35Config, decode_step_bytes
from minillm.ui.report import fmt_bytes, fmt_flops

TITLE = "A state that does not grow"
MINUTES = 8
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
            return qwen35.random(qwen35.SHAPES[name], name=name)
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
        layers. Qwen3.5 (and Qwen3-Next before it; Kimi Linear, Nemotron-H, Jamba, MiniMax alike)
        replaces three attention layers of every four with **linear attention** (Gated DeltaNet): a
        layer that folds everything it has seen into a **state of fixed size**, per value head one
        `[dk, dv]` matrix, whatever the context.
    """)
    L.pause()
    hybrid, full = preset(L, HYBRID), preset(L, FULL_NAME)
    two_forms(L, hybrid)
    rows = context_sweep(L, hybrid, full)
    L.try_it(f"""
        `minillm bench --context-sweep --model {HYBRID},{FULL_NAME}` measures this lesson's sweep as a
        command (256 to 16,384 tokens), in interleaved rounds, with the crossover named. The chunk size
        of the prompt's form is `model.chunk` (64 by default): any value gives the same logits.
    """)


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
    forms = {"recurrent": lambda: qwen35.delta_rule_recurrent(q, k, v, g, beta, S0),
             "chunked": lambda: qwen35.delta_rule_chunked(q, k, v, g, beta, S0, qwen35.CHUNK)}
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
    for col in ("form", "FLOPs", "state traffic", "time"):
        t.add_column(col, justify="right", no_wrap=True)
    state = S0.nbytes
    for name in forms:
        traffic = counted[name].bytes["activations"] - sum(a.nbytes for a in (q, k, v, g, beta)) \
            - out[name][0].nbytes
        t.add_row(name, fmt_flops(counted[name].total_flops), fmt_bytes(traffic), times[name].short())
    L.show(t, f"[dim]{Hv} heads, dk = {dk}, dv = {dv}, {T} tokens, chunks of {qwen35.CHUNK}; state traffic: the "
              f"states the form reads and writes as it goes ({fmt_bytes(state)} each), counted by the meter[/]")
    L.timing_note()
    f_rec, f_chunk = counted["recurrent"].total_flops, counted["chunked"].total_flops
    L.fact(f"the recurrent form does {fmt_flops(f_rec)} in {T} tiny steps that each move the whole state; the "
           f"chunked form does {fmt_x(f_chunk / f_rec)} those FLOPs as matrix products over "
           f"{plural(-(-T // qwen35.CHUNK), 'chunk')}, the state moved once per chunk")
    ratio = times["recurrent"].median / times["chunked"].median
    L.say(f"Here the recurrent form took {fmt_x(ratio)} the chunked form's time over the whole prompt"
          + (": a prompt wants the chunked form." if ratio > 1 else
             ", no more: at this size the two are close on this machine (the chunked form's lead grows with "
             "the heads' widths, its products' efficiency)."))
    ids = np.random.default_rng(1).integers(0, c.vocab_size, L.pick(96, 48))
    P = len(ids) // 2
    naive = model.forward(ids)
    logits, cache = model.prefill(ids[:P])
    rows = [logits] + [model.decode_step(int(tok), cache) for tok in ids[P:-1]]
    gap = float(np.abs(np.array(rows) - naive[P - 1:-1]).max())
    L.claim(gap < 1e-4, f"the whole model: a prefill of {P} tokens (chunked form) and {len(ids) - P - 1} decode "
            f"steps (recurrent form) give the logits of one pass with no cache, within {gap:.1e}")
    L.pause()


def context_sweep(L: Lesson, hybrid, full) -> list[dict]:
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
            f"{len(h.full_layers)}/{len(f.full_layers)} of the other's {fmt_bytes(grow[full.name])}")
    T_bytes = qwen35.crossover_context(h, f, hybrid.dtype.itemsize)
    L.fact(f"by the closed form the hybrid's step moves fewer bytes from context {T_bytes:,} on: its linear "
           f"layers' extra weights and its state ({fmt_bytes(2 * h.state_bytes(4))} read and written) against "
           f"{fmt_bytes(f.kv_bytes_per_token(4) - h.kv_bytes_per_token(4))} less KV per position")
    T_time = r["crossover_time"]
    if T_time is None:
        L.say(f"In time, the hybrid's step was not below the other's at {hi:,} tokens on this run.")
    elif T_time == lo:
        L.say(f"In time, the hybrid's step was below the other's at every context measured, from {lo:,}.")
    else:
        L.say(f"In time, the hybrid's step was below the other's from {T_time:,} tokens on (and at every longer "
              "context measured): at short contexts its linear layers' small operations cost more than the few "
              "KV bytes they save.")
    L.pause()
    return r["rows"]


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
