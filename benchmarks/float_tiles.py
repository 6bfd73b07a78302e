"""The fused float32 product's forms side by side, interleaved in one process: every product weight of
GPT-2-124M (each layer its own matrices, the tied head included: 498 MB, so each comes from memory),
B rows of x, medians of the rounds with each round's ratio. What products.py's BLOCKED_FROM and
BLOCKED were chosen by; run it on a new CPU before trusting the choice there.

    python benchmarks/float_tiles.py                          # B = 1,4,6,8,16,32, 9 rounds, 2 threads
    python benchmarks/float_tiles.py --batch 4,8 --rounds 15 --threads 1

Forms (kernels/_numba.py; each checked against NumPy on the first matrix before timing):
    row    dense_matmul_t           a weight row against every row of x, up to four at a time
    4x4    dense_matmul_t_blocked   four output rows against four rows of x, 16 sums
    6x4    dense_matmul_t_6x4       six output rows against four rows of x, 24 sums (AVX-512's 32
                                    vector registers; on AVX2's 16 it spills)
"""

from __future__ import annotations

import argparse
import os as _os
import statistics
import sys
import time
from pathlib import Path

_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "10")   # before NumPy loads OpenBLAS: as minillm sets it

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = [(2304, 768), (768, 768), (3072, 768), (768, 3072)] * 12 + [(50257, 768)]   # [out, in]


def positive_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers, comma-separated (4,8,16)") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every batch size must be 1 or more")
    return values


def cpu_words() -> str:
    """The CPU by name and LLVM's name for it (what numba compiles for: the forms' code)."""
    name = "?"
    try:
        name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name")), name)
    except OSError:
        pass
    import llvmlite.binding as ll
    return f"{name} ({ll.get_host_cpu_name()})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=positive_list, default=[1, 4, 6, 8, 16, 32],
                    help="rows of x, comma-separated (default 1,4,6,8,16,32)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    ap.add_argument("--threads", type=int, default=2, help="numba threads (default 2)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        ap.error("--rounds and --threads must be 1 or more")
    from minillm.models.fused import DENSE_ROWS
    if max(args.batch) > DENSE_ROWS[1]:                      # before any array is made
        ap.error(f"--batch: at most {DENSE_ROWS[1]} rows of x, the fused forms' reach")

    import numba
    from minillm.kernels import _numba as K
    from minillm.kernels import int8, products
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    forms = {"row": K.dense_matmul_t, "4x4": K.dense_matmul_t_blocked, "6x4": K.dense_matmul_t_6x4}
    rng = np.random.default_rng(0)
    print(f"writing GPT-2-124M's {len(SHAPES)} product weights (random, float32)...", file=sys.stderr,
          flush=True)
    weights = [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]
    print(f"{cpu_words()}; {int8.describe()}\n"
          f"numba {numba.get_num_threads()} threads; the row form below {products.BLOCKED_FROM} rows, then "
          f"{products.BLOCKED.__name__}\n{sum(w.nbytes for w in weights) / 1e6:.0f} MB a pass; "
          f"ms, medians of {args.rounds} rounds [range]")

    def one_pass(form, xs, ys) -> float:
        t = time.perf_counter()
        for w, x, y in zip(weights, xs, ys):
            form(w, x, y)
        return time.perf_counter() - t

    for T in args.batch:
        x = np.random.default_rng(T).standard_normal((T, 3072), dtype=np.float32)
        xs = [np.ascontiguousarray(x[:, :w.shape[1]]) for w in weights]
        ys = [np.empty((T, w.shape[0]), np.float32) for w in weights]
        want = xs[0] @ weights[0].T
        for name, form in forms.items():                      # compiled, and right, before the timer
            form(weights[0], xs[0], ys[0])
            if not np.allclose(ys[0], want, rtol=1e-4, atol=1e-3):
                sys.exit(f"the {name} form disagrees with NumPy at {T} rows: not timed")
        times = {name: [] for name in forms}
        for r in range(args.rounds):
            for name, form in forms.items():
                times[name].append(one_pass(form, xs, ys))
            print(f"  {T} rows: round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)

        def ratio(a: str, b: str) -> str:
            rs = [p / q for p, q in zip(times[a], times[b])]
            return f"{statistics.median(rs):.2f}x [{min(rs):.2f}-{max(rs):.2f}]"
        ms = "  ".join(f"{n} {statistics.median(v) * 1e3:.1f} [{min(v) * 1e3:.1f}-{max(v) * 1e3:.1f}]"
                       for n, v in times.items())
        print(f"{T:3d} rows  {ms}\n          6x4 against 4x4 {ratio('4x4', '6x4')}, against row {ratio('row', '6x4')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
