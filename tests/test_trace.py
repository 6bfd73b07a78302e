"""The trace writer (minillm/trace.py): a real generation traced, the file valid JSON in Chrome's
trace-event form, one slice per operation the meter counted, their arguments adding up to the
meter's own counts, the slices inside their steps, and a bad path refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm.errors import MiniLLMError
from minillm.meter import BYTE_KINDS, FLOP_KINDS
from minillm.trace import TraceMeter


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    model = minillm.load("random-tiny", kernels="numpy")
    with TraceMeter() as m:
        minillm.generate(model, np.array([1, 2, 3, 4, 5]), 6)
    path = m.write_trace(tmp_path_factory.mktemp("t") / "trace.json")
    return m, json.loads(path.read_text())


def test_the_file_is_chrome_trace_json_with_one_slice_per_counted_operation(traced):
    m, data = traced
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]
    ops = [e for e in slices if e["cat"] == "op"]
    assert sum(op["calls"] for s in m.steps for op in s.ops.values()) == len(ops) > 0
    for e in slices:
        assert {"name", "ts", "dur", "pid", "tid"} <= e.keys() and e["dur"] >= 0
    steps = [e for e in slices if e["cat"] == "step" and e["name"] != "after the last operation"]
    assert [e["name"] for e in steps] == [s.kind for s in m.steps]
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in data["traceEvents"])


def test_each_operations_arguments_add_up_to_the_meters_counts(traced):
    m, data = traced
    ops = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "op"]
    for name in {n for s in m.steps for n in s.ops}:
        mine = [e["args"] for e in ops if e["name"] == name]
        assert sum(a["bytes"] for a in mine) == sum(s.ops[name]["bytes"] for s in m.steps if name in s.ops)
        assert sum(a["flops"] for a in mine) == sum(s.ops[name]["flops"] for s in m.steps if name in s.ops)
    for kind in (*BYTE_KINDS, *FLOP_KINDS):
        total = sum(s.bytes.get(kind, 0) + s.flops.get(kind, 0) for s in m.steps)
        assert sum(e["args"].get(kind, 0) for e in ops) == total


def test_operations_tile_their_step(traced):
    """The slices of a step's operations (and the time after the last) lie inside it, back to back."""
    m, data = traced
    xs = sorted((e for e in data["traceEvents"] if e["ph"] == "X"), key=lambda e: e["ts"])
    steps = [e for e in xs if e["cat"] == "step" and e["name"] != "after the last operation"]
    for st, rec in zip(steps, m.steps):
        inner = [e for e in xs if e is not st and st["ts"] <= e["ts"] < st["ts"] + st["dur"]]
        assert inner and inner[0]["ts"] == pytest.approx(st["ts"], abs=0.01)
        for a, b in zip(inner, inner[1:]):
            assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=0.01)
        end = inner[-1]["ts"] + inner[-1]["dur"]
        assert end == pytest.approx(st["ts"] + st["dur"], abs=0.01)
        assert st["args"]["bytes"] == rec.total_bytes and st["args"]["flops"] == rec.total_flops


def test_a_missing_folder_is_refused_and_nothing_half_written(tmp_path):
    m = TraceMeter()
    with pytest.raises(MiniLLMError, match="does not exist"):
        m.write_trace(tmp_path / "no" / "t.json")
    m.write_trace(tmp_path / "t.json")
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]


# -- the commands' --trace --------------------------------------------------------------------------

import http.client  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def cli_env(tmp_path) -> dict:
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1"}
    env.pop("PYTHONPATH", None)
    return env


