"""Lesson 11: Speculative decoding. A cheap draft guesses k tokens; one step of the model checks them
all. Why checking k guesses costs about one weight read, what acceptance buys, and when it stops paying.

Run:  python lessons/11_speculative.py        (or: minillm learn 11)
"""

from __future__ import annotations

import numpy as np
from rich import box
from rich.markup import escape
from rich.table import Table

import minillm
from minillm.engine.speculative import speculative_generate
from minillm.lessons._common import Lesson, bar_chart, fmt_bytes, fmt_x, run_lesson, time_interleaved
from minillm import closeness
from minillm.measure.chips import CHIPS
from minillm.meter import Meter
from minillm.measure.speculation import heldout_prompts, run_speculation_bench

TITLE = "Speculative decoding: guess cheaply, check in one read"
MINUTES = 9  # 1,829 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "k+1 tokens for one weight read, acceptance against k, a speedup and where it goes"


def lesson(L: Lesson) -> None:
    model = L.load_model(default="large", fast="default")
    draft = minillm.load(L.pick("small", "random-tiny"), quiet=True)
    prompt = heldout_prompts(1, 32)[0]
    one_read(L, model, prompt)
    same_tokens(L, model, draft, prompt)
    sweep = measure(L, model, draft)
    against_k(L, model, sweep)
    when_it_vanishes(L, model, draft, sweep)
    L.try_it("""
        `minillm generate "ROMEO:" --model large --draft small --speculate-k 4` streams text with a
        draft; the last line says how many guesses were kept. `minillm compare "ROMEO:" --model large
        --draft small` puts speculative decode beside naive and cached, and `minillm bench --speculate
        1,2,3,4,6,8` is this lesson's sweep. In Python: `minillm.generate(model, ids, 50, draft="ngram")`.
    """)


def one_read(L: Lesson, model, prompt) -> None:
    L.say(f"""
        A decode step reads every weight of `{escape(model.name)}` ({fmt_bytes(model.nbytes())}) to make
        one token. A step over **k+1** tokens reads them once too: the tokens are k+1 rows of one
        matrix. So if something cheap could *guess* the next k tokens, one step of the model could check
        all of them at once, and keep every guess it agrees with.

        First the cost of checking. Steps over 1 to 9 new tokens at the same position, from one cache:
    """)
    L.pause()
    _, cache = model.prefill(prompt)
    n0 = cache.length
    sizes = [1, 2, 3, 5, 9]

    def run(n):
        def work():
            cache.truncate(n0)
            cache.reserve(n)                       # the caller reserves KV room; the model only computes
            with minillm.meter.label("verify"):
                model.step([(np.arange(n) + 100, cache)], scores="all")
        return work

    timing = time_interleaved({n: run(n) for n in sizes}, L.pick(7, 3))
    counted = {}
    for n in sizes:
        with Meter() as m:
            run(n)()
        counted[n] = m.steps[0]
    base = timing[1].median
    L.show(bar_chart("time of one step over n new tokens", [
        (f"n = {n}", timing[n].median, f"{1e3 * timing[n].median:.1f} ms  {fmt_x(timing[n].median / base)}")
        for n in sizes]))
    L.console.print(f"[dim]times: median and range of {L.pick(7, 3)} interleaved rounds; {L.conditions()}[/]")
    L.console.print()
    w1, w9 = counted[1].bytes["weights"], counted[9].bytes["weights"]
    L.claim(w9 - w1 == 8 * 2 * model.config.n_embd * model.dtype.itemsize,
            f"the meter counts {fmt_bytes(w1)} of weights for 1 token and {fmt_bytes(w9)} for 9: the same read, "
            "plus the 8 more embedding rows gathered")
    five = timing[5].median / base
    L.say(f"A step over 5 tokens took {fmt_x(five)} the time of a step over one: "
          + ("less than the 5× of five decode steps." if five < 4.5 else
             "on this run, about as much as five decode steps or more (a busy machine, or a small model whose "
             "steps are mostly fixed costs)."))
    hw = L.machine()
    i1, i9 = counted[1].intensity, counted[9].intensity
    L.say(f"""
        The bytes stay put; the time does not stay flat. The FLOPs grow with every token: a step over 9
        does {i9:.2g} FLOP per byte moved against {i1:.2g} for one, on the way to this machine's ridge
        of {hw.ridge:.2g}, and the BLAS kernel for a few rows is less efficient than the one for a
        single row (lesson 8 met that cliff). So checking k guesses costs one weight read but
        {fmt_x(five)} a step's time for k = 4: the exchange rate the guesses must beat.
    """)
    L.pause()


