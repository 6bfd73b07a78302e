"""The command under hostile input, as a real subprocess, one test per class of fault (issue 12): each
must end non-zero with one line naming the problem and what to do, no traceback, no hang, and nothing
half-written left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from minillm.checkpoints.safetensors import write_safetensors
from test_cli import (IN_VOCAB, REPO, TINY_A, checkpoint, cli_env, fixture_tensors, home, join_file, ok,  # noqa: F401
                      run, split_file, user_error)

FAST = ("--model", "random-tiny", "--max-new-tokens", "2")


def test_a_tiny_file_claiming_ten_million_layers(home, tmp_path):
    lone = tmp_path / "lone.safetensors"
    config = json.loads((TINY_A / "config.json").read_text()) | {"n_layer": 10**7}
    write_safetensors(lone, {"wte.weight": np.zeros((512, 64), np.float32)}, {"config": json.dumps(config)})
    user_error(run(home, "generate", IN_VOCAB, "--model", lone, timeout=30), "10000000 layers need")
    d = checkpoint(tmp_path, config={"n_layer": 2147483648})
    user_error(run(home, "generate", IN_VOCAB, "--model", d, timeout=30), "2147483648 layers need")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_config_json_that_would_hang_or_never_end(home, tmp_path, kind):
    d = checkpoint(tmp_path)
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json") if kind == "fifo" else (d / "config.json").symlink_to("/dev/zero")
    data = tmp_path / "text.txt"
    data.write_text("to be or not to be " * 50)
    words = "FIFO" if kind == "fifo" else "character device"
    user_error(run(home, "generate", IN_VOCAB, "--model", d, timeout=30), "config.json", words)
    user_error(run(home, "eval", "--model", d, "--data", data, timeout=30), "config.json", words)


def test_paths_that_exist_but_are_not_files_say_what_they_are(home, tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for model, words in (("/dev/zero", "character device"), ("/dev/null", "character device"),
                         (tmp_path / "fifo", "FIFO")):
        user_error(run(home, "generate", "hi", "--model", model, timeout=30), str(model), words)
    for data, words in ((tmp_path, "is a directory"), (tmp_path / "fifo", "FIFO")):
        user_error(run(home, "eval", "--model", "random-tiny", "--data", data, timeout=30), words, "--data")
        user_error(run(home, "train", "--data", data, "--steps", "1", timeout=30), words)


def test_a_header_length_a_few_bytes_short(home, tmp_path):
    raw = (TINY_A / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    if raw[8 + n - 1:8 + n] != b" ":                             # give the header padding to lose
        head, data = split_file()
        raw = join_file(head, data)
        n = int.from_bytes(raw[:8], "little")
        raw = (n + 8).to_bytes(8, "little") + raw[8:8 + n] + b" " * 8 + raw[8 + n:]
        n += 8
    d = checkpoint(tmp_path, raw=(n - 3).to_bytes(8, "little") + raw[8:])
    user_error(run(home, "generate", IN_VOCAB, "--model", d), "data section")


@pytest.mark.parametrize("damage, words", [
    (lambda h: h["transformer.wte.weight"].update(dtype=["F32"]), "unknown dtype ['F32']"),
    (lambda h: h["transformer.wte.weight"].update(shape=[1] * 70), "70 dimensions"),
])
def test_header_values_of_the_wrong_kind(home, tmp_path, damage, words):
    head, data = split_file()
    damage(head)
    d = checkpoint(tmp_path, raw=join_file(head, data))
    user_error(run(home, "generate", IN_VOCAB, "--model", d), words)


def test_a_vector_embedding_and_a_huge_epsilon(home, tmp_path):
    tensors = {k.removeprefix("transformer."): v for k, v in fixture_tensors().items()}
    tensors["wte.weight"] = tensors["wte.weight"].reshape(-1)
    (tmp_path / "a").mkdir()
    write_safetensors(tmp_path / "a" / "lone.safetensors", tensors)
    user_error(run(home, "generate", IN_VOCAB, "--model", tmp_path / "a" / "lone.safetensors"), "wte.weight has shape")
    d = checkpoint(tmp_path, config={"layer_norm_epsilon": 10**400})
    user_error(run(home, "generate", IN_VOCAB, "--model", d), "layer_norm_epsilon")


def test_a_nan_weight_is_named_by_generate_and_eval(home, tmp_path):
    tensors = fixture_tensors()
    tensors["transformer.h.0.mlp.c_fc.weight"][1, 2] = np.nan
    d = checkpoint(tmp_path, tensors=tensors)
    data = tmp_path / "text.txt"
    data.write_text("a b c " * 100)
    user_error(run(home, "generate", IN_VOCAB, "--model", d), "h.0.mlp.c_fc.weight", "NaN")
    user_error(run(home, "eval", "--model", d, "--data", data), "h.0.mlp.c_fc.weight", "NaN")


def test_a_tiny_temperature_is_greedy(home):
    greedy = ok(run(home, "generate", "ROMEO:", *FAST)).stdout
    assert ok(run(home, "generate", "ROMEO:", *FAST, "--temperature", "1e-300", "--seed", "1")).stdout == greedy


@pytest.mark.parametrize("args, words", [
    (["--minutes", "nan"], "--minutes=nan"), (["--minutes", "inf"], "--minutes=inf"), (["--lr", "nan"], "--lr=nan"),
    (["--out", "FILE"], "is a file"), (["--out", "FILE/sub"], "--out"), (["--out", "/proc/minillm"], "--out"),
])
def test_train_checks_its_options_before_the_work(home, tmp_path, args, words):
    (tmp_path / "FILE").write_text("x")
    data = tmp_path / "text.txt"
    data.write_text("to be or not to be " * 400)
    args = [str(tmp_path / a) if a.startswith("FILE") else a for a in args]
    r = run(home, "train", "--data", data, "--layers", "1", "--heads", "1", "--width", "8", "--context", "8",
            "--steps", "100000", "--eval-every", "0", *args, timeout=60)
    user_error(r, words)


def test_eval_with_a_smaller_vocabulary(home, tmp_path):
    data = tmp_path / "text.txt"
    data.write_text("Zebras quixotically juxtapose! " * 100)            # GPT-2 ids beyond tiny-a's 512
    user_error(run(home, "eval", "--model", TINY_A, "--data", data), "vocabulary of 512")


@pytest.mark.parametrize("model, words", [("x" * 300, "File name too long"), ("~nosuchuser/x", "~nosuchuser")])
def test_paths_that_cannot_be_looked_up(home, model, words):
    user_error(run(home, "generate", "hi", "--model", model), words)


def test_invalid_utf8_prompt(home):
    r = subprocess.run([sys.executable, "-m", "minillm", "generate", os.fsencode("ab\udcff"), *FAST],
                       capture_output=True, env=cli_env(home, LC_ALL="C.UTF-8"), cwd=REPO, timeout=60)
    r = subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode(errors="replace"))
    user_error(r, "not valid UTF-8", "0xff")


def test_stdout_full_or_closed(home):
    args = [sys.executable, "-m", "minillm", "generate", "ROMEO:", *FAST]
    with open("/dev/full", "w") as full:
        r = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True, env=cli_env(home), cwd=REPO, timeout=60)
    user_error(subprocess.CompletedProcess(args, r.returncode, "", r.stderr), "No space left")
    r = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=cli_env(home),
                       cwd=REPO, timeout=60, preexec_fn=lambda: os.close(1))
    user_error(subprocess.CompletedProcess(args, r.returncode, "", r.stderr), "standard output is closed")


def ctrl_c_reaches_it() -> None:
    """In the child before it starts: SIGINT as a terminal's Ctrl-C finds it. A test run started in the
    background of a shell without job control inherits SIGINT ignored, and an ignored SIGINT stays
    ignored in every child (Python installs its handler only over the default): the child would
    finish its 250 tokens and exit 0 (seen beside two CPU burners, started that way)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(not hasattr(__import__("fcntl"), "F_SETPIPE_SZ"), reason="needs Linux's F_SETPIPE_SZ "
                    "to size the pipe the generation writes to")
