"""The GPU check of issue 31: one command, a few minutes on one NVIDIA GPU, one JSON file.

    python benchmarks/gpu_check.py [--out FILE] [--quick]

What it runs, in order, each part timed and kept apart (a part that fails records its one-line
error and the next part runs; no part starts once the time budget is spent):

    tests        the tests marked `gpu` (pytest -m gpu), on this machine's GPU
    hardware     copy bandwidth, float16/float32 matmul peak, launch cost, ridge (minillm.measure.gpu)
    tokens       greedy tokens on the GPU (float32) equal to the CPU's, on the fixtures and on SmolLM2
                 (when it is downloaded here), and to transformers' on the fixtures
    figures      decode steps, eager against one CUDA-graph replay: GPT-2-124M shape fp16 B=1,
                 SmolLM2-135M shape fp16 B=1, Llama-2-7B shape fp16 B=1 (its bytes a step over its
                 time, against the copy bandwidth measured above), and the 7B shape at B=64 and 256

Without CuPy or a GPU it writes {"skipped": "<why>"} and exits 0. Output: --out, else
$OUT/gpu_check.json when $OUT is set, else ./gpu_check.json.

The model parts call minillm's GPU API: `minillm.load(..., device="cuda", dtype=...)`,
`checkpoints.load.random_model(LlamaConfig, dtype=, device=)` and `measure.gpu.decode_figures`
(engine/static.py's StaticDecode, eager and as one CUDA-graph replay).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from minillm import backend  # noqa: E402
from minillm.errors import MiniLLMError  # noqa: E402
from minillm.measure.gpu import H200_RUN, SHAPES, decode_figures  # noqa: E402  (the developers' H200 figures, the shapes)

BUDGET_S = 280          # no part starts after this: the whole check stays under 5 minutes
CONTEXT = 256           # KV positions per sequence in the figures (the static cache)
PROMPT = 16             # prompt tokens before the timed decode steps


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


class Check:
    def __init__(self, quick: bool) -> None:
        self.t0 = time.perf_counter()
        self.quick = quick
        self.report: dict = {"developers_h200": H200_RUN, "parts": {}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def part(self, name: str, fn, *args) -> dict | None:
        """Run one part: its result, or its error in one line (and the traceback's last frames)."""
        if self.elapsed() > BUDGET_S:
            self.report["parts"][name] = {"skipped": f"time budget of {BUDGET_S} s spent"}
            return None
        start = time.perf_counter()
        print(f"[{self.elapsed():6.1f} s] {name} ...", flush=True)
        try:
            result = fn(*args)
        except Exception as e:  # noqa: BLE001  (one part's failure must not stop the others)
            result = {"error": one_line(e), "where": traceback.format_exc(limit=-3).splitlines()[-6:]}
        result["seconds"] = round(time.perf_counter() - start, 1)
        self.report["parts"][name] = result
        print(f"           {json.dumps(result)[:300]}", flush=True)
        return result


# -- parts ---------------------------------------------------------------------------------------------

def run_gpu_tests() -> dict:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rs",
                        "tests/"], cwd=ROOT, capture_output=True, text=True, timeout=150)
    tail = [ln for ln in r.stdout.splitlines() if ln.strip()][-8:]
    return {"returncode": r.returncode, "passed": r.returncode == 0, "summary": tail}


def hardware(quick: bool) -> dict:
    from minillm.measure.gpu import measure_gpu
    return measure_gpu(backend.get_device("cuda"), quick=quick)


def greedy(model, prompt, n: int) -> list[int]:
    import minillm
    return [int(t) for t in minillm.generate(model, [int(t) for t in prompt], n)]


