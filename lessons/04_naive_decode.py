"""Lesson 4: Naive decode. Generate one token at a time by running the whole sequence again every step.

Run:  python lessons/04_naive_decode.py        (or: minillm learn 4)
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

import minillm
from minillm.lessons._common import (Lesson, bar_chart, fmt_bytes, fmt_flops, fmt_ratio, fmt_time, fmt_x,
                                     growth_words, ratio_range, run_lesson, time_interleaved)
from minillm.ui import report

TITLE = "Naive decode: recompute everything"
MINUTES = 3  # 679 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "per-step cost growing with position, total cost growing with length²"

PROMPT = "ROMEO:"
SAMPLING = {"temperature": 0.8, "top_k": 40, "seed": 1}   # a seeded sample: greedy text loops
SAMPLING_TEXT = "temperature 0.8, top-k 40, seed 1"


def lesson(L: Lesson) -> None:
    model = L.load_model()
    enc = minillm.tokenizer()
    ids = enc.encode(PROMPT)
    N = min(L.pick(160, 32), model.config.n_ctx - len(ids))
    intro(L, len(ids), N)
    steps, new = naive_run(L, model, enc, ids, N)
    L.pause()
    cost_per_step_grows(L, model, steps, ids + new)
    L.pause()
    total_cost_grows_quadratically(L, steps)


def intro(L: Lesson, P: int, N: int) -> None:
    L.say(f"""
        The model predicts **one** next token per pass. To write {N} tokens, the simplest loop runs the
        whole sequence, picks a token from the last logits, appends it, and repeats.

        ```python
        seq = list(ids)
        for _ in range(n):
            logits = model.forward(seq, last_only=True)   # every token so far, again
            seq.append(minillm.sample(logits[0]))
        ```

        That is `minillm.generate(model, ids, n, kv_cache=False)`. Step *i* pushes all {P} + *i*
        tokens through every block, though only the newest is new.
    """)
    L.pause()


def naive_run(L: Lesson, model, enc, ids, N: int):
    P = len(ids)
    minillm.generate(model, ids, min(2, N), kv_cache=False)  # warm-up: first touches of the weights
    with L.status(f"generating {N} tokens the naive way…"):
        with minillm.Meter() as m:
            new = minillm.generate(model, ids, N, kv_cache=False, **SAMPLING)
    steps = m.steps
    L.sample_panel(PROMPT, enc.decode(new), f"{escape(model.name)}, sampled ({SAMPLING_TEXT}), the first lines")

    t = Table(header_style="bold", title=f"{N} steps, each a full forward pass (m.steps)",
              title_justify="left")
    for col in ("step", "tokens run", "FLOPs", "LM head", "bytes moved", "time (one run)"):
        t.add_column(col, justify="right")
    for i in report.select(steps, 5):
        r = steps[i]
        t.add_row(str(i), str(r.n_tokens), fmt_flops(r.total_flops), fmt_flops(r.ops["lm_head"]["flops"]),
                  fmt_bytes(r.total_bytes), fmt_time(r.seconds))
    L.show(t)
    L.claim(all(r.n_tokens == P + i for i, r in enumerate(steps)),
            f"step i runs all {P} + i tokens through the model ({steps[0].n_tokens} to {steps[-1].n_tokens})")
    L.claim(all(b.total_flops > a.total_flops for a, b in zip(steps, steps[1:])),
            f"FLOPs grow at every step: {fmt_flops(steps[0].total_flops)} → {fmt_flops(steps[-1].total_flops)}")
    L.claim(all(b.total_bytes > a.total_bytes for a, b in zip(steps, steps[1:])),
            f"so do the bytes moved: {fmt_bytes(steps[0].total_bytes)} → {fmt_bytes(steps[-1].total_bytes)}")
    return steps, new


def cost_per_step_grows(L: Lesson, model, steps, seq) -> None:
    L.section("Cost per step grows with position")
    P, last = steps[0].n_tokens, len(steps) - 1
    with L.status("timing the first and the last step again, in turns…"):
        times = time_interleaved({"first": lambda: model.forward(seq[:P], last_only=True),
                                  "last": lambda: model.forward(seq[:P + last], last_only=True)}, L.rounds())
    L.show(bar_chart("The first and last step, timed again (median, ± half the range):",
                     [(f"step 0 ({P} tokens)", times["first"].median, times["first"].short()),
                      (f"step {last} ({P + last} tokens)", times["last"].median, times["last"].short())],
                     style="yellow"))
    L.timing_note()
    flop_growth = steps[-1].total_flops / steps[0].total_flops
    ratio = ratio_range(times["last"], times["first"])
    why = ("Fixed costs a step (the LM head's read, NumPy's per-call overhead) explain the gap."
           if ratio[0] < 0.8 * flop_growth else "")
    L.say(f"""
        The last step did {fmt_x(flop_growth)} the FLOPs of the first and took {fmt_ratio(ratio)}
        its time: the time {growth_words(ratio[0], flop_growth)}. Only the LM head (the last
        position alone) does not grow. {why}
    """)
    L.claim(steps[-1].total_flops - steps[-1].ops["lm_head"]["flops"]
            > (P + last) / P * 0.99 * (steps[0].total_flops - steps[0].ops["lm_head"]["flops"]),
            f"the blocks' FLOPs grow at least in proportion to the tokens run: {P} → {P + last} tokens, "
            f"{fmt_x(flop_growth)} the FLOPs")
    L.busy_note()


def total_cost_grows_quadratically(L: Lesson, steps) -> None:
    L.section("Total cost grows with the square of the length")
    P, N = steps[0].n_tokens, len(steps)
    L.say(f"""
        Step *i* costs about P + *i* tokens' work, so *n* tokens cost about P·n + n²/2 (P = {P}):
        **double the answer, roughly four times the work** once it outgrows the prompt.
    """)
    t = Table(header_style="bold")
    for col in ("tokens generated", "total FLOPs", "recomputed (no LM head)", "× previous", "time (one run)"):
        t.add_column(col, justify="right")
    marks = sorted({max(1, N // 4), max(1, N // 2), N})
    prev = None
    totals = {}
    for n in marks:
        flops = sum(r.total_flops for r in steps[:n])
        recomputed = sum(r.total_flops - r.ops["lm_head"]["flops"] for r in steps[:n])
        seconds = sum(r.seconds for r in steps[:n])
        totals[n] = recomputed
        t.add_row(str(n), fmt_flops(flops), fmt_flops(recomputed), "" if prev is None else fmt_x(recomputed / prev),
                  fmt_time(seconds))
        prev = recomputed
    L.show(t)
    half = N // 2   # the claim compares N tokens with N // 2: a run too short for that has nothing to show
    ratio = totals[N] / totals[half] if half in totals and totals[half] > 0 else 0.0
    L.claim(ratio > 3.0, f"doubling the answer from {half} to {N} tokens multiplies the recomputed work by "
                         f"{ratio:.2f}: nearer 4 (= 2², the mark of n² growth) than 2 (the mark of linear growth)")
    L.takeaway(f"""
        Naive decode pushed {sum(r.n_tokens for r in steps):,} token-positions through the blocks
        for {N} tokens, only {P + N - 1} of them new. Lesson 5 keeps the old keys and values in the
        **KV cache** instead.
    """)
    L.try_it("""
        `minillm generate "ROMEO:" --no-cache --max-new-tokens 200` streams text the naive way:
        watch it slow down. Then drop `--no-cache` (lesson 5 measures the difference).
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
