"""Lesson 5: The KV cache. Keep every position's keys and values, and compute each token only once.

Run:  python lessons/05_kv_cache.py        (or: minillm learn 5)
"""

from __future__ import annotations

import numpy as np
from rich.markup import escape
from rich.table import Table

import minillm
from minillm.models.gpt2 import GPT2_SIZES
from minillm.lessons._common import (Lesson, faster_words, fmt_bytes, fmt_flops, fmt_kib, fmt_x, paired_chart,
                                     ratio_range, run_lesson, time_interleaved, token_text)
from minillm.measure.chips import get_chip
from minillm.measure.shapes import UTILISATION, capacity, shape
from minillm.ui import report

TITLE = "The KV cache: compute each token once"
MINUTES = 5  # 1,075 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "same tokens, flat per-step cost, measured speedups, 72 KiB a token, two classic bugs"

PROMPT = "JULIET: O Romeo, Romeo! wherefore art thou Romeo?"
SAMPLING = {"temperature": 0.8, "top_k": 40, "seed": 1}   # a seeded sample: greedy text loops

# Published shapes of two 7-8B models (measure/shapes.py, from their configs) and GPUs (measure/chips.py,
# with each chip's own memory): the capacity function sizes the KV cache for lesson 12 and the commands too.
BIG_MODELS = {"Llama-2-7B (MHA: 32 KV heads)": "llama-2-7b", "Llama-3-8B (GQA: 8 KV heads)": "llama-3-8b"}
GPUS = ("a100-80gb", "h200")   # an H100 SXM holds 80 GB too: its column was the A100's


def metered_generate(model, ids, n: int, kv_cache: bool, **sampling) -> tuple[list[int], minillm.Meter]:
    """Generate n tokens under a Meter: the tokens and every step's counters."""
    with minillm.Meter() as m:
        out = minillm.generate(model, ids, n, kv_cache=kv_cache, **sampling)
    return out, m


def lesson(L: Lesson) -> None:
    model = L.load_model()
    enc = minillm.tokenizer()
    ids = enc.encode(PROMPT)
    N = min(L.pick(160, 48), model.config.n_ctx - len(ids))
    intro(L, N)
    mn, mc = same_tokens(L, model, enc, ids, N)
    L.pause()
    per_step_cost_is_flat(L, model, mn, mc)
    L.pause()
    rows = speedup_measured(L, model, ids)
    L.pause()
    what_the_cache_costs(L, model, mc.of_kind("decode"))
    L.pause()
    two_classic_bugs(L, model, enc, ids, rows)


def intro(L: Lesson, N: int) -> None:
    L.say(f"""
        Lesson 4 recomputed every earlier position's keys and values each step, though they never
        change. The fix: **keep them**. `model.prefill(ids)` fills a cache (lesson 3); then each
        `model.decode_step(token, cache)` runs **only the new token**, appends its key and value,
        and attends over the cache.

        ```python
        logits, cache = model.prefill(ids)            # the prompt, once
        for _ in range(n - 1):
            token = minillm.sample(logits)
            logits = model.decode_step(token, cache)  # one token, reading the cache
        ```

        `minillm.generate(model, ids, n)` is this loop. Here: {N} tokens, one seed, both ways.
    """)
    L.pause()


def same_tokens(L: Lesson, model, enc, ids, N: int):
    P = len(ids)
    minillm.generate(model, ids, 2)                   # warm-up: first touches of weights and cache pages
    minillm.generate(model, ids, 2, kv_cache=False)
    with L.status(f"generating {N} tokens twice: naive, then with the KV cache…"):
        naive, mn = metered_generate(model, ids, N, kv_cache=False, **SAMPLING)
        cached, mc = metered_generate(model, ids, N, kv_cache=True, **SAMPLING)
    L.sample_panel(PROMPT, enc.decode(cached), f"{escape(model.name)}, seed 1, KV-cached: the first lines")
    L.claim(naive == cached, f"naive and cached decode produced the same {N} tokens")
    decode = mc.of_kind("decode")
    L.claim(mc.steps[0].kind == "prefill" and mc.steps[0].n_tokens == P and all(r.n_tokens == 1 for r in decode),
            f"with the cache: one prefill of {P} tokens, then {len(decode)} decode steps of one token each")
    return mn, mc


