"""What integer products cost in accuracy: float32 against W8A32/W4A32 (the weights quantized, the
activations float: the NumPy kernels) and W8A8/W4A8 (the activations rounded to int8 blocks too:
--kernels int8), on the same weights, measured, not assumed.

    python benchmarks/int8_error.py                                  # the bundled model and SmolLM2
    python benchmarks/int8_error.py --models small --tokens 0         # all of the held-out text
    python benchmarks/int8_error.py --models smollm2-135m --tokens 4096 --greedy 256 \\
        --llama-perplexity PATH/TO/llama-perplexity                   # and llama.cpp's on the same file

The text: the last 10% of the bundled tinyshakespeare (the held-out part `minillm eval` scores), read
with each model's own tokenizer; the first --tokens of it (0: all). For every variant against
float32 on the same weights, windows of --window tokens (at most the model's context):
  - max |Δlogit|: the largest difference of any logit at any scored position, and the median of each
    position's largest (how far a typical step moves);
  - same top-1: the share of positions whose most likely next token is float32's;
  - perplexity: exp(mean cross-entropy of each window's next tokens), the windows back to back;
  - greedy: --greedy new tokens (at most what the context holds) from the text's first 16, with
    the KV cache: how many come before
    the first one that differs from float32's, and the share of positions equal.
With --llama-perplexity, llama.cpp's tool on SmolLM2's own GGUF and the same held-out text
(its own protocol: windows of -c tokens, scoring each window's second half; so its number is beside
ours, not the same measure).
"""

from __future__ import annotations

import argparse
import math
import re
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

import minillm                                          # noqa: E402
from minillm.data import bundled_text_path               # noqa: E402

# model -> [(label, weights, kernels)]: float32 first (the baseline)
VARIANTS = {
    "small": [("float32", "float32", "numpy"), ("W8A32 q8_0", "q8_0", "numpy"), ("W8A8 q8_0", "q8_0", "int8"),
              ("W4A32 q4_0", "q4_0", "numpy"), ("W4A8 q4_0", "q4_0", "int8")],
    "smollm2-135m": [("float32", "float32", "numpy"), ("W8A32 q8_0", "q8_0", "numpy"), ("W8A8 q8_0", "q8_0", "int8"),
                     ("W4A32 native", "native", "numpy"), ("W4A8 native", "native", "int8")],
}


def heldout_ids(model, tokens: int) -> np.ndarray:
    """The held-out text: the last 10% of the bundled text's tokens, with the model's own tokenizer;
    its first `tokens` of them (0: all)."""
    text = bundled_text_path().read_text(encoding="utf-8")
    ids = np.asarray(minillm.tokenizer(model).encode(text), np.int64)
    ids = ids[int(len(ids) * 0.9):]
    return ids[:tokens] if tokens else ids


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def compare(models: dict, ids: np.ndarray, window: int, greedy: int) -> list[dict]:
    """One pass over the windows, every variant beside float32's logits (never all held at once)."""
    labels = list(models)
    base = labels[0]
    stats = {k: {"nll": 0.0, "n": 0, "max": 0.0, "pos_max": [], "same": 0} for k in labels}
    for s in range(0, len(ids) - 1, window):
        x, tgt = ids[s:s + window], ids[s + 1:s + window + 1]
        x = x[:len(tgt)]
        ref = models[base].forward(x)                                        # [t, V]
        for k in labels:
            z = ref if k == base else models[k].forward(x)
            st = stats[k]
            st["nll"] -= float(log_softmax(z)[np.arange(len(tgt)), tgt].sum())
            st["n"] += len(tgt)
            d = np.abs(z.astype(np.float64) - ref)
            st["max"] = max(st["max"], float(d.max()))
            st["pos_max"].extend(d.max(axis=1).tolist())
            st["same"] += int((z.argmax(1) == ref.argmax(1)).sum())
    prompt = ids[:16]
    greedy = min(greedy, models[base].config.n_ctx - len(prompt))     # what the context holds
    runs = {k: np.asarray(minillm.generate(models[k], prompt, greedy)) for k in labels} if greedy else {}
    rows = []
    for k in labels:
        st = stats[k]
        row = {"variant": k, "weights_mb": models[k].nbytes() / 1e6, "max_dlogit": st["max"],
               "median_dlogit": float(np.median(st["pos_max"])), "same_top1": st["same"] / st["n"],
               "ppl": math.exp(st["nll"] / st["n"]), "tokens": st["n"]}
        if greedy:
            a, b = runs[k], runs[base]
            n = min(len(a), len(b))
            diff = np.nonzero(a[:n] != b[:n])[0]
            row["greedy_first_diff"] = int(diff[0]) if len(diff) else n
            row["greedy_same"] = float((a[:n] == b[:n]).mean()) if n else 1.0
            row["greedy_n"] = n
        rows.append(row)
    return rows


