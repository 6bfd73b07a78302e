"""minillm beside llama.cpp on the same weights and the same threads, every case interleaved round by
round (minillm's side, then llama.cpp's), medians of the rounds: the integer kernels' goals.

    python benchmarks/vs_llamacpp.py --llama-bin PATH/TO/llama.cpp/build/bin
    python benchmarks/vs_llamacpp.py --llama-bin BIN --rounds 5 --threads 2 --cases smollm2,gpt2,batch
    python benchmarks/vs_llamacpp.py --cases q8                        # minillm alone: int8 Q8_0 against NumPy

Build llama.cpp yourself (from the `llama-cpp-python` sdist's vendored copy, say; llama-bench and
llama-batched-bench); the script only runs the binaries in --llama-bin. Needs `minillm download
smollm2-135m` for the SmolLM2 cases; the GPT-2 cases write random-124m (seeded, so the same weights
minillm loads) as a float32 GGUF with `minillm quantize` into a temporary folder, or take --gpt2-gguf.

Cases (tokens/s; llama-bench runs -r 1 a round, after its own warm-up):
    q8        random-124m decode: --kernels int8 on Q8_0 against NumPy float32 (goal 2.5x)
    smollm2   SmolLM2-135M's native Q4_1: decode of 64 tokens from a 1-token prompt (llama-bench tg64)
              and a 512-token prefill (pp512), minillm's int8 and fused sets (goal: >= llama.cpp)
    gpt2      random-124m float32: decode (tg64) and prefill (pp512), minillm's fused set (goal 1.0x)
    batch     random-124m float32, B sequences of 16 prompt tokens decoding 32 steps together:
              B·32 / the decode time (llama-batched-bench's S_TG), B = 1..32 (goal 0.9x)
"""

from __future__ import annotations

import argparse
import json
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


def prefill_rate(model, n: int = 512) -> float:
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, n)
    t0 = time.perf_counter()
    model.prefill(ids)
    return n / (time.perf_counter() - t0)


def batch_rate(model, B: int, prompt: int = 16, steps: int = 32, block: int = 16) -> float:
    """B·steps / seconds of `steps` batched decode steps of B sequences in one paged pool."""
    rng = np.random.default_rng(B)
    pool = PagedKVPool(model.config, B * (-(-(prompt + steps + 1) // block)) + 2, block)
    caches, toks = [], []
    for _ in range(B):
        c = pool.sequence()
        logits, _ = model.prefill(rng.integers(0, model.config.vocab_size, prompt), c)
        caches.append(c)
        toks.append(int(np.argmax(logits)))
    t0 = time.perf_counter()
    for _ in range(steps):
        for c in caches:
            c.reserve(1)
        outs = model.step([(np.array([t]), c) for t, c in zip(toks, caches)])
        toks = [int(np.argmax(o)) for o in outs]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", type=Path, help="folder with llama-bench and llama-batched-bench")
    ap.add_argument("--cases", default="q8,smollm2,gpt2,batch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpt2-gguf", type=Path, help="random-124m as a float32 GGUF (default: written to a temp folder)")
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if any(c != "q8" for c in cases) and not (args.llama_bin and (args.llama_bin / "llama-bench").is_file()):
        sys.exit("--llama-bin: give the folder holding llama-bench and llama-batched-bench (or --cases q8)")
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
    sides: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        sides.setdefault(name, []).append(value)

    with limited(t):
        kernels.set_threads(t)
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
        print(f"{int8.describe()}; minillm and llama.cpp on {t} threads; {args.rounds} interleaved rounds",
              file=sys.stderr)
        for r in range(args.rounds):
            if "q8" in cases:
                add("random-124m decode: NumPy float32", decode_rate(models["q8 numpy f32"]))
                add("random-124m decode: int8 Q8_0", decode_rate(models["q8 int8"]))
            if "smollm2" in cases:
                for k in ("int8", "fused"):
                    add(f"SmolLM2 Q4_1 decode: minillm {k}", decode_rate(models[f"smollm2 {k}"]))
                add("SmolLM2 Q4_1 decode: llama.cpp", llama_bench(args.llama_bin, smol_gguf, t, 0, 64))
                for k in ("int8", "fused"):
                    add(f"SmolLM2 Q4_1 prefill 512: minillm {k}", prefill_rate(models[f"smollm2 {k}"]))
                add("SmolLM2 Q4_1 prefill 512: llama.cpp", llama_bench(args.llama_bin, smol_gguf, t, 512, 0))
            if "gpt2" in cases:
                add("GPT-2 f32 decode: minillm fused", decode_rate(models["gpt2 fused"]))
                add("GPT-2 f32 decode: llama.cpp", llama_bench(args.llama_bin, gpt2_gguf, t, 0, 64))
                add("GPT-2 f32 prefill 512: minillm fused", prefill_rate(models["gpt2 fused"]))
                add("GPT-2 f32 prefill 512: llama.cpp", llama_bench(args.llama_bin, gpt2_gguf, t, 512, 0))
            if "batch" in cases:
                for B in BATCHES:
                    add(f"GPT-2 f32 batch {B:2d}: minillm fused", batch_rate(models["gpt2 fused"], B))
                for B, v in llama_batched(args.llama_bin, gpt2_gguf, t, BATCHES).items():
                    add(f"GPT-2 f32 batch {B:2d}: llama.cpp", v)
            print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in sides.items()}
    print(f"{'case':44} {'tok/s':>9} {'range':>17}")
    for k, v in sides.items():
        print(f"{k:44} {med[k]:9.1f} {min(v):8.1f}-{max(v):<8.1f}")
    print("\nagainst the goals (medians):")
    goals = []
    if "q8" in cases:
        goals.append(("int8 Q8_0 / NumPy float32, random-124m decode", med["random-124m decode: int8 Q8_0"]
                      / med["random-124m decode: NumPy float32"], 2.5))
    for what in ("decode", "prefill 512"):
        if "smollm2" in cases:
            goals.append((f"SmolLM2 Q4_1 {what}: int8 / llama.cpp", med[f"SmolLM2 Q4_1 {what}: minillm int8"]
                          / med[f"SmolLM2 Q4_1 {what}: llama.cpp"], 1.0))
        if "gpt2" in cases:
            goals.append((f"GPT-2 f32 {what}: fused / llama.cpp", med[f"GPT-2 f32 {what}: minillm fused"]
                          / med[f"GPT-2 f32 {what}: llama.cpp"], 1.0))
    if "batch" in cases:
        for B in BATCHES[1:]:
            a, b = f"GPT-2 f32 batch {B:2d}: minillm fused", f"GPT-2 f32 batch {B:2d}: llama.cpp"
            if a in med and b in med:
                goals.append((f"GPT-2 f32 batch {B}: fused / llama.cpp", med[a] / med[b], 0.9))
    for what, ratio, goal in goals:
        print(f"  {what:48} {ratio:6.2f}x  goal {goal:.1f}x: {'met' if ratio >= goal else 'missed'}")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
