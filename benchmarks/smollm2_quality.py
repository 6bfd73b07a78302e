"""SmolLM2-135M's logits in each weight format against its float32 dequantization, on held-out text.

    python benchmarks/smollm2_quality.py [--tokens 256]

Needs `minillm download smollm2-135m`. For float32 (the Q4_1 file dequantized), native (its Q4_1 and
Q8_0 blocks kept as they are), and Q8_0 / Q4_0 requantized from those floats: bytes in memory, the
largest logit difference from float32, the share of positions with the same top-1 token, the loss
on the text (the first tokens of the bundled text's last 10%), and the greedy answers to two questions.
"""

from __future__ import annotations

import argparse

import os as _os
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "10")   # before NumPy loads OpenBLAS: as minillm sets it

import numpy as np

import minillm
from minillm.chat import render
from minillm.data import BundledText

QUESTIONS = ("What is the capital of France?", "Name three primary colors.")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
    text = open(BundledText(), encoding="utf-8").read()
    text = text[int(len(text) * 0.9):]
    models = {w: minillm.load("smollm2-135m", weights=w, quiet=True) for w in ("float32", "native", "q8_0", "q4_0")}
    tok = minillm.tokenizer(models["float32"])
    ids = tok.encode(text[: 8 * args.tokens])[: args.tokens]
    base = models["float32"].forward(ids)                                  # [T, V]
    print(f"{len(ids)} tokens of held-out text")
    print(f"{'weights':16} {'in memory':>10} {'max |Δlogit|':>13} {'same top-1':>11} {'loss':>7}")
    for w, m in models.items():
        logits = m.forward(ids)                                            # [T, V]
        z = logits - logits.max(1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(1, keepdims=True))
        loss = -logp[np.arange(len(ids) - 1), ids[1:]].mean()
        same = (logits.argmax(1) == base.argmax(1)).mean()
        print(f"{w + ' (' + m.weights + ')':16} {m.nbytes() / 1e6:8.1f} MB {np.abs(logits - base).max():13.3g} "
              f"{same:11.1%} {loss:7.4f}")
    for q in QUESTIONS:
        prompt = tok.encode(render([{"role": "user", "content": q}], tok)[0])
        print(f"\n{q}")
        for w, m in models.items():
            new = minillm.generate(m, prompt, 40, stop_ids=m.eos_ids)
            print(f"  {w:8} {tok.decode([t for t in new if t not in m.eos_ids])!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
