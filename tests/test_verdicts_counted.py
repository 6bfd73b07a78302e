"""Issue 53: every sentence of lessons 5, 8, 10, 11, 12, 14, 16, 17, 18 and 19 that ranks or compares is
one the under-load harness counts (`benchmarks/lessons_under_load.py`: RANKINGS), and the verdicts that
sat at the rule's edge are drawn from counts (priced on the roofline), not from times."""

from __future__ import annotations

import importlib
import importlib.util
import textwrap
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import closeness
from minillm.lessons import _common
from minillm.lessons._common import Timing
from minillm.measure.chips import Hardware

UNDER_LOAD = Path(__file__).resolve().parents[1] / "benchmarks" / "lessons_under_load.py"


def _lesson(n: str):
    return importlib.import_module(f"minillm.lessons.{n}")


def _printed(sentence: str) -> str:
    """As a lesson prints it: wrapped at 80 columns, between two other paragraphs."""
    return "Before it.\n\n" + textwrap.fill(sentence, 80) + "\n\nAfter it, a sentence that ranks nothing.\n"


def _sentences() -> list[tuple[str, str, str | list | None]]:
    """(lesson, sentence, the verdict the harness must find) for every wording that ranks or compares
    in the ten lessons, each outcome it can take, built by the lessons' own functions."""
    m8, m10, m12, m14 = _lesson("08_batching"), _lesson("10_prefix_caching"), _lesson("12_gqa"), \
        _lesson("14_quantization")
    m17, m18 = _lesson("17_gpu"), _lesson("18_latent_attention")
    fast, slow, tied = Timing((1.0,) * 6), Timing((2.0,) * 6), Timing((1.0, 2.0) * 3)
    out = []
    for a, b, verdict in ((fast, slow, "faster"), (slow, fast, "slower"), (tied, fast, None)):   # 5, 8, 14, 18, 19
        out.append(("5", _common.faster_words(a, b, "the cache", "naive decode") + ".", verdict))
    for pa, pb, verdict in ((1.0, 2.0, "faster"), (2.0, 1.0, "slower"), (1.0, 1.01, None)):   # 16, 18, 19
        out.append(("16", "The whole prefill of 1,024 tokens: " + _common.priced_words(
            pa, pb, "the fused one", "NumPy's", fast, slow), verdict))
        out.append(("19", _common.priced_words(pa, pb, "At 16,384 tokens the hybrid's step",
                                               "the all-attention one's", fast, slow), verdict))
    hw = Hardware("test", 20.0, 200.0)
    mla = {"ms_rounds": [50.0] * 6, "kv_read": 5e6, "bytes": 275e6, "flops": 1e6}
    for twin_bytes, verdict in ((250e6, "faster"), (400e6, "slower"), (270e6, None)):
        out.append(("18", m18.twin_words({"ms_rounds": [60.0] * 6, "bytes": twin_bytes, "flops": 1e6}, mla,
                                          8192, 1.78, 15.1, hw), verdict))
    ranked = closeness.rank({"B = 1": [10.0] * 6, "B = 32": [60.0] * 6})
    close = closeness.rank({"ngram k = 1": [1.2, 1.0] * 3, "plain": [1.0] * 6})
    priced = closeness.rank_priced({"continuous": 3.0, "static": 1.0})
    for r, verdict in ((ranked, "B = 32"), (close, None), (priced, "continuous")):          # 8, 11 (and 9)
        out.append(("8/11", closeness.best_words(r, "By the closeness rule, tokens/s", lambda v: f"{v:.2f}"), verdict))
    for ratio, verdict in ((1.1, "hardly grew"), (4.7, "grew #×, less than"), (30.0, "grew about in proportion"),
                           (90.0, "grew more than")):                                           # 8
        out.append(("8", f"From B = 1 to B = 32 the time per step {_common.growth_words(ratio, 32)}.", verdict))
    for ratio, verdict in ((2.0, "less than"), (10.4, "more than"), (6.0, "about as much as")):  # 10
        out.append(("10", f"Priced: the median {_common.fall_words(ratio, 6.08, 'time to first token')} "
                          "(prefill FLOPs).", verdict))
    bare = {1: (20.0, 20.0), 2: (52.0, 36.0), 4: (50.0, 52.0), 8: (51.6, 51.6)}
    rows = [{"batch": b, "bare_plain_ms": p, "bare_engine_ms": e, "bare_plain_rounds_ms": [p] * 6,
             "bare_engine_rounds_ms": [e] * 6} for b, (p, e) in bare.items()]
    out.append(("8", m8.cliff_words(rows), "the cliff"))
    sweep = [{"batch": b, "tok_s": t, "tok_s_rounds": [t * (1 + 0.01 * i) for i in range(6)]}
             for b, t in ((1, 40.0), (16, 330.0), (32, 320.0))]                 # a plateau: 16 above 32
    out.append(("8", m8.sweep_words(sweep), "B = 32"))                           # the largest against B = 1
    out.append(("8", m8.cliff_words([{**r, "bare_plain_ms": 20.0} for r in rows]), None))
    for shares, verdict in (((0.88, 0.12), "prefill"), ((0.5, 0.52), None)):                   # 10
        said = m10.diagnosis_words((*shares, "compute", "memory"), (0.03, 0.97, "compute", "memory"))
        out.append(("10", said, [verdict, "decode"]))           # one verdict per workload
    out.append(("12", m12.prefill_words([263.0, 269.0], [24.7, 25.5]), "faster per token in every answer"))
    out.append(("12", m12.prefill_words([20.0, 269.0], [24.7, 25.5]), None))
    for d4, d8, verdict in ((0.0175, 0.0, "more than Q#_#"), (0.0, 0.001, "no more than Q#_#"),
                            (0.02, 0.005, "#× Q#_#'s change")):
        out.append(("14", m14.loss_words(d4, d8), verdict))
    for cap, verdict in ((99.0, "below"), (451.0, "above")):                                    # 17
        out.append(("17", f"Its FLOPs per byte can only tend to one row's FLOPs ÷ its own KV bytes, {cap:.0f}: "
                          + m17.cap_words(cap), verdict))
    return out


