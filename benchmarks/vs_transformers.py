"""minillm against Hugging Face transformers: one GPT-2 checkpoint, both engines, CPU, float32, batch 1.

It builds (or takes) ONE checkpoint directory in the Hugging Face layout, loads it in minillm and in
`transformers.GPT2LMHeadModel` (eager attention, eval mode, `torch.inference_mode()`), and first
checks that the two agree: the max-abs difference of their logits over a prompt (fails above 1e-3),
the KV-cached decode logits step by step, and 20 greedy tokens (must be identical). Then it times, in
interleaved rounds (the order of the two engines alternates each round; medians are reported):

  cached decode   a prompt (default 64 tokens), then per-token steps over the KV cache (default 32);
                  minillm prefill + decode_step, transformers one forward with use_cache=True then one
                  forward per token with the returned cache. Only the decode steps are timed; the
                  per-step median gives tok/s.
  naive decode    no cache: every step runs the whole sequence again (the same growing sequences as
                  the cached decode); minillm forward(ids, last_only=True), transformers
                  use_cache=False scoring only the last position (logits_to_keep=1 or
                  num_logits_to_keep=1, whichever this transformers takes; the output says which).
  prefill         512 tokens (or the model's context, if shorter):
                  (a) minillm prefill (fills a KV cache, LM head on the last position) against
                      transformers use_cache=True with logits_to_keep=1;
                  (b) all positions scored: minillm forward(ids) against transformers use_cache=False
                      with every position's logits.

Ratios are minillm speed / transformers speed: above 1, minillm is faster.

Setup: torch and transformers are NOT minillm dependencies (minillm is pure NumPy; this script is a
yardstick, not part of the package), so use a scratch virtual environment outside the repository:

    python3 -m venv /tmp/tfvenv
    /tmp/tfvenv/bin/pip install torch==2.13.0 transformers     # the CPU build of torch
    /tmp/tfvenv/bin/pip install -e .                            # minillm + numpy, tiktoken, rich

Run (from the repository root):

    /tmp/tfvenv/bin/python benchmarks/vs_transformers.py                       # random-124m, all cores
    /tmp/tfvenv/bin/python benchmarks/vs_transformers.py --threads 1 --json
    /tmp/tfvenv/bin/python benchmarks/vs_transformers.py --model tests/fixtures/gpt2-tiny-a
    /tmp/tfvenv/bin/python benchmarks/vs_transformers.py --check-logits weights   # agreement only

--threads N (default: every core) is given to torch (torch.set_num_threads) and to NumPy's BLAS
(OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS, set before NumPy is imported), so both
engines get the same number of threads.
"""

from __future__ import annotations

import argparse
import os
import sys

