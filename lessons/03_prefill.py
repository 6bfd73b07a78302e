"""Lesson 3: Prefill. The whole prompt goes through the model in one pass and leaves a KV cache behind.

Run:  python lessons/03_prefill.py        (or: minillm learn 3)
"""

from __future__ import annotations

import numpy as np
from rich.markup import escape
from rich.table import Table

import minillm
from minillm.models.gpt2 import GPT2_SIZES
from minillm.lessons._common import (Lesson, Timing, bar_chart, fmt_bytes, fmt_flops, fmt_kib, fmt_time, fmt_x, plural,
                                     run_lesson, time_interleaved)
from minillm.measure.chips import CHIPS

TITLE = "Prefill: the whole prompt in one pass"
MINUTES = 4  # 784 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "a prompt's FLOPs and bytes, the KV cache it leaves, intensity rising with length"

PROMPT = ("JULIET: O Romeo, Romeo! wherefore art thou Romeo? Deny thy father and refuse thy name; "
          "Or, if thou wilt not, be but sworn my love, And I'll no longer be a Capulet.")


def lesson(L: Lesson) -> None:
    model = L.load_model()
    enc = minillm.tokenizer()
    ids = enc.encode(PROMPT)[: model.config.n_ctx - 1]
    intro(L, len(ids))
    pre, cache = one_prefill(L, model, ids)
    L.pause()
    the_kv_cache_it_leaves(L, model, ids, pre, cache)
    L.pause()
    longer_prompts_higher_intensity(L, model, enc)


def step_table(records: list) -> Table:
    t = Table(header_style="bold")
    t.add_column("")
    for name, _ in records:
        t.add_column(name, justify="right")
    rows = [
        ("tokens through the blocks", lambda r: f"{r.n_tokens}"),
        ("FLOPs", lambda r: fmt_flops(r.total_flops)),
        ("  matmul", lambda r: fmt_flops(r.flops["matmul"])),
        ("  attention", lambda r: fmt_flops(r.flops["attention"])),
        ("  other", lambda r: fmt_flops(r.flops["other"])),
        ("bytes moved", lambda r: fmt_bytes(r.total_bytes)),
        ("  weights", lambda r: fmt_bytes(r.bytes["weights"])),
        ("  KV cache read", lambda r: fmt_bytes(r.bytes["kv_read"])),
        ("  KV cache written", lambda r: fmt_bytes(r.bytes["kv_write"])),
        ("  activations", lambda r: fmt_bytes(r.bytes["activations"])),
        ("[bold]FLOPs per byte[/]", lambda r: f"[bold]{r.intensity:.3g}[/]"),
        ("weight bytes per token", lambda r: fmt_bytes(r.bytes["weights"] / r.n_tokens)),
        ("wall time (one run)", lambda r: fmt_time(r.seconds)),
    ]
    for label, fn in rows:
        t.add_row(label, *(fn(r) for _, r in records))
    return t


def intro(L: Lesson, n: int) -> None:
    L.say(f"""
        Generating text has two phases. **Prefill** runs all {n} prompt tokens through the model at
        once, as one [T, d] matrix: lesson 2's pass, except that each block keeps every position's
        keys and values in a **KV cache** for later tokens' queries.

        ```python
        with minillm.Meter() as m:
            logits, cache = model.prefill(ids)   # last position's logits, the cache
        record = m.steps[0]                      # what the pass read and computed
        ```
    """)
    L.pause()


def one_prefill(L: Lesson, model, ids):
    model.prefill(ids[:4])  # warm-up: first touches of the weights and of a cache
    with minillm.Meter() as m:
        logits, cache = model.prefill(ids)
    pre = m.steps[0]
    first = int(np.argmax(logits))
    with minillm.Meter() as m1:
        model.decode_step(first, cache)
    dec = m1.steps[0]
    L.show(f"[bold]{escape(model.name)}: the prompt's prefill, then one decode step[/]",
           step_table([(f"prefill ({pre.n_tokens} tokens)", pre), ("one decode step", dec)]))
    L.say(f"""
        The prefill read the weights **once** ({fmt_bytes(pre.bytes['weights'])}) for
        {pre.n_tokens} tokens, the decode step as many for a **single** token. FLOPs per byte is the
        **arithmetic intensity**: high, work waits on arithmetic; low, on memory.
    """)
    L.claim(pre.kind == "prefill" and pre.n_tokens == len(ids), f"one prefill step processed all {len(ids)} prompt tokens")
    L.claim(pre.intensity > dec.intensity,
            f"prefill's arithmetic intensity ({pre.intensity:.3g} FLOP/byte) is above a decode step's ({dec.intensity:.3g})")
    return pre, cache