def test_every_ranking_sentence_of_the_lessons_is_one_the_harness_counts(under_load):
    """Each sentence, wrapped as printed, gives exactly one (subject, verdict) per thing it ranks, with the
    verdict it says (None: no winner). A sentence the harness missed would be a verdict no repeated run could count."""
    m = under_load
    for lesson, sentence, verdict in _sentences():
        found = m.rankings(_printed(sentence))
        want = verdict if isinstance(verdict, list) else [verdict]
        assert [v for _, v in found] == want, (lesson, sentence, found)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.01, 100.0), st.floats(0.01, 100.0), st.lists(st.floats(0.1, 10.0), min_size=6, max_size=12),
       st.lists(st.floats(0.1, 10.0), min_size=6, max_size=12))
def test_a_priced_verdict_is_the_prices_alone_whatever_the_rounds(under_load, pa, pb, ra, rb):
    """priced_words: the verdict follows the two prices by the minimum effect, and no round moves it;
    the measured ratio stands beside it with no verdict word."""
    m = under_load
    n = min(len(ra), len(rb))
    said = _common.priced_words(pa, pb, "the fused one", "NumPy's", Timing(tuple(ra[:n])), Timing(tuple(rb[:n])))
    same = _common.priced_words(pa, pb, "the fused one", "NumPy's", Timing(tuple(rb[:n])), Timing(tuple(ra[:n])))
    assert said.split(" Measured:")[0] == same.split(" Measured:")[0]
    side = closeness.figures_apart(pa, pb)
    want = None if side == 0 else "faster" if side < 0 else "slower"
    assert m.rankings(_printed(said)) == [("the fused one / NumPy's", want)]
    measured = said.split(" Measured:")[1]
    assert not any(w in measured for w in ("faster", "slower", "winner", "best"))


def test_lesson_16_prices_the_fused_prefill_whatever_the_rounds_say(capsys, monkeypatch):
    """The fused prefill against NumPy's sat at the rule's edge (6 of 9 rounds, p = 0.51): the verdict
    is now the two prefills' prices. Rounds made to say the fused one took 3× the time move nothing
    but the measured ratio."""
    monkeypatch.setenv("COLUMNS", "80")
    m16 = _lesson("16_flash_attention")
    real = m16.time_interleaved
    outs = []
    for slow in (1.0, 3.0):
        def skewed(work, rounds, warmup=True, settle=True, slow=slow):
            t = real(work, rounds, warmup, settle)
            return {**t, "fused": Timing(tuple(slow * x for x in t["numpy"].seconds))}
        monkeypatch.setattr(m16, "time_interleaved", skewed)
        assert m16.main(["--fast", "--no-pause"]) == 0
        out = " ".join(capsys.readouterr().out.replace("│", " ").split())
        outs.append(out[out.index("The whole prefill of"):][:400])
    assert "the fused one costs" in outs[0] and "on the roofline: faster" in outs[0], outs[0]
    assert "Measured: 3× (3×–3× over" in outs[1], outs[1]
    assert outs[0].split(" Measured:")[0] == outs[1].split(" Measured:")[0]


