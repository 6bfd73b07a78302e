"""The terminal lessons: every one runs in fast mode and its checked claims hold; `minillm learn` lists
and runs them; pauses wait for Enter only at a terminal."""

from __future__ import annotations

import argparse
import importlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minillm.cli import learn
from minillm.errors import MiniLLMError
from minillm.lessons import _common

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def home(tmp_path_factory):
    """A private $MINILLM_HOME (the hardware figures are measured once, in fast mode, for all lessons)."""
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("minillm_home")
        mp.setenv("MINILLM_HOME", str(path))
        mp.delenv("MINILLM_FAST", raising=False)
        yield path


def test_lessons_are_discovered_in_order_with_their_metadata():
    numbers = [info.number for info in learn.LESSONS]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 7
    for info in learn.LESSONS:
        assert info.title and info.what and info.minutes > 0
        module = importlib.import_module(info.module)
        assert callable(module.main)


@pytest.mark.parametrize("info", learn.LESSONS, ids=lambda info: f"{info.number:02d}_{info.slug}")
def test_lesson_runs_in_fast_mode_and_its_claims_hold(info, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")            # the narrowest terminal a learner is likely to have
    module = importlib.import_module(info.module)
    rc = module.main(["--fast", "--no-pause"])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert not wide, wide[:3]
    assert "…" not in out, [line for line in out.splitlines() if "…" in line][:3]   # no cell cut short
    assert "✓ checked" in out
    assert "✗" not in out
    assert "Try it yourself" in out
    assert os.environ.get("MINILLM_FAST") is None   # the lesson put the environment back


def test_listing_shows_every_lesson(capsys):
    rc = learn.run(argparse.Namespace(lesson=None, no_pause=False, fast=False, model=None))
    out = capsys.readouterr().out
    assert rc == 0
    for info in learn.LESSONS:
        assert f"{info.number:02d}" in out
        assert info.title.split(":")[0] in out


def test_find_by_number_or_name():
    assert learn.find("3") == learn.find("03") == learn.find("prefill")
    assert learn.find("kv-cache") == learn.find("5")
    with pytest.raises(MiniLLMError, match="no lesson"):
        learn.find("99")


def test_learn_passes_the_options_to_the_lesson(monkeypatch):
    seen = []
    module = importlib.import_module(learn.find("2").module)
    monkeypatch.setattr(module, "main", lambda argv=None: seen.append(argv) or 0)
    args = argparse.ArgumentParser()
    learn.add_arguments(args)
    assert learn.run(args.parse_args(["2", "--fast", "--no-pause", "--model", "random-tiny"])) == 0
    assert seen == [["--no-pause", "--fast", "--model", "random-tiny"]]


def test_cli_wires_learn(capsys):
    from minillm import cli

    assert cli.main(["learn"]) == 0           # unwired, argparse exits 2 (SystemExit): the test fails
    assert learn.LESSONS[0].title.split(":")[0] in capsys.readouterr().out


def test_a_lesson_runs_as_a_script_without_waiting_when_stdin_is_not_a_terminal(home):
    """No --no-pause: the pauses must see that stdin is not a terminal and not wait."""
    proc = subprocess.run([sys.executable, str(ROOT / "lessons" / "01_tokens.py"), "--fast"], cwd=ROOT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Lesson 1 done" in proc.stdout


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("tty, no_pause, waits", [(True, False, True), (True, True, False), (False, False, False)])
def test_pause_waits_for_enter_only_at_a_terminal_without_no_pause(monkeypatch, tty, no_pause, waits):
    stdin = (_Terminal if tty else io.StringIO)("\nrest\n")
    monkeypatch.setattr(sys, "stdin", stdin)
    lesson = _common.Lesson(1, "t", no_pause=no_pause, console=_common.Console(file=io.StringIO()))
    lesson.pause()
    assert (stdin.tell() > 0) is waits


def test_a_failed_claim_stops_the_lesson_with_status_1(capsys):
    def body(L):
        L.claim(True, "fine")
        L.claim(False, "the numbers disagree")

    assert _common.run_lesson(body, ["--no-pause"], number=9, title="t", minutes=1, what="w") == 1
    assert "the numbers disagree" in capsys.readouterr().out


def test_a_user_error_is_one_red_line_and_status_1(capsys):
    def body(L):
        L.load_model()

    assert _common.run_lesson(body, ["--no-pause", "--model", "no-such-model"], number=9, title="t",
                              minutes=1, what="w") == 1
    out = capsys.readouterr().out
    assert "error:" in out and "Traceback" not in out


def test_fast_mode_from_the_environment(monkeypatch):
    seen = []
    monkeypatch.setenv("MINILLM_FAST", "1")
    assert _common.run_lesson(lambda L: seen.append(L.fast), ["--no-pause"], number=9, title="t",
                              minutes=1, what="w") == 0
    assert seen == [True]


@pytest.mark.parametrize("info", learn.LESSONS, ids=lambda info: f"{info.number:02d}_{info.slug}")
def test_a_lesson_body_is_one_function_per_section(info):
    """`lesson(L)` calls one function per section; a pause comes between sections (in the driver, or as
    a section's last statement), never inside one."""
    import ast
    import inspect

    module = importlib.import_module(info.module)
    tree = ast.parse(inspect.getsource(module))
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    driver = funcs["lesson"]
    called = [n.func.id for n in ast.walk(driver) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    pauses = sum(1 for n in ast.walk(driver) if isinstance(n, ast.Attribute) and n.attr == "pause")
    assert len(called) >= 3 and pauses <= len(called) - 1, (called, pauses)   # a heading or a pause between
    for name in called:
        if name not in funcs:
            continue
        body = funcs[name]
        inner = [n for n in ast.walk(body) if isinstance(n, ast.Attribute) and n.attr == "pause"]
        last = body.body[-1]
        at_end = (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
                  and isinstance(last.value.func, ast.Attribute) and last.value.func.attr == "pause")
        assert len(inner) <= int(at_end), f"{name} pauses inside a section"
        assert body.end_lineno - body.lineno < 120, f"{name} is {body.end_lineno - body.lineno} lines"


def test_nothing_shipped_points_at_a_file_the_user_does_not_have():
    """DESIGN.md and STYLE.md do not ship: no module, lesson, package file or the README may cite them."""
    shipped = [*ROOT.joinpath("minillm").rglob("*.py"), *ROOT.joinpath("minillm").rglob("*.md"), ROOT / "README.md"]
    for path in shipped:
        text = path.read_text(encoding="utf-8")
        for name in ("DESIGN.md", "STYLE.md", "../shared", "seed's"):
            assert name not in text, f"{path.relative_to(ROOT)} mentions {name}"


def _lesson(number):
    return importlib.import_module(next(i.module for i in learn.LESSONS if i.number == number))


def test_claims_fail_on_a_wrong_engine_cache_size(monkeypatch, capsys):
    """Lesson 5 checks the run: a cache that misreports its size per token fails the lesson."""
    import minillm

    real = minillm.KVCache.bytes_per_token
    monkeypatch.setattr(minillm.KVCache, "bytes_per_token", lambda self: real(self) + 4)
    assert _lesson(5).main(["--fast", "--no-pause"]) == 1
    assert "did not hold" in capsys.readouterr().out


@pytest.mark.parametrize("number", [6, 7])
def test_claims_fail_when_the_meter_counts_the_lm_head_weights_twice(number, monkeypatch, capsys):
    """Lessons 6 and 7 check this run's weight bytes (not published constants): a meter that counts the
    LM head's read of wte twice, or that ignores the dtype, fails them."""
    from minillm import meter

    real = meter.Meter.count

    def wrong(self, op, **kw):
        if op == "lm_head" or (number == 7 and kw.get("weights") and self._open is not None
                               and self._open.kind == "decode"):
            kw["weights"] = 2 * kw.get("weights", 0) if op == "lm_head" else kw["weights"] + 1
        return real(self, op, **kw)

    monkeypatch.setattr(meter.Meter, "count", wrong)
    assert _lesson(number).main(["--fast", "--no-pause"]) == 1
    assert "did not hold" in capsys.readouterr().out


def test_lesson_5s_cache_table_shows_each_models_own_context(monkeypatch):
    """The "context" column of lesson 5's KV table is each model's own n_ctx (1,024 for the GPT-2 presets,
    256 for the bundled model), and "KV, full" is that model's bytes per token times it: one context
    shared by every row was a bug (the bundled model's 256-token figure under "1,024 tokens")."""
    import io

    import numpy as np
    from rich.console import Console

    import minillm
    from minillm.config import PRESETS

    lesson = _lesson(5)
    model = minillm.load(quiet=True)
    c = model.config
    with minillm.Meter() as m:
        minillm.generate(model, [464, 2068], 3)
    L = _common.Lesson(5, "test", fast=True, no_pause=True, console=Console(file=io.StringIO(), width=200))
    shown = []
    monkeypatch.setattr(L, "show", lambda *renderables: shown.extend(renderables))
    lesson.what_the_cache_costs(L, c, m.of_kind("decode"), model)
    (table,) = [r for r in shown if hasattr(r, "columns")]
    columns = {col.header: [str(cell) for cell in col.cells] for col in table.columns}
    rows = dict(zip(columns["model"], zip(columns["context"], columns["KV, full"], columns["KV/token"])))
    expected = {f"GPT-2 {name}": cfg for name, cfg in PRESETS.items()} | {model.name: c}
    assert set(rows) == set(expected), rows
    for name, cfg in expected.items():
        per = minillm.KVCache(cfg).bytes_per_token() if name != model.name else model.new_cache().bytes_per_token()
        assert per == 2 * cfg.n_layer * cfg.n_embd * (4 if name != model.name else np.dtype(model.dtype).itemsize)
        assert rows[name] == (f"{cfg.n_ctx:,}", _common.fmt_bytes(per * cfg.n_ctx), f"{per / 1024:g} KiB"), (name, rows)
    contexts = {rows[name][0] for name in rows}
    assert {"1,024", f"{c.n_ctx:,}"} <= contexts and c.n_ctx != 1024, contexts   # the test can tell them apart


@pytest.mark.parametrize("wrong", ["the model's n_params counts the tied LM head again",
                                   "the config's n_params forgets the final layer norm"])
def test_lesson_2s_parameter_claim_fails_on_a_wrong_count(wrong, monkeypatch, capsys):
    """Lesson 2 checks n_params() against the arrays it loaded and GPT-2 small's shapes against its config
    count: either count going wrong fails the lesson."""
    import minillm
    from minillm.config import GPT2Config

    if wrong.startswith("the model's"):
        real = minillm.GPT2.n_params
        monkeypatch.setattr(minillm.GPT2, "n_params", lambda self: real(self) + self.params["wte.weight"].size)
    else:
        real = GPT2Config.n_params
        monkeypatch.setattr(GPT2Config, "n_params", lambda self: real(self) - 2 * self.n_embd)
    assert _lesson(2).main(["--fast", "--no-pause"]) == 1
    out = capsys.readouterr().out
    assert "did not hold" in out and "n_params()" in out.split("did not hold")[1], out[-2000:]


def test_lesson_4s_claims_fail_when_the_naive_loop_reuses_a_cache(monkeypatch, capsys):
    """Lesson 4 checks that each naive step ran the whole sequence: a `kv_cache=False` that is ignored
    (the steps are a prefill and one-token decodes) fails it."""
    import minillm

    real = minillm.generate
    monkeypatch.setattr(minillm, "generate", lambda model, ids, n, kv_cache=True, **kw: real(model, ids, n, **kw))
    assert _lesson(4).main(["--fast", "--no-pause"]) == 1
    out = capsys.readouterr().out
    assert "did not hold" in out and "tokens through the model" in out.split("did not hold")[1], out[-2000:]


def test_lesson_4s_quadratic_claim_fails_on_a_run_too_short_to_compare(tmp_path, capsys):
    """A model whose context leaves room for one new token has no half-length run to compare with: the
    "double the answer, about four times the work" claim must fail, not hold by default."""
    import minillm
    from minillm.checkpoints.checkpoint import random_params, save_checkpoint
    from minillm.config import GPT2Config

    lesson = _lesson(4)
    P = len(minillm.tokenizer().encode(lesson.PROMPT))
    config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_ctx=P + 1, vocab_size=50257)
    save_checkpoint(tmp_path / "short", random_params(config), config)
    assert lesson.main(["--fast", "--no-pause", "--model", str(tmp_path / "short")]) == 1
    out = capsys.readouterr().out
    assert "did not hold" in out and "doubling the answer" in out.split("did not hold")[1], out[-2000:]