def same_tokens(L: Lesson, model, draft, prompt) -> None:
    L.section("Guess, check, keep the agreed prefix")
    L.say(f"""
        Two drafts. **ngram** (prompt lookup) costs nothing: find the longest recent suffix of the text
        that occurred earlier, and guess what followed it. **{escape(draft.name)}**
        ({fmt_bytes(draft.nbytes())}) is a smaller model with the same tokenizer: k cheap decode steps.

        One round: the draft guesses d1..dk; one step of the model runs [last token, d1..dk] and gives
        its logits at every position; the guesses are kept up to the first one the model disagrees
        with (greedy: its argmax), and the model's own token is kept after them (the correction, or a
        bonus token when all k were right). Both KV caches are rolled back past the rejected guesses
        (`cache.truncate`).
    """)
    n = L.pick(48, 12)
    plain = minillm.generate(model, prompt, n)
    _, shown = speculative_generate(model, prompt, n, draft=draft, k=4)
    L.show(rounds_picture(shown.rounds[:L.pick(8, 4)], f"the first rounds with {escape(draft.name)}, k = 4"),
           "[dim][green]green[/]: a guess the model agreed with, kept; [red]red[/]: rejected (and every guess "
           "after it); [bold cyan]blue[/]: the model's own token, one per round[/]")
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("draft", "k", "guesses", "accepted", "tokens per step", "same tokens"):
        t.add_column(col, justify="right")
    same = True
    for name, d in (("ngram", "ngram"), (draft.name, draft)):
        new, stats = speculative_generate(model, prompt, n, draft=d, k=4)
        same &= new == plain
        t.add_row(escape(name), "4", str(stats.drafted), f"{stats.accepted} ({stats.acceptance_rate:.0%})",
                  f"{stats.tokens_per_round:.2f}", "✓" if new == plain else "✗")
    L.show(t)
    L.claim(same, f"both drafts gave exactly the {n} tokens plain greedy decode gives")
    L.say("""
        That is the guarantee: greedy speculative decoding changes nothing but the number of steps of
        the model. Sampling keeps the distribution instead: a guess with draft probability q is kept
        with probability min(1, p/q), and a rejection draws from what is left of p; the tests check the
        output's distribution against the model's with a chi-square test.
    """)
    L.pause()


def expected_tokens(alpha: float, k: int) -> float:
    """E = (1 − α^(k+1)) / (1 − α): tokens kept per round of k guesses, each accepted with chance α."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def alpha_from(tokens_per_round: float, k: int) -> float:
    """The α whose E(α, k) equals the measured tokens per round (bisection; E rises with α)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < tokens_per_round else (lo, mid)
    return (lo + hi) / 2


def rounds_picture(rounds, title: str):
    """One line per round: its guesses, kept or rejected, then the model's own token."""
    from rich.console import Group
    from rich.text import Text

    from minillm.lessons._common import token_text

    enc = minillm.tokenizer()
    lines = [Text.from_markup(f"[bold]{title}[/]")]
    for i, r in enumerate(rounds, 1):
        line = Text(f"round {i}: ", style="dim")
        for j, g in enumerate(r.guesses):
            line.append(f"[{token_text(enc, g)}]", style="green" if j < r.accepted else "red strike")
            line.append(" ")
        line.append(f"→ {token_text(enc, r.token)}", style="bold cyan")
        line.append(f"   kept {r.kept}", style="dim")
        lines.append(line)
    return Group(*lines)


def measure(L: Lesson, model, draft) -> dict:
    L.section("Acceptance against k")
    ks = L.pick([1, 2, 3, 4, 6, 8], [1, 2, 4])
    prompts = heldout_prompts(L.pick(2, 1), 32)
    with L.status(f"speculative decode for k = {', '.join(map(str, ks))}, two drafts…"):
        sweep = run_speculation_bench(model, {"ngram": "ngram", draft.name: draft}, ks, prompts,
                                      L.pick(40, 12), repeats=L.rounds())
    return sweep


def short_name(name: str, width: int = 20) -> str:
    """A draft's name as a table cell: a checkpoint path by its last part, cut to `width` with '~'."""
    from pathlib import PurePath
    name = PurePath(name).name or name
    return name if len(name) <= width else name[: width - 1] + "~"


