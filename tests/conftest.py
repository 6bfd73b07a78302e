"""Shared test fixtures: the Hugging Face reference checkpoints in tests/fixtures/."""

from __future__ import annotations

import os

# One BLAS thread for the tests. The matrices here are tiny, and on a small shared machine OpenBLAS's
# threads spin against each other (and against any other job): a naive 60-token generation took 3 s
# with two threads and 0.1 s with one. Must be set before NumPy is first imported; setdefault lets a
# caller choose otherwise.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# The suite's models compute with the NumPy reference unless a test asks for the fused kernels
# (kernels="fused": tests/test_fused_model.py, test_kernels.py); the default elsewhere is fused
# where numba works. MINILLM_KERNELS=fused runs the whole suite on the fused default instead.
os.environ.setdefault("MINILLM_KERNELS", "numpy")
# pytest-xdist's workers (`-n auto`, the README's command) start with COLUMNS=80 and LINES=24 set;
# the commands the tests run then lay out their output for 80 columns instead of a pipe's 150. A
# worker runs them as the single process does: the tests that want a width set it themselves.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

import minillm  # noqa: E402

# No per-example deadline: on a loaded 2-core machine a NumPy example can take longer than
# hypothesis's 200 ms default without anything being wrong.
settings.register_profile("minillm", deadline=None)
settings.load_profile("minillm")

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE_NAMES = ("gpt2-tiny-a", "gpt2-tiny-b")


@dataclass(frozen=True)
class Reference:
    """A fixture checkpoint loaded by minillm, beside what Hugging Face transformers computed from it."""

    name: str
    path: Path
    model: minillm.GPT2
    prompt: np.ndarray   # int64 [P]
    greedy: np.ndarray   # int64 [N]: transformers' greedy continuation of the prompt
    logits: np.ndarray   # float32 [P+N, V]: transformers' forward over prompt + greedy


@pytest.fixture(scope="session", params=REFERENCE_NAMES)
def reference(request) -> Reference:
    path = FIXTURES / request.param
    expected = np.load(path / "expected.npz")
    return Reference(request.param, path, minillm.load(path), expected["input_ids"],
                     expected["greedy_ids"], expected["logits"])


@pytest.fixture(scope="session")
def under_load():
    """benchmarks/lessons_under_load.py, the harness that counts differing verdicts, loaded once: the
    tests that check a sentence is one it reads (`rankings`) share it."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "lessons_under_load", Path(__file__).resolve().parents[1] / "benchmarks" / "lessons_under_load.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m
