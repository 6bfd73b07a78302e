"""How the commands are put together: each imports what it runs (no lesson for `--help` or
`generate`), every command that computes takes --threads, the KV options mean one thing on both
serving commands, and the busy-machine note says what it saw."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minillm.cli.commands import COMMANDS
from minillm.measure import busy

from test_cli import REPO, cli_env, ok, run, user_error

COMPUTES = ["generate", "generate-batch", "serve", "serve-sim", "compare", "traffic", "hardware", "diagnose",
            "bench", "train", "eval", "learn", "roofline"]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("minillm-home")


def imported_after(home: Path, *argv: str) -> set[str]:
    """The minillm modules a run of `minillm ARGV` imported."""
    code = ("import sys\nfrom minillm.cli.commands import main\n"
            f"status = main({list(argv)!r})\n"
            "print('MODULES', *sorted(m for m in sys.modules if m.startswith('minillm')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=cli_env(home),
                       timeout=120)
    line = next((x for x in r.stdout.splitlines() if x.startswith("MODULES")), None)
    assert line is not None, r.stderr
    return set(line.split()[1:])


def test_help_imports_no_command_and_no_lesson(home):
    r = subprocess.run([sys.executable, "-c", "import sys\nfrom minillm.cli.commands import main\n"
                        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
                        "print('MODULES', *sorted(m for m in sys.modules if m.startswith(('minillm', 'numpy'))))"],
                       capture_output=True, text=True, cwd=REPO, env=cli_env(home), timeout=60)
    modules = set(r.stdout.split("MODULES")[1].split())
    assert not {m for m in modules if m.startswith("minillm.lessons")}
    assert not {m for m in modules if m.startswith("numpy")}             # nothing that computes
    assert not {m for m in modules if m.startswith("minillm.cli.") and m not in
                ("minillm.cli.commands", "minillm.cli.console")}


def test_generate_imports_no_lesson_and_no_other_command(home):
    modules = imported_after(home, "generate", "a b c", "--model", "random-tiny", "--max-new-tokens", "2")
    assert "minillm.cli.generate" in modules
    assert not {m for m in modules if m.startswith("minillm.lessons")}
    others = {f"minillm.{c.module}" for c in COMMANDS} - {"minillm.cli.generate"}
    assert not modules & others


def test_learn_finds_the_lessons_when_asked(home):
    modules = imported_after(home, "learn")
    assert {m for m in modules if m.startswith("minillm.lessons.")}
    r = ok(run(home, "learn", "--help"))
    assert "the lesson to run: its number (1-" in r.stdout


# The commands that run a model without --kernels, each with the reason (the README names them). Every
# other command with a --model option must take --kernels with every kernel set: the walk below reads it
# from the parser itself, so a new command that runs a model is held to it without being listed.
NO_KERNELS = {
    "loadgen": "its --model is the field sent to a server, which runs the model",
    "learn": "each lesson computes with the NumPy reference, or names the set it teaches",
}


def _options(name: str) -> dict:
    from minillm.cli.commands import build_parser
    parser = build_parser(name)
    sub = next(a for a in parser._actions if a.dest == "command").choices[name]
    return {o: a for a in sub._actions for o in a.option_strings}


def test_every_command_that_runs_a_model_takes_kernels():
    from minillm.models import kernel_sets
    runs_a_model = [c.name for c in COMMANDS if "--model" in _options(c.name)]
    assert {"generate", "chat", "eval", "bench", "roofline", "serve", "diagnose"} <= set(runs_a_model)
    for name in runs_a_model:
        options = _options(name)
        if name in NO_KERNELS:
            assert "--kernels" not in options, f"{name} takes --kernels now: drop it from NO_KERNELS"
            continue
        assert "--kernels" in options, f"minillm {name} runs a model and takes no --kernels"
        choices = options["--kernels"].choices
        assert choices is None or set(kernel_sets.NAMES) <= set(choices), name


def test_eval_scores_with_a_kernel_set(home, tmp_path):
    """`eval --kernels K`: the model's own forward with K. With numpy's products it equals the training
    code's loss; int8 (where it runs) scores the same quantized model within its rounding of x."""
    import minillm
    from minillm.models import kernel_sets
    from minillm.training.data import evaluate, evaluate_model
    from minillm.models.gpt2 import dequantize_params
    tokens = np.random.default_rng(0).integers(0, 1000, 300)
    m = minillm.load("random-tiny", weights="q4_0", kernels="numpy", quiet=True)
    assert evaluate_model(m, tokens) == pytest.approx(evaluate(dequantize_params(m.params), m.config, tokens),
                                                       rel=1e-5)
    data = tmp_path / "t.txt"
    data.write_text("To be, or not to be, that is the question. " * 40)
    base = ok(run(home, "eval", "--model", "random-tiny", "--weights", "q4_0", "--data", data)).stdout
    try:
        kernel_sets.spec("int8").check()
    except minillm.MiniLLMError as e:
        pytest.skip(f"the int8 kernel set cannot run here: {e}")
    r = ok(run(home, "eval", "--model", "random-tiny", "--kernels", "int8", "--weights", "q4_0", "--data", data,
               timeout=300)).stdout
    assert "q4_0 weights, int8 kernels" in r
    loss = lambda text: float(text.split("held-out loss ")[1].split()[0])
    assert loss(r) == pytest.approx(loss(base), abs=0.02)