def token_equality() -> dict:
    """Greedy tokens on the GPU (float32) against the CPU's and, on the fixtures, transformers'."""
    import minillm
    out = {}
    fixtures = sorted(p for p in (ROOT / "tests" / "fixtures").iterdir() if (p / "expected.npz").is_file())
    for path in fixtures:
        expected = np.load(path / "expected.npz")
        prompt, want = expected["input_ids"], [int(t) for t in expected["greedy_ids"]]
        cpu = greedy(minillm.load(path), prompt, len(want))
        gpu = greedy(minillm.load(path, device="cuda", dtype="float32"), prompt, len(want))
        half = greedy(minillm.load(path, device="cuda", dtype="float16"), prompt, len(want))   # reported only
        out[path.name] = {"gpu_equals_cpu": gpu == cpu, "gpu_equals_transformers": gpu == want,
                          "tokens": len(want), "float16_agreeing_with_cpu": sum(a == b for a, b in zip(half, cpu))}
    try:
        cpu_model = minillm.load("smollm2-135m")
    except MiniLLMError as e:
        out["smollm2-135m"] = {"skipped": str(e)}
    else:
        enc = minillm.tokenizer(cpu_model)
        prompt = enc.encode("The capital of France is")
        cpu = greedy(cpu_model, prompt, 24)
        gpu = greedy(minillm.load("smollm2-135m", device="cuda", dtype="float32"), prompt, 24)
        out["smollm2-135m"] = {"gpu_equals_cpu": gpu == cpu, "tokens": 24,
                               "first_difference": next((i for i, (a, b) in enumerate(zip(gpu, cpu)) if a != b), None)}
    out["all_equal"] = all(v.get("gpu_equals_cpu", True) for v in out.values() if isinstance(v, dict))
    return out


def random_model(shape: str, dtype: str):
    """A random-weight model of a named shape on the GPU (a Llama shape's matrices drawn there)."""
    import minillm
    if shape == "gpt2-124m":
        return minillm.load("random-124m", device="cuda", dtype=dtype)
    from minillm.models.llama import LlamaConfig
    from minillm.checkpoints.load import random_model as make
    return make(LlamaConfig(**SHAPES[shape]), dtype=dtype, device="cuda")


def step_figures(model, batch: int, steps: int, eager: bool = True) -> dict:
    """Decode steps of `batch` sequences over a static KV of CONTEXT positions: eager and as one graph
    replay, each the median of `steps` timed steps (greedy pick included, as a server runs them)."""
    r = decode_figures(model, batch, CONTEXT, steps, PROMPT, eager=eager)
    out = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}
    out["kernels_per_step"] = r["kernels"]
    if eager and r["kernels"]:
        out["eager_us_per_kernel"] = round(r["eager_ms"] * 1e3 / r["kernels"], 2)
    return out


def figures(check: Check) -> None:
    hw = check.report["parts"].get("hardware", {})
    copy_gbs = hw.get("copy_gbs")
    steps = 10 if check.quick else 50
    for shape in ("gpt2-124m", "smollm2-135m"):
        def small(shape=shape):
            model = random_model(shape, "float16")
            r = step_figures(model, 1, steps)
            if shape == "gpt2-124m":
                ref = H200_RUN["gpt2_124m_fp16_b1"]
                r["goal_graph_within_1.5x_torch_graph"] = r["graph_ms"] <= 1.5 * ref["graph_ms"]
                r["goal_faster_than_transformers_eager"] = r["graph_ms"] < ref["transformers_eager_ms"]
            return r
        check.part(f"{shape}-fp16-b1", small)

    holder = {}

    def big_b1():
        backend.get_device("cuda").xp.get_default_memory_pool().free_all_blocks()   # the small models' memory
        holder["model"] = model = random_model("llama2-7b", "float16")
        r = step_figures(model, 1, steps)
        if copy_gbs:
            r["graph_fraction_of_copy_bandwidth"] = round(r["graph_gbs"] / copy_gbs, 3)
            r["goal_at_least_half_copy_bandwidth"] = r["graph_gbs"] >= 0.5 * copy_gbs
        return r
    check.part("llama2-7b-fp16-b1", big_b1)
    for B in (64, 256):
        if "model" in holder:
            check.part(f"llama2-7b-fp16-b{B}", lambda B=B: step_figures(holder["model"], B, max(5, steps // 5),
                                                                         eager=False))
    holder.clear()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="the JSON file to write (default: $OUT/gpu_check.json or ./gpu_check.json)")
    p.add_argument("--quick", action="store_true", help="smaller measurements, fewer steps (a smoke run)")
    args = p.parse_args(argv)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else Path.cwd()) / "gpu_check.json"
    check = Check(args.quick)
    try:
        device = backend.get_device("cuda")
    except backend.DeviceError as e:
        print(f"gpu_check: skipped: {e}")
        check.report["skipped"] = str(e)
        out.write_text(json.dumps(check.report, indent=1))
        return 0
    check.report["device"] = device.description
    check.part("tests", run_gpu_tests)
    check.part("hardware", hardware, args.quick)
    check.part("tokens", token_equality)
    figures(check)
    check.report["total_seconds"] = round(check.elapsed(), 1)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(check.report, indent=1))
    tmp.replace(out)
    print(f"gpu_check: wrote {out} in {check.report['total_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
