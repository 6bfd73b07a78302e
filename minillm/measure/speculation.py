"""`minillm bench --speculate`: what speculative decoding buys, for each k and each draft, against
plain KV-cached decode of the same model on the same prompts.

Prompts are real text: windows of the bundled tinyshakespeare's held-out tenth (the text the
bundled models never trained on). For each prompt, plain greedy decode, then speculative decode for
every (draft, k), in interleaved rounds; medians of the time. Time counts decode only (after the
prefill, whose logits give the first token in both). Beside the speed, from the meter in the same
runs: the acceptance rate, the tokens kept per step of the model, the bytes moved per token kept
(draft and model) against one plain decode step, and the time of one verify step against one
plain decode step (the claim that checking k guesses costs about one weight read, measured).
"""

from __future__ import annotations

import statistics

import numpy as np

from ..engine.generate import generate
from ..engine.speculative import speculative_generate
from ..data import BundledText
from ..meter import Meter
from ..training.data import DEFAULT_DATA_SPLIT, load_tokens


def heldout_prompts(n_prompts: int, length: int) -> list[np.ndarray]:
    """`n_prompts` windows of `length` tokens, evenly spaced through the held-out tenth of the
    bundled text."""
    tokens = load_tokens(BundledText())
    held = tokens[int(len(tokens) * DEFAULT_DATA_SPLIT):]
    starts = np.linspace(0, len(held) - length - 1, n_prompts).astype(int)
    return [np.asarray(held[s:s + length], dtype=np.intp) for s in starts]


def _plain(model, prompt, n):
    with Meter() as m:
        new = generate(model, prompt, n)
    return new, m.totals("decode"), m.of_kind("decode")


def run_speculation_bench(model, drafts: dict, ks: list[int], prompts: list[np.ndarray], new_tokens: int,
                          repeats: int = 3, temperature: float = 0.0, seed: int = 0, progress=None) -> dict:
    """drafts: name -> "ngram" or a model. Returns {"plain": {...}, "rows": [{draft, k, ...}]}."""
    configs = [(name, k) for name in drafts for k in ks]
    times = {c: [] for c in [None, *configs]}
    per = {c: {} for c in [None, *configs]}      # the counters of the first repeat (they do not vary)
    same = {c: True for c in configs}
    for r in range(repeats):
        for p_i, prompt in enumerate(prompts):
            plain_new, total, decode = _plain(model, prompt, new_tokens)
            times[None].append((p_i, total.seconds))
            if r == 0:
                per[None][p_i] = {"steps": total.steps, "bytes": total.bytes,
                                  "step_s": [s.seconds for s in decode]}
            for c in configs:
                name, k = c
                with Meter():
                    new, stats = speculative_generate(model, prompt, new_tokens, draft=drafts[name], k=k,
                                                      temperature=temperature, seed=seed)
                times[c].append((p_i, stats.seconds))
                if temperature == 0 and new != plain_new:
                    same[c] = False
                if r == 0:
                    per[c][p_i] = {"drafted": stats.drafted, "accepted": stats.accepted, "kept": stats.kept,
                                   "rounds": len(stats.rounds), "draft_bytes": stats.draft_bytes,
                                   "target_bytes": stats.target_bytes,
                                   "verify_s": [x.verify_step.seconds for x in stats.rounds
                                                if x.verify_step is not None and x.drafted == k],
                                   "draft_s": [d.seconds for x in stats.rounds for d in x.draft_steps[1:]]}
            if progress is not None:
                progress()

    def by_repeat(c) -> list[float]:
        """Each repeat's time, summed over the prompts."""
        return [sum(s for _, s in times[c][i * len(prompts):(i + 1) * len(prompts)]) for i in range(repeats)]

    def seconds_of(c) -> float:
        """Median over repeats of the time summed over prompts."""
        return statistics.median(by_repeat(c))

    plain_tokens = sum(v["steps"] for v in per[None].values())
    plain_s = seconds_of(None)
    step_s = statistics.median([s for v in per[None].values() for s in v["step_s"]])
    plain = {"tok_s": plain_tokens / plain_s, "ms_step": 1e3 * step_s,
             "bytes_per_token": sum(v["bytes"] for v in per[None].values()) / plain_tokens}
    rows = []
    for c in configs:
        name, k = c
        agg = {key: sum(v[key] for v in per[c].values()) for key in
               ("drafted", "accepted", "kept", "rounds", "draft_bytes", "target_bytes")}
        verify = [s for v in per[c].values() for s in v["verify_s"]]
        s = seconds_of(c)
        speedups = [(agg["kept"] / a) / (plain_tokens / b) for a, b in zip(by_repeat(c), by_repeat(None))]
        rows.append({
            # one speed-up, the median of the paired rounds' ratios: the table and the ranking say the same
            "draft": name, "k": k, "tok_s": agg["kept"] / s, "speedup": statistics.median(speedups),
            "acceptance": agg["accepted"] / agg["drafted"] if agg["drafted"] else 0.0,
            "tokens_per_step": agg["kept"] / agg["rounds"] if agg["rounds"] else 0.0,
            "drafted": agg["drafted"], "rounds": agg["rounds"],
            "bytes_per_token": (agg["draft_bytes"] + agg["target_bytes"]) / agg["kept"],
            "draft_bytes_per_token": agg["draft_bytes"] / agg["kept"],
            "verify_ms": 1e3 * statistics.median(verify) if verify else None,
            "same_tokens": same[c] if temperature == 0 else None,
            "speedup_rounds": speedups,        # each repeat's tokens/s ÷ plain decode's in the same repeat
        })
    draft_ms = {}
    for name in drafts:
        ds = [s for c in configs if c[0] == name for v in per[c].values() for s in v["draft_s"]]
        if ds:
            draft_ms[name] = 1e3 * statistics.median(ds)
    return {"plain": plain, "rows": rows, "draft_ms": draft_ms, "prompts": len(prompts), "prompt_tokens": int(prompts[0].size),
            "new_tokens": new_tokens, "repeats": repeats, "temperature": temperature}
