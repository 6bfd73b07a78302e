"""Train a GPT-2 from scratch in NumPy, with every backward pass written by hand: the loop. The pieces:
`ops.py` (each operation's forward and backward side by side), `model.py` (the whole network),
`optim.py` (AdamW, clipping, the schedule), `data.py` (tokens, batches, the held-out loss). The
`train` and `eval` commands are `minillm.cli.train`.

A whole training step of the 4-layer, width-128 model runs at ~1,800-1,950 tokens/s (~1,600 with
dropout) on this 2-core machine.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from ..checkpoints.checkpoint import save_checkpoint
from ..models.gpt2 import GPT2Config
from ..errors import MiniLLMError, WeightsError
from ..paths import TEMP_NAME_ROOM, expand_user
from .data import evaluate, get_batch, load_tokens, split_tokens
from .model import init_params, loss_and_grads
from .optim import AdamW, clip_grad_norm, lr_at


def train(data, out=None, layers=4, heads=4, width=128, context=256, batch=8, steps=None, minutes=None,
          lr=3e-3, weight_decay=0.1, dropout=0.0, seed=1337, eval_every=200, warmup=100, clip=1.0,
          chunk=512, log=print, progress=True, dtype="float16") -> dict:
    """Train on the text at `data`; keep the checkpoint with the best held-out loss in `out`. Returns a summary."""
    if steps is None and minutes is None:
        steps = 1000
    config = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_ctx=context)
    tokens = load_tokens(data)
    train_tok, heldout = split_tokens(tokens, context, str(data))
    if out is not None:
        out = check_out(out)
    rng = np.random.default_rng(seed)
    params = init_params(config, seed)
    opt = AdamW(params, weight_decay)
    budget = minutes * 60.0 if minutes is not None else None
    log(f"data {data}: {len(tokens):,} tokens ({len(train_tok):,} train, {len(heldout):,} held out); "
        f"model {config.n_params():,} parameters (L={layers} H={heads} d={width} ctx={context}); "
        f"batch {batch}x{context}, lr {lr}, weight decay {weight_decay}, dropout {dropout}, seed {seed}")

    best = {"heldout": math.inf, "step": 0}
    history = []
    t0 = time.perf_counter()
    step, seen, ema = 0, 0, None

    def checkpoint_eval(step, train_loss):
        te = time.perf_counter()
        val = evaluate(params, config, heldout, chunk=chunk)
        history.append((step, time.perf_counter() - t0, train_loss, val))
        msg = (f"step {step:6d}  {(time.perf_counter() - t0) / 60:6.1f} min  tokens {seen:,}  "
               f"train {train_loss:.4f}  held-out {val:.4f}")
        if val < best["heldout"]:
            best.update(heldout=val, step=step, train=train_loss, tokens=seen, minutes=(time.perf_counter() - t0) / 60)
            if out is not None:
                try:
                    save_checkpoint(out, params, config, dtype=dtype, metadata={
                        "step": str(step), "heldout_loss": f"{val:.4f}", "train_loss": f"{train_loss:.4f}",
                        "tokens_seen": str(seen), "seed": str(seed), "data": Path(data).name})
                    msg += "  (saved)"
                    best["unsaved"] = None
                except WeightsError as e:          # disk full, say: the run goes on, the next best tries again
                    msg += "  (NOT saved)"
                    best["unsaved"] = str(e)
                    log(f"warning: {e}; training goes on, and the next better held-out loss is saved")
        log(msg + f"  [eval {time.perf_counter() - te:.1f}s]")
        return val

    bar = None
    if progress:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        bar = Progress(TextColumn("[bold]train"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                       TextColumn("loss {task.fields[loss]}  {task.fields[tps]} tok/s  lr {task.fields[lr]}"),
                       TimeElapsedColumn(), TimeRemainingColumn())
        task = bar.add_task("train", total=budget if budget else steps, loss="-", tps="-", lr="-")
        bar.start()
    try:
        while True:
            elapsed = time.perf_counter() - t0
            if (steps is not None and step >= steps) or (budget is not None and elapsed >= budget):
                break
            progress_frac = step / steps if steps is not None else elapsed / budget
            if steps is not None and budget is not None:
                progress_frac = max(progress_frac, elapsed / budget)
            ts = time.perf_counter()
            x, y = get_batch(train_tok, batch, context, rng)
            loss, grads = loss_and_grads(params, config, x, y, dropout, rng if dropout > 0 else None, chunk)
            if not math.isfinite(loss):
                raise MiniLLMError(f"training diverged at step {step + 1}: the loss is {loss}; try a lower --lr"
                                   + (f" (the best checkpoint so far, step {best['step']}, is in {out})"
                                      if out is not None and best["step"] else ""))
            norm = clip_grad_norm(grads, clip)
            rate = lr_at(progress_frac, step, lr, warmup)
            opt.step(params, grads, rate)
            step += 1
            seen += x.size
            ema = loss if ema is None else 0.95 * ema + 0.05 * loss
            tps = x.size / (time.perf_counter() - ts)
            if bar is not None:
                bar.update(task, completed=(time.perf_counter() - t0) if budget else step,
                           loss=f"{ema:.3f}", tps=f"{tps:,.0f}", lr=f"{rate:.2e}")
            if step % 50 == 0:
                log(f"step {step:6d}  loss {ema:.4f}  grad norm {norm:.2f}  lr {rate:.2e}  {tps:,.0f} tok/s")
            if eval_every and step % eval_every == 0:
                checkpoint_eval(step, ema)
    finally:
        if bar is not None:
            bar.stop()
    if not history or history[-1][0] != step:
        checkpoint_eval(step, ema if ema is not None else float("nan"))
    wall = time.perf_counter() - t0
    # the train loss without dropout, measured like the held-out one, on the first len(heldout) train tokens
    train_eval = evaluate(params, config, train_tok[:len(heldout)], chunk=chunk)
    if best.get("unsaved"):
        raise MiniLLMError(f"the best checkpoint (step {best['step']}, held-out {best['heldout']:.4f}) could not be "
                           f"saved: {best['unsaved']}")
    summary = {"steps": step, "tokens_seen": seen, "wall_s": wall, "final_train": ema, "train_eval": train_eval,
               "final_heldout": history[-1][3], "best": best, "config": config, "history": history}
    log(f"done: {step} steps, {seen:,} tokens in {wall / 60:.1f} min ({seen / wall:,.0f} tok/s overall); "
        f"final train {ema:.4f} (no dropout, first {len(heldout):,} train tokens: {train_eval:.4f}) "
        f"held-out {history[-1][3]:.4f}; best held-out {best['heldout']:.4f} at step "
        f"{best['step']}" + (f", saved in {out}" if out is not None and "unsaved" in best else ""))
    return summary


def check_out(out) -> Path:
    """Make the checkpoint folder now and write a file in it: a bad --out fails before the run, not at
    its first save, hours in."""
    out = expand_user(out)
    if len(os.fsencode(out.name)) + TEMP_NAME_ROOM > 255:
        raise MiniLLMError(f"--out {str(out)[:60]}...: the folder name is {len(os.fsencode(out.name)):,} bytes; "
                           f"use at most {255 - TEMP_NAME_ROOM} (a save writes a temporary folder beside it first)")
    try:
        if out.exists() and not out.is_dir():
            raise MiniLLMError(f"--out {out}: is a file, not a folder; choose a folder for the checkpoint")
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise MiniLLMError(f"--out {str(out)[:80]}: cannot write a checkpoint there ({e.strerror}); "
                           "choose a folder you can write to") from None
    return out