def ops_in(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    return [e for e in data["traceEvents"] if e.get("cat") == "op"]


def test_generate_writes_its_steps_with_the_int8_kernels(tmp_path):
    out = tmp_path / "gen.json"
    r = subprocess.run([sys.executable, "-m", "minillm", "generate", "ROMEO:", "--model", "random-tiny", "--weights",
                        "q8_0", "--kernels", "int8", "--max-new-tokens", "4", "--trace", str(out)],
                       capture_output=True, text=True, cwd=REPO, env=cli_env(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr
    ops = ops_in(out)
    assert {"linear", "lm_head", "attention"} <= {e["name"] for e in ops}
    assert "integer kernels" in r.stderr and f"{len(ops):,} operation slices" in r.stderr


def test_bench_traces_each_kernel_set_on_its_own_track(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "minillm", "bench", "--model", "random-tiny", "--weights", "q4_0",
                        "--kernels", "fused,int8", "--repeats", "1", "--trace", str(out)],
                       capture_output=True, text=True, cwd=REPO, env=cli_env(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr
    names = [e["args"]["name"] for e in json.loads(out.read_text())["traceEvents"] if e["name"] == "process_name"]
    assert names == ["random-tiny, q4_0 weights, fused kernels", "random-tiny, q4_0 weights, int8 kernels"]
    assert len({e["pid"] for e in ops_in(out)}) == 2


def test_a_bad_trace_path_is_refused_before_any_work(tmp_path):
    for cmd in (["generate", "hi"], ["bench", "--contexts", "16"], ["serve"]):
        r = subprocess.run([sys.executable, "-m", "minillm", *cmd, "--model", "random-tiny", "--trace",
                            str(tmp_path / "no" / "t.json")], capture_output=True, text=True, cwd=REPO,
                           env=cli_env(tmp_path), timeout=120)
        assert r.returncode != 0 and "does not exist" in r.stderr and "Traceback" not in r.stderr, cmd


def test_serve_writes_the_engine_threads_steps_when_it_stops(tmp_path):
    out = tmp_path / "serve.json"
    p = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", "random-tiny", "--port", "0",
                          "--kv-memory", "8MB", "--quiet", "--trace", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=REPO, env=cli_env(tmp_path))
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), (line, p.stderr.read() if p.poll() else "")
        conn = http.client.HTTPConnection("127.0.0.1", int(line.rsplit(":", 1)[1]), timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "a", "max_tokens": 3}),
                     headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 0
        assert "operation slices" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    ops = ops_in(out)
    assert ops and len({e["tid"] for e in ops}) == 1           # the engine thread's track


# -- where a trace may go: nothing replaced that minillm did not write, checked before the work -----

def _bad_paths(tmp_path):
    """(path, words of its one line, what must stay as it was)."""
    import os
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "precious.txt"
    target.write_text("not a trace")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    ours = tmp_path / "ours.json"
    TraceMeter().write_trace(ours)
    link_to_ours = tmp_path / "link-to-ours.json"
    link_to_ours.symlink_to(ours)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    readonly = Path("/proc/trace.json") if os.geteuid() == 0 else ro / "trace.json"   # root writes anywhere else
    return [(fifo, "FIFO"), (link, "symbolic link"), (link_to_ours, "symbolic link"), (target, "not a trace"),
            (tmp_path / ("x" * 256 + ".json"), "261 bytes long"), (readonly, "takes no new file"),
            (tmp_path, "folder"), (tmp_path / "nope" / "t.json", "does not exist")]


def test_a_trace_refuses_what_it_did_not_write_in_one_line(tmp_path):
    """Device nodes, FIFOs, links (to anything, a trace of ours too), a file minillm did not write, a
    name past 255 bytes, a folder that takes no file, a NUL byte: one TraceError line each, from the
    check the commands run before their work and from the write itself; nothing there changes."""
    import os
    from minillm.trace import TraceError, check_path
    bad = _bad_paths(tmp_path) + [(Path("/dev/null"), "device"), (str(tmp_path / "a\0b.json"), "NUL")]
    for path, words in bad:
        before = os.lstat(path) if os.path.lexists(path) and "\0" not in str(path) else None
        for attempt in (check_path, TraceMeter().write_trace):
            with pytest.raises(TraceError) as e:
                attempt(path)
            assert words in str(e.value) and "\n" not in str(e.value), (path, str(e.value))
        if before is not None:
            after = os.lstat(path)
            assert (after.st_mode, after.st_ino, after.st_size, after.st_mtime_ns) == \
                (before.st_mode, before.st_ino, before.st_size, before.st_mtime_ns), path
    assert (tmp_path / "precious.txt").read_text() == "not a trace"
    ours = tmp_path / "ours.json"
    TraceMeter().write_trace(ours)                       # a trace of ours: replaced whole
    assert json.loads(ours.read_text())["otherData"]["source"] == "minillm"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []    # no temporary left


def test_generate_trace_refuses_before_it_generates(tmp_path):
    """The CLI: one line, exit 1, before the model runs (no generated text), nothing replaced."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, MINILLM_HOME=str(tmp_path / "home"), MINILLM_FAST="1")
    for path, words in _bad_paths(tmp_path):
        r = subprocess.run([sys.executable, "-m", "minillm", "generate", "ROMEO:", "--model", "random-tiny",
                            "--max-new-tokens", "3", "--trace", str(path)], capture_output=True, text=True,
                           env=env, timeout=120)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr
        assert "ROMEO:" not in r.stdout, r.stdout
    assert (tmp_path / "precious.txt").read_text() == "not a trace"


def test_a_traced_commands_slices_are_bounded():
    """`traced` keeps the last TRACE_EVENTS slices (about 1 kB each): a long run's memory is bounded."""
    from minillm import trace
    with trace.TraceMeter(max_events=50) as m:
        minillm.generate(minillm.load("random-tiny"), [1, 2, 3], 20)
    assert len(m.events) == 50 and "the last 50 slices kept" in trace.trace_line("t.json", [m])
    assert trace.TRACE_EVENTS <= 100_000