@pytest.mark.parametrize("name", COMPUTES)
def test_every_command_that_computes_takes_threads(home, name):
    assert "--threads N" in ok(run(home, name, "--help")).stdout


def test_threads_one_runs_generate_and_a_bad_count_is_one_line(home):
    ok(run(home, "generate", "a b c", "--model", "random-tiny", "--max-new-tokens", "2", "--threads", "1"))
    user_error(run(home, "generate", "a b c", "--model", "random-tiny", "--threads", "0"), "--threads 0")


@pytest.mark.parametrize("name", ["serve", "serve-sim"])
def test_the_serving_commands_share_their_knobs(home, name):
    text = ok(run(home, name, "--help")).stdout
    for option in ("--kv-memory", "--block-size", "--max-seqs", "--max-batched-tokens"):
        assert option in text
    assert "--max-batch " not in text and "--max-tokens" not in text
    user_error(run(home, name, "--kv-memory", "0", "--model", "random-tiny"), "--kv-memory '0'", "256MB")
    user_error(run(home, name, "--max-seqs", "0", "--model", "random-tiny"), "--max-seqs 0")
    user_error(run(home, name, "--max-batched-tokens", "0", "--model", "random-tiny"), "--max-batched-tokens 0")


@pytest.mark.parametrize("argv", [["generate", "a b c"], ["compare", "a b c"]])
def test_max_new_tokens_zero_is_refused_alike(home, argv, tmp_path):
    user_error(run(home, *argv, "--model", "random-tiny", "--max-new-tokens", "0"), "--max-new-tokens 0",
               "at least 1")


def test_max_new_tokens_zero_is_refused_by_generate_batch(home, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a b c\n")
    user_error(run(home, "generate-batch", prompts, "--model", "random-tiny", "--max-new-tokens", "0"),
               "--max-new-tokens 0", "at least 1")
    prompts.write_text('{"prompt": "a b c", "max_new_tokens": 0}\n')
    user_error(run(home, "generate-batch", prompts, "--model", "random-tiny"), "line 1", "at least 1")


# ------------------------------------------------------------------------------ the busy-machine note

def test_a_quiet_machine_gets_no_note():
    assert busy.assess(threads=1, cpus=4, load=0.2, share=0.98) is None
    assert busy.assess(threads=2, cpus=2, load=None, share=0.95) is None


def test_a_crowded_machine_gets_one_line_with_how_busy_and_the_fix():
    note = busy.assess(threads=2, cpus=2, load=3.4, share=0.95)
    assert "load 3.4 on 2 CPUs" in note and "--threads 1" in note and "\n" not in note
    assert len("note: " + note) <= 150
    assert "close other work" in busy.assess(threads=1, cpus=2, load=3.4, share=0.95)


def test_a_starved_probe_is_busy_even_when_the_load_looks_low():
    note = busy.assess(threads=1, cpus=8, load=0.5, share=0.3)
    assert note is not None and "30% of a core" in note


def test_the_probe_measures_a_share_of_one_core():
    assert 0.0 < busy.cpu_share(0.02) <= 1.0


def test_the_cpus_others_use_now_decide_where_the_system_counts_them():
    """The load average lags a minute: burners started a moment ago (load still 0.3, a whole core for
    the probe) are busy by the CPUs they took; work that has just finished (load 1.2, nothing running
    now) is not. Room for 2 threads on 2 CPUs: 0.5 CPU of others at most."""
    note = busy.assess(threads=2, cpus=2, load=0.3, share=1.0, others=1.9)
    assert note is not None and "other processes kept 1.9 of 2 CPUs busy" in note and "--threads 1" in note
    assert busy.assess(threads=2, cpus=2, load=1.2, share=1.0, others=0.1) is None
    assert busy.assess(threads=1, cpus=2, load=3.0, share=1.0, others=1.2) is None      # one CPU left: room for 1
    assert busy.assess(threads=1, cpus=2, load=0.1, share=0.4, others=0.0) is not None  # starved all the same


def test_the_probe_sees_a_process_burning_a_cpu():
    """A real burner beside the probe: on Linux the others' CPUs show it (about one CPU)."""
    import os
    import time
    if busy._busy_seconds() is None or (os.cpu_count() or 1) < 2:
        pytest.skip("needs /proc/stat's CPU counts and two CPUs")
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)                                   # the burner up and spinning
        share, others = busy.probe(0.3)
    finally:
        burner.kill()
        burner.wait()
    assert others is not None and others > 0.5


