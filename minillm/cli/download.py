"""`minillm download NAME [--dir DIR]`: fetch a GPT-2 checkpoint (`minillm.checkpoints.download`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checkpoints.download import KNOWN_MODELS, download


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `minillm download`."""
    sizes = ", ".join(f"{n} ({i.params / 1e6:.0f}M)" for n, i in KNOWN_MODELS.items())
    parser.add_argument("name", choices=list(KNOWN_MODELS), metavar="name", help=f"the model: {sizes}")
    parser.add_argument(
        "--dir", type=Path, default=None,
        help="folder to put the files in (default: $MINILLM_HOME/<name>, else ~/.cache/minillm/<name>)",
    )


def run(args: argparse.Namespace) -> int:
    """`minillm download`: fetch the model, say where it went and what to run next."""
    folder = download(args.name, args.dir)
    model = args.name if args.dir is None else str(folder)
    print(f"{args.name} is ready in {folder}")
    print(f'next: minillm generate "Hello" --model {model}')
    return 0
