"""Is decode running at the speed of memory? The measurements behind `minillm bench`.

For each context length it measures, interleaved and repeated (medians reported):
  - cached decode: one decode_step at that position, tokens/s and achieved GB/s;
  - naive decode: one forward over that many tokens (LM head on the last only), tokens/s;
  - prefill of that many tokens, seconds;
and, in the same run, the **bare matrix-vector pass**: a bare NumPy pass over every weight a decode
step reads (each linear layer and the LM head as one vector-matrix product, nothing else). NumPy's
decode step should not beat it (the gap is Python and the small operations); the fused kernels can,
so it is a reference, not a ceiling (the `ceiling_*` keys keep their old names).

It also measures the two weight layouts a matrix-vector product can stream ([in, out] as the
checkpoint stores them, `x @ W`; and [out, in], `W @ x`), and the cost of the meter: the decode step
with no meter active against the same step with the counting code removed from the operations.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import statistics
import textwrap
import time
import types
from contextlib import contextmanager

import numpy as np

from .. import cache, models
from ..errors import MiniLLMError
from ..meter import Meter
from ..models.int8 import runs_compiled_blocks


# -- the ceiling ---------------------------------------------------------------------------------

def decode_weights(model, chosen=None) -> list[np.ndarray]:
    """The [in, out] arrays of every linear layer a decode step multiplies a vector by (the LM head
    aside: `head_array`). A float model's: the weights are `Dense` (models/weights.py), or the fused
    kernels' FusedDense, kept [out, in] (then copied to [in, out] here, the layout the bare pass
    streams). A mixture of experts': a one-token step's k experts per sparse layer, or the `chosen`
    ones (`model.matrices`)."""
    return [np.ascontiguousarray(np.asarray(w)) for w in model.matrices(head=False, chosen=chosen)]


def head_array(model) -> np.ndarray:
    """The LM head as the NumPy engine multiplies by it: [d, V], contiguous."""
    return np.ascontiguousarray(np.asarray(model.head_w))


def matvec_pass(mats: list[np.ndarray], head: np.ndarray) -> None:
    """One vector through every [in, out] matrix (x @ W), then the LM head stored [d, V]: the engine's layout."""
    for w in mats:
        np.ones((1, w.shape[0]), dtype=w.dtype) @ w
    np.ones((1, head.shape[0]), dtype=head.dtype) @ head


def matvec_pass_out_in(mats_t: list[np.ndarray], wte: np.ndarray) -> None:
    """The other layout: every matrix stored [out, in] (W @ x), the LM head as the checkpoint's [V, d]."""
    for w in mats_t:
        w @ np.ones(w.shape[1], dtype=w.dtype)
    wte @ np.ones(wte.shape[1], dtype=wte.dtype)


# -- the meter's cost ----------------------------------------------------------------------------