def test_ctrl_c_while_generating(home):
    """Ctrl-C while tokens are being generated: 130, "interrupted", no traceback. However fast or slow
    the machine, the signal lands mid-generation: the child's stdout is a one-page pipe filled here to
    all but the prompt's 6 bytes, so after echoing "ROMEO:" it blocks on its first token until read."""
    import fcntl
    import termios
    import time
    r, w = os.pipe()
    size = fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    os.write(w, b"." * (size - len("ROMEO:")))                   # the pipe full but for the prompt
    p = subprocess.Popen([sys.executable, "-m", "minillm", "generate", "ROMEO:", "--model", "random-tiny",
                          "--max-new-tokens", "250", "--no-cache"], stdout=w, stderr=subprocess.PIPE,
                         text=True, env=cli_env(home), cwd=REPO, preexec_fn=ctrl_c_reaches_it)
    os.close(w)
    try:
        t0 = time.monotonic()
        queued = lambda: int.from_bytes(fcntl.ioctl(r, termios.FIONREAD, b"\0" * 4), sys.byteorder)
        while queued() < size and p.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.01)                                     # until the prompt is echoed: in main()
        assert queued() == size and p.poll() is None, p.stderr.read() if p.poll() is not None else "timeout"
        p.send_signal(signal.SIGINT)                             # it cannot have finished: the pipe is full
        with os.fdopen(r, "rb") as reader:
            out = reader.read()
        err = p.stderr.read()
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert out.startswith(b"." * (size - 6) + b"ROMEO:")
    assert p.returncode == 130 and "Traceback" not in err and "interrupted" in err, err