def llama_perplexity(binary: str, gguf: Path, text: str, ctx: int, threads: int) -> str:
    """llama.cpp's perplexity on `text` (its last line with the estimate), or why it did not run."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(text)
    try:
        out = subprocess.run([binary, "-m", str(gguf), "-f", f.name, "-c", str(ctx), "-t", str(threads)],
                             capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"did not run: {e}"
    finally:
        Path(f.name).unlink(missing_ok=True)
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out.stdout + out.stderr)
    return (f"PPL {m.group(1)} ± {m.group(2)} (-c {ctx}: each window's second half scored)" if m
            else f"exit {out.returncode}, no estimate: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")


def table(name: str, rows: list[dict], greedy: int) -> str:
    head = (f"{'variant':14} {'MB':>6} {'max |Δlogit|':>12} {'median':>7} {'same top-1':>10} "
            f"{'perplexity':>10}" + (f" {'greedy':>12}" if greedy else ""))
    out = [f"{name}: {rows[0]['tokens']} held-out tokens scored", head]
    for r in rows:
        g = f" {r['greedy_first_diff']:>4}/{r['greedy_n']} {r['greedy_same']:4.0%}" if greedy else ""
        out.append(f"{r['variant']:14} {r['weights_mb']:6.1f} {r['max_dlogit']:12.4g} {r['median_dlogit']:7.3g} "
                   f"{r['same_top1']:10.1%} {r['ppl']:10.3f}{g}")
    if greedy:
        out.append("greedy: new tokens before the first that differs from float32's / all, and the share equal")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="small,smollm2-135m")
    ap.add_argument("--tokens", type=int, default=4096, help="held-out tokens scored (0: all)")
    ap.add_argument("--window", type=int, default=512, help="tokens per forward (at most the model's context)")
    ap.add_argument("--greedy", type=int, default=256, help="greedy tokens compared (0: none)")
    ap.add_argument("--llama-perplexity", help="llama.cpp's llama-perplexity binary (SmolLM2 only)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    for name in [m for m in args.models.split(",") if m]:
        if name not in VARIANTS:
            sys.exit(f"unknown model {name!r}; choose from {', '.join(VARIANTS)}")
        t0 = time.perf_counter()
        models = {label: minillm.load(name, weights=w, kernels=k, quiet=True) for label, w, k in VARIANTS[name]}
        first = next(iter(models.values()))
        ids = heldout_ids(first, args.tokens)
        window = min(args.window, first.config.n_ctx)
        rows = compare(models, ids, window, args.greedy)
        print(table(name, rows, args.greedy))
        print(f"(windows of {window} tokens; {time.perf_counter() - t0:.0f} s)\n")
        if args.llama_perplexity and name == "smollm2-135m":
            from minillm.checkpoints.smollm import find as smollm2_path
            text = minillm.tokenizer(first).decode([int(i) for i in ids])
            print("llama.cpp llama-perplexity, native GGUF:",
                  llama_perplexity(args.llama_perplexity, smollm2_path(), text, window, args.threads))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
