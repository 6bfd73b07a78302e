"""minillm beside llama.cpp on the same weights and the same threads, every case interleaved round by
round (minillm's side, then each llama.cpp build's), medians of the rounds with their ranges: issue 51's goals.

    python benchmarks/vs_llamacpp.py --llama-bin BUILD/bin [--llama-bin OTHER/bin] --rounds 7 --threads 2
    python benchmarks/vs_llamacpp.py --llama-bin BIN --cases smollm2,gpt2,batch
    python benchmarks/vs_llamacpp.py --cases q8                        # minillm alone: int8 Q8_0 against NumPy

Build llama.cpp yourself (from the `llama-cpp-python` sdist's vendored copy, say; llama-bench and
llama-batched-bench); the script only runs the binaries in each --llama-bin. Give several builds (a native
one and one without AMX, say): a build that dies on this CPU (SIGILL) is left out and said so, and every row
is compared with the fastest build that ran it. Needs `minillm download smollm2-135m` for the SmolLM2
cases; the GPT-2 cases write random-124m (seeded, so the same weights minillm loads) as a float32 GGUF with
`minillm quantize` into a temporary folder, or take --gpt2-gguf.

Cases (tokens/s; llama-bench runs -r 1 a round, after its own warm-up; minillm's prefills reuse one cache
per model, emptied first, as llama-bench reuses its context's):
    q8        random-124m decode: --kernels int8 on Q8_0 against NumPy float32
    smollm2   SmolLM2-135M's native Q4_1: decode of 64 tokens from a 1-token prompt (llama-bench tg64)
              and a 512-token prefill (pp512), minillm's int8 and fused sets
    gpt2      random-124m float32: decode (tg64) and prefill (pp512), minillm's fused set
    batch     random-124m float32, B sequences of 16 prompt tokens decoding 32 steps together:
              B·32 / the decode time (llama-batched-bench's S_TG), B = 1..32

Byte ceilings: a decode step's bytes (the meter's; a batched step's shared by its B tokens) over the speed
of a read of memory (`minillm hardware`'s methods, at the start and then once a round, interleaved with the
sides: the host's speed moves) give the tokens/s the bytes allow. Each memory-bound case prints both sides'
share of it at the median read, and what a goal's rate would take at the median read and at the fastest
("beyond the ceiling" only past the fastest: no engine reads a step's bytes faster than this machine did).

Goals (issue 51): SmolLM2 Q4_1 decode >= 70% of its byte ceiling at the fastest read; GPT-2 f32 decode,
prefill and every batch size >= 1.2x the fastest llama.cpp build. A ratio whose two sides' ranges overlap
is "not ranked", and a goal it reaches is "not shown": met needs both.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
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

import minillm                                                  # noqa: E402
from minillm import kernels                                     # noqa: E402
from minillm.cache.paged import PagedKVPool                     # noqa: E402
from minillm.kernels import int8                                # noqa: E402
from minillm.threads import limited                             # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32)


def decode_rate(model, steps: int = 64) -> float:
    """Tokens/s of `steps` decode steps after a one-token prompt (llama-bench's tg: from an empty context)."""
    logits, cache = model.prefill(np.array([1]))
    t0 = time.perf_counter()
    tok = int(np.argmax(logits))
    for _ in range(steps):
        tok = int(np.argmax(model.decode_step(tok, cache)))
    return steps / (time.perf_counter() - t0)


_HELD: dict[int, object] = {}       # id(model) -> the cache its prefills reuse


def prefill_rate(model, n: int = 512) -> float:
    """Tokens/s of an n-token prefill into a cache the model already holds, emptied first, as llama-bench's
    pp clears its context's cache between repetitions: a new cache's first writes fault its pages in,
    which a server's pool pays once (GPT-2's prefill of 512, 10 interleaved rounds on an AMD EPYC Zen 5
    VM: into a new cache 481 ms, 22 of them writing the keys and values; into a held one 445 and 4)."""
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, n)
    if id(model) not in _HELD:
        _HELD[id(model)] = model.new_cache()
    cache = _HELD[id(model)]
    cache.truncate(0)
    t0 = time.perf_counter()
    model.prefill(ids, cache)
    return n / (time.perf_counter() - t0)