def the_kv_cache_it_leaves(L: Lesson, model, ids, pre, cache) -> None:
    L.section("The KV cache it leaves behind")
    c = model.config
    per_token = cache.bytes_per_token()
    prompt_kv = pre.bytes["kv_write"]
    b = np.dtype(model.dtype).itemsize
    L.say(f"""
        Each layer keeps a key and a value per KV head (hd numbers; GPT-2 has one per query head)
        for every position: **2 · L · H_kv · hd · b** bytes per token = 2 · {c.n_layer} ·
        {c.n_kv_head} · {c.head_dim} · {b} = **{per_token:,} bytes** ({fmt_kib(per_token)}) for
        `{escape(model.name)}` in {np.dtype(model.dtype).name} (`cache.bytes_per_token()`).
    """)
    t = Table(header_style="bold")
    t.add_column("")
    t.add_column("tokens", justify="right")
    t.add_column("KV cache", justify="right")
    t.add_row("the prompt (cache.nbytes_used())", f"{len(ids)}", fmt_bytes(prompt_kv))
    t.add_row("the context, allocated up front (cache.k, .v)", f"{cache.capacity:,}",
              fmt_bytes(cache.k.nbytes + cache.v.nbytes))
    small = minillm.KVCache(GPT2_SIZES["124m"])
    t.add_row("GPT-2 small, full context (1,024)", "1,024", fmt_bytes(small.bytes_per_token() * 1024))
    L.show(t)
    L.claim(pre.bytes["kv_write"] == len(ids) * per_token,
            f"the meter saw the prefill write exactly {len(ids)} tokens' worth of keys and values "
            f"({fmt_bytes(pre.bytes['kv_write'])})")
    L.claim(cache.nbytes_used() == prompt_kv + per_token,
            "the cache holds the prompt's keys and values, and one more token's after the decode step")


def longer_prompts_higher_intensity(L: Lesson, model, enc) -> None:
    L.section("Longer prompts, higher intensity")
    c = model.config
    per_token = model.new_cache().bytes_per_token()
    lengths = [n for n in L.pick([1, 2, 4, 8, 16, 32, 64, 128, 256], [1, 8, 64]) if n <= c.n_ctx]
    source = np.resize(np.array(enc.encode(PROMPT)), max(lengths))  # the prompt's tokens, repeated as needed
    records = []
    with L.status("prefilling prompts of several lengths…"):
        for n in lengths:
            with minillm.Meter() as m:
                model.prefill(source[:n])
            records.append(m.steps[0])
        times = time_interleaved({n: (lambda n=n: model.prefill(source[:n])) for n in lengths}, L.rounds())
    L.show(bar_chart("Arithmetic intensity of prefill (FLOPs per byte moved), by prompt length:",
                     [(plural(r.n_tokens, "token"), r.intensity, f"{r.intensity:.3g} FLOP/byte") for r in records],
                     style="magenta"))
    L.show(bar_chart("Wall time per prompt token (measured: median, ± half the range of the rounds):",
                     [(plural(n, "token"), times[n].median / n, Timing(tuple(t / n for t in times[n].seconds)).short())
                      for n in lengths], style="cyan"))
    L.timing_note()
    L.claim(records[-1].intensity > 2 * records[0].intensity,
            f"a {records[-1].n_tokens}-token prefill does {records[-1].intensity / records[0].intensity:.1f}× "
            f"more FLOPs per byte than a 1-token one")
    per_tok = [times[n].median / n for n in lengths]
    falls = all(b_ < a_ for a_, b_ in zip(per_tok, per_tok[1:]))
    cheap = per_tok[-1] / per_tok[0]
    if falls:
        timed = f"fell at every length, to {fmt_x(cheap)} the 1-token figure: per token, a long prompt is cheap"
    elif cheap < 0.5:
        timed = (f"fell overall, to {fmt_x(cheap)} the 1-token figure, though not at every length (a busy "
                 "machine or a kernel change between sizes shows as a bump)")
    else:
        timed = (f"ended at {fmt_x(cheap)} the 1-token figure: in this run the times do not show it (on a busy "
                 "machine, try --threads 1)")
    L.say(f"""
        The weights are read once a pass while the arithmetic grows with every token, so intensity
        climbs with length. The time per prompt token {timed}.

        Past the chip's **ridge** (peak FLOP/s ÷ bandwidth, lesson 6) arithmetic sets the pace: the
        work is **compute-bound**. In fp16 a prefill does about one FLOP per weight byte per token,
        so it gets there at about ridge-many tokens: {CHIPS['a100-80gb'].ridge:.0f} on an A100,
        {CHIPS['h100-sxm'].ridge:.0f} on an H100.
    """)
    head = records[-1].ops["lm_head"]["bytes"] / records[-1].total_bytes
    if head > 0.5:
        L.note(f"the LM head's read of wte is {head:.0%} of the {records[-1].n_tokens}-token prefill's bytes, "
               "for the last position only: no prompt token shares it, so it holds the intensity down.")
    L.takeaway(f"""
        Prefill: the prompt in **one** pass, more FLOPs per byte than decode, and {fmt_kib(per_token)} of KV
        cache per token left behind.
    """)
    small = GPT2_SIZES["124m"]
    small_kv = 2 * small.n_layer * small.n_embd * np.dtype(np.float32).itemsize   # 2·L·d·b, float32
    L.try_it(f"""
        `minillm learn 3 --model random-124m --no-pause`: GPT-2 small's prefill reaches far higher
        intensity (its shared blocks are most of its weights), and its KV cache is
        {fmt_kib(small_kv)} per token.
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
