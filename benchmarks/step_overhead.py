"""Where a small step goes: each operation's time in a decode step against the time its bytes take
at this machine's measured bandwidth, and the fixed cost of what every operation pays whatever its
bytes (a Python call, a numba call, a parallel region, an argument check, a meter report).

    python benchmarks/step_overhead.py                                  # the bundled model, fused
    python benchmarks/step_overhead.py --model small,smollm2-135m:native --kernels int8
    python benchmarks/step_overhead.py --model smollm2-135m:native@int8,random-124m@fused \
        --trees /tmp/base,.                                             # two source trees, A/B

One process, interleaved rounds: each round times every fixed cost, then --steps decode steps of
every (model, B) in turn with no meter (the step `generate` pays), then traces as many (the caches
cut back to the prompt after each, so every round decodes at the same length), medians over the
rounds with their ranges. A step's operations come from its trace
(minillm.trace.TraceMeter, what `--trace` writes): each slice is the time since the previous report,
so it holds the operation's Python and dispatch as well as its compute. "at bandwidth" is its bytes
over `minillm hardware`'s figure; "beyond" is the slice's median less that, in µs (what is not
bytes: small operations are nearly all of it). The untraced step less its bytes' time is what the
step itself pays beyond them (a meter makes the int8 set run a block's operations one by one, where
a step with none runs every block in one compiled call: the traced rows are the operations'). B = 1
decodes over a contiguous cache, B > 1 over one paged pool. No figure is printed that this run did
not measure.

--trees A,B: the same run over each source tree's minillm (before and after a change), one worker
process a tree (PYTHONPATH=the tree), each with its models loaded once; the rounds alternate between
them, one worker timing while the others wait on their input, the order reversed every round. Then
per (model, B) the step's µs untraced and traced, each beyond its bytes, the traced one as the median
over the rounds of each round's sum over the operations, and each operation's µs a call (the median of each round's medians), with their
ranges, tree beside tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

_GIVEN_ENV = dict(os.environ)   # before minillm's kernels set numba's target here: each --trees worker's own
                                # minillm chooses it (a tree before or after a change of it)

import numpy as np


def _fixed_costs(reps: int):
    """name -> callable timing `reps` calls of one fixed cost, µs per call."""
    from numba import njit, prange

    from minillm.kernels import checks, runtime
    from minillm.meter import Meter

    @njit(cache=False)
    def noop(x, y):
        return None

    @njit(parallel=True, cache=False)
    def region(x, y):
        for i in prange(y.shape[0]):
            y[i] = x[i]

    def py(x, y):
        return None

    n = max(1, runtime.threads() or 1)
    x = np.ones((n, 16), np.float32)
    y = np.empty((n, 16), np.float32)
    wt = np.ones((64, 64), np.float32)
    xr = np.ones((1, 64), np.float32)
    noop(x, y)
    region(x, y)

    def timed(f):
        def run():
            t = time.perf_counter()
            for _ in range(reps):
                f()
            return (time.perf_counter() - t) / reps * 1e6
        return run

    def meter_report():
        m = Meter()
        m.begin("decode", 0, 1)
        t = time.perf_counter()
        for _ in range(reps):
            m.count("op", activations=64, matmul=64)
        dt = time.perf_counter() - t
        m.end()
        return dt / reps * 1e6

    return {"Python call": timed(lambda: py(x, y)),
            "numba call (no work)": timed(lambda: noop(x, y)),
            f"parallel region ({n} items)": timed(lambda: region(x, y)),
            "argument check (a product's)": timed(lambda: checks.dense_product(wt, xr)),
            "meter report": meter_report}


def _setup(spec: str, kernels: str, B: int, context: int, steps: int):
    """spec: a model's name, or name:weights (smollm2-135m:native). B = 1: a contiguous cache (what
    `generate` uses); B > 1: one paged pool of 16-position blocks (what `generate_batch` and the
    engine use: the set's paged kernel attends the batch in one call)."""
    import minillm
    from minillm.cache.paged import PagedKVPool
    spec, _, own = spec.partition("@")                  # NAME[:WEIGHTS][@KERNELS]: this model's own set
    name, _, weights = spec.partition(":")
    model = minillm.load(name, weights=weights or "float32", kernels=own or kernels, quiet=True)
    rng = np.random.default_rng(B)
    pool = PagedKVPool(model.config, B * -(-(context + steps + 1) // 16) + 1, 16) if B > 1 else None
    caches = []
    for _ in range(B):
        c = model.new_cache() if pool is None else pool.sequence()
        model.prefill(rng.integers(0, model.config.vocab_size, context), c)
        caches.append(c)
    return model, caches


def _steps(model, caches, steps: int, context: int) -> list:
    """µs of each of `steps` decode steps of every cache, the caches cut back to `context` after (with
    no meter and no trace: what `generate` pays; `_trace_steps` runs it under a trace)."""
    out = []
    for _ in range(steps):
        for c in caches:
            c.reserve(1)
        t0 = time.perf_counter()
        model.step([(np.array([7]), c) for c in caches])
        out.append((time.perf_counter() - t0) * 1e6)
    for c in caches:
        c.truncate(context)
    return out


def _trace_steps(model, caches, steps: int, context: int):
    """Per operation name: list of (µs, bytes) of each slice; the steps' µs."""
    from minillm.trace import TraceMeter
    tm = TraceMeter()
    with tm:
        _steps(model, caches, steps, context)
    ops, step_us = defaultdict(list), []
    for e in tm.events:
        if e["cat"] == "op":
            ops[e["name"]].append((e["dur"], e["args"].get("bytes", 0)))
        elif e["name"] != "after the last operation":
            step_us.append(e["dur"])
    return ops, step_us


def _round(fixed: dict, configs: dict, a) -> dict:
    """One round: every fixed cost, then --steps decode steps of every (model, B) in turn, untraced,
    then traced."""
    out = {"fixed": {name: f() for name, f in fixed.items()}, "configs": {}}
    for k, (model, caches) in configs.items():
        plain = statistics.median(_steps(model, caches, a.steps, a.context))
        ops, steps = _trace_steps(model, caches, a.steps, a.context)
        out["configs"][k] = {"ops": dict(ops), "step": statistics.median(steps), "plain": plain}
    return out


def _beyond(ops: dict, per: int, bw: float) -> float:
    """µs a step beyond the bytes: over the operations, calls a step x (median µs - its bytes' µs)."""
    total = 0.0
    for xs in ops.values():
        us = statistics.median(d for d, _ in xs)
        at = statistics.median(b for _, b in xs) / bw * 1e6
        total += len(xs) / per * max(us - at, 0.0)
    return total


def _step_bytes(ops: dict, per: int) -> float:
    """A step's bytes: every operation's, over the traced steps."""
    return sum(b for xs in ops.values() for _, b in xs) / per


def _keys(a, batches) -> list[str]:
    return [f"{m}|{B}" for m in a.model.split(",") if m.strip() for B in batches]


def _worker(a, batches) -> int:
    """--worker: load the configs, warm them, then answer each "round" line on stdin with one JSON line
    (prefixed @@, so that anything else the package prints is ignored) until stdin closes."""
    from minillm.errors import MiniLLMError
    from minillm.kernels import runtime
    try:
        configs = {k: _setup(k.split("|")[0], a.kernels, int(k.split("|")[1]), a.context, a.steps)
                   for k in _keys(a, batches)}
    except MiniLLMError as e:
        print(f"@@{json.dumps({'error': str(e)})}", flush=True)
        return 2
    fixed = _fixed_costs(a.reps)
    for (model, caches) in configs.values():
        _trace_steps(model, caches, 1, a.context)
    import minillm
    print("@@" + json.dumps({"ready": True, "threads": runtime.threads(), "from": str(Path(minillm.__file__).parent),
                             "weights": {k: str(m.weights) for k, (m, _) in configs.items()},
                             "kernels": {k: m.kernel_set.name for k, (m, _) in configs.items()}}), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        print("@@" + json.dumps(_round(fixed, configs, a)), flush=True)
    return 0


def _answer(proc) -> dict:
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("a worker stopped before answering (its stderr is above)")
        if line.startswith("@@"):
            return json.loads(line[2:])


def _trees(a, batches, argv, gbs: float, where: str) -> int:
    """--trees: one worker per tree, rounds alternating between them; the table tree beside tree."""
    trees = [Path(t).resolve() for t in a.trees.split(",") if t.strip()]
    for t in trees:
        if not (t / "minillm" / "__init__.py").is_file():
            print(f"step_overhead: {t} holds no minillm package (minillm/__init__.py)", file=sys.stderr)
            return 2
    args = [x for x in (argv if argv is not None else sys.argv[1:])]
    args = [x for i, x in enumerate(args) if not (x.startswith("--trees") or (i and args[i - 1] == "--trees"))]
    args = [x for i, x in enumerate(args) if not (x.startswith("--bandwidth") or (i and args[i - 1] == "--bandwidth"))]
    workers, ready = [], []
    try:
        for t in trees:
            env = {**_GIVEN_ENV, "PYTHONPATH": str(t)}
            workers.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args, "--worker",
                                             "--bandwidth", str(gbs)], cwd=str(t), env=env,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            ready.append(_answer(workers[-1]))       # one loads at a time: loading is not timed
            if "error" in ready[-1]:
                print(f"step_overhead: {ready[-1]['error']}", file=sys.stderr)
                return 2
        rounds = [[] for _ in trees]
        for r in range(a.rounds):
            order = list(range(len(trees)))
            for i in (order if r % 2 == 0 else order[::-1]):
                workers[i].stdin.write("round\n")
                workers[i].stdin.flush()
                rounds[i].append(_answer(workers[i]))
    finally:
        for w in workers:
            if w.stdin:
                w.stdin.close()
            w.wait(timeout=60)
    bw = gbs * 1e9
    names = [t.name for t in trees]
    print(f"{where}, threads: " + ", ".join(f"{n} {r['threads']}" for n, r in zip(names, ready)))
    print(f"medians of {a.rounds} interleaved rounds [range]; the trees' minillm:")
    for n, r in zip(names, ready):
        print(f"  {n} = {r['from']}")
    print("\nfixed cost of one, µs a call   " + "".join(f" {n[:23]:>23s}" for n in names))
    for name in rounds[0][0]["fixed"]:
        cells = []
        for rs in rounds:
            xs = [r["fixed"][name] for r in rs]
            cells.append(f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]")
        print(f"  {name[:28]:28s} " + "".join(f" {c:>23s}" for c in cells))
    per = a.steps
    print("\nµs a step: the step, and beyond its bytes (each round's sum)")
    for k in rounds[0][0]["configs"]:
        m, B = k.split("|")
        print(f"{m.split(':')[0].split('@')[0]} ({ready[0]['weights'][k]}, {ready[0]['kernels'][k]}), B = {B}")
        for label, f in (("step, untraced", lambda c: c["plain"]),
                         ("untraced, beyond its bytes", lambda c: c["plain"] - _step_bytes(c["ops"], per) / bw * 1e6),
                         ("step, traced", lambda c: c["step"]),
                         ("traced, beyond the bytes", lambda c: _beyond(c["ops"], per, bw))):
            cells = []
            for rs in rounds:
                xs = [f(r["configs"][k]) for r in rs]
                cells.append(f"{statistics.median(xs):.0f} [{min(xs):.0f}-{max(xs):.0f}]")
            print(f"  {label:28s} " + "".join(f" {c:>23s}" for c in cells))
        for op in rounds[0][0]["configs"][k]["ops"]:          # each operation: µs a call, each round's median
            cells = []
            for rs in rounds:
                xs = [statistics.median(d for d, _ in r["configs"][k]["ops"][op]) for r in rs
                      if r["configs"][k]["ops"].get(op)]
                cells.append(f"{statistics.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]" if xs else "-")
            print(f"  {op[:14] + ', µs a call':28s} " + "".join(f" {c:>23s}" for c in cells))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small", help="models, comma-separated, each NAME or NAME:WEIGHTS "
                   "(smollm2-135m:native; default: small, the bundled one, float32)")
    p.add_argument("--kernels", default="fused", help="kernel set (default: fused)")
    p.add_argument("--batch", default="1,8", help="batch sizes B, comma-separated (default: 1,8)")
    p.add_argument("--context", type=int, default=32, help="prompt tokens each sequence decodes after (default: 32)")
    p.add_argument("--steps", type=int, default=8, help="decode steps traced per round (default: 8)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default: 7)")
    p.add_argument("--reps", type=int, default=2000, help="calls per fixed-cost timing (default: 2000)")
    p.add_argument("--bandwidth", type=float, default=None, metavar="GBS",
                   help="GB/s to price the bytes at (default: what `minillm hardware` measured)")
    p.add_argument("--trees", default=None, metavar="A,B",
                   help="source trees to compare, each a folder holding minillm/: rounds alternate between them")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        batches = [int(b) for b in a.batch.split(",") if b.strip()]
        if (not batches or min(batches) < 1 or a.rounds < 1 or a.steps < 1 or a.context < 1 or a.reps < 1
                or (a.bandwidth is not None and not a.bandwidth > 0)):
            raise ValueError
    except ValueError:
        print(f"step_overhead: --batch takes positive integers (got {a.batch!r}); --rounds, --steps, --context "
              "--reps and --bandwidth positive", file=sys.stderr)
        return 2

    if a.worker:
        return _worker(a, batches)
    from minillm.errors import MiniLLMError
    from minillm.kernels import runtime
    from minillm.measure import hardware
    if a.trees is not None:
        if a.bandwidth is None:
            hw = hardware.machine(progress=False)
            where, gbs = f"{hw.name}: {hw.bandwidth_gbs:.1f} GB/s (minillm hardware)", hw.bandwidth_gbs
        else:
            where, gbs = f"{a.bandwidth:.1f} GB/s (--bandwidth)", a.bandwidth
        return _trees(a, batches, argv, gbs, where)
    try:
        configs = {(m, B): _setup(m, a.kernels, B, a.context, a.steps)
                   for m in a.model.split(",") if m.strip() for B in batches}
    except MiniLLMError as e:
        print(f"step_overhead: {e}", file=sys.stderr)
        return 2
    if a.bandwidth is None:
        hw = hardware.machine(progress=False)
        where, gbs = f"{hw.name}: {hw.bandwidth_gbs:.1f} GB/s (minillm hardware)", hw.bandwidth_gbs
    else:
        where, gbs = f"{a.bandwidth:.1f} GB/s (--bandwidth)", a.bandwidth
    bw = gbs * 1e9
    fixed = _fixed_costs(a.reps)
    for (model, caches) in configs.values():                      # warm: compiled, caches touched
        _trace_steps(model, caches, 1, a.context)
    fx = defaultdict(list)
    per = {k: (defaultdict(list), [], []) for k in configs}
    for r in range(a.rounds):
        for name, f in fixed.items():
            fx[name].append(f())
        for k, (model, caches) in configs.items():
            per[k][2].append(statistics.median(_steps(model, caches, a.steps, a.context)))
            ops, steps = _trace_steps(model, caches, a.steps, a.context)
            for op, xs in ops.items():
                per[k][0][op].extend(xs)
            per[k][1].append(statistics.median(steps))

    print(f"{where}, {runtime.threads()} threads,")
    print(f"{a.kernels} kernels; medians of {a.rounds} interleaved rounds [range]")
    print("\nfixed cost of one                      µs per call")
    for name, xs in fx.items():
        print(f"  {name:34s} {statistics.median(xs):8.2f} [{min(xs):.2f}-{max(xs):.2f}]")
    for (m, B), (ops, steps, plain) in per.items():
        model = configs[(m, B)][0]
        calls = sum(len(xs) for xs in ops.values()) / (a.rounds * a.steps)
        byts = _step_bytes(ops, a.rounds * a.steps)
        step = statistics.median(steps)
        print(f"\n{m.split('@')[0].partition(':')[0]} ({model.weights}), B = {B}: a decode step {step:.0f} µs "
              f"[{min(steps):.0f}-{max(steps):.0f}],")
        print(f"  untraced {statistics.median(plain):.0f} µs [{min(plain):.0f}-{max(plain):.0f}] (no meter: "
              f"{statistics.median(plain) - byts / bw * 1e6:.0f} µs beyond its bytes),")
        print(f"  {byts / 1e6:.2f} MB = {byts / bw * 1e6:.0f} µs at bandwidth, {calls:.0f} operations")
        print("  operation      calls  µs/call   bytes/call  at bandwidth  beyond")
        rows = []
        for op, xs in ops.items():
            us = statistics.median(d for d, _ in xs)
            b = statistics.median(b for _, b in xs)
            rows.append((len(xs) / (a.rounds * a.steps), op, us, b, b / bw * 1e6))
        for n, op, us, b, at in sorted(rows, key=lambda r: -r[0] * (r[2] - r[4])):
            print(f"  {op[:14]:14s} {n:5.0f} {us:8.2f} {b:12,.0f} {at:13.2f} {us - at:7.2f}")
        beyond = sum(n * max(us - at, 0.0) for n, _, us, _, at in rows)
        print(f"  calls x median beyond the bytes: {beyond:.0f} µs a step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