def per_step_cost_is_flat(L: Lesson, model, mn, mc) -> None:
    L.section("Per-step cost: flat instead of growing")
    c, decode, N = model.config, mc.of_kind("decode"), len(mc.steps)
    shown = report.select(mn.steps, 3)
    L.show(paired_chart("FLOPs per step, on one scale (counted by the meter):",
                        [(f"step {i}", mn.steps[i].total_flops, mc.steps[i].total_flops,
                          fmt_flops(mn.steps[i].total_flops), fmt_flops(mc.steps[i].total_flops)) for i in shown],
                        names=("naive ", "cached")))
    matmul = {r.flops["matmul"] for r in decode}
    growth = {b.flops["attention"] - a.flops["attention"] for a, b in zip(decode, decode[1:])}
    L.claim(len(matmul) == 1, f"every cached decode step does the same matrix work: {fmt_flops(matmul.pop())}")
    grow = 4 * c.n_layer * c.n_head * c.head_dim
    L.claim(growth == {grow},
            f"only attention grows, by 4·L·H·hd = {grow:,} FLOPs per step: one more key and value to read")
    L.claim(all(a.total_flops > b.total_flops for a, b in zip(mn.steps[1:], mc.steps[1:])),
            "after the prefill, every cached step does fewer FLOPs than the naive step at the same position")
    L.say(f"""
        Totals for {N} tokens: naive {fmt_flops(mn.total('total_flops'))}, cached
        {fmt_flops(mc.total('total_flops'))}. In exchange the cache takes memory, and each step reads
        **all** earlier keys and values ({fmt_bytes(decode[-1].bytes['kv_read'])} at the last).
    """)


def speedup_measured(L: Lesson, model, ids) -> list:
    L.section("Speedup, measured")
    P, c = len(ids), model.config
    big = model.n_params() > 50e6
    # naive decode's work grows with the square of the length: the longest run sets the lesson's time
    lengths = [n for n in L.pick([8, 16, 32] if big else [16, 48, 128], [16, 96]) if n <= c.n_ctx - P]
    rows = []
    with L.status("timing naive and cached decode at several lengths, in turns…"):
        work = {}
        for n in lengths:
            work[("naive", n)] = lambda n=n: minillm.generate(model, ids, n, kv_cache=False)
            work[("cached", n)] = lambda n=n: minillm.generate(model, ids, n, kv_cache=True)
        times = time_interleaved(work, L.rounds())
        for n in lengths:
            _, m_n = metered_generate(model, ids, n, kv_cache=False)
            _, m_c = metered_generate(model, ids, n, kv_cache=True)
            rows.append((n, times[("naive", n)], times[("cached", n)],
                         m_n.total("total_flops") / m_c.total("total_flops")))
    t = Table(header_style="bold")
    for col in ("new tokens", "naive", "cached", "speedup (time)", "FLOPs saved"):
        t.add_column(col, justify="right")
    for n, s_n, s_c, fr in rows:
        mid, lo, hi = ratio_range(s_n, s_c)
        t.add_row(str(n), s_n.short(), s_c.short(), f"[bold]{fmt_x(mid)}[/] ({fmt_x(lo)}–{fmt_x(hi)})", fmt_x(fr))
    L.show(f"[bold]{escape(model.name)}, {P}-token prompt, greedy; times: median ± half the range[/]", t)
    L.timing_note()
    L.busy_note()
    n, s_n, s_c, fr = rows[-1]
    L.claim(all(fr > 1.0 for *_, fr in rows) and rows[-1][3] > rows[0][3],
            "it saves FLOPs at every length, and more the longer the answer (counted)")
    # Timed: words from the rounds, never a claim (a busy machine changes the words, not the exit status).
    L.say(f"For {n} new tokens, saving {fmt_x(fr)} the FLOPs, "
          + faster_words(s_c, s_n, "the cache", "naive decode") + ".")
    return rows


