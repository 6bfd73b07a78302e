"""The traps a learner hit in the course (issue 32), each tested at its source: words kept whole in
`chat`, the model's first newline kept in a sample, every workload in `loadgen --help`, `monitor` rating
a server at the server's thread count, a copy command never broken inside a box; and the helpers that
keep a busy machine from ranking upside down or a fit that explains nothing from being used."""

from __future__ import annotations

import io
import sys

import pytest

import minillm
from minillm.lessons import _common
from minillm.measure import comparisons


def _streamed(text: str, width: int | None) -> str:
    from minillm.cli.common import TextStream

    enc = minillm.tokenizer()
    out, old = io.StringIO(), sys.stdout
    sys.stdout = out
    try:
        stream = TextStream(None, width=width)
        for t in enc.encode(text):
            stream(t)
        stream.close()
    finally:
        sys.stdout = old
    return out.getvalue()


TEXT = ("ROMEO: What occurs to thee, fair Juliet, when the morning breaks upon the orchard wall?\n"
        "JULIET: Nothing occurs that I would tell thee now, my lord.")


@pytest.mark.parametrize("width", [12, 20, 37, 80])
def test_chat_keeps_words_whole_at_the_terminals_width(width):
    shown = _streamed(TEXT, width)
    lines = shown.split("\n")
    assert all(len(line) <= width for line in lines), lines
    assert shown.split() == TEXT.split()                 # every word printed whole, none cut in two
    assert _streamed(TEXT, None) == TEXT                 # not a terminal: the text as it comes


def test_a_sample_keeps_the_models_first_newline(capsys):
    from rich.console import Console

    console = Console(file=io.StringIO(), width=80)
    L = _common.Lesson(1, "t", console=console)
    L.sample_panel("ROMEO:", "\nNow, sir, what news?\n\n", "sample")
    text = console.file.getvalue()
    assert "ROMEO:Now" not in text and "ROMEO:" in text and "Now, sir" in text