TOLERANCE = 1e-3
CHECK_TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="minillm vs Hugging Face transformers on the same GPT-2 checkpoint (CPU, float32, batch 1)")
    p.add_argument("--model", default="random-124m",
                   help="a checkpoint directory (model.safetensors + config.json), or any minillm.load source "
                        "(random-124m, gpt2, ...), saved to a temporary directory first (default random-124m)")
    p.add_argument("--check-logits", metavar="DIR",
                   help="only load DIR in both engines and report the max-abs logits difference over a prompt")
    p.add_argument("--text", default=CHECK_TEXT,
                   help="prompt for the agreement checks when the vocabulary is GPT-2's (50257); "
                        "other vocabularies get seeded random ids")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads for torch and for NumPy's BLAS (default: os.cpu_count())")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are reported (default 5)")
    p.add_argument("--prompt-tokens", type=int, default=64,
                   help="prompt before the timed decode steps (default 64; at most half the model's context)")
    p.add_argument("--steps", type=int, default=32, help="decode steps per round (default 32)")
    p.add_argument("--prefill-tokens", type=int, default=512,
                   help="prefill length (default 512; at most the model's context)")
    p.add_argument("--greedy-steps", type=int, default=20, help="greedy tokens compared (default 20)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = p.parse_args(argv)
    for name in ("threads", "rounds", "prompt_tokens", "steps", "prefill_tokens", "greedy_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:   # NumPy's BLAS reads its thread count once, when NumPy is imported: set it first
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import inspect  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import os as _os
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "10")   # before NumPy loads OpenBLAS: as minillm sets it

import numpy as np  # noqa: E402

try:
    import torch
    import transformers
    from transformers import GPT2LMHeadModel
except ImportError as e:   # pragma: no cover - depends on the environment
    sys.exit(f"vs_transformers: {e.name} is not installed here; this script runs in a scratch venv "
             "(see its docstring): python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install torch==2.13.0 "
             "transformers && /tmp/tfvenv/bin/pip install -e .")

import minillm  # noqa: E402
from minillm.checkpoints.checkpoint import save_checkpoint  # noqa: E402
from minillm.errors import MiniLLMError  # noqa: E402
from minillm.ui.report import fmt_time  # noqa: E402

transformers.logging.set_verbosity_error()   # no config warnings (a tiny vocabulary vs GPT-2's bos/eos ids)
transformers.logging.disable_progress_bar()  # no "Loading weights" bar


# -- loading -------------------------------------------------------------------------------------

class HF:
    """A transformers GPT2LMHeadModel plus the names this version gives its keyword arguments."""

    def __init__(self, directory: Path, threads: int) -> None:
        torch.set_num_threads(threads)
        from packaging.version import Version
        # `dtype=` replaced `torch_dtype=` in transformers 4.56 (the old name still works there, with a warning)
        dtype_kw = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
        self.dtype_kw = dtype_kw
        self.model = GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager",
                                                     **{dtype_kw: torch.float32})
        self.model.eval()
        params = inspect.signature(self.model.forward).parameters
        self.keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)
        self.cache_kw = "cache" if "cache" in params else "past_key_values"   # renamed in transformers 5.x

    def __call__(self, ids, *, cache=None, use_cache: bool, last_only: bool):
        """-> (logits [T or 1, V] as a torch tensor, the cache or None)."""
        kw = {"use_cache": use_cache}
        if cache is not None:
            kw[self.cache_kw] = cache
        if last_only and self.keep_kw:
            kw[self.keep_kw] = 1
        out = self.model(input_ids=ids, **kw)
        logits = out.logits[0]
        if last_only:
            logits = logits[-1:]
        return logits, getattr(out, self.cache_kw, None)   # the output field has the argument's name

    def keep_note(self) -> str:
        return f"{self.keep_kw}=1" if self.keep_kw else "all positions, then sliced (no logits_to_keep here)"


def as_ids(ids: np.ndarray) -> "torch.Tensor":
    return torch.from_numpy(np.asarray(ids, dtype=np.int64)).reshape(1, -1)


def agreement_prompt(config, text: str, n: int | None = None) -> tuple[np.ndarray, str]:
    if config.vocab_size == 50257:
        ids = np.array(minillm.tokenizer().encode(text), dtype=np.int64)
        if ids.size > config.n_ctx:
            ids = ids[:config.n_ctx]
        return ids, f"{text!r} ({ids.size} GPT-2 tokens)"
    n = n or min(16, config.n_ctx)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, n)
    return ids, f"{n} random ids (seed 0; the vocabulary is {config.vocab_size}, not GPT-2's)"


# -- agreement -----------------------------------------------------------------------------------

def logits_diff(mm, hf: HF, ids: np.ndarray) -> dict:
    a = mm.forward(ids)                                          # [T, V]
    with torch.inference_mode():
        b = hf(as_ids(ids), use_cache=False, last_only=False)[0].numpy()
    d = np.abs(a - b)
    return {"tokens": int(ids.size), "max_abs_diff": float(d.max()), "max_abs_logit": float(np.abs(b).max()),
            "argmax_agree": int((a.argmax(-1) == b.argmax(-1)).sum())}