def test_lesson_10_serves_its_prefix_cache_comparison_on_the_roofline_clock(monkeypatch):
    """The TTFT fall against the work's ("less than" on quiet runs, "more than" beside two burners) is
    drawn from runs on the roofline clock: every serve of that comparison is priced, and the sentence
    says "Priced"."""
    m10 = _lesson("10_prefix_caching")
    seen = []
    real = m10.serve

    def spy(*a, **kw):
        seen.append(kw.get("step_time"))
        return real(*a, **kw)
    monkeypatch.setattr(m10, "serve", spy)
    said = []
    L = types.SimpleNamespace(say=said.append, pause=lambda: None, show=lambda *a: None, claim=lambda ok, t: None,
                              status=lambda msg: __import__("contextlib").nullcontext(), fast=True,
                              pick=lambda full, fast: fast, _asked_threads=None,
                              console=types.SimpleNamespace(is_terminal=False))
    model = __import__("minillm").load("random-tiny", quiet=True)
    c = model.config
    items = m10.generate_workload("shared-prefix", rate=20.0, n=6, seed=0, vocab_size=c.vocab_size, n_ctx=c.n_ctx)
    shared = len(items[0].prompt) - next(i for i, (a, b) in enumerate(zip(items[0].prompt, items[1].prompt))
                                         if a != b)
    m10.with_and_without(L, model, items, len(items[0].prompt) - shared, Hardware("test", 20.0, 200.0))
    assert len(seen) == 2 and all(isinstance(f, __import__("minillm").serving.metrics.RooflineClock) for f in seen)
    assert any("Priced: the median time to first token fell" in " ".join(s.split()) for s in said), said


def test_lesson_8_states_ops_matmul_against_the_plain_product_with_no_verdict(under_load):
    """Medians alone named B = 8 one run and not the next (51.6 ms both); then the sign test said "faster
    at B = 2" idle on 2 threads and "not ranked" beside two burners on 1, where BLAS has no cliff to
    avoid (issue 53). The ratio and its range are stated per batch, with no verdict word."""
    m8 = _lesson("08_batching")
    rows = [{"batch": 1, "bare_plain_rounds_ms": [20.0] * 6, "bare_engine_rounds_ms": [20.0] * 6},
            {"batch": 2, "bare_plain_rounds_ms": [52.0] * 6, "bare_engine_rounds_ms": [36.0] * 6},
            {"batch": 8, "bare_plain_rounds_ms": [51.0, 52.0] * 3, "bare_engine_rounds_ms": [50.9, 53.0] * 3},
            {"batch": 4, "bare_plain_rounds_ms": [40.0] * 6, "bare_engine_rounds_ms": [50.0] * 6}]
    said = m8.matmul_words(rows)
    assert "0.692× (0.692×–0.692×) at B = 2" in said and "1.25× (1.25×–1.25×) at B = 4" in said, said
    assert "over 6 paired rounds (a figure, not a verdict" in said
    assert not any(w in said for w in ("faster", "slower", "not ranked")), said
    assert under_load.rankings(said) == []


@pytest.mark.parametrize("winner", [False, True])
def test_lesson_11_names_a_fastest_draft_only_where_the_rule_ranks_it(winner):
    """"At the median the fastest was ngram k = 1" (quiet) and "k = 6" (busy) beside "no winner": a
    median alone is no verdict, so the fastest is named only with a winner."""
    m11 = _lesson("11_speculative")
    top = [1.5] * 6 if winner else [1.24, 1.0] * 3
    rows = [{"draft": "ngram", "k": 1, "speedup": 1.24 if not winner else 1.5, "speedup_rounds": top,
             "tokens_per_step": 1.44},
            {"draft": "ngram", "k": 6, "speedup": 1.15, "speedup_rounds": [1.0, 1.2] * 3, "tokens_per_step": 2.0}]
    sweep = {"rows": rows, "repeats": 6, "plain": {"ms_step": 10.0}, "draft_ms": {}}
    said = []
    L = types.SimpleNamespace(section=lambda t: None, show=lambda *a: None, say=said.append,
                              takeaway=lambda t: None)
    model = types.SimpleNamespace(name="m", nbytes=lambda: 100)
    draft = types.SimpleNamespace(name="d", nbytes=lambda: 10)
    m11.when_it_vanishes(L, model, draft, sweep)
    text = " ".join(" ".join(said).split())
    assert ("the fastest was draft ngram at k = 1" in text) == winner, text
    assert ("Ranked by the closeness rule: ngram k = 1 best" in text) == winner


def test_lesson_14_states_numpys_q8_0_time_against_float32_with_no_verdict(under_load):
    """NumPy's Q8_0 decode step against float32's read "slower" idle and "no winner" beside two burners
    on one thread (issue 53): both of lesson 14's timings are stated (`timed_words`), none ranked."""
    import inspect
    m14 = _lesson("14_quantization")
    src = inspect.getsource(m14)
    assert "faster_words(" not in src and src.count("timed_words(") == 2
    said = _common.timed_words(Timing((2.2, 2.1) * 3), Timing((1.0, 1.0) * 3), "a Q8_0 decode step", "a float32 one")
    assert said == "a Q8_0 decode step took 2.15× the time of a float32 one (2.1×–2.2× in 6 paired rounds)"
    assert under_load.rankings(_printed("Measured: " + said + ".")) == []
    widen = m14.widen_words(0.0303, 0.0275)                 # at the former bands' edge: "about what", "more than"
    assert widen == "Widening its integers to floats, alone, took 30.3 ms, 1.1× the time of the read it saves"
    assert under_load.rankings(_printed(widen + ".")) == []


