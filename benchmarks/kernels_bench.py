"""The fused kernels (minillm/kernels/) against NumPy on whole-model passes of the decode products.

For GPT-2 124M's and SmolLM2-135M's product weights (every layer its own matrices, so a pass reads
them all from memory as a decode step does, the tied LM head included), one pass multiplies
B = 1, 2, 4, 8 rows of x by every weight, for each way of holding the weights:

    numpy float32        ops.matmul on [in, out] float32 (BLAS, with the engine's row shaping)
    numpy q8_0/q4_0/q4_1 QuantMatrix.matmul_t (widening a tile at a time, then BLAS)
    fused q8_0/q4_0/q4_1 FusedQuant.matmul (blocks read once, widened in registers)
    fused float32        FusedDense.matmul ([out, in]; fused kernel for 2..8 rows, BLAS for 1)

Rounds are interleaved (every variant once per round, in turn) and each figure is the median over
the rounds; GB/s is the weight bytes the pass reads divided by that median. Weight values are
random (speed does not depend on them; the tests check the values).

    python benchmarks/kernels_bench.py                       # both models, B = 1,2,4,8, 2 threads
    python benchmarks/kernels_bench.py --models smollm2 --batch 1 --rounds 21 --threads 1
    python benchmarks/kernels_bench.py --attention           # also fused vs NumPy attention, 512-token prefill
    python benchmarks/kernels_bench.py --compile             # the one-time compile cost (cold and warm cache)
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import os as _os
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "10")   # before NumPy loads OpenBLAS: as minillm sets it

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minillm import kernels                                    # noqa: E402
from minillm.models.fused import FusedDense, FusedQuant  # noqa: E402
from minillm.measure.threads import blas_kernel, blas_name, blas_threads, limited   # noqa: E402
from minillm.models import ops                                 # noqa: E402
from minillm.models.quant import QK, QuantMatrix, get_format  # noqa: E402

# [in, out] of each product of a layer, the layers, and the tied head's [V, d]
MODELS = {
    "gpt2-124m": dict(layer=[(768, 2304), (768, 768), (768, 3072), (3072, 768)], L=12, head=(50257, 768)),
    "smollm2-135m": dict(layer=[(576, 960), (576, 576), (576, 3072), (1536, 576)], L=30, head=(49152, 576)),
}
FORMATS = ("q8_0", "q4_0", "q4_1")


def random_quant(rng, fmt: str, rows: int, cols: int) -> QuantMatrix:
    """Random stored bytes of a [rows, cols] quantized matrix (scales ~0.01, as trained weights' are)."""
    f = get_format(fmt)
    nb = cols // QK
    q = (rng.integers(-127, 128, (rows, cols), dtype=np.int8) if f.bits == 8
         else rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8))
    d = (rng.random((rows, nb), dtype=np.float32) * 0.02).astype(np.float16)
    m = (rng.random((rows, nb), dtype=np.float32) * -0.1).astype(np.float16) if f.has_min else None
    return QuantMatrix(f, q, d, m)


def build(model: str, rng) -> dict:
    """variant -> list of (weight, n_in, multiply) for one whole pass."""
    spec = MODELS[model]
    shapes = spec["layer"] * spec["L"]
    V, d = spec["head"]
    out = {}
    dense = [rng.standard_normal(s, dtype=np.float32) * 0.02 for s in shapes]    # [in, out]
    wte = rng.standard_normal((V, d), dtype=np.float32) * 0.02                    # [V, d]
    out["numpy float32"] = [(w, w.shape[0], ops.matmul) for w in dense] + [(wte.T, d, ops.matmul)]
    fd = [FusedDense(w) for w in dense] + [FusedDense(wte, transposed=True)]
    out["fused float32"] = [(w, w.n_in, lambda x, w: w.matmul(x)) for w in fd]
    del dense
    for fmt in FORMATS:
        qs = [random_quant(rng, fmt, o, i) for i, o in shapes] + [random_quant(rng, fmt, V, d)]
        out[f"numpy {fmt}"] = [(w, w.shape[1], lambda x, w: QuantMatrix.matmul_t(w, x)) for w in qs]
        out[f"fused {fmt}"] = [(FusedQuant.of(w), w.shape[1], lambda x, w: w.matmul(x)) for w in qs]
    return out


def nbytes(w) -> int:
    return w.nbytes


