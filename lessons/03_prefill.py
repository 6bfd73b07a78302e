"""Lesson 3: Prefill. The whole prompt goes through the model in one pass and leaves a KV cache behind.

Run:  python lessons/03_prefill.py        (or: minillm learn 3)
"""

from __future__ import annotations

try:
    from minillm.lessons._common import Lesson, Timing, time_interleaved, bar_chart, fmt_bytes, fmt_flops, fmt_time, plural, run_lesson
except ModuleNotFoundError as e:  # run from a checkout in which minillm is not installed
    raise SystemExit(f"{e}: install minillm first (pip install -e . in the checkout), then run this again")

import numpy as np
from rich.markup import escape
from rich.table import Table

import minillm
from minillm.config import PRESETS

TITLE = "Prefill: the whole prompt in one pass"
MINUTES = 6
WHAT_YOU_WILL_SEE = "a prompt's FLOPs and bytes, the KV cache it leaves, intensity rising with length"

PROMPT = ("JULIET: O Romeo, Romeo! wherefore art thou Romeo? Deny thy father and refuse thy name; "
          "Or, if thou wilt not, be but sworn my love, And I'll no longer be a Capulet.")


def step_table(records: list[tuple[str, minillm.meter.StepRecord]]) -> Table:
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
        ("FLOPs per token", lambda r: fmt_flops(r.total_flops / r.n_tokens)),
        ("weight bytes per token", lambda r: fmt_bytes(r.bytes["weights"] / r.n_tokens)),
        ("wall time (one run)", lambda r: fmt_time(r.seconds)),
        ("time per token (one run)", lambda r: fmt_time(r.seconds / r.n_tokens)),
    ]
    for label, fn in rows:
        t.add_row(label, *(fn(r) for _, r in records))
    return t


def first_steps(L: Lesson):
    """Section: the opening."""
    model = L.load_model()
    c = model.config
    enc = minillm.tokenizer()
    ids = enc.encode(PROMPT)[: c.n_ctx - 1]
    L.say(f"""
        Generating text has two phases. **Prefill** runs the whole prompt through the model at once:
        all {len(ids)} tokens of our prompt go through every block together, as one [T, d] matrix.
        That is the same pass as lesson 2, with one addition: each block stores the **keys and
        values** it computed for every position in a **KV cache**, so that later tokens can attend to
        the prompt without recomputing it.

        ```python
        with minillm.Meter() as m:
            logits, cache = model.prefill(ids)   # logits of the last position, and the filled cache
        record = m.steps[0]                      # what the pass read, wrote and computed
        ```
    """)
    model.prefill(ids[:4])  # warm-up: first touches of the weights and of a cache
    with minillm.Meter() as m:
        logits, cache = model.prefill(ids)
    pre = m.steps[0]
    prompt_kv = cache.nbytes_used()
    first = int(np.argmax(logits))
    with minillm.Meter() as m1:
        model.decode_step(first, cache)
    dec = m1.steps[0]
    L.show(f"[bold]{escape(model.name)}: prefill of the prompt, and then one decode step for comparison[/]",
           step_table([(f"prefill ({pre.n_tokens} tokens)", pre), ("one decode step", dec)]))
    L.say(f"""
        The prefill read the weights **once** ({fmt_bytes(pre.bytes['weights'])}) and used them for all
        {pre.n_tokens} tokens: {fmt_flops(pre.total_flops / pre.n_tokens)} of arithmetic per token for
        only {fmt_bytes(pre.bytes['weights'] / pre.n_tokens)} of weights per token. The decode step
        read about as many weight bytes ({fmt_bytes(dec.bytes['weights'])}) for a **single** token.
        The ratio of the two, FLOPs per byte moved, is the **arithmetic intensity**: it says whether a
        piece of work waits on arithmetic (high) or on memory (low).
    """)
    L.claim(pre.kind == "prefill" and pre.n_tokens == len(ids), f"one prefill step processed all {len(ids)} prompt tokens")
    L.claim(pre.intensity > dec.intensity,
            f"prefill's arithmetic intensity ({pre.intensity:.3g} FLOP/byte) is above a decode step's ({dec.intensity:.3g})")
    return c, cache, enc, ids, model, pre, prompt_kv