def greedy_compare(mm, hf: HF, prompt: np.ndarray, steps: int) -> dict:
    """Greedy decoding in both engines, each from its own argmax, with the KV cache; also the max-abs
    difference of their decode-step logits while their tokens agree."""
    mm_tokens = minillm.generate(mm, prompt, steps, kv_cache=True, temperature=0.0)
    logits, cache = mm.prefill(prompt)
    mm_step_logits = [logits]
    for t in mm_tokens[:-1]:
        mm_step_logits.append(mm.decode_step(int(t), cache))
    hf_tokens, hf_step_logits = [], []
    with torch.inference_mode():
        lg, hcache = hf(as_ids(prompt), use_cache=True, last_only=True)
        for i in range(steps):
            row = lg[-1].numpy()
            hf_step_logits.append(row)
            hf_tokens.append(int(row.argmax()))
            if i + 1 < steps:
                lg, hcache = hf(as_ids([hf_tokens[-1]]), cache=hcache, use_cache=True, last_only=True)
    same = 0
    while same < steps and mm_tokens[same] == hf_tokens[same]:
        same += 1
    agree_upto = min(same + 1, steps)   # step `same` still had identical inputs
    diff = max(float(np.abs(mm_step_logits[i] - hf_step_logits[i]).max()) for i in range(agree_upto))
    result = {"steps": steps, "identical": same == steps, "matching_prefix": same,
              "max_abs_step_logit_diff": diff, "minillm": [int(t) for t in mm_tokens], "transformers": hf_tokens}
    if same < steps:
        top2 = np.sort(hf_step_logits[same])[-2:]
        result["divergence_top2_margin"] = float(top2[1] - top2[0])
    return result


# -- timing --------------------------------------------------------------------------------------