def test_bench_states_one_kernel_set_against_another_with_no_verdict(under_load):
    """`bench --batch 1,8 --kernels numpy,fused` said "no winner" for fused against NumPy at B = 1 idle on
    2 threads and "slower" (0.82×, 6 of 6 rounds) beside two burners on 1 (issue 53): the same counted work
    on both sides, so the ratio is the kernels' at a thread count the load decides. It is stated per B,
    with the range of the paired rounds, and no verdict word."""
    from minillm.cli.bench_modes import sets_words
    base = {1: {"tok_s": 40.0, "tok_s_rounds": [40.0, 42.0, 38.0]}, 8: {"tok_s": 120.0, "tok_s_rounds": [120.0] * 3}}
    rows = {1: {"tok_s": 34.0, "tok_s_rounds": [34.0, 33.6, 34.2]}, 8: {"tok_s": 200.0, "tok_s_rounds": [204.0] * 3}}
    said = " ".join(sets_words("random-124m", "fused", "numpy", rows, base).split())
    assert "B = 1 0.85× (0.80×–0.90×), B = 8 1.67× (1.70×–1.70×)" in said, said
    assert "the range over 3 paired rounds" in said and "Figures, not ranked" in said
    assert not any(w in said for w in ("faster", "slower", "no winner")), said
    assert under_load.rankings(_printed(said)) == []


def test_bench_batch_adds_rounds_until_each_b_against_b1_is_settled(monkeypatch):
    """`bench --batch 1,2,4,8,16,32` read B = 2 against B = 1 "no winner" in one busy run (1.36×, 5 of 6
    rounds) and "faster" in the others (issue 53): 6 fixed rounds. It now adds rounds, up to closeness.CAP,
    until the rule ranks each B against B = 1 or can no longer. Here B = 2 is 1.2× B = 1 in rounds 0-4
    and 0.8× after: 5 of 6 at 6 rounds (p = 0.22) could still reach 10 of 12; 5 of 8 no longer can."""
    import minillm
    from minillm.measure import batching
    seconds = {1: lambda i: 1.0, 2: lambda i: 2 / 1.2 if i < 5 else 2 / 0.8}
    calls = {1: 0, 2: 0}

    def fake_steps(model, seqs, steps):
        B = len(seqs)
        i, calls[B] = calls[B], calls[B] + 1
        return seconds[B](i)
    monkeypatch.setattr(batching, "decode_steps", fake_steps)
    model, hw = minillm.load("random-tiny", quiet=True), Hardware("test", 26.2, 199.0)
    more, ticks = [], []
    result = batching.run_batch_bench(model, [1, 2], hw, context=8, repeats=6, steps=2,
                                      progress=lambda: ticks.append(1))
    assert result["repeats"] == 8 and result["repeats_asked"] == 6, result["repeats"]
    assert [len(r["tok_s_rounds"]) for r in result["rows"]] == [8, 8] and len(ticks) == 8
    calls.update({1: 0, 2: 0})
    result = batching.run_batch_benches({model.name: model}, [1, 2], hw, context=8, repeats=6, steps=2,
                                        more=lambda: more.append(1))[model.name]
    assert result["repeats"] == 8 and len(more) == 2
    seconds[2] = lambda i: 2 / 1.2 if i % 2 else 2 / 0.8            # never ranks: stops once it cannot
    for asked, taken in ((6, 6), (2, 2), (12, 12)):                   # 3 of 6 each way: settled at 6
        calls.update({1: 0, 2: 0})
        result = batching.run_batch_bench(model, [1, 2], hw, context=8, repeats=asked, steps=2)
        assert result["repeats"] == taken, (asked, result["repeats"])
    seconds[2] = lambda i: 2 / 1.2 if i % 6 else 2 / 0.8            # 5 of 6 every 6: ranks at 12, not before
    calls.update({1: 0, 2: 0})
    assert batching.run_batch_bench(model, [1, 2], hw, context=8, repeats=6, steps=2)["repeats"] == 12


def test_bench_batch_titles_say_the_rounds_taken():
    from minillm.cli.bench_modes import rounds_words
    assert rounds_words({"repeats": 6, "repeats_asked": 6}) == "6 rounds"
    said = rounds_words({"repeats": 9, "repeats_asked": 6})
    assert said.startswith("9 rounds: 6 asked, 3 more until each B against B = 1 was ranked") and "12" in said
