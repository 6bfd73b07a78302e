"""The commands' two consoles: results on stdout, progress, notes and errors on stderr."""

from __future__ import annotations

import os
import sys

from rich.console import Console

STDOUT_CLOSED = sys.stdout is None     # `minillm ... >&-`: main() says so; until then, write nowhere
if STDOUT_CLOSED:
    sys.stdout = open(os.devnull, "w")


def console(stderr: bool = False) -> Console:
    """A rich console. Sent to a file or a pipe, output is laid out for 150 columns (or $COLUMNS).
    No emoji codes: a path or a prompt holding ":thumbs_up:" is shown as the user wrote it."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(highlight=False, emoji=False, stderr=stderr, soft_wrap=stderr,
                   width=None if stream.isatty() or os.environ.get("COLUMNS") else 150)


out = console()
err = console(stderr=True)
