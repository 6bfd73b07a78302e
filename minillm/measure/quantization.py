"""`minillm bench --weights float32,q8_0,q4_0`: do fewer bytes per weight make decode faster?
("native" keeps a GGUF's own quantized matrices, e.g. SmolLM2's Q4_1.)

One model, loaded once per weight format. Interleaved rounds (each format once per round, medians
reported) of:
  - a cached decode step (batch 1) after a prompt of `context` tokens: tokens/s;
  - a prefill of `prefill` tokens: seconds;
  - for a quantized format, the widening alone: every tile of every quantized matrix turned into
    floats exactly as a decode step does it (scales too), without the products; its time against
    the decode step's is the widening's share of the step.
The bytes of a decode step are the meter's (the quantized bytes, scales included, for the
matrices); each format's own ceiling is those bytes at this machine's measured bandwidth, so
"% of ceiling" says how close each format gets to what its bytes allow.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from ..checkpoints.load import load
from ..closeness import round_order
from ..errors import MiniLLMError
from ..meter import Meter
from ..models.quant import (DECODE_ROWS, FORMATS, TILE_BYTES, QuantMatrix, _scratch,
                             f16_to_f32)

FORMAT_NAMES = ("float32", *FORMATS, "native")


def parse_formats(text: str) -> list[str]:
    names = [w.strip().lower() for w in text.split(",") if w.strip()]
    bad = [w for w in names if w not in FORMAT_NAMES]
    if not names or bad:
        raise MiniLLMError(f"--weights {text!r}: give formats from {', '.join(FORMAT_NAMES)}, e.g. float32,q8_0,q4_0")
    return list(dict.fromkeys(names))


def quantized_matrices(model) -> list[QuantMatrix]:
    """The quantized matrices a decode step multiplies, each once (`model.matrices()`: every block's
    products and the LM head, not an untied embedding, of which a step reads one row)."""
    return [m for m in model.matrices() if isinstance(m, QuantMatrix)]


def weights_read_per_step(model) -> int:
    """What one decode step must read of the weights, by its closed form (`model.step_weight_bytes()`:
    every parameter once, a tied embedding as the LM head, plus the rows the step gathers). The
    meter's count is checked against it (lesson 14, tests)."""
    return model.step_weight_bytes()


def widen_pass(mats: list[QuantMatrix]) -> None:
    """What a decode step's products do to widen, and nothing else: per matrix its scales, then
    every tile of integers into the reused float32 scratch."""
    for w in mats:
        R, C = w.shape
        f16_to_f32(w.d, _scratch(w.d.size, np.float32, "scales").reshape(w.d.shape))
        if w.m is not None:
            f16_to_f32(w.m, _scratch(w.m.size, np.float32, "mins").reshape(w.m.shape))
        rows = max(1, min(R, TILE_BYTES // (C * 4)))
        scratch = _scratch(rows * C, np.float32).reshape(rows, C)
        for r0 in range(0, R, rows):
            r1 = min(R, r0 + rows)
            w._widen_raw(w.q_rows(slice(r0, r1)), scratch[:r1 - r0])


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_quant_bench(source, formats: list[str], *, context: int = 16, prefill: int = 128, repeats: int = 5,
                    decode_steps: int = 4, progress=None, bandwidth_gbs: float | None = None,
                    kernels: list[str] | None = None) -> dict:
    """The rounds described above. With `bandwidth_gbs`, each row also has its format's own ceiling
    (`ceiling_tok_s`: its step's bytes at that bandwidth) and the share of it reached (`of_ceiling`).
    kernels: "numpy" and/or "fused", each format loaded with each, all interleaved in the same rounds
    (None: the default kernels). The fused products widen nothing apart: no widening row for them."""
    pairs = [(w, k) for k in (kernels or [None]) for w in formats]
    models = {(w, k): load(source, weights=w, kernels=k) for w, k in pairs}
    first = next(iter(models.values()))
    c = first.config
    if context + repeats * decode_steps + 1 > c.n_ctx or prefill > c.n_ctx:
        raise MiniLLMError(f"context {context} and prefill {prefill} must fit {first.name}'s context of {c.n_ctx}")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, c.vocab_size, context)
    long_prompt = rng.integers(0, c.vocab_size, prefill)
    counted = {}
    for w, model in models.items():
        _, cache = model.prefill(prompt)
        with Meter() as m:
            model.decode_step(1, cache)
        with Meter() as mp:
            model.prefill(long_prompt)
        counted[w] = (m.steps[0], mp.steps[0])
    samples = {w: {"decode": [], "prefill": [], "widen": []} for w in models}
    for i in range(repeats):
        for w in round_order(list(models), i):               # interleaved, each format once per round,
            model = models[w]                                # the order reversed every other round
            _, cache = model.prefill(prompt)
            samples[w]["decode"].append(statistics.median(
                _time(lambda: model.decode_step(1, cache)) for _ in range(decode_steps)))
            samples[w]["prefill"].append(_time(lambda: model.prefill(long_prompt)))
            mats = quantized_matrices(model) if model.kernels == "numpy" else []
            if mats:
                samples[w]["widen"].append(min(_time(lambda: widen_pass(mats)) for _ in range(2)))
            if progress:
                progress()
    med = statistics.median
    rows = []
    for w, model in models.items():
        dec, pre = counted[w]
        s = samples[w]
        t = med(s["decode"])
        rows.append({
            "weights": w[0] if w[0] != "native" else f"native {model.weights}",
            "kernels": model.kernels,
            "model_bytes": model.nbytes(),
            "step_bytes": dec.total_bytes,
            "step_flops": dec.total_flops,
            "weight_bytes": dec.bytes["weights"],
            "weights_read": weights_read_per_step(model),     # the closed form the meter should equal
            "scratch_bytes": dec.scratch,
            "dequant_flops": dec.flops["dequant"],
            "decode_ms": t * 1e3,
            "tok_s": 1 / t,
            "prefill_s": med(s["prefill"]),
            "prefill_tok_s": prefill / med(s["prefill"]),
            "prefill_gflops": pre.total_flops / med(s["prefill"]) / 1e9,
            "widen_ms": med(s["widen"]) * 1e3 if s["widen"] else 0.0,
            "widen_share": med(s["widen"]) / t if s["widen"] else 0.0,
            "decode_rounds_s": s["decode"],                   # per round, in the order they ran
            "prefill_rounds_s": s["prefill"],
        })
        if bandwidth_gbs:
            rows[-1]["ceiling_tok_s"] = bandwidth_gbs * 1e9 / dec.total_bytes
            rows[-1]["of_ceiling"] = rows[-1]["tok_s"] / rows[-1]["ceiling_tok_s"]
    return {"model": first.name, "n_params": first.n_params(), "context": context, "prefill": prefill,
            "repeats": repeats, "decode_rows": DECODE_ROWS, "tile_bytes": TILE_BYTES, "rows": rows,
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def parse_first_context(text: str) -> int:
    try:
        return int(text.split(",")[0])
    except ValueError:
        raise MiniLLMError(f"--contexts {text!r}: expected integers such as 16,128") from None
