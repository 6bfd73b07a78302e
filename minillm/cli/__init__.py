"""The `minillm` command: one module per group of subcommands, registered from one table in `main`."""

from .. import _starting_the_command

try:
    from .main import build_parser, main
except KeyboardInterrupt:          # Ctrl-C while the command's modules load: exit quietly
    if _starting_the_command():
        raise SystemExit(130) from None
    raise

__all__ = ["build_parser", "main"]