def test_hardware_figures_follow_threads(tmp_path):
    """`--threads 2` then the default (one thread in the tests): two records, each run shown its own."""
    import json

    env = cli_env(tmp_path, OPENBLAS_NUM_THREADS="1")
    shown = []
    for extra in (["--threads", "2"], []):
        r = subprocess.run([sys.executable, "-m", "minillm", "hardware", "--json", *extra], capture_output=True,
                           text=True, cwd=REPO, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        shown.append(json.loads(r.stdout)["machine"]["blas_threads"])
    assert shown == [2, 1]
    records = json.loads((tmp_path / "hardware.json").read_text())["records"]
    assert sorted(r["blas_threads"] for r in records) == [1, 2]


def test_the_thread_limit_holds_on_every_thread():
    """`--threads` is applied once, in main, for the whole process: the server's engine thread, started
    inside it, runs on the same number of BLAS threads."""
    import threading

    from minillm.threads import blas_threads, limited

    before, seen = blas_threads(), []
    with limited(2):
        worker = threading.Thread(target=lambda: seen.append(blas_threads()))
        worker.start()
        worker.join()
    assert seen == [2] and blas_threads() == before


def test_blas_spin_reads_back_what_openblas_takes(monkeypatch):
    """OPENBLAS_THREAD_TIMEOUT as OpenBLAS uses it: a whole number clamped to 4..30, nothing for 0,
    a non-number or a setting NumPy loaded OpenBLAS before (minillm sets 10 before it imports NumPy)."""
    from minillm import threads
    if not (threads.blas_name() or "").startswith("openblas"):
        pytest.skip("NumPy's BLAS here is not OpenBLAS")
    monkeypatch.setattr(threads, "SPIN_SET_BEFORE_NUMPY", True)
    for value, want in [("10", 10), ("2", 4), ("40", 30), ("0", None), ("x", None)]:
        monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", value)
        assert threads.blas_spin() == want, value
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "10")
    monkeypatch.setattr(threads, "SPIN_SET_BEFORE_NUMPY", False)
    assert threads.blas_spin() is None


def test_the_blas_named_is_numpys_own_whatever_order_threadpoolctl_lists_them(monkeypatch):
    """`bench` printed "openblas 0.3.30" on 2 threads and "0.3.31.188.0" on 1 in the same session: SciPy's
    OpenBLAS was loaded beside NumPy's, and the first pool threadpoolctl listed was named. NumPy's own
    library (in its package, or the wheel's numpy.libs beside it) is named first in either order."""
    import os

    import numpy
    import threadpoolctl

    from minillm import threads
    home = os.path.dirname(os.path.abspath(numpy.__file__))
    mine = {"user_api": "blas", "internal_api": "openblas", "version": "9.9.mine", "architecture": "Mine",
            "filepath": os.path.join(home + ".libs", "libscipy_openblas64_-x.so")}
    other = {"user_api": "blas", "internal_api": "openblas", "version": "1.0.other", "architecture": "Other",
             "filepath": os.path.join(os.path.dirname(home), "scipy.libs", "libscipy_openblas-y.so")}
    omp = {"user_api": "openmp", "internal_api": "openmp", "version": None, "filepath": "/lib/libgomp.so"}
    for listed in ([other, omp, mine], [mine, other], [omp, other, mine]):
        monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda listed=listed: listed)
        assert threads.blas_name() == "openblas 9.9.mine" and threads.blas_kernel() == "Mine", listed
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: [other, omp])   # NumPy's not found: the first
    assert threads.blas_name() == "openblas 1.0.other"


def test_the_minillm_command_sets_the_spin_before_numpy_loads():
    code = "import minillm, os, numpy; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))"
    env = {k: v for k, v in __import__("os").environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.strip() == "10"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**env, "OPENBLAS_THREAD_TIMEOUT": "20"})
    assert r.stdout.strip() == "20"                                  # an explicit setting wins


def test_chats_counters_line_fits_80_columns_at_extremes(monkeypatch):
    from types import SimpleNamespace

    from minillm.cli import chat
    from minillm.measure import hardware
    monkeypatch.setattr(hardware, "cached", lambda: SimpleNamespace(bandwidth_gbs=99.9))

    def meter(pre_tok, pre_s, n_dec, dec_s, dec_bytes):
        steps = [SimpleNamespace(kind="prefill", n_tokens=pre_tok, seconds=pre_s, total_bytes=0)]
        steps += [SimpleNamespace(kind="decode", n_tokens=1, seconds=dec_s / n_dec, total_bytes=dec_bytes)] * n_dec
        return SimpleNamespace(steps=steps)
    slow = chat.counters_line(meter(8192, 123.4, 10, 100.0, 5e8))               # a long prompt, a slow machine
    cpu = chat.counters_line(meter(8192, 9.99, 9999, 10.0, 9.99e7))             # 999.9 tok/s at 99.9 GB/s
    gpu = chat.counters_line(meter(8192, 0.5, 10000, 1.0, 4.8e8), on_cpu=False)  # 10,000 tok/s at 4,800 GB/s
    assert "123.4 s" in slow and "999.9 tok/s, 99.9 GB/s (100% of 99.9 measured)" in cpu
    assert "4,800 GB/s" in gpu and "e+" not in gpu and "measured" not in gpu
    assert all(len(line) <= 80 for line in (slow, cpu, gpu)), (slow, cpu, gpu)