def test_prompt_from_a_file_or_stdin(home, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("word " * 60_000)                             # 300 KB: more than argv takes
    user_error(run(home, "generate", "--prompt-file", big, *FAST), "60001 tokens do not fit")
    r = ok(subprocess.run([sys.executable, "-m", "minillm", "generate", "--prompt-file", "-", *FAST],
                          input="ROMEO:", capture_output=True, text=True, env=cli_env(home), cwd=REPO, timeout=60))
    assert r.stdout.startswith("ROMEO:")
    user_error(run(home, "generate", *FAST), "--prompt-file")
    user_error(run(home, "generate", "hi", "--prompt-file", big, *FAST), "not both")
    user_error(run(home, "generate", "--prompt-file", tmp_path, *FAST), "is a directory")


def test_the_stream_prints_a_last_partial_character_as_decode_does(capsys):
    from minillm.cli.common import TextStream
    from minillm.bpe import tokenizer

    for tokens in ([30266], [40, 30266], [30266, 30266, 30266]):
        stream = TextStream()
        for t in tokens:
            stream(t)
        stream.close()
        assert capsys.readouterr().out == tokenizer().decode(tokens)


@pytest.mark.parametrize("delay", [0.02, 0.06, 0.12, 0.2, 0.35])
def test_ctrl_c_while_the_command_is_still_starting(home, delay):
    """Ctrl-C in the first fraction of a second (NumPy and the commands still importing): a quiet
    exit, never a KeyboardInterrupt traceback."""
    import time
    p = subprocess.Popen([sys.executable, "-m", "minillm", "traffic", "--model", "random-tiny"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(home), cwd=REPO,
                         preexec_fn=ctrl_c_reaches_it)
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    # At the earliest delays the signal can land in Python's own start-up (the site module), which no
    # program can catch; what must never appear is a traceback through minillm's own modules (named by
    # the package's own folder: a checkout folder called minillm holds the virtual environment too).
    package = f'"{REPO / "minillm"}{os.sep}'
    ours = [line for line in err.splitlines() if line.strip().startswith("File ") and package in line]
    assert not ours, err
    if "Traceback" not in err:
        assert p.returncode in (0, 130, -signal.SIGINT), (p.returncode, err)


def test_ctrl_c_inside_a_class_bodys_set_name_counts_as_ctrl_c():
    """CI, busy: Ctrl-C at 0.12 s landed in rich's `ConsoleThreadLocals` dataclass, and Python handed it
    on as "RuntimeError: Error calling __set_name__" with the interrupt as its cause: a traceback
    through minillm's modules. The start-up's handlers look for the interrupt down the chain."""
    from minillm.errors import interrupted
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as k:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance 'buffer'") from k
    except RuntimeError as e:
        assert interrupted(e)
    assert interrupted(KeyboardInterrupt()) and not interrupted(RuntimeError("x")) and not interrupted(None)
    main = (REPO / "minillm" / "__main__.py").read_text()
    assert "except BaseException as e:" in main and "interrupted(e)" in main and "except KeyboardInterrupt:" in main


def test_a_config_json_over_the_cap(home, tmp_path):
    """config.json is read with the 16 MiB cap of every JSON file a folder holds: a bigger one (valid
    JSON, padded) is one line, not parsed."""
    d = checkpoint(tmp_path)
    text = (d / "config.json").read_text()
    (d / "config.json").write_text(text + " " * (1 << 24))
    user_error(run(home, "generate", IN_VOCAB, "--model", d, timeout=30), "config.json",
               "over the 16,777,216-byte cap", "is it the right file")


def test_a_scalar_position_embedding(home, tmp_path):
    tensors = fixture_tensors()
    tensors["transformer.wpe.weight"] = np.array(0.5, dtype=np.float32)             # 0-D
    d = checkpoint(tmp_path, tensors=tensors)
    user_error(run(home, "generate", IN_VOCAB, "--model", d, timeout=30), "tensor wpe.weight has shape []",
               "re-download or re-save")
    (tmp_path / "a").mkdir()
    write_safetensors(tmp_path / "a" / "lone.safetensors", tensors)                  # no config beside it
    user_error(run(home, "generate", IN_VOCAB, "--model", tmp_path / "a" / "lone.safetensors", timeout=30),
               "tensor wpe.weight has shape []", "is this a GPT-2 checkpoint?")


def test_a_minillm_home_that_is_a_file(tmp_path):
    """Commands that must write under $MINILLM_HOME (the bundled text's copy, downloads) stop with one line;
    `hardware` still shows its figures and says in one note why they were not cached."""
    home = tmp_path / "home"
    home.write_text("not a folder")
    user_error(run(home, "eval", "--model", "random-tiny", timeout=60), str(home), "Not a directory", "MINILLM_HOME")
    user_error(run(home, "download", "gpt2", timeout=60), str(home / "gpt2"), "Not a directory", "MINILLM_HOME")
    r = ok(run(home, "hardware", env=cli_env(home, COLUMNS="1000"), timeout=60))
    assert "memory read bandwidth" in r.stdout
    note = [line for line in r.stderr.splitlines() if "could not cache" in line]
    assert len(note) == 1, r.stderr
    assert f"{home} is not a directory" in note[0] and "MINILLM_HOME" in note[0], note
    assert home.read_text() == "not a folder"


@pytest.mark.parametrize("command", [("generate", IN_VOCAB), ("compare", IN_VOCAB), ("serve-sim",), ("chat",),
                                     ("traffic",), ("diagnose",), ("bench",)])
def test_device_cuda_without_a_gpu_is_one_line(home, command):
    """Every command that runs a model takes --device; asking for a GPU where none can be used is one
    line naming why and what to do, and a non-zero exit, before any model is read."""
    from minillm.backend import DeviceError, get_device
    try:
        get_device("cuda")
    except DeviceError:
        pass
    else:
        pytest.skip("this machine has a GPU: --device cuda runs")
    user_error(run(home, *command, "--device", "cuda", "--model", "random-tiny", timeout=60),
               "--device cuda: no CUDA GPU found", "--device cpu")
