"""What the kernels' argument checks (minillm/kernels/checks.py) cost a decode step: the same model,
the same steps, with the checks and with each replaced by a no-op (what the wrappers did before them:
the table and lengths still made intp arrays), interleaved round by round in one process; medians.

    decode     model.decode_step at context --context, batch 1 (contiguous cache: the fused
               attention, norms, rotations, SwiGLU, products)
    batched    an Engine's decode steps of --batch sequences over a paged pool (the paged kernel,
               its block table's min and max checked every layer)

    python benchmarks/kernel_checks.py                              # random-moe-16x2-dense (a Llama), q4_1
    python benchmarks/kernel_checks.py --model random-124m --weights float32 --rounds 31 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import os as _os
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "10")   # before NumPy loads OpenBLAS: as minillm sets it

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import minillm                                            # noqa: E402
from minillm.kernels import checks                        # noqa: E402

REAL = {name: getattr(checks, name) for name in ("quant_product", "dense_product", "attention", "paged",
                                                 "rms_norm", "rope", "swiglu", "positive")}
NONE = {name: (lambda *a, **k: None) for name in REAL} | {
    "attention": lambda q, k, v, Tk: k.shape[1] if Tk is None else int(Tk),
    "paged": lambda q, kp, vp, table, lengths: (np.ascontiguousarray(table, np.intp),
                                                np.ascontiguousarray(lengths, np.intp)),
}


def use(funcs: dict) -> None:
    for name, f in funcs.items():
        setattr(checks, name, f)


def decode_seconds(model, context: int, steps: int) -> float:
    """Median seconds of `steps` decode steps after a prefill of `context` tokens."""
    ids = np.arange(1, context + 1) % model.config.vocab_size
    logits, cache = model.prefill(ids)
    token, times = int(np.argmax(logits)), []
    for _ in range(steps):
        t = time.perf_counter()
        logits = model.decode_step(token, cache)
        times.append(time.perf_counter() - t)
        token = int(np.argmax(logits))
    return statistics.median(times)


def batched_seconds(model, batch: int, context: int, steps: int) -> float:
    """Median seconds of an Engine's decode steps, `batch` sequences over a paged pool."""
    from minillm.engine.engine import Engine
    engine = Engine(model, kv_memory=64 << 20, block_size=16, max_seqs=batch, max_batched_tokens=batch * context)
    for b in range(batch):
        engine.add_request(list((np.arange(context) + 7 * b) % model.config.vocab_size + 1), steps + 2)
    times = []
    while engine.has_work:
        t = time.perf_counter()
        info = engine.step()
        if info is not None and info.prefill_tokens == 0:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="random-moe-16x2-dense")
    ap.add_argument("--weights", default="q4_1")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed per round")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1, help="BLAS and numba threads (default 1: steadier on a "
                    "busy machine, where a parallel kernel waits for a descheduled thread)")
    a = ap.parse_args()
    from minillm.threads import limited
    with limited(a.threads):
        return measure(a)


def measure(a) -> int:
    model = minillm.load(a.model, weights=a.weights, kernels="fused")
    print(f"{a.model}, weights {a.weights}, kernels {model.kernels}, {a.threads} thread(s); {a.rounds} rounds "
          f"of {a.steps} steps, the two forms interleaved; medians")
    for name, run in (("decode", lambda: decode_seconds(model, a.context, a.steps)),
                      ("batched", lambda: batched_seconds(model, a.batch, a.context, a.steps))):
        got = {"checks": [], "none": []}
        run()                                               # warm: compiled, caches touched
        for r in range(a.rounds):
            for form in (("checks", "none") if r % 2 == 0 else ("none", "checks")):
                use(REAL if form == "checks" else NONE)
                got[form].append(run())
        use(REAL)
        on, off = statistics.median(got["checks"]), statistics.median(got["none"])
        print(f"{name:8} with checks {on * 1e3:8.3f} ms/step   without {off * 1e3:8.3f} ms/step   "
              f"difference {(on - off) * 1e6:+8.1f} µs ({(on - off) / off:+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