def _strip_meter(fn) -> types.FunctionType:
    """A copy of `fn` with its meter report removed (`m = meter.active()` and `if m is not None: ...`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    func = tree.body[0]
    func.body = [s for s in func.body if not _is_meter_stmt(s)]
    func.decorator_list = []
    code = compile(ast.fix_missing_locations(tree), inspect.getsourcefile(fn), "exec")
    namespace = dict(fn.__globals__)
    exec(code, namespace)
    return namespace[fn.__name__]


def _is_meter_stmt(s: ast.stmt) -> bool:
    src = ast.unparse(s)
    return src.startswith("m = meter.active()") or src.startswith("if m is not None")


def _reporters() -> list[tuple[object, str]]:
    """Every function of the model and cache packages (and the fused kernels', where numba runs) that
    reports to the meter (reads `meter.active()`), as (module or class, name): the operations, the
    caches' reads and writes, the fused products and attention."""
    from .. import kernels
    found = []
    for package in (models, cache, *((kernels,) if kernels.available() else ())):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            owners = [module] + [c for c in vars(module).values()
                                 if inspect.isclass(c) and c.__module__ == module.__name__]
            for owner in owners:
                for name, fn in vars(owner).items():
                    if (inspect.isfunction(fn) and fn.__module__ == module.__name__
                            and "active" in fn.__code__.co_names and _reports(fn)):
                        found.append((owner, name))
    return found


def _reports(fn) -> bool:
    """Does `fn` hold a meter report `counting_code_removed` can cut (`m = meter.active()` ...)?"""
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
    except (OSError, TypeError):
        return False
    return any(_is_meter_stmt(s) for s in body)


@contextmanager
def counting_code_removed():
    """Run with the counting code cut out of every operation, to measure what the meter costs idle."""
    saved = [(owner, name, getattr(owner, name)) for owner, name in _reporters()]
    try:
        for owner, name, fn in saved:
            setattr(owner, name, _strip_meter(fn))
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


# -- timing --------------------------------------------------------------------------------------

def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def check_contexts(model, contexts: list[int], decode_steps: int = 8) -> None:
    """Refuse context lengths that leave no room for `decode_steps` decode steps after them."""
    c = model.config
    if not contexts:
        raise MiniLLMError("--contexts: give at least one context length")
    for n in contexts:
        if not 1 <= n < c.n_ctx - decode_steps:
            raise MiniLLMError(f"context {n}: must be between 1 and {c.n_ctx - decode_steps - 1} for this model "
                               f"(context {c.n_ctx}, {decode_steps} decode steps after it)")


def run_bench(model, contexts: list[int], repeats: int = 5, decode_steps: int = 8, progress=None) -> dict:
    check_contexts(model, contexts, decode_steps)
    c = model.config
    rng = np.random.default_rng(0)
    prompts = {n: rng.integers(0, c.vocab_size, n) for n in contexts}
    mats = decode_weights(model)
    mats_t = [np.ascontiguousarray(w.T) for w in mats]     # the [out, in] layout, for the comparison
    head = head_array(model)                                # [d, V]
    wte_vd = np.ascontiguousarray(head.T)                   # [V, d], as the checkpoint stores it
    samples: dict = {n: {"cached": [], "naive": [], "prefill": []} for n in contexts}
    ceiling, layout_oi, stripped, idle, metered = [], [], [], [], []

    # bytes of one cached decode step at each context: from the meter, as the engine reports them
    step_bytes, step_flops, whole = {}, {}, {}
    for n in contexts:
        with Meter() as mp:
            _, cache = model.prefill(prompts[n])
        with Meter() as m:
            model.decode_step(1, cache)
        with Meter() as mn:
            model.forward(prompts[n], last_only=True)
        step_bytes[n], step_flops[n] = m.steps[0].total_bytes, m.steps[0].total_flops
        whole[n] = (mp.totals(), mn.totals())             # the prefill and the naive step, counted

    for _ in range(repeats):
        for n in contexts:                                   # interleaved: every measurement once per round
            prompt = prompts[n]
            samples[n]["prefill"].append(_time(lambda: model.prefill(prompt)))
            _, cache = model.prefill(prompt)
            times = []
            for _ in range(decode_steps):
                times.append(_time(lambda: model.decode_step(1, cache)))
            samples[n]["cached"].append(statistics.median(times))
            samples[n]["naive"].append(_time(lambda: model.forward(prompt, last_only=True)))
            if progress:
                progress()
        io, oi = [], []
        for _ in range(3):                                   # the two layouts alternate, best of 3 each
            io.append(_time(lambda: matvec_pass(mats, head)))
            oi.append(_time(lambda: matvec_pass_out_in(mats_t, wte_vd)))
        ceiling.append(min(io))
        layout_oi.append(min(oi))
        # the meter's idle cost: the same decode step with no meter, with the counting code cut out, metered
        n0 = contexts[0]
        _, cache = model.prefill(prompts[n0])
        idle.append(statistics.median(_time(lambda: model.decode_step(1, cache)) for _ in range(decode_steps)))
        with counting_code_removed():
            _, cache = model.prefill(prompts[n0])
            stripped.append(statistics.median(_time(lambda: model.decode_step(1, cache)) for _ in range(decode_steps)))
        _, cache = model.prefill(prompts[n0])
        with Meter():
            metered.append(statistics.median(_time(lambda: model.decode_step(1, cache)) for _ in range(decode_steps)))
        if progress:
            progress()

    med = statistics.median
    ceiling_s = med(ceiling)
    ceiling_bytes = sum(w.nbytes for w in mats) + head.nbytes
    rows = []
    for n in contexts:
        s = samples[n]
        t_cached = med(s["cached"])
        rows.append({
            "context": n,
            "cached_tok_s": 1 / t_cached,
            "cached_ms": t_cached * 1e3,
            "naive_tok_s": 1 / med(s["naive"]),
            "naive_ms": med(s["naive"]) * 1e3,
            "prefill_s": med(s["prefill"]),
            "step_bytes": step_bytes[n],
            "step_flops": step_flops[n],
            "prefill_bytes": whole[n][0].bytes, "prefill_flops": whole[n][0].flops,
            "naive_bytes": whole[n][1].bytes, "naive_flops": whole[n][1].flops,
            "achieved_gbs": step_bytes[n] / t_cached / 1e9,
            "of_ceiling": ceiling_s / t_cached,
        })
    return {
        "model": model.name,
        "n_params": model.n_params(),
        "repeats": repeats,
        "decode_steps_per_sample": decode_steps,
        "ceiling_ms": ceiling_s * 1e3,
        "ceiling_tok_s": 1 / ceiling_s,
        "ceiling_bytes": ceiling_bytes,
        "ceiling_gbs": ceiling_bytes / ceiling_s / 1e9,
        "layout_in_out_ms": ceiling_s * 1e3,
        "layout_out_in_ms": med(layout_oi) * 1e3,
        "meter_idle_ms": med(idle) * 1e3,
        "meter_removed_ms": med(stripped) * 1e3,
        "meter_on_ms": med(metered) * 1e3,
        "meter_compiled": runs_compiled_blocks(model),     # "meter on" then also runs the operations one by one
        "rows": rows,
    }