def bench(model: str, batches: list[int], rounds: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    variants = build(model, rng)
    rows = []
    for B in batches:
        xs = {n: rng.standard_normal((B, n), dtype=np.float32) for n in {n for v in variants.values() for _, n, _ in v}}

        def one_pass(items):
            for w, n, mul in items:
                mul(xs[n], w)

        for items in variants.values():                                  # warm: compile, page in
            one_pass(items)
        times = {k: [] for k in variants}
        for _ in range(rounds):
            for k, items in variants.items():
                t0 = time.perf_counter()
                one_pass(items)
                times[k].append(time.perf_counter() - t0)
        base = float(np.median(times["numpy float32"]))
        for k, items in variants.items():
            med = float(np.median(times[k]))
            read = sum(nbytes(w) for w, _, _ in items)
            rows.append(dict(model=model, B=B, variant=k, ms=med * 1e3, best=float(np.min(times[k])) * 1e3, gbps=read / med / 1e9, mb=read / 1e6,
                             vs_f32=base / med, spread=(float(np.percentile(times[k], 75)) - float(np.percentile(times[k], 25))) / med))
    return rows


def attention_bench(rounds: int) -> list[str]:
    """A 512-token causal prefill of one GPT-2 layer's attention (12 heads of 64) and SmolLM2's
    (9 query heads, 3 KV heads), fused against ops.attention; and one decode query over 1,024 keys."""
    rng = np.random.default_rng(1)
    lines = []
    for name, H, Hkv, T in (("gpt2 prefill", 12, 12, 512), ("smollm2 prefill", 9, 3, 512),
                            ("gpt2 decode@1024", 12, 12, 1024), ("smollm2 decode@1024", 9, 3, 1024)):
        Tq = 1 if "decode" in name else T
        q = rng.standard_normal((H, Tq, 64), dtype=np.float32)
        k = rng.standard_normal((Hkv, T, 64), dtype=np.float32)
        v = rng.standard_normal((Hkv, T, 64), dtype=np.float32)
        kernels.attention(q, k, v)
        ops.attention(q, k, v)
        tn, tf = [], []
        for _ in range(rounds):
            t0 = time.perf_counter(); ops.attention(q, k, v); tn.append(time.perf_counter() - t0)
            t0 = time.perf_counter(); kernels.attention(q, k, v); tf.append(time.perf_counter() - t0)
        a, b = np.median(tn), np.median(tf)
        lines.append(f"  {name:22s} numpy {a * 1e3:8.2f} ms   fused {b * 1e3:8.2f} ms   fused/numpy speed {a / b:5.2f}x"
                     f"   (best rounds {min(tn) * 1e3:.2f} / {min(tf) * 1e3:.2f} ms)")
    return lines


COMPILE = """
import time, numpy as np
t0 = time.perf_counter()
from minillm import kernels
from minillm.models.quant import QuantMatrix
st = kernels.status()
for fmt in ("q8_0", "q4_0", "q4_1"):
    w = FusedQuant.of(QuantMatrix.quantize(np.ones((4, 64), np.float32), fmt))
    w.matmul(np.ones((1, 64), np.float32))
FusedDense(np.ones((64, 4), np.float32)).matmul(np.ones((2, 64), np.float32))
q = np.ones((2, 3, 8), np.float32); k = np.ones((1, 3, 8), np.float32)
kernels.attention(q, k, k); kernels.attention(q[:, :1], k, k)
print(f"{time.perf_counter() - t0:.2f}")
"""


def compile_cost() -> str:
    """Import + first call of every kernel in a fresh process: with an empty numba cache (compiling)
    and again with the cache it left (loading)."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
        run = lambda: float(subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True,
                                           text=True, check=True).stdout.strip().splitlines()[-1])
        cold = run()
        warm = run()
    return f"first use in a fresh process: {cold:.1f} s compiling (empty cache), {warm:.1f} s loading from numba's disk cache"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2-124m,smollm2-135m")
    ap.add_argument("--batch", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attention", action="store_true")
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    st = kernels.status()
    if not st.usable:
        sys.exit(f"the fused kernels cannot run here: {st.reason}")
    if args.compile:
        print(compile_cost())
    batches = [int(b) for b in args.batch.split(",")]
    with limited(args.threads):
        kernels.set_threads(args.threads)
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; BLAS {blas_name()} kernel "
              f"{blas_kernel()} on {blas_threads()} threads; fused kernels ({st.reason}) on {kernels.threads()} threads; "
              f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}")
        print(f"medians of {args.rounds} interleaved rounds; 'x f32' = numpy float32's time / this one's "
              "(same B); spread = interquartile range / median; best = the fastest round (on a busy machine the "
              "least disturbed)")
        for model in [m for m in args.models.split(",") if m]:
            rows = bench(model, batches, args.rounds)
            print(f"\n{model}: one pass over every product weight (decode products, tied head included)")
            print(f"  {'B':>2} {'variant':15s} {'MB read':>8} {'ms/pass':>9} {'GB/s':>6} {'x f32':>6} {'spread':>7} {'best ms':>8}")
            for r in rows:
                print(f"  {r['B']:>2} {r['variant']:15s} {r['mb']:8.1f} {r['ms']:9.2f} {r['gbps']:6.1f} "
                      f"{r['vs_f32']:6.2f} {r['spread']:7.0%} {r['best']:8.2f}")
        if args.attention:
            print("\nattention, one layer, medians of interleaved rounds:")
            print("\n".join(attention_bench(args.rounds)))


if __name__ == "__main__":
    main()
