"""The `minillm` command: one module per group of subcommands, registered from one table in `main`."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