def against_k(L: Lesson, model, sweep: dict) -> None:
    p = sweep["plain"]
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("draft", "k", "guesses", "accepted", "kept", "speedup", "bytes/tok"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_row("plain", "-", "-", "-", "1.00", "1.00×", fmt_bytes(p["bytes_per_token"]))
    for r in sweep["rows"]:
        t.add_row(escape(short_name(r["draft"])), str(r["k"]), f"{r['drafted'] / max(1, r['rounds']):.2f}",
                  f"{r['acceptance']:.0%}", f"{r['tokens_per_step']:.2f}",
                  f"{r['speedup']:.2f}×", fmt_bytes(r["bytes_per_token"]))
    L.show(t, "[dim]guesses: guesses made per round (the n-gram draft makes none when nothing matches); "
              "accepted: accepted ÷ guessed; kept: tokens kept per step of the model; speedup: the median over "
              f"the rounds of tokens per second against plain decode's in the same round (plain: "
              f"{p['tok_s']:.1f} tokens/s); bytes/tok: the "
              "draft's and the model's, as metered, per token kept; greedy, real held-out text[/]")
    L.console.print(f"[dim]times: medians of {sweep['repeats']} interleaved rounds; {L.conditions()}[/]")
    L.console.print()
    L.claim(all(r["same_tokens"] for r in sweep["rows"]), "every k, both drafts: the same tokens as plain decode")
    ngram = [r for r in sweep["rows"] if r["draft"] == "ngram" and r["acceptance"] > 0]
    L.claim(all(r["bytes_per_token"] < p["bytes_per_token"] for r in ngram),
            "wherever the n-gram draft had a guess accepted, the bytes moved per token kept fell below plain "
            "decode's: one weight read was shared by several tokens")
    model_rows = [r for r in sweep["rows"] if r["draft"] != "ngram"]
    L.say("""
        Two different shares. **accepted** is accepted guesses ÷ guesses made. The literature's **α** is
        the chance that one guess is accepted given that every guess before it was: guess i is kept with
        probability α^i, so later guesses are *reached* less often even when α stays the same, and the
        accepted share falls with k. A round of k guesses keeps on average (the accepted guesses and the
        model's own token; the *acceptance length*, τ, that papers report)

        ```
        E = (1 − α^(k+1)) ÷ (1 − α)   tokens a round
        speedup ≈ E ÷ (c·k + 1)       a draft step costing c model steps
        ```

        (Leviathan et al.), before the cost of checking k+1 tokens at once, which the first part of this
        lesson measured.
    """)
    if model_rows:
        k1 = next((r for r in model_rows if r["k"] == 1), model_rows[0])
        alpha = alpha_from(k1["tokens_per_step"], k1["k"])
        rows = [(r["k"], r["tokens_per_step"], expected_tokens(alpha, r["k"])) for r in model_rows]
        c = sweep["draft_ms"].get(k1["draft"], 0.0) / sweep["plain"]["ms_step"]
        t2 = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
                   title=f"{escape(k1['draft'])}: α = {alpha:.2f}, fitted at k = {k1['k']}; c = {c:.2f}",
                   title_justify="left")
        for col in ("k", "kept/check", "E formula", "E÷(ck+1)", "measured"):
            t2.add_column(col, justify="right", no_wrap=True)
        for (k, got, want), r in zip(rows, model_rows):
            t2.add_row(str(k), f"{got:.2f}", f"{want:.2f}", f"{want / (c * k + 1):.2f}×", f"{r['speedup']:.2f}×")
        L.show(t2, "[dim]E÷(ck+1): the formula's speedup; c: one draft step's time ÷ one plain step's, measured; the formula counts a check of "
                   "k+1 tokens as one step (the first part of this lesson measured what it costs here)[/]")
        worst = max(abs(got - want) / want for _, got, want in rows)
        acc = [r["acceptance"] for r in model_rows]
        if worst >= 0.15:
            fit = "only loosely here: α itself changes with k on this text."
        elif acc[-1] < acc[0]:
            fit = ("here, while the accepted share fell from {:.0%} to {:.0%}: later guesses are reached less "
                   "often, not right less often.".format(acc[0], acc[-1]))
        else:
            fit = "here."
        L.say(f"The formula with one α follows the measured tokens per check within {worst:.0%} at every k {fit}")
        heads(L, model, alpha)
    L.pause()


def head_cost(model) -> float:
    """A one-layer draft head's cost in model steps (c), by bytes: one block's weights and the LM head it
    shares with the model, over the model's weights (GPT-2's block: 12·d² + 13·d parameters)."""
    c = model.config
    return (12 * c.n_embd ** 2 + 13 * c.n_embd + c.vocab_size * c.n_embd) / model.n_params()


MTP_ACCEPTED = (0.85, 0.90)     # DeepSeek-V3's report: its MTP draft's second token accepted 85-90% of the time


