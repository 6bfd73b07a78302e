"""The chat-template worker is a module of its own (minillm/chat_worker.py), started by path with
`python -I`: it imports the standard library and jinja2 only, never minillm, and sets its limits
before jinja2 is imported; importing minillm.chat starts nothing and registers nothing at exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minillm import chat_pool

REPO = Path(__file__).resolve().parents[1]
REQUEST = {"template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
           "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True, "bos_token": "",
           "eos_token": "", "limit": 1000, "max_range": 10, "max_indent": 4}


def run_worker(*flags: str, request: dict = REQUEST) -> subprocess.CompletedProcess:
    """The worker as the pool starts it (by path, -I), one request on stdin, `flags` for Python."""
    return subprocess.run([sys.executable, "-I", *flags, str(chat_pool.WORKER), str(chat_pool.RENDER_MEMORY),
                           "2"], input=json.dumps(request) + "\n", capture_output=True, text=True, timeout=60,
                          cwd="/")


def test_the_worker_renders_by_path_from_anywhere():
    r = run_worker()
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"text": "user: hi\n", "spans": [[6, 8]]}


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX resource limits")
def test_the_worker_imports_nothing_of_minillm_and_sets_its_limits_before_jinja2():
    r = run_worker("-X", "importtime")
    assert r.returncode == 0, r.stderr
    imported = [line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")
                and "|" in line]
    top = [name.split(".")[0] for name in imported]
    assert "jinja2" in top and "resource" in top, imported
    assert not any(name == "minillm" or name == "chat_worker" for name in top), imported
    assert top.index("resource") < top.index("jinja2"), "jinja2 was imported before the limits were set"


@pytest.mark.skipif(not Path("/proc/self/limits").is_file(), reason="reads /proc/PID/limits (Linux)")
def test_a_pool_worker_runs_under_its_limits():
    pool = chat_pool.Pool(1)
    try:
        reply = pool.render({k: v for k, v in REQUEST.items() if k not in ("limit", "max_range", "max_indent")})
        assert reply["text"] == "user: hi\n"
        (worker,) = pool.idle
        limits = Path(f"/proc/{worker.proc.pid}/limits").read_text()
        row = {line[:26].strip(): line[26:].split() for line in limits.splitlines()[1:]}
        assert row["Max address space"][:2] == [str(chat_pool.RENDER_MEMORY)] * 2
        assert row["Max file size"][:2] == ["0", "0"] and row["Max core file size"][:2] == ["0", "0"]
        assert int(row["Max open files"][0]) <= 32
        cmdline = Path(f"/proc/{worker.proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1:3] == [b"-I", os.fsencode(chat_pool.WORKER)]
    finally:
        pool.close()


def test_importing_chat_starts_no_worker_and_registers_nothing_at_exit():
    code = ("import atexit, sys\n"
            "seen = []\n"
            "real = atexit.register\n"
            "atexit.register = lambda f, *a, **k: (seen.append(sys._getframe(1).f_globals['__name__']), "
            "real(f, *a, **k))[1]\n"
            "import minillm.chat, minillm.serving.chat_api\n"
            "print(sorted({m for m in seen if m and m.startswith('minillm')}))\n"
            "from minillm import chat_pool\n"
            "print(chat_pool._POOL)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[]", "None"], r.stdout