def test_loadgen_help_lists_every_workload(capsys):
    from minillm import cli
    from minillm.serving.workloads import WORKLOADS

    with pytest.raises(SystemExit):
        cli.main(["loadgen", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "mixed" in WORKLOADS
    for name in WORKLOADS:
        assert name in help_text, name


def test_monitor_reads_the_servers_thread_count():
    from minillm.cli.monitor import server_threads
    from minillm.serving.prom import Registry, parse

    r = Registry()
    assert server_threads(parse(r.render())) is None            # not set: unknown
    r.set("blas_threads", 1)
    assert server_threads(parse(r.render())) == 1


def test_a_copy_command_is_printed_whole_outside_the_box():
    from rich.console import Console

    console = Console(file=io.StringIO(), width=40)
    L = _common.Lesson(2, "t", console=console)
    long = "/a/very/long/site-packages/path/that/will/not/fit/in/forty/columns/minillm/lessons/02_forward.py"
    L.try_it(f"Run your copy: {L.copy_hint(long, 'forward')}")
    text = console.file.getvalue()
    assert f"$ cp {long} my_02_forward.py" in text


def test_blas_threads_are_counted_in_words(monkeypatch):
    monkeypatch.setattr(_common, "blas_threads", lambda: 1)
    assert "1 BLAS thread," in _common.Lesson(1, "t").conditions() + ","
    monkeypatch.setattr(_common, "blas_threads", lambda: 2)
    assert "2 BLAS threads" in _common.Lesson(1, "t").conditions()


def test_no_lesson_puts_a_bare_count_before_threads():
    """A count filled in before "threads" ("at {n} BLAS threads") reads "1 BLAS threads" on one thread:
    every lesson counts them with `plural` (lesson 6's ridge sentence did not, in the full runs)."""
    import re
    from pathlib import Path
    bare = re.compile(r"\{[^{}]*\}\s*(BLAS )?threads\b")
    found = [f"{p.name}:{text[:m.start()].count(chr(10)) + 1}" for p in sorted(Path(_common.__file__).parent.glob("*.py"))
             for text in [p.read_text(encoding="utf-8")] for m in bare.finditer(text)]
    assert not found, f"counts before 'threads' without plural(): {found}"


# -- comparisons on a busy machine; fits that explain nothing ----------------------------------------

def test_a_busy_machine_runs_every_side_on_one_thread(monkeypatch):
    monkeypatch.setattr(comparisons, "busy_note", lambda threads: "busy machine (load 9 on 2 CPUs)")
    threads, why = comparisons.comparison_threads(2)
    assert threads == 1 and "every side of this comparison runs on 1 BLAS thread" in why
    monkeypatch.setattr(comparisons, "busy_note", lambda threads: None)
    assert comparisons.comparison_threads(2) == (2, None)
    assert comparisons.comparison_threads(None, default=2) == (2, None)


@pytest.mark.parametrize("fit, problem", [
    (None, "too few steps"),
    ({"r2": 0.01, "fixed_s": 0.05, "per_token_s": 1e-3}, "r² 0.01"),          # lesson 13's run: r² 0.01
    ({"r2": 0.9, "fixed_s": -3.07e-3, "per_token_s": 1e-3}, "below zero"),    # serve-sim's -3.07e+03 µs
    ({"r2": 0.9, "fixed_s": 0.05, "per_token_s": -1e-4}, "not above zero"),
    ({"r2": 0.77, "fixed_s": 0.0461, "per_token_s": 1.3e-3}, None),          # the README's quiet run
])
def test_a_fit_that_explains_nothing_is_named(fit, problem):
    said = comparisons.fit_problem(fit)
    assert (said is None) if problem is None else (problem in said)


def test_a_priced_fit_blames_no_noise():
    """A fit of priced steps (the roofline clock: no noise in them) names the cost's shape, not the
    machine's load; a timed fit may name the load."""
    fit = {"r2": 0.01, "fixed_s": 0.05, "per_token_s": 1e-3}
    priced, timed = comparisons.fit_problem(fit, priced=True), comparisons.fit_problem(fit)
    assert "noise" in timed and "busy" in timed
    assert "busy" not in priced and "no noise" in priced


def test_lesson_13_draws_no_conclusion_from_a_meaningless_fit(monkeypatch, capsys):
    """The budget sweep's fit, made meaningless on purpose (r² 0.01): the lesson says so and prints no
    fixed-part sentence, no chunk-cost chart and no comparison with the GPU built on it."""
    from minillm.serving import metrics

    real = metrics.step_fit

    def useless(steps):
        f = real(steps)
        return None if f is None else {**f, "r2": 0.01}

    lesson = __import__("importlib").import_module("minillm.lessons.13_two_phases")
    monkeypatch.setattr(lesson, "step_fit", useless)
    assert lesson.main(["--fast", "--no-pause"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fit of step time against tokens is not used: r² 0.01" in out
    assert "a step by the fit" not in out and "Step time ≈" not in out and "the fit's fixed part" not in out


def test_a_busy_machine_runs_a_lesson_on_one_thread_and_says_so(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(_common, "busy_line", lambda: "busy machine (load 9 on 2 CPUs)")
    monkeypatch.setattr(_common, "blas_threads", lambda: 2)
    monkeypatch.setattr(_common, "limited", lambda n: seen.append(n) or __import__("contextlib").nullcontext())
    assert _common.run_lesson(lambda L: None, ["--no-pause"], number=3, title="t", minutes=1, what="w") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert seen == [1] and "runs on 1 BLAS thread, every side of each comparison alike" in out
    seen.clear()
    assert _common.run_lesson(lambda L: None, ["--no-pause", "--threads", "2"], number=3, title="t", minutes=1,
                              what="w") == 0
    assert seen == [2]                                   # the learner's choice stands


def test_a_lesson_shows_when_its_hardware_figures_were_measured(monkeypatch):
    """Figures read from a cache written days ago were shown with no date: the first use says when."""
    from rich.console import Console

    from minillm.measure.chips import Hardware

    hw = Hardware(name="this machine", bandwidth_gbs=25.0, peak_gflops=90.0, measured_at="2026-11-28T09:00:00+00:00",
                  method="copy", methods={"copy": 25.0}, blas_threads=1, load_avg=0.5, threads=2)
    monkeypatch.setattr(_common.hardware, "machine", lambda progress=True: hw)
    console = Console(file=io.StringIO(), width=80)
    L = _common.Lesson(6, "t", console=console)
    assert L.machine() is hw and L.machine() is hw
    text = " ".join(console.file.getvalue().split())
    assert text.count("this machine's figures on 2026-11-28") == 1 and "measured" in text


def test_serve_sim_runs_every_side_of_a_comparison_on_the_threads_the_busy_check_gives(monkeypatch, capsys):
    """On a busy machine `serve-sim --compare` runs every configuration on one BLAS thread, and the split
    against one engine ranks only when every engine's steps ran on the same thread count."""
    import contextlib
    import json

    from minillm import cli
    from minillm.cli import serve_sim

    seen = []
    monkeypatch.setattr(serve_sim, "comparison_threads", lambda requested, default=None: (1, "busy: one thread"))
    monkeypatch.setattr(serve_sim, "limited", lambda n: seen.append(n) or contextlib.nullcontext())
    assert cli.main(["serve-sim", "--model", "random-tiny", "--requests", "4", "--rate", "50", "--compare",
                     "policies", "--json"]) == 0
    assert seen == [1]
    capsys.readouterr()
    assert cli.main(["serve-sim", "--model", "random-tiny", "--requests", "4", "--rate", "50", "--compare",
                     "disagg", "--link-gbps", "100", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    one = [r for r in runs if r["split"] == "colocated"]
    split = [r for r in runs if r["split"] != "colocated"]
    assert {r["threads"] for r in one} == {1} and {r["split"] for r in split} == {"1:1"}