def heads(L: Lesson, model, alpha: float) -> None:
    """X24: the drafts engines run now, one paragraph and a row computed from this run's α."""
    c = head_cost(model)
    rows = [(k, expected_tokens(alpha, k), expected_tokens(alpha, k) / (c * k + 1)) for k in (1, 2, 4)]
    L.say(f"""
        Engines now draft with the model itself. An **EAGLE** head (EAGLE-3 the latest) is one decoder
        layer that reads the model's own last hidden states and reuses its LM head; DeepSeek-V3 ships a
        **multi-token prediction** (MTP) module that does the same for one token ahead (lesson 15), with
        the second token accepted {MTP_ACCEPTED[0] * 100:.0f}-{MTP_ACCEPTED[1]:.0%} of the time by its report:
        an acceptance length τ = 1 + α of {1 + MTP_ACCEPTED[0]:.2f}-{1 + MTP_ACCEPTED[1]:.2f} tokens a check.
        Their guesses are often a small tree, checked in one step with a mask that lets each branch see
        only its own ancestors, and they report τ, not the acceptance rate. On `{escape(model.name)}` a
        one-layer head would cost c ≈ {c:.2f} of a step (one block and the head, by bytes); with this
        run's α = {alpha:.2f}:
    """)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("k", "τ = E", "E ÷ (ck + 1)"):
        t.add_column(col, justify="right", no_wrap=True)
    for k, e, sp in rows:
        t.add_row(str(k), f"{e:.2f}", f"{sp:.2f}×")
    L.show(t, f"[dim]a one-layer head on {escape(model.name)}: c = (12·d² + 13·d + V·d) ÷ params = {c:.2f}; α "
              "fitted above; the check of k+1 tokens counted as one step[/]")


def when_it_vanishes(L: Lesson, model, draft, sweep: dict) -> None:
    L.section("Where the speedup comes from, and when it vanishes")
    best = max(sweep["rows"], key=lambda r: r["speedup"])
    rounds = {f"{short_name(r['draft'])} k = {r['k']}": r["speedup_rounds"] for r in sweep["rows"]}
    rounds["plain"] = [1.0] * sweep["repeats"]
    ranking = closeness.rank(rounds, higher=True)
    by_draft = {}
    for r in sweep["rows"]:
        if r["draft"] not in by_draft or r["speedup"] > by_draft[r["draft"]]["speedup"]:
            by_draft[r["draft"]] = r
    L.show(bar_chart("best speedup over plain decode, per draft", [
        (escape(name), r["speedup"], f"{r['speedup']:.2f}× at k = {r['k']}") for name, r in by_draft.items()],
        vmax=max(1.0, best["speedup"])))
    plain_ms, draft_ms = sweep["plain"]["ms_step"], sweep["draft_ms"].get(draft.name)
    a100 = CHIPS["a100-80gb"]
    cost = (f"one of its decode steps took {draft_ms:.2g} ms here, {draft_ms / plain_ms:.0%} of one of the "
            f"model's ({plain_ms:.2g} ms), so k guesses cost {draft_ms / plain_ms:.2g}·k steps of the model"
            if draft_ms else "its k steps are not free")
    # The fastest is named only where the rule ranks it: a median alone, rounds apart, is no verdict.
    fastest = (f"At the median the fastest was draft {escape(best['draft'])} at k = {best['k']}: "
               f"{best['speedup']:.2f}× plain decode of `{escape(model.name)}` ({min(best['speedup_rounds']):.2f}-"
               f"{max(best['speedup_rounds']):.2f}× over the rounds), with {best['tokens_per_step']:.2f} tokens kept "
               "per check. " if ranking.winner not in (None, "plain") else "")
    L.say(f"""
        If a guesses of a round are accepted, the round keeps a+1 tokens for one check of the model plus
        k draft steps. The speedup is (tokens kept per round) × (time of a plain step) ÷ (time of a
        round). It vanishes when:

        - **the draft is too slow**: {escape(draft.name)} has {draft.nbytes() / model.nbytes():.0%} of the
          model's weight bytes, and {cost}; a draft should cost a tenth of a step or less;
        - **the draft is too often wrong**: with acceptance near 0 every round keeps one token and pays
          for a check of k+1; the n-gram draft is right only where the text repeats itself;
        - **the model is not memory-bound enough**: a check of k+1 tokens costs about one step only while
          the step is bound by its weight read. A small model's step is partly fixed per-operation cost.
          A wide LM head at a few rows nears the ridge. A step already carrying a batch near the ridge
          (lesson 8) pays for every extra token in FLOPs, so speculation buys less as the batch grows.
          Real LLMs on GPUs are far more memory-bound than this: a check of 5 tokens of a 7B model in
          fp16 does 2·5 FLOPs per 2-byte weight, {2 * 5 / 2:.0f} FLOP/byte, against an A100's ridge of
          {a100.ridge:.0f}.

        {fastest}{escape(closeness.best_words(ranking, 'Ranked by the closeness rule', lambda v: f'{v:.2f}×'))} The
        shares depend on the text: `minillm bench --speculate` runs other prompts and lengths, so the same
        draft and k can show another acceptance there.
    """)
    L.takeaway("""
        Decode is memory-bound, so a step over k+1 tokens reads the weights once and costs far less than
        k+1 steps. Speculative decoding turns that slack into tokens when a guess is cheap and often
        right; how much it buys is the tokens kept per check against what a check and the guesses
        cost. With the acceptance rule it changes nothing about what the model says.
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