def the_kv_cache_it_leaves(L: Lesson, c, cache, ids, model, pre, prompt_kv):
    """Section: The KV cache it leaves behind."""
    L.section("The KV cache it leaves behind")
    per_token = cache.bytes_per_token()
    b = np.dtype(model.dtype).itemsize
    L.say(f"""
        For every position, every layer keeps one key and one value vector of width d: that is
        **2 · L · d · b** bytes per token = 2 · {c.n_layer} · {c.n_embd} · {b} = **{per_token:,} bytes**
        ({per_token / 1024:g} KiB) for `{escape(model.name)}` in {np.dtype(model.dtype).name}.
    """)
    t = Table(header_style="bold")
    t.add_column("")
    t.add_column("tokens", justify="right")
    t.add_column("KV cache", justify="right")
    t.add_row("per token: cache.bytes_per_token()", "1", fmt_bytes(per_token))
    t.add_row("the prompt: cache.nbytes_used() after prefill", f"{len(ids)}", fmt_bytes(prompt_kv))
    t.add_row("a full context", f"{c.n_ctx:,}", fmt_bytes(per_token * c.n_ctx))
    t.add_row("allocated up front: cache.k + cache.v", f"{cache.n_ctx:,}", fmt_bytes(cache.k.nbytes + cache.v.nbytes))
    small = minillm.KVCache(PRESETS["124m"])
    t.add_row("GPT-2 small, full context (1,024)", "1,024", fmt_bytes(small.bytes_per_token() * 1024))
    L.show(t)
    L.claim(per_token == 2 * c.n_layer * c.n_embd * b, f"bytes per token = 2·L·d·b = {per_token:,}")
    L.claim(pre.bytes["kv_write"] == len(ids) * per_token,
            f"the meter saw the prefill write exactly {len(ids)} tokens' worth of keys and values "
            f"({fmt_bytes(pre.bytes['kv_write'])})")
    L.claim(prompt_kv == pre.bytes["kv_write"] and cache.nbytes_used() == prompt_kv + per_token,
            "the cache holds the prompt after prefill, and one more token after the decode step")
    L.say("""
        minillm allocates the cache for the whole context once, up front, so a decode step never
        copies it; the pages are only touched as positions fill. Real servers cannot afford that for
        thousands of concurrent requests: managing this memory is lesson 7's *KV-cache management*.
    """)
    return per_token


def longer_prompts_higher_intensity(L: Lesson, c, enc, model, per_token):
    """Section: Longer prompts, higher intensity."""
    L.section("Longer prompts, higher intensity")
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
                     [(plural(r.n_tokens, "token"), r.intensity, f"{r.intensity:.3g} FLOP/B") for r in records],
                     style="magenta"))
    L.show(bar_chart("Wall time per prompt token (measured: median, ± half the range of the rounds):",
                     [(plural(n, "token"), times[n].median / n, Timing(tuple(t / n for t in times[n].seconds)).short())
                      for n in lengths], style="cyan"))
    L.timing_note()
    L.claim(records[-1].intensity > 2 * records[0].intensity,
            f"a {records[-1].n_tokens}-token prefill does {records[-1].intensity / records[0].intensity:.1f}× "
            f"more FLOPs per byte than a 1-token one")
    L.say("""
        The weights are read once per pass whatever the number of tokens, while the arithmetic grows
        with every token: intensity climbs with prompt length until the activations (which also
        grow with T) take over. Per token, a long prompt is cheap. With a real-size model and a long
        prompt the intensity gets high enough that the chip's arithmetic, not its memory, sets the
        pace: this is why the article calls prefill **compute-bound** (lesson 7 checks it against this
        machine's roofline). On a GPU the whole prompt is one big matrix multiply that keeps every
        core busy.
    """)
    head = records[-1].ops["lm_head"]["bytes"] / records[-1].total_bytes
    if head > 0.5:
        L.note(f"in this model the LM head's read of wte is {head:.0%} of the {records[-1].n_tokens}-token prefill's "
               "bytes. Prefill needs logits for the last position only, so that read is not shared by the prompt's "
               "tokens, and it holds the intensity down. GPT-2 small (--model random-124m) spends most of its "
               "bytes in the blocks, which every token shares.")
    L.takeaway(f"""
        Prefill: all prompt tokens in **one** pass, high FLOPs per byte, and a KV cache of
        {fmt_bytes(per_token)} per token left behind. Next: generating the answer, one token at a
        time, first without the cache (lesson 4), then with it (lesson 5).
    """)
    small = PRESETS["124m"]
    small_kv = 2 * small.n_layer * small.n_embd * np.dtype(np.float32).itemsize   # 2·L·d·b, float32
    L.try_it(f"""
        `minillm learn 3 --model random-124m --no-pause`: GPT-2 small's prefill
        reaches far higher intensity (d = {small.n_embd}: each weight byte feeds more arithmetic), and its KV
        cache is {small_kv // 1024} KiB per token. Lesson 7 puts these numbers on this machine's roofline.
    """)


def lesson(L: Lesson) -> None:
    c, cache, enc, ids, model, pre, prompt_kv = first_steps(L)
    L.pause()
    per_token = the_kv_cache_it_leaves(L, c, cache, ids, model, pre, prompt_kv)
    L.pause()
    longer_prompts_higher_intensity(L, c, enc, model, per_token)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv, number=3, title=TITLE, minutes=MINUTES, what=WHAT_YOU_WILL_SEE,
                      prog="python lessons/03_prefill.py")


if __name__ == "__main__":
    raise SystemExit(main())