def _batch(model, B: int, prompt: int = 16, steps: int = 32, block: int = 16):
    """B sequences of `prompt` random tokens prefilled into one paged pool with room for `steps` more
    -> their caches and each one's next token."""
    rng = np.random.default_rng(B)
    pool = PagedKVPool(model.config, B * (-(-(prompt + steps + 1) // block)) + 2, block)
    caches, toks = [], []
    for _ in range(B):
        c = pool.sequence()
        logits, _ = model.prefill(rng.integers(0, model.config.vocab_size, prompt), c)
        caches.append(c)
        toks.append(int(np.argmax(logits)))
    return caches, toks


def _batch_step(model, caches, toks) -> list[int]:
    for c in caches:
        c.reserve(1)
    outs = model.step([(np.array([t]), c) for t, c in zip(toks, caches)])
    return [int(np.argmax(o)) for o in outs]


def batch_rate(model, B: int, prompt: int = 16, steps: int = 32) -> float:
    """B·steps / seconds of `steps` batched decode steps of B sequences in one paged pool."""
    caches, toks = _batch(model, B, prompt, steps)
    t0 = time.perf_counter()
    for _ in range(steps):
        toks = _batch_step(model, caches, toks)
    return B * steps / (time.perf_counter() - t0)


def llama_bench(bin_dir: Path, gguf: Path, threads: int, p: int, n: int) -> float:
    """llama-bench's tokens/s for one test (-p p -n 0, or -p 0 -n n), one repetition."""
    out = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", str(p),
                          "-n", str(n), "-r", "1", "-o", "json"], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def llama_batched(bin_dir: Path, gguf: Path, threads: int, batches) -> dict[int, float]:
    """llama-batched-bench's S_TG (tokens/s of the decode steps) for each B, 16 prompt and 32 new tokens."""
    out = subprocess.run([str(bin_dir / "llama-batched-bench"), "-m", str(gguf), "-t", str(threads), "-c", "4096",
                          "-npp", "16", "-ntg", "32", "-npl", ",".join(map(str, batches))],
                         capture_output=True, text=True, check=True)
    rates = {}
    for line in (out.stdout + out.stderr).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[2].isdigit():
            rates[int(cells[2])] = float(cells[7])
    return rates


def build_name(bin_dir: Path) -> str:
    """'build-noamx' for .../build-noamx/bin: the folder that names the build."""
    return bin_dir.parent.name if bin_dir.name == "bin" else bin_dir.name


def dies_here(bin_dir: Path, gguf: Path, threads: int) -> str | None:
    """Why this build cannot run on this CPU (a signal, e.g. SIGILL for AMX code on a host without it), or None."""
    out = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-p", "0", "-n", "2",
                          "-r", "1", "-o", "json"], capture_output=True, text=True)   
    if out.returncode < 0:
        import signal
        return f"killed by {signal.Signals(-out.returncode).name}"
    if out.returncode:
        return f"exit {out.returncode}: {(out.stderr.strip().splitlines() or ['?'])[-1][:80]}"
    return None


def host_words() -> str:
    """The CPU by name, LLVM's name for it (what numba compiles for), the int8 dot and BLAS's kernels."""
    name = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import llvmlite.binding as ll
    from threadpoolctl import threadpool_info
    blas = ", ".join(f"{i.get('internal_api')} {i.get('architecture', '?')}" for i in threadpool_info()
                     if i.get("user_api") == "blas")
    return f"{name} ({ll.get_host_cpu_name()}); {int8.describe()}; BLAS: {blas or '?'}"


def step_bytes(model, position: int = 32) -> int:
    """The meter's bytes of one decode step at `position` (the middle of llama-bench's tg64)."""
    from minillm.meter import Meter
    _, cache = model.prefill(np.arange(1, position + 1) % model.config.vocab_size)
    with Meter() as m:
        model.decode_step(1, cache)
    return m.steps[0].total_bytes


