"""`pip install .` into a fresh venv: import, load and the bundled data work from the repository root
(where the source folder shadows the installed package) and from elsewhere; `eval` needs no --data."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PROBE = ("import minillm, minillm.data as d; m = minillm.load(); print(minillm.__file__); print(m.name); "
         "print(len(minillm.tokenizer().encode('ROMEO:'))); print(d.bundled_text_path().stat().st_size); "
         "import minillm.lessons._common, minillm.cli.learn as l; print(len(l.LESSONS))")


@pytest.mark.slow
def test_fresh_venv_install(tmp_path):
    src = tmp_path / "clone"   # a copy of the checkout, as a fresh clone would be: no build leftovers
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*cache*", ".hypothesis"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # The dependencies come from this test run's environment (no network needed); minillm itself is
    # built and installed from the copy, non-editable, exactly as the README's `pip install .`.
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    Path(purelib, "deps-from-test.pth").write_text("\n".join(sorted(ours)) + "\n")
    r = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "."],
                       cwd=src, capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and "setuptools" in (r.stdout + r.stderr):
        r = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "-q", "."],
                           cwd=src, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["MINILLM_HOME"] = str(tmp_path / "home")
    for cwd in (src, elsewhere):   # the repository root shadows the installed package: it must work too
        probe = subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)
        assert probe.returncode == 0, f"from {cwd}: {probe.stderr[-2000:]}"
        module, name, n, size, lessons = probe.stdout.split("\n")[:5]
        assert name == "minillm-shakespeare" and n == "3" and size == "1115394" and int(lessons) >= 7, probe.stdout
        if cwd == elsewhere:
            assert "site-packages" in module, module
    minillm = venv / "bin" / "minillm"
    r = subprocess.run([str(minillm), "eval"], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=600)
    assert r.returncode == 0 and "held-out loss 4.8" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([str(py), "-m", "minillm.lessons.01_tokens", "--fast", "--no-pause"], capture_output=True,
                       text=True, cwd=src, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "site-packages" not in r.stdout.split("Try it yourself")[-1].split("cp ")[0]


@pytest.mark.slow
def test_train_and_eval_default_to_the_bundled_text(tmp_path):
    env = {**os.environ, "MINILLM_HOME": str(tmp_path / "home")}
    out = tmp_path / "tiny"
    r = subprocess.run([sys.executable, "-m", "minillm", "train", "--steps", "2", "--layers", "1", "--heads", "1",
                        "--width", "16", "--context", "16", "--batch", "2", "--eval-every", "1", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "tinyshakespeare.txt" in r.stdout + r.stderr and (out / "model.safetensors").is_file()
    r = subprocess.run([sys.executable, "-m", "minillm", "eval", "--model", str(out)],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and "held-out loss" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_every_package_is_listed_for_installation():
    """A folder of minillm/ with an __init__.py that pyproject.toml does not list is left out of
    `pip install .` (editable installs hide it; this caught minillm.serving)."""
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "minillm").rglob("__init__.py")}
    assert found <= listed, f"not in pyproject.toml's packages: {sorted(found - listed)}"
