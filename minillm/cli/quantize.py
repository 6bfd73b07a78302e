"""`minillm quantize SRC --format q8_0 --out FILE.gguf`: a model's weights quantized as GGUF defines
them, written as a GGUF file (llama.cpp's format) with the `gguf` package."""

from __future__ import annotations

from rich.markup import escape

from ..errors import MiniLLMError
from ..paths import output_file
from ..ui.report import fmt_bytes
from .common import MODEL_HELP, err, load_model, out

FORMATS = ("q8_0", "q4_0", "q4_1", "float32")


def add_arguments(p) -> None:
    p.add_argument("source", metavar="SRC", help=MODEL_HELP)
    p.add_argument("--format", default="q8_0", choices=FORMATS,
                   help="q8_0 (default; 8.5 bits a weight), q4_0 (4.5), q4_1 (5) or float32; the matrices and "
                        "the token embedding take it, norms, biases and the position embedding stay F32")
    p.add_argument("--out", required=True, metavar="FILE.gguf", help="the GGUF file to write")


def run(args) -> int:
    from ..checkpoints.gguf_gpt2 import write_gguf
    from ..bpe import tokenizer

    path = output_file(args.out)          # a new name or a regular file: never a device, FIFO or folder
    model = load_model(args.source, args.format, kernels="numpy", quiet=True)   # its bytes are written, not multiplied
    with err.status(f"writing {escape(str(path))}…"):
        try:
            write_gguf(model, path, args.format, tokenizer())
        except OSError as e:
            raise MiniLLMError(f"cannot write {path}: {e.strerror or e}") from None
    out.print(f"{escape(model.name)}: {model.n_params():,} parameters, {fmt_bytes(model.nbytes())} as "
              f"{args.format} in memory -> {escape(str(path))} ({fmt_bytes(path.stat().st_size)})")
    return 0