def batch_step_bytes(model, B: int, prompt: int = 16, steps: int = 32) -> int:
    """The meter's bytes of one batched decode step of B sequences half way through `batch_rate`'s
    steps (the weights once, each sequence's keys and values)."""
    from minillm.meter import Meter
    caches, toks = _batch(model, B, prompt, steps)
    for _ in range(steps // 2):
        toks = _batch_step(model, caches, toks)
    with Meter() as m:
        _batch_step(model, caches, toks)
    return m.steps[0].total_bytes


def ceiling_words(need_median: float, need_fastest: float) -> str:
    """What a goal asks of the bytes: the share of a step's byte ceiling its rate would take, at the
    median read of memory in the run (the memory's speed at the rounds' moments) and at the fastest
    (the most this machine read)."""
    if need_fastest > 1:
        return "beyond the ceiling: no engine reads a step's bytes that fast here"
    if need_median > 1:
        return "past the median read: only at the run's fastest moments"
    return "within the ceiling"


def goal_words(share: float, goal: float) -> str:
    """A share against its goal, cut (not rounded) to a tenth of a percent, so the figure never shows
    the goal's own value beside "missed" (a run printed "70%, missed" for 69.6%)."""
    cut = math.floor(share * 1000)                                  # tenths of a percent
    if share < goal:
        cut = min(cut, math.ceil(goal * 1000) - 1)                  # under the goal's figure, always
    return f"{cut / 10:.1f}%, {'met' if share >= goal else 'missed'}"


def overlap(a: list[float], b: list[float]) -> bool:
    """True when the two sides' rounds overlap, or there are too few rounds (under 3) to rank at all."""
    return len(a) < 3 or len(b) < 3 or (min(a) <= max(b) and min(b) <= max(a))


def verdict(ratio: float, goal: float, ranked: bool) -> str:
    """A goal's word: met only where the medians' ratio reaches it and the two sides' rounds do not
    overlap; a ratio that reaches it inside overlapping rounds is not shown (a busy round can make
    it); one that falls short is missed."""
    if ratio < goal:
        return "missed"
    return "met" if ranked else "not shown (the rounds overlap)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", type=Path, action="append", default=[],
                    help="folder with llama-bench and llama-batched-bench (repeat it for several builds)")
    ap.add_argument("--cases", default="q8,smollm2,gpt2,batch")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpt2-gguf", type=Path, help="random-124m as a float32 GGUF (default: written to a temp folder)")
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in ("q8", "smollm2", "gpt2", "batch")]
    if unknown:
        sys.exit(f"--cases: unknown {', '.join(unknown)} (known: q8, smollm2, gpt2, batch)")
    if args.rounds < 1:
        sys.exit("--rounds: at least 1")
    missing = [str(b) for b in args.llama_bin if not (b / "llama-bench").is_file()]
    if missing or (any(c != "q8" for c in cases) and not args.llama_bin):
        sys.exit(f"--llama-bin: no llama-bench in {', '.join(missing)}" if missing else
                 "--llama-bin: give the folder holding llama-bench and llama-batched-bench (or --cases q8)")
    tmp = tempfile.TemporaryDirectory()
    gpt2_gguf = args.gpt2_gguf
    if ("gpt2" in cases or "batch" in cases) and gpt2_gguf is None:
        gpt2_gguf = Path(tmp.name) / "random-124m-f32.gguf"
        subprocess.run([sys.executable, "-m", "minillm", "quantize", "random-124m", "--format", "float32",
                        "--out", str(gpt2_gguf)], check=True, capture_output=True)
    smol_gguf = None
    if "smollm2" in cases:
        from minillm.checkpoints.smollm import find
        smol_gguf = find()
        if smol_gguf is None or smol_gguf.suffix != ".gguf":
            sys.exit("SmolLM2's GGUF is missing: minillm download smollm2-135m")
    t = args.threads
    builds: dict[str, Path] = {}
    probe = smol_gguf or gpt2_gguf
    for b in args.llama_bin:
        why = dies_here(b, probe, t) if probe else None
        if why:
            print(f"llama.cpp {build_name(b)} left out: it does not run here ({why})", file=sys.stderr)
        else:
            builds[build_name(b)] = b
    if any(c != "q8" for c in cases) and not builds:
        sys.exit("no llama.cpp build given runs on this CPU")
    rows: dict[str, dict[str, list[float]]] = {}        # case -> side -> tokens/s, one per round

    def add(case: str, side: str, value: float) -> None:
        rows.setdefault(case, {}).setdefault(side, []).append(value)

    dead: set[tuple[str, str]] = set()                  # (case, build) that died on this CPU: said once, not run again

    def llama(case: str, name: str, run) -> None:
        """One llama.cpp measurement (run() gives tokens/s, or a dict of B -> tokens/s for the batch cases)."""
        if (case, name) in dead:
            return
        try:
            v = run()
        except subprocess.CalledProcessError as exc:
            if exc.returncode >= 0:
                raise
            import signal
            dead.add((case, name))
            print(f"llama.cpp {name} left out of {case}: killed by {signal.Signals(-exc.returncode).name} "
                  "on this CPU", file=sys.stderr)
            return
        if isinstance(v, dict):
            for B, rate in v.items():
                add(f"GPT-2 f32 batch {B:2d}", f"llama.cpp {name}", rate)
        else:
            add(case, f"llama.cpp {name}", v)

    with limited(t):
        kernels.set_threads(t)
        from minillm.measure.hardware import measure_machine
        from minillm.measure.probe import measure_bandwidth
        # this machine's bandwidth, now, at these threads; measured, not cached: a benchmark does not
        # replace the figures the user's roofline clock prices at (a priced verdict follows them)
        hw = measure_machine(progress=False)
        models = {}
        if "q8" in cases:
            models["q8 numpy f32"] = minillm.load("random-124m", kernels="numpy")
            models["q8 int8"] = minillm.load("random-124m", weights="q8_0", kernels="int8")
        if "smollm2" in cases:
            for k in ("int8", "fused"):
                models[f"smollm2 {k}"] = minillm.load("smollm2-135m", weights="native", kernels=k)
        if "gpt2" in cases or "batch" in cases:
            models["gpt2 fused"] = minillm.load("random-124m", kernels="fused")
        for m in models.values():                                      # compile, page in
            decode_rate(m, 2)
            prefill_rate(m, 512)
        step_mb = {}                                              # case -> the meter's MB of its step
        if "smollm2" in cases:
            step_mb["SmolLM2 Q4_1 decode"] = step_bytes(models["smollm2 int8"]) / 1e6
        if "gpt2" in cases:
            step_mb["GPT-2 f32 decode"] = step_bytes(models["gpt2 fused"]) / 1e6
        if "batch" in cases:
            for B in BATCHES:
                step_mb[f"GPT-2 f32 batch {B:2d}"] = batch_step_bytes(models["gpt2 fused"], B) / 1e6 / B
        print(f"{host_words()}\n{hw.bandwidth_gbs:.1f} GB/s measured now ({hw.method}); minillm and llama.cpp "
              f"({', '.join(builds) or 'none'}) on {t} threads; {args.rounds} interleaved rounds", file=sys.stderr)
        reads = [hw.bandwidth_gbs]                     # GB/s: the start's, then one read a round (the host's
        for r in range(args.rounds):                   # speed moves): their median and their fastest
            reads.append(measure_bandwidth(repeats=1)["bandwidth_gbs"])
            if "q8" in cases:
                add("random-124m decode", "minillm NumPy float32", decode_rate(models["q8 numpy f32"]))
                add("random-124m decode", "minillm int8 Q8_0", decode_rate(models["q8 int8"]))
            if "smollm2" in cases:
                for k in ("int8", "fused"):
                    add("SmolLM2 Q4_1 decode", f"minillm {k}", decode_rate(models[f"smollm2 {k}"]))
                for name, b in builds.items():
                    llama("SmolLM2 Q4_1 decode", name, lambda: llama_bench(b, smol_gguf, t, 0, 64))
                for k in ("int8", "fused"):
                    add("SmolLM2 Q4_1 prefill 512", f"minillm {k}", prefill_rate(models[f"smollm2 {k}"]))
                for name, b in builds.items():
                    llama("SmolLM2 Q4_1 prefill 512", name, lambda: llama_bench(b, smol_gguf, t, 512, 0))
            if "gpt2" in cases:
                add("GPT-2 f32 decode", "minillm fused", decode_rate(models["gpt2 fused"]))
                for name, b in builds.items():
                    llama("GPT-2 f32 decode", name, lambda: llama_bench(b, gpt2_gguf, t, 0, 64))
                add("GPT-2 f32 prefill 512", "minillm fused", prefill_rate(models["gpt2 fused"]))
                for name, b in builds.items():
                    llama("GPT-2 f32 prefill 512", name, lambda: llama_bench(b, gpt2_gguf, t, 512, 0))
            if "batch" in cases:
                for B in BATCHES:
                    add(f"GPT-2 f32 batch {B:2d}", "minillm fused", batch_rate(models["gpt2 fused"], B))
                for name, b in builds.items():
                    llama("GPT-2 f32 batches", name, lambda: llama_batched(b, gpt2_gguf, t, BATCHES))
            print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    med = {(c, side): statistics.median(v) for c, sides in rows.items() for side, v in sides.items()}
    print(f"{'case':26} {'side':24} {'tok/s':>9} {'range':>17}")
    for c, sides in rows.items():
        for side, v in sides.items():
            print(f"{c:26} {side:24} {med[c, side]:9.1f} {min(v):8.1f}-{max(v):<8.1f}")

    def fastest_llama(c: str) -> str | None:
        ours = [s for s in rows.get(c, {}) if s.startswith("llama.cpp")]
        return max(ours, key=lambda s: med[c, s]) if ours else None

    fast, typical = max(reads), statistics.median(reads)
    if step_mb:
        print(f"\nbyte ceilings: {len(reads)} reads of memory in this run (one at the start, one a round) took "
              f"{min(reads):.1f}-{fast:.1f} GB/s, median {typical:.1f}. Per case: a step's MB (a batched step's "
              "per token), the tokens/s they allow at the median read, each side's median as a share of that "
              "(minillm's rounds), and the goal (its share at the median read / the fastest):")
        print(f"  {'case':22} {'MB':>6} {'tok/s':>7}  {'minillm':15} {'llama.cpp':9}  goal")
    for c, mb in step_mb.items():
        ceiling = typical * 1e3 / mb                              # tokens/s at the median read
        ours = "minillm int8" if c.startswith("SmolLM2") else "minillm fused"
        ll = fastest_llama(c)
        if ll is None or (c, ours) not in med:
            continue
        share, theirs = med[c, ours] / ceiling, med[c, ll] / ceiling
        lo, hi = min(rows[c][ours]) / ceiling, max(rows[c][ours]) / ceiling
        to_fast = typical / fast                                  # a share at the median read -> at the fastest
        if c.startswith("SmolLM2"):
            goal = f"70% of the fastest read's: {goal_words(share * to_fast, 0.7)}"
        else:
            need = 1.2 * theirs
            goal = (f"1.2x llama.cpp {100 * need:.0f}% / {100 * need * to_fast:.0f}%: "
                    f"{ceiling_words(need, need * to_fast)}")
        cell = f"{100 * share:3.0f}% ({100 * lo:.0f}-{100 * hi:.0f}%)"
        print(f"  {c:22} {mb:6.1f} {ceiling:7.1f}  {cell:15} {100 * theirs:3.0f}%{'':5}  {goal}")
    print(f"\nagainst the goals (medians of {args.rounds} rounds; ranges that overlap, or under 3 rounds: not ranked):")
    goals = []                                            # (what, ratio, goal, ranked?)
    if "q8" in cases:
        c = "random-124m decode"
        goals.append(("int8 Q8_0 / NumPy float32, random-124m decode",
                      med[c, "minillm int8 Q8_0"] / med[c, "minillm NumPy float32"], 2.5,
                      not overlap(rows[c]["minillm int8 Q8_0"], rows[c]["minillm NumPy float32"])))
    if "smollm2" in cases:
        for what in ("decode", "prefill 512"):
            c = f"SmolLM2 Q4_1 {what}"
            ll = fastest_llama(c)
            goals.append((f"SmolLM2 Q4_1 {what}: int8 / {ll}", med[c, "minillm int8"] / med[c, ll],
                          1.4 if what == "decode" else 1.2, not overlap(rows[c]["minillm int8"], rows[c][ll])))
    if "gpt2" in cases:
        for what in ("decode", "prefill 512"):
            c = f"GPT-2 f32 {what}"
            ll = fastest_llama(c)
            goals.append((f"GPT-2 f32 {what}: fused / {ll}", med[c, "minillm fused"] / med[c, ll], 1.2,
                          not overlap(rows[c]["minillm fused"], rows[c][ll])))
    if "batch" in cases:
        for B in BATCHES:
            c = f"GPT-2 f32 batch {B:2d}"
            ll = fastest_llama(c)
            if ll and (c, "minillm fused") in med:
                goals.append((f"GPT-2 f32 batch {B}: fused / {ll}", med[c, "minillm fused"] / med[c, ll], 1.2,
                              not overlap(rows[c]["minillm fused"], rows[c][ll])))
    for what, ratio, goal, ranked in goals:
        side = "ahead" if ratio > 1 else "behind"
        print(f"  {what:52} {ratio:5.2f}x  {side if ranked else 'not ranked'}; goal {goal:.1f}x: "
              f"{verdict(ratio, goal, ranked)}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
