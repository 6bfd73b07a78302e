"""The integer kernels' loop forms against each other and against the float ones, interleaved in one
process: whole-model passes over every product weight of GPT-2-124M or SmolLM2-135M (each layer its
own matrices, the tied head included), B rows of x, medians of the rounds.

    python benchmarks/int8_bench.py                                   # SmolLM2 shapes, Q4_1, B = 1,4,16
    python benchmarks/int8_bench.py --model gpt2-124m --format q8_0 --batch 1,4,16,128 --threads 1

Forms (each computes the same exact integers; all int8 forms equal the NumPy reference bit for bit,
checked before timing on the first matrix):
    numpy f32        ops.matmul on float32 [in, out] (BLAS)
    fused            models.fused.FusedQuant (float32 arithmetic on the widened blocks)
    int8 <isa>       kernels.int8 on each instruction set this CPU has (x rounded inside the call)
    int8 plain loop  the same arithmetic as plain numba loops over int8 (numba types an int8 product
                     as int64), x rounded before the timer starts (its time leaves that out)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import os as _os
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "10")   # before NumPy loads OpenBLAS: as minillm sets it

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minillm import kernels                                     # noqa: E402
from minillm.kernels import int8                                # noqa: E402
from minillm.models import ops                                  # noqa: E402
from minillm.models.fused import FusedQuant                    # noqa: E402
from minillm.models.quant import QK, QuantMatrix, get_format   # noqa: E402
from minillm.threads import blas_threads, limited              # noqa: E402

MODELS = {
    "gpt2-124m": dict(layer=[(768, 2304), (768, 768), (768, 3072), (3072, 768)], L=12, head=(50257, 768)),
    "smollm2-135m": dict(layer=[(576, 960), (576, 576), (576, 3072), (1536, 576)], L=30, head=(49152, 576)),
}


def random_quant(rng, fmt: str, rows: int, cols: int) -> QuantMatrix:
    f = get_format(fmt)
    nb = cols // QK
    q = (rng.integers(-127, 128, (rows, cols), dtype=np.int8) if f.bits == 8
         else rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8))
    d = (rng.random((rows, nb), dtype=np.float32) * 0.02).astype(np.float16)
    m = (rng.random((rows, nb), dtype=np.float32) * -0.1).astype(np.float16) if f.has_min else None
    return QuantMatrix(f, q, d, m)


def plain_kernel():
    """The reference's steps 3-5 as plain numba loops (x already rounded: q [T, nb, 32] int8, d, m)."""
    from numba import njit, prange

    @njit(parallel=True, cache=True)
    def plain(wi, dw, mw, has_min, qx, dx, mx, y):
        R, nb, _ = wi.shape
        T = qx.shape[0]
        for r in prange(R):
            for t in range(T):
                a = np.float32(0.0)                 # the row's blocks added in order (step 5)
                for b in range(nb):
                    s = 0
                    for k in range(QK):
                        s += np.int32(wi[r, b, k]) * np.int32(qx[t, b, k])
                    p = (dw[r, b] * dx[t, b]) * np.float32(s)
                    if has_min:
                        p = p + mw[r, b] * mx[t, b]
                    a = a + p
                y[t, r] = a
    return plain


def build(model: str, fmt: str, rng) -> tuple[dict, list]:
    spec = MODELS[model]
    shapes = spec["layer"] * spec["L"] + [tuple(reversed(spec["head"]))]          # [in, out]
    qs = [random_quant(rng, fmt, o, i) for i, o in shapes]
    dense = [rng.standard_normal(s, dtype=np.float32) * 0.02 for s in shapes]
    v = {"numpy f32": [(lambda x, w=w: ops.matmul(x, w), w.shape[0], w.nbytes) for w in dense]}
    fused = [FusedQuant.of(w) for w in qs]
    v[f"fused {fmt}"] = [(w.matmul, w.shape[1], w.nbytes) for w in fused]
    for name in int8.supported():          # laid out once, as a weight keeps them (not by matmul, each call)
        v[f"int8 {name}"] = [(lambda x, p=int8.lane_order(int8.planes(w.q, w.d, w.m)), n=name: int8.matmul(p, x, n),
                               w.shape[1], w.nbytes)
                             for w in fused]
    plain = plain_kernel()
    pre = []
    for w in qs:
        wi = int8.weight_ints(int8.planes(w.q, w.d, w.m))
        dw = w.d.astype(np.float32)
        mw = w.m.astype(np.float32) if w.m is not None else np.zeros_like(dw)
        pre.append((w, wi, dw, mw, w.m is not None))
    return v, (plain, pre)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", choices=list(MODELS))
    ap.add_argument("--format", default="q4_1", choices=["q8_0", "q4_0", "q4_1"])
    ap.add_argument("--batch", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-plain", action="store_true", help="leave out the plain-loop form (slow)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with limited(args.threads):
        kernels.set_threads(args.threads)
        variants, (plain, pre) = build(args.model, args.format, rng)
        print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {int8.describe()}; "
              f"BLAS on {blas_threads()} threads, numba on {kernels.threads()}; load {os.getloadavg()[0]:.2f}")
        print(f"{args.model}, {args.format}: one pass over every product weight; medians of {args.rounds} "
              "interleaved rounds; 'x f32' = numpy f32's time / this one's")
        for B in [int(b) for b in args.batch.split(",")]:
            xs = {n: rng.standard_normal((B, n), dtype=np.float32) for n in {n for it in variants.values() for _, n, _ in it}}
            w0, x0 = pre[0][0], xs[pre[0][0].shape[1]]
            p0 = int8.planes(w0.q, w0.d, w0.m)
            for name in int8.supported():                                     # equal to the reference first
                assert np.array_equal(int8.matmul(p0, x0, name), int8.matmul_ref(p0, x0)), name
            rounded = {n: int8.quantize_x_ref(x) for n, x in xs.items()}
            forms = dict(variants)
            if not args.no_plain:
                def run_plain():
                    for w, wi, dw, mw, hm in pre:
                        qx, dx, _, mx = rounded[w.shape[1]]
                        plain(wi, dw, mw, hm, qx, dx, mx, np.empty((B, w.shape[0]), np.float32))
                forms["int8 plain loop"] = [(lambda x: run_plain(), 0, sum(w.nbytes for w, *_ in pre))]
                qx, dx, _, mx = rounded[w0.shape[1]]
                y = np.empty((B, w0.shape[0]), np.float32)
                plain(*pre[0][1:], qx, dx, mx, y)
                assert np.array_equal(y, int8.matmul_ref(p0, x0))
            times = {k: [] for k in forms}
            for r in range(args.rounds + 1):                                  # the first round warms up
                for k, items in forms.items():
                    t0 = time.perf_counter()
                    for f, n, _ in items:
                        f(xs.get(n))
                    if r:
                        times[k].append(time.perf_counter() - t0)
            base = float(np.median(times["numpy f32"]))
            print(f"\nB = {B}")
            print(f"  {'form':22} {'ms/pass':>8} {'GB/s':>6} {'x f32':>6} {'spread':>7}")
            for k, items in forms.items():
                med = float(np.median(times[k]))
                gb = sum(b for _, _, b in items) / med / 1e9
                spread = (np.percentile(times[k], 75) - np.percentile(times[k], 25)) / med
                print(f"  {k:22} {med * 1e3:8.2f} {gb:6.1f} {base / med:6.2f} {spread:7.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