def what_the_cache_costs(L: Lesson, model, decode) -> None:
    L.section("What the cache costs: memory")
    c = model.config
    t = Table(header_style="bold")
    for col in ("model", "KV/token", "context", "KV, full", "KV/weights"):
        t.add_column(col, justify="right", no_wrap=True)
    per = {}
    for name, cfg in GPT2_SIZES.items():
        per[name] = minillm.KVCache(cfg).bytes_per_token()   # allocates lazily: no page is touched
        full = per[name] * cfg.n_ctx
        t.add_row(f"GPT-2 {name}", fmt_kib(per[name]), f"{cfg.n_ctx:,}",
                  fmt_bytes(full), f"{full / (4 * cfg.n_params()):.0%}")
    mine = model.new_cache().bytes_per_token()
    t.add_row(escape(model.name), fmt_kib(mine), f"{c.n_ctx:,}",
              fmt_bytes(mine * c.n_ctx), f"{mine * c.n_ctx / model.nbytes():.0%}")
    L.show("[bold]KV cache, float32, at each model's full context[/]", t)
    small = GPT2_SIZES["124m"]
    written = {r.bytes["kv_write"] for r in decode}
    L.claim(written == {mine} and mine == 2 * c.n_layer * c.n_embd * np.dtype(model.dtype).itemsize,
            f"every decode step of this run wrote exactly one token of cache, {mine:,} bytes = 2·L·d·b "
            f"(counted by the meter, sized by the cache)")
    users = int(4 * small.n_params() // (per["124m"] * small.n_ctx)) + 1
    L.say(f"""
        Requests share the weights but each has its own cache: {users} at full context on GPT-2
        small outweigh the model. So the cache decides how many fit:

        **sequences that fit = (GPU memory × {UTILISATION} − weights) ÷ (KV bytes per token × context)**
        ({UTILISATION}: vLLM's default `gpu_memory_utilization`)
    """)
    L.pause()
    ctx = 4096
    gpus = [get_chip(g) for g in GPUS]
    t = Table(header_style="bold", title=f"fp16, {ctx:,}-token contexts",
              title_justify="left")
    t.add_column("model")
    t.add_column("KV/token", justify="right")
    for gpu in gpus:
        t.add_column(f"{gpu.name} ({gpu.memory_gb:g} GB)", justify="right")
    fits = {}
    for name, key in BIG_MODELS.items():
        s = shape(key)
        caps = [capacity(s, ctx, gpu.memory_gb * 1e9) for gpu in gpus]
        fits[name] = [c["sequences"] for c in caps]
        t.add_row(name, fmt_kib(caps[0]["kv_bytes_per_token"]), *(f"{f} seqs" for f in fits[name]))
    L.show(t, "[dim]the same function answers `minillm hardware --shape llama-2-7b --fit 4096 --chip a100`[/]")
    mha, gqa = fits.values()
    gib = [capacity(shape(key), ctx, gpus[0].memory_gb * 2 ** 30)["sequences"] for key in BIG_MODELS.values()]
    L.say(f"""
        GB here are 10⁹ bytes; {article(gpus[0].memory_gb)} "{gpus[0].memory_gb:g} GB" card holds
        {gpus[0].memory_gb:g} GiB ({gpus[0].memory_gb * 2 ** 30 / 1e9:.1f}·10⁹): so counted, the
        {gpus[0].name} fits {gib[0]} and {gib[1]}. GQA's fewer KV heads hold
        {fmt_x(gqa[0] / max(1, mha[0]))} the sequences (lesson 12).
    """)


def article(n: float) -> str:
    """'a' or 'an' before a number as it is read aloud: an 8, an 11, an 18, an 80; a 40, a 141."""
    text = f"{n:g}"
    return "an" if text[0] == "8" or text in ("11", "18") or text.startswith(("11", "18")) and len(text) in (
        5, 6) else "a"


def two_classic_bugs(L: Lesson, model, enc, ids, rows) -> None:
    L.section("Two classic bugs, avoided")
    P, c = len(ids), model.config
    logits, cache = model.prefill(ids)
    token = int(np.argmax(logits))
    reference = model.forward(ids + [token])[-1]              # the truth: the whole sequence, no cache
    right = model.decode_step(token, cache.fork())
    # The bug: the new token embedded at position 0, written over slot 0, attending over slot 0 alone.
    # That is exactly a pass over the one token with no cache: a forward of [token].
    wrong = model.forward([token])[-1]
    d_right, d_wrong = np.abs(right - reference).max(), np.abs(wrong - reference).max()
    L.say(f"""
        **1. The position offset.** A decode step embeds the new token at position *t* (tokens
        cached), stores its key and value at slot *t*, and attends over 0..*t*. Forget *t* and it is
        `model.forward([token])`. The token `{token_text(enc, token)}` after the {P}-token prompt:
    """)
    t = Table(header_style="bold")
    for col in ("", "largest |logit − truth|", "next token"):
        t.add_column(col, justify="right" if col else "left")
    t.add_row(escape("model.forward(ids + [token])[-1]"), "0", token_text(enc, int(np.argmax(reference))))
    t.add_row(f"model.decode_step(token, cache)  (position {P})", f"{d_right:.1e}", token_text(enc, int(np.argmax(right))))
    t.add_row(escape("model.forward([token])  (position 0: the bug)"), f"{d_wrong:.3g}",
              token_text(enc, int(np.argmax(wrong))))
    L.show(t)
    L.claim(d_right < 1e-3, "decode_step with the cache gives the logits of a full forward pass (to float32 rounding)")
    L.claim(d_wrong > 100 * max(d_right, 1e-7), "the missing offset gives different logits: a silent wrong answer")
    L.say("""
        In minillm `decode_step(token, cache)` reads the position from `cache.length`.

        **2. The context limit.** Past the learned positions an unchecked loop crashes or reuses
        rows; minillm refuses first:
    """)
    for what, fn in ((f"minillm.generate(model, ids, {c.n_ctx})", lambda: minillm.generate(model, ids, c.n_ctx)),
                     (f"model.prefill({c.n_ctx + 1} tokens)", lambda: model.prefill(np.zeros(c.n_ctx + 1, dtype=np.intp)))):
        try:
            fn()
        except minillm.PromptError as e:
            L.console.print(f"  [bold]{escape(what)}[/] → [red]PromptError:[/] {escape(str(e))}")
            raised = True
        else:
            raised = False
        L.claim(raised, f"{what} raises PromptError instead of running past the context")
    L.takeaway(f"""
        The KV cache makes decode **one token's work per step**: same tokens, {fmt_x(rows[-1][3])}
        fewer FLOPs for {rows[-1][0]} tokens, for 2·L·H_kv·hd·b bytes a token. Each step still reads
        **every weight** for one token: lesson 6 measures that.
    """)
    L.try_it("""
        `minillm compare "ROMEO:" --max-new-tokens 200`: both decodes side by side, every step's
        counters, the speedup in **time**. It grows with `--max-new-tokens`, slower than the FLOPs
        saved: every step still reads every weight.
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