def _t(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def plan(config, args) -> dict:
    """Fit the lengths to the model's context: the cached and naive decode stay within 128 positions
    (or half the context, whichever is smaller, for the prompt)."""
    n_ctx = config.n_ctx
    prompt = max(1, min(args.prompt_tokens, n_ctx // 2))
    steps = max(1, min(args.steps, n_ctx - prompt))
    return {"decode_prompt": prompt, "decode_steps": steps, "prefill": min(args.prefill_tokens, n_ctx),
            "greedy_steps": max(1, min(args.greedy_steps, n_ctx - prompt))}


def mm_cached(mm, seq, P, S) -> list[float]:
    _, cache = mm.prefill(seq[:P])
    return [_t(lambda i=i: mm.decode_step(int(seq[P + i]), cache)) for i in range(S)]


def hf_cached(hf: HF, seq, P, S) -> list[float]:
    _, cache = hf(as_ids(seq[:P]), use_cache=True, last_only=True)
    times = []
    for i in range(S):
        tok = as_ids(seq[P + i:P + i + 1])
        t0 = time.perf_counter()
        _, cache = hf(tok, cache=cache, use_cache=True, last_only=True)
        times.append(time.perf_counter() - t0)
    return times


def mm_naive(mm, seq, P, S) -> list[float]:
    return [_t(lambda i=i: mm.forward(seq[:P + i + 1], last_only=True)) for i in range(S)]


def hf_naive(hf: HF, seq, P, S) -> list[float]:
    inputs = [as_ids(seq[:P + i + 1]) for i in range(S)]
    return [_t(lambda x=x: hf(x, use_cache=False, last_only=True)) for x in inputs]


def run_bench(mm, hf: HF, lengths: dict, rounds: int, progress=None) -> dict:
    c = mm.config
    P, S, N = lengths["decode_prompt"], lengths["decode_steps"], lengths["prefill"]
    rng = np.random.default_rng(1)
    seq = rng.integers(0, c.vocab_size, P + S)
    long = rng.integers(0, c.vocab_size, N)
    long_t = as_ids(long)
    tests = {
        "cached": (lambda: statistics.median(mm_cached(mm, seq, P, S)),
                   lambda: statistics.median(hf_cached(hf, seq, P, S))),
        "naive": (lambda: statistics.median(mm_naive(mm, seq, P, S)),
                  lambda: statistics.median(hf_naive(hf, seq, P, S))),
        "prefill_last": (lambda: _t(lambda: mm.prefill(long)),
                         lambda: _t(lambda: hf(long_t, use_cache=True, last_only=True))),
        "prefill_all": (lambda: _t(lambda: mm.forward(long)),
                        lambda: _t(lambda: hf(long_t, use_cache=False, last_only=False))),
    }
    samples = {k: {"minillm": [], "transformers": []} for k in tests}
    with torch.inference_mode():
        for name, (f_mm, f_hf) in tests.items():          # warm-up, not recorded
            f_mm(), f_hf()
        for r in range(rounds):
            for name, (f_mm, f_hf) in tests.items():
                order = [("minillm", f_mm), ("transformers", f_hf)]
                for who, f in (order if r % 2 == 0 else order[::-1]):   # alternate who goes first
                    samples[name][who].append(f())
                if progress:
                    progress()
    med = {k: {who: statistics.median(v) for who, v in s.items()} for k, s in samples.items()}
    per = {"cached": 1, "naive": 1, "prefill_last": N, "prefill_all": N}   # tokens per timed unit
    rows = {}
    for k, m in med.items():
        rows[k] = {"minillm_s": m["minillm"], "transformers_s": m["transformers"],
                   "minillm_tok_s": per[k] / m["minillm"], "transformers_tok_s": per[k] / m["transformers"],
                   "ratio": m["transformers"] / m["minillm"],   # minillm speed / transformers speed
                   "samples": samples[k]}
    return rows


# -- output --------------------------------------------------------------------------------------

def versions() -> dict:
    return {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "minillm": minillm.__version__,
            "machine": platform.machine(), "cpu_count": os.cpu_count()}


def load_both(directory: Path, threads: int):
    mm = minillm.load(directory)
    hf = HF(directory, threads)
    return mm, hf


def check_logits_mode(args) -> int:
    directory = Path(args.check_logits).expanduser()
    mm, hf = load_both(directory, args.threads)
    ids, what = agreement_prompt(mm.config, args.text)
    with torch.inference_mode():
        d = logits_diff(mm, hf, ids)
    ok = d["max_abs_diff"] <= TOLERANCE
    result = {"mode": "check-logits", "checkpoint": str(directory), "prompt": what, **d,
              "tolerance": TOLERANCE, "ok": ok, "versions": versions()}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"checkpoint {directory}: {mm!r}")
        print(f"prompt: {what}")
        print(f"max-abs logits difference, minillm vs transformers {transformers.__version__} (eager, float32), "
              f"over all {d['tokens']} positions: {d['max_abs_diff']:.3g} (largest |logit| {d['max_abs_logit']:.3g}; "
              f"argmax agrees at {d['argmax_agree']}/{d['tokens']} positions) -> "
              f"{'OK' if ok else 'FAIL'} (tolerance {TOLERANCE:g})")
    return 0 if ok else 1


def bench_mode(args) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    source = args.model
    as_dir = Path(source).expanduser()
    tmp = None
    if as_dir.is_dir() and (as_dir / "model.safetensors").is_file() and (as_dir / "config.json").is_file():
        directory = as_dir
    else:   # a minillm.load source: save it in the Hugging Face layout so both engines read the same file
        src = minillm.load(source)
        tmp = tempfile.TemporaryDirectory(prefix="vs_transformers_")
        directory = Path(tmp.name)
        save_checkpoint(directory, src.params, src.config, dtype="float32")
        del src
    try:
        mm, hf = load_both(directory, args.threads)
        mm.name = str(source)
        c = mm.config
        lengths = plan(c, args)
        P = lengths["decode_prompt"]
        with torch.inference_mode():
            ids, what = agreement_prompt(c, args.text)
            agree = {"prompt": what, **logits_diff(mm, hf, ids)}
            prompt = ids if ids.size <= P else ids[:P]   # greedy starts from the agreement prompt
            greedy = greedy_compare(mm, hf, prompt, lengths["greedy_steps"])
        agree["ok"] = agree["max_abs_diff"] <= TOLERANCE
        if not args.json:
            err.print(f"{mm!r}; checkpoint {directory}")
            err.print(f"agreement on {what}: max-abs logits difference {agree['max_abs_diff']:.3g} "
                      f"(largest |logit| {agree['max_abs_logit']:.3g}) -> {'OK' if agree['ok'] else 'FAIL'}")
            err.print(f"greedy, {greedy['steps']} steps with the KV cache: "
                      f"{'identical tokens' if greedy['identical'] else 'tokens DIFFER'} "
                      f"(matching prefix {greedy['matching_prefix']}); "
                      f"max-abs decode-step logits difference {greedy['max_abs_step_logit_diff']:.3g}")
        if not agree["ok"] or not greedy["identical"]:
            result = {"ok": False, "agreement": agree, "greedy": greedy, "versions": versions()}
            if args.json:
                print(json.dumps(result))
            else:
                err.print("[red]minillm and transformers disagree on this checkpoint; not benchmarking[/]")
                if not greedy["identical"]:
                    err.print(f"  minillm      {greedy['minillm']}\n  transformers {greedy['transformers']}\n"
                              f"  top-2 logit margin at the first difference: {greedy.get('divergence_top2_margin')}")
            return 1
        with Progress(console=err, transient=True, disable=args.json) as bar:
            task = bar.add_task(f"benchmarking {mm.name}", total=args.rounds * 4)
            rows = run_bench(mm, hf, lengths, args.rounds, progress=lambda: bar.advance(task))
    finally:
        if tmp is not None:
            tmp.cleanup()

    result = {
        "ok": True, "model": str(source), "config": c.asdict(), "n_params": mm.n_params(),
        "threads": {"torch": torch.get_num_threads(), "numpy_blas_env": os.environ.get("OPENBLAS_NUM_THREADS")},
        "rounds": args.rounds, "lengths": lengths,
        "transformers_setup": {"attn_implementation": "eager", "load_kw": f"{hf.dtype_kw}=torch.float32",
                               "last_position_kw": hf.keep_note(), "cache_kw": hf.cache_kw,
                               "mode": "eval, torch.inference_mode()"},
        "agreement": agree, "greedy": greedy, "rows": rows, "versions": versions(),
    }
    if args.json:
        print(json.dumps(result))
        return 0

    P, S, N = lengths["decode_prompt"], lengths["decode_steps"], lengths["prefill"]
    v = result["versions"]
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 150)
    t = Table(title=f"{mm.name}: {mm.n_params():,} params, float32, batch 1, {args.threads} thread(s); "
                    f"minillm {v['minillm']} (numpy {v['numpy']}) vs transformers {v['transformers']} "
                    f"(torch {v['torch']}, eager); medians of {args.rounds} interleaved rounds",
              title_justify="left")
    for col in ("measurement", "minillm", "transformers", "minillm ÷ transformers (speed)"):
        t.add_column(col, justify="left" if col == "measurement" else "right")
    keep = hf.keep_note()

    def tok_row(label, r):
        t.add_row(label, f"{r['minillm_tok_s']:,.1f} tok/s ({fmt_time(r['minillm_s'])})",
                  f"{r['transformers_tok_s']:,.1f} tok/s ({fmt_time(r['transformers_s'])})", f"{r['ratio']:.2f}x")

    def time_row(label, r):
        t.add_row(label, f"{fmt_time(r['minillm_s'])} ({r['minillm_tok_s']:,.0f} tok/s)",
                  f"{fmt_time(r['transformers_s'])} ({r['transformers_tok_s']:,.0f} tok/s)", f"{r['ratio']:.2f}x")

    tok_row(f"cached decode, positions {P}..{P + S - 1} (per-step median)", rows["cached"])
    tok_row(f"naive decode, no cache, {P + 1}..{P + S} tokens (per-step median)", rows["naive"])
    time_row(f"prefill {N} tokens: KV cache, last position scored", rows["prefill_last"])
    time_row(f"forward {N} tokens: no cache, all positions scored", rows["prefill_all"])
    out.print(t)
    out.print(f"calls: cached decode = minillm prefill + decode_step / transformers use_cache=True, one token per "
              f"forward with the returned '{hf.cache_kw}'; naive decode = minillm forward(ids, last_only=True) / "
              f"transformers use_cache=False, {keep}; prefill = minillm prefill(ids) / transformers use_cache=True, "
              f"{keep}; forward = minillm forward(ids) / transformers use_cache=False, every position's logits")
    out.print(f"agreement: max-abs logits difference {agree['max_abs_diff']:.3g} over {agree['tokens']} positions "
              f"({agree['prompt']}); greedy {greedy['steps']} tokens with the KV cache: "
              f"{'identical' if greedy['identical'] else 'DIFFERENT'} "
              f"(decode-step logits max-abs difference {greedy['max_abs_step_logit_diff']:.3g})")
    out.print(f"[dim]threads: torch {torch.get_num_threads()}, NumPy BLAS {os.environ.get('OPENBLAS_NUM_THREADS')}; "
              f"transformers loaded with {hf.dtype_kw}=torch.float32, attn_implementation='eager', eval mode, "
              f"torch.inference_mode(); cache argument '{hf.cache_kw}'; python {v['python']}[/]")
    return 0


def main(args) -> int:
    try:
        return check_logits_mode(args) if args.check_logits else bench_mode(args)
    except MiniLLMError as e:
        print(f"vs_transformers: {e}", file=sys.stderr)
        return 2
    except OSError as e:   # transformers could not read the directory, say
        print(f"vs_transformers: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(ARGS))
