"""`minillm roofline`: this machine's roofline with the steps minillm measured on it, and a published
chip's with the same steps' counted intensities; in the terminal (plotext) and, with --plot, in a
file (matplotlib, the `plots` extra). The data is `measure.roofline`'s, the pictures `ui.roofline`'s."""

from __future__ import annotations

import json
from contextlib import nullcontext

from rich.markup import escape

from ..errors import MiniLLMError
from ..measure import roofline as rl
from ..measure.busy import conditions
from ..measure.comparisons import comparison_threads
from ..measure.hardware import machine
from ..threads import blas_threads, limited
from ..ui import roofline as draw
from .bench import parse_contexts
from .common import err, out

PART_WORDS = {"batch": "decode at each B", "contexts": "prefills and naive steps", "formats": "weight formats",
              "mixture": f"a mixture ({rl.MIXTURE})", "latent": f"latent attention ({rl.LATENT}), both ways"}


def add_arguments(p) -> None:
    p.add_argument("--model", default="random-124m", metavar="MODEL",
                   help="the model of the decode, prefill, naive and format points (default random-124m: GPT-2 "
                        "small's size, its weights beyond the caches)")
    p.add_argument("--parts", default=None, metavar="P,P",
                   help=f"which steps to measure, comma-separated: {', '.join(rl.PARTS)} (default all: decode at "
                        f"each --batch B; prefills and naive steps of each --contexts length; float32, Q8_0 and "
                        f"Q4_0 with the fused and integer kernel sets; a mixture of experts at B = 1 and 8; a "
                        f"latent-attention step absorbed and decompressed)")
    p.add_argument("--batch", default=",".join(map(str, rl.BATCHES)), metavar="B,B",
                   help=f"batch sizes of the decode points (default {','.join(map(str, rl.BATCHES))})")
    p.add_argument("--contexts", default=",".join(map(str, rl.CONTEXTS)), metavar="T,T",
                   help=f"prompt lengths of the prefill and naive points (default "
                        f"{','.join(map(str, rl.CONTEXTS))})")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds; medians are drawn (default 3)")
    p.add_argument("--kernels", default=None, metavar="K",
                   help="the kernel set of every part but the formats' (which run the fused and integer sets "
                        "where they can): numpy, fused, int8 or batch-invariant (default: as `minillm bench`)")
    p.add_argument("--chip", default="a100", metavar="NAME",
                   help="the published chip whose roofline is drawn beside this machine's, with the same steps' "
                        "counted FLOP/byte (default a100; e.g. h100, h200, b200; 'none' for this machine's alone)")
    p.add_argument("--plot", default=None, metavar="FILE",
                   help="also write the pictures to FILE, .svg or .png (matplotlib: pip install 'minillm[plots]')")
    p.add_argument("--json", action="store_true",
                   help="print the measurements and the pictures' data as one JSON object")


def run(args) -> int:
    """Checks first (one line each), then every part on one thread count (one on a busy machine, said
    on stderr and on the picture), then the pictures, or the tables where no picture fits."""
    parts = rl.parse_parts(args.parts)
    batches = parse_contexts(args.batch, "--batch")
    contexts = parse_contexts(args.contexts, "--contexts")
    if not batches or any(B < 1 for B in batches):
        raise MiniLLMError(f"--batch {args.batch}: give batch sizes of at least 1, e.g. 1,2,4,8")
    if not contexts or any(T < 1 for T in contexts):
        raise MiniLLMError(f"--contexts {args.contexts}: give prompt lengths of at least 1, e.g. 16,128,512")
    if args.repeats < 1:
        raise MiniLLMError(f"--repeats {args.repeats}: must be at least 1")
    chip = None if args.chip.strip().lower() == "none" else rl.chip_roof(args.chip).name
    if args.kernels is not None:
        from .bench import parse_kernels
        if len(parse_kernels(args.kernels)) != 1:
            raise MiniLLMError(f"--kernels {args.kernels}: give one kernel set")
    if args.plot is not None:
        draw.check_plot_path(args.plot)           # before measuring: the folder, the name, matplotlib
    threads, why = comparison_threads(getattr(args, "threads", None), default=blas_threads())
    if why:
        err.print(f"[yellow]note:[/] {escape(why)}", soft_wrap=False)
    with limited(threads):
        hw = machine(progress=not args.json)      # this thread count's figures
        with err.status("measuring…") if not args.json else nullcontext() as status:
            def progress(part):
                if status is not None:
                    status.update(f"measuring {PART_WORDS[part]}…")
            results = rl.collect(hw, parts, args.model, batches, contexts, args.repeats, args.kernels, progress)
        ran_on = blas_threads()
    pictures = [rl.picture(results, hw, busy=why)] + ([rl.chip_picture(results, chip)] if chip else [])
    if args.json:
        print(json.dumps({"results": results, "pictures": [p.as_dict() for p in pictures], "threads": ran_on,
                          "conditions": conditions(threads, why)}))
    elif not draw.show(out, pictures):
        for pic in pictures:                      # not a terminal, or too narrow: the tables
            out.print(f"[bold]{escape(draw.title(pic))}[/]")
            out.print(draw.legend(pic))
            for line in draw.describe(pic):
                out.print(f"[dim]{escape(line)}[/]")
    if args.plot is not None:
        path = draw.write_file(pictures, args.plot)
        (err if args.json else out).print(f"[dim]wrote the pictures to {escape(str(path))}[/]", soft_wrap=False)
    return 0
