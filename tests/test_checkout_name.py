"""The suite passes in a checkout whatever its folder is called. A checkout named `minillm`, with its
virtual environment inside, puts "/minillm/" in every path of the run, NumPy's included: a test that
tells minillm's own frames by that string then fails there (it did, 5 of 5). This runs the tests that
read file paths from a copy of the checkout in a folder named `minillm`, with an environment inside
it that holds this one's packages."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SENSITIVE = ["tests/test_cli_faults.py::test_ctrl_c_while_the_command_is_still_starting",
             "tests/test_cli_faults.py::test_ctrl_c_while_generating"]


def checkout_named_minillm(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the code and tests in tmp/minillm, and a Python whose packages sit under it."""
    root = tmp_path / "minillm"
    root.mkdir()
    for name in ("minillm", "tests"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("weights", "lessons"):
        (root / name).symlink_to(REPO / name, target_is_directory=True)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    venv = root / ".venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    shutil.rmtree(site)
    site.symlink_to(sysconfig.get_paths()["purelib"], target_is_directory=True)   # paths read .../minillm/.venv/...
    return root, python


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and symlinks")
def test_the_path_sensitive_tests_pass_in_a_checkout_named_minillm(tmp_path):
    root, python = checkout_named_minillm(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *SENSITIVE], cwd=root, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "passed" in r.stdout and "/minillm/.venv/" in subprocess.run(
        [str(python), "-c", "import numpy; print(numpy.__file__)"], cwd=root, capture_output=True, text=True,
        env=env).stdout
