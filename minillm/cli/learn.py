"""`minillm learn`: the terminal lessons, listed or run.

The lessons live in `lessons/NN_slug.py` (installed as the package `minillm.lessons`). Each module has
TITLE, MINUTES, WHAT_YOU_WILL_SEE and `main(argv=None) -> int`. They are found when asked
(`discover()`, or `LESSONS`), never when this module loads: a broken lesson breaks only itself.

    minillm learn              the list: number, title, minutes, what you will see
    minillm learn 3            run lesson 3 (also `03`, or its slug: `prefill`)
    minillm learn 3 --fast     smaller models and fewer steps
    minillm learn 3 --no-pause do not wait for Enter between parts
"""

from __future__ import annotations

import argparse
import functools
import importlib
import re
from dataclasses import dataclass
from importlib import resources

from ..errors import MiniLLMError

_NAME = re.compile(r"^(\d\d)_([a-z0-9_]+)\.py$")


@dataclass(frozen=True)
class LessonInfo:
    number: int
    slug: str        # "prefill" for 03_prefill.py
    module: str      # "minillm.lessons.03_prefill"
    title: str
    minutes: int
    what: str


def lesson_files() -> list[str]:
    """The names `NN_slug.py` in the `minillm.lessons` package, in order (nothing imported)."""
    return sorted(e.name for e in resources.files("minillm.lessons").iterdir() if _NAME.match(e.name))


@functools.cache
def discover() -> list[LessonInfo]:
    """Every lesson, in order, with its metadata (each lesson module is imported to read it)."""
    found = []
    for name in lesson_files():
        match = _NAME.match(name)
        module = f"minillm.lessons.{name[:-3]}"
        mod = importlib.import_module(module)
        found.append(LessonInfo(int(match.group(1)), match.group(2), module, mod.TITLE, int(mod.MINUTES),
                                mod.WHAT_YOU_WILL_SEE))
    return found


def __getattr__(name: str):
    if name == "LESSONS":                  # `learn.LESSONS`: discovered on first use
        return discover()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def find(which: str) -> LessonInfo:
    """A lesson by number ('3', '03') or slug ('prefill', 'kv_cache', 'kv-cache')."""
    key = which.strip().lower().replace("-", "_")
    for info in discover():
        if (key.isdigit() and int(key) == info.number) or key == info.slug:
            return info
    choices = ", ".join(f"{info.number} ({info.slug})" for info in discover())
    raise MiniLLMError(f"no lesson {which!r}; choose one of: {choices}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `minillm learn`."""
    parser.add_argument("lesson", nargs="?", metavar="NN",
                        help="the lesson to run: its number (1-%d) or name; without it, list the lessons" % len(lesson_files()))
    parser.add_argument("--no-pause", action="store_true", help="do not wait for Enter between parts")
    parser.add_argument("--fast", action="store_true",
                        help="smaller models and fewer steps (also: environment MINILLM_FAST=1)")
    parser.add_argument("--model", default=None, metavar="MODEL",
                        help="run the lesson on another model: random-124m, random-tiny, a checkpoint path, gpt2, ...")


def listing():
    from rich import box
    from rich.table import Table

    t = Table(title="minillm lessons: run one with `minillm learn NN`", title_justify="left",
              box=box.SIMPLE_HEAD, header_style="bold")
    t.add_column("NN", justify="right", no_wrap=True)
    t.add_column("lesson", style="bold")
    t.add_column("min", justify="right", no_wrap=True)
    t.add_column("what you will see")
    for info in discover():
        t.add_row(f"{info.number:02d}", info.title, str(info.minutes), info.what)
    return t


def run(args: argparse.Namespace) -> int:
    """`minillm learn`: the list of lessons, or one lesson."""
    which = getattr(args, "lesson", None)
    if which is None:
        from rich.console import Console

        console = Console(emoji=False)
        console.print(listing())
        lessons = discover()
        total = sum(info.minutes for info in lessons)
        console.print(f"  [dim]{len(lessons)} lessons, about {total} minutes in all. Options: --fast (quick "
                      "run, smaller models), --no-pause, --model NAME, --threads N. Each lesson is also a script: "
                      "python lessons/01_tokens.py in a checkout[/]")
        return 0
    info = find(str(which))
    argv = []
    if getattr(args, "no_pause", False):
        argv.append("--no-pause")
    if getattr(args, "fast", False):
        argv.append("--fast")
    if getattr(args, "model", None):
        argv += ["--model", args.model]
    if getattr(args, "threads", None) is not None:
        argv += ["--threads", str(args.threads)]
    return importlib.import_module(info.module).main(argv)
