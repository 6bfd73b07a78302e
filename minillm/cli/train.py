"""`minillm train` (a small GPT-2 from scratch, hand-written backward) and `minillm eval` (held-out
loss of a model): the options and the log; the loop is `minillm.training.train`."""

from __future__ import annotations

import math
import sys

from rich.console import Console

from ..checkpoints.load import load
from ..data import BundledText  # the default --data: the bundled text
from ..errors import MiniLLMError
from ..models import kernel_sets
from ..training.data import heldout_loss
from ..training.train import train


def add_arguments(parser) -> None:
    parser.add_argument("--data", default=BundledText(), help="UTF-8 text to train on (first 90%% of its tokens train; default: the bundled tinyshakespeare)")
    parser.add_argument("--out", default=None, help="directory for the best checkpoint (model.safetensors + config.json)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default 1000 if no --minutes)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="wall-clock budget; with --steps too, stop at whichever comes first")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (warm-up, then cosine to 10%%)")
    parser.add_argument("--warmup", type=int, default=100, help="warm-up steps")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout on embeddings, attention and residuals")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--eval-every", type=int, default=200, help="steps between held-out evaluations")
    parser.add_argument("--chunk", type=int, default=512, help="rows per chunk of the fused LM head + loss")


def run(args) -> int:
    console = Console(emoji=False, width=None if sys.stdout.isatty() else 150)  # log lines unwrapped in a file
    for name in ("layers", "heads", "width", "context", "batch", "eval_every", "chunk"):
        v = getattr(args, name)
        if v is not None and v < (0 if name == "eval_every" else 1):
            raise MiniLLMError(f"--{name.replace('_', '-')}={v}: must be positive")
    if args.steps is not None and args.steps < 1:
        raise MiniLLMError(f"--steps={args.steps}: must be at least 1")
    if args.minutes is not None and not 0 < args.minutes < math.inf:
        raise MiniLLMError(f"--minutes={args.minutes}: must be a positive number")
    if not 0 < args.lr < math.inf:
        raise MiniLLMError(f"--lr={args.lr}: must be a positive number")
    if not 0 <= args.weight_decay < math.inf:
        raise MiniLLMError(f"--weight-decay={args.weight_decay}: must be a number >= 0")
    if args.warmup < 0:
        raise MiniLLMError(f"--warmup={args.warmup}: must be >= 0")
    if not 0.0 <= args.dropout < 1.0:
        raise MiniLLMError(f"--dropout={args.dropout}: must be in [0, 1)")
    train(args.data, out=args.out, layers=args.layers, heads=args.heads, width=args.width, context=args.context,
          batch=args.batch, steps=args.steps, minutes=args.minutes, lr=args.lr, weight_decay=args.weight_decay,
          dropout=args.dropout, seed=args.seed, eval_every=args.eval_every, warmup=args.warmup,
          chunk=args.chunk, log=console.log)
    return 0


def add_eval_arguments(parser) -> None:
    parser.add_argument("--model", default=None, help="checkpoint directory or model name (default: the bundled model)")
    parser.add_argument("--weights", default="float32", metavar="FORMAT",
                        help="float32 (default), q8_0, q4_0 or q4_1: score the model with its weights quantized "
                             "as GGUF defines them (the loss of the dequantized values: the quantized product "
                             "computes x @ dequantize(W) to float32 rounding)")
    parser.add_argument("--data", default=BundledText(), help="the text whose last 10%% of tokens is scored (default: the bundled tinyshakespeare)")
    parser.add_argument("--kernels", default=None, choices=kernel_sets.NAMES,
                        help="the kernel set that scores: numpy (the default: the training code's forward pass "
                             "over the dequantized weights), or fused, int8, batch-invariant: the model's own "
                             "forward pass with that set, as generate runs it (int8: x rounded to int8 blocks too)")


def run_eval(args) -> int:
    from ..models.gpt2 import dequantize_params

    own = args.kernels not in (None, "numpy")          # another set: the model's own forward with it
    model = load(args.model, weights=args.weights, kernels=args.kernels if own else "numpy")   # a checkpoint or any model name; default the bundled model
    loss = heldout_loss(args.data, model if own else (dequantize_params(model.params), model.config))
    what = "" if model.weights in ("float32", "float64") else f" with {model.weights} weights"
    what += f", {model.kernels} kernels" if own else ""
    print(f"held-out loss {loss:.4f} nats/token (perplexity {math.exp(loss):.1f}){what} on the last 10% of {args.data}")
    return 0
