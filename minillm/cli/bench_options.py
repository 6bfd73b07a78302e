"""What `minillm bench`'s lists mean: the context lengths, the kernel sets (and the title's words
for them), the family options, each parsed to values, one line for a bad one. The command
(cli/bench.py) and its modes (cli/bench_modes.py) read them; `minillm roofline` too."""

from __future__ import annotations

from ..checkpoints.families import all_options
from ..errors import MiniLLMError
from ..models import kernel_sets

DEFAULT_CONTEXTS = "16,128,512,1000"     # --contexts when not given (--context-sweep has its own)


def parse_contexts(text: str, option: str = "--contexts") -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MiniLLMError(f"{option} {text!r}: expected comma-separated integers such as 16,128,512") from None
    if not values:                      # "" or ",": nothing asked is not the defaults
        raise MiniLLMError(f"{option} {text!r}: give at least one integer, comma-separated, such as 16,128,512")
    return values


def parse_kernels(text: str | None) -> list[str]:
    """--kernels: kernel set names, comma-separated; None: the default alone. One line for a set that
    is not one, or cannot run here."""
    if text is None:
        return [kernel_sets.default(True, "float32", "float32")]
    names = list(dict.fromkeys(k.strip().lower() for k in text.split(",") if k.strip()))
    if not names or any(k not in kernel_sets.NAMES for k in names):
        raise MiniLLMError(f"--kernels {text!r}: give kernel sets from {', '.join(kernel_sets.NAMES)}, "
                           "comma-separated (e.g. numpy,fused)")
    for k in names:
        kernel_sets.spec(k).check()
    return names


def kernels_title(kernels: list[str]) -> str:
    """The bench title's words for the kernel sets measured ('fused kernels (numba 0.68.1, 2 threads)', ...)."""
    from ..kernels import threads
    words = [kernel_sets.get(k).about + (f", {threads()} threads" if kernel_sets.spec(k).needs_numba else "")
             for k in kernels]
    why = kernel_sets.why_default()
    if kernels == ["numpy"] and why:
        words[0] += f" ({why})"
    return " and ".join(words)


def parse_option_values(args) -> dict[str, list[str]]:
    """The family options given (--mla-decode absorbed,decompressed, ...): name -> values, each one of
    the option's choices (one line otherwise); the options not given are left out."""
    given, out = vars(args), {}
    for o in all_options():
        text = given.get(o.name)
        if text is None:
            continue
        values = list(dict.fromkeys(w.strip() for w in text.split(",") if w.strip()))
        if not values or any(w not in o.choices for w in values):
            raise MiniLLMError(f"{o.flag} {text!r}: give {' and/or '.join(o.choices)}, comma-separated")
        out[o.name] = values
    return out
