"""`minillm learn`: the terminal lessons, listed or run.

The lessons live in `lessons/NN_slug.py` (installed as the package `minillm.lessons`). Each module has
TITLE, MINUTES, WHAT_YOU_WILL_SEE and `main(argv=None) -> int`. They are found when asked
(`discover()`, or `LESSONS`), never when this module loads: a broken lesson breaks only itself.

    minillm learn              the list: number, title, track, minutes, what you will see
    minillm learn --track core the short path, or any track (TRACKS)
    minillm learn 3            run lesson 3 (also `03`, or its slug: `prefill`)
    minillm learn glossary     the words the lessons introduce, each with its lesson
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


@dataclass(frozen=True)
class Track:
    """A path through the lessons: its name, what it answers, the lessons in order, what it builds on."""

    name: str
    what: str
    lessons: tuple[int, ...]
    builds_on: str


# Every lesson in exactly one track (tests/test_course6.py). The core carries the mission: tokens ->
# forward pass -> prefill -> naive decode -> KV cache -> memory traffic and the roofline -> batching.
# Its minutes are its lessons' MINUTES. The others are independent parts a learner picks after it.
TRACKS = (
    Track("core", "why decode is memory-bound, cached against naive, and what batching buys",
          (1, 2, 3, 4, 5, 6, 8), "nothing: start here"),
    Track("serving", "many requests at once: schedulers, prefix caching, speculation, the two phases",
          (9, 10, 11, 13), "core (the KV cache, 5; batching, 8)"),
    Track("models", "fewer bytes a token: GQA and windows, latent attention, a fixed state, experts",
          (12, 18, 19, 15), "core (the KV cache, 5; memory traffic, 6)"),
    Track("kernels", "fewer bytes and passes: quantized weights and their kernels, flash attention",
          (14, 20, 16), "core (memory traffic and the roofline, 6); 20 builds on 14"),
    Track("hardware", "the same regimes on a GPU, then one workload diagnosed: which lessons it needs",
          (17, 7), "core (the roofline, 6); 7 last: it refers back to every other track"),
)


def track_of(number: int) -> Track | None:
    """The track a lesson belongs to (None: a lesson no track names)."""
    return next((t for t in TRACKS if number in t.lessons), None)


def find_track(name: str) -> Track:
    for t in TRACKS:
        if t.name == name.strip().lower():
            return t
    raise MiniLLMError(f"no track {name!r}; choose one of: {', '.join(t.name for t in TRACKS)}")


def next_in_track(number: int) -> int | None:
    """The lesson after `number` in its track (None: the last of it)."""
    t = track_of(number)
    if t is None:
        return None
    i = t.lessons.index(number)
    return t.lessons[i + 1] if i + 1 < len(t.lessons) else None


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
                        help="the lesson to run: its number (1-%d) or name; without it, list the lessons; "
                             "'glossary': the words the lessons introduce" % len(lesson_files()))
    parser.add_argument("--track", default=None, metavar="NAME",
                        help="list one track's lessons in order: " + ", ".join(t.name for t in TRACKS)
                             + " (core: the short path; start there)")
    parser.add_argument("--no-pause", action="store_true", help="do not wait for Enter between parts")
    parser.add_argument("--fast", action="store_true",
                        help="smaller models and fewer steps (also: environment MINILLM_FAST=1)")
    parser.add_argument("--model", default=None, metavar="MODEL",
                        help="run the lesson on another model: random-124m, random-tiny, a checkpoint path, gpt2, ...")


def listing(track: Track | None = None):
    from rich import box
    from rich.table import Table

    by_number = {info.number: info for info in discover()}
    infos = [by_number[n] for n in track.lessons if n in by_number] if track else discover()
    title = (f"the {track.name} track: {track.what}; builds on {track.builds_on}" if track else
             "minillm lessons: run one with `minillm learn NN`")
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, header_style="bold")
    t.add_column("NN", justify="right", no_wrap=True)
    t.add_column("lesson", style="bold")
    t.add_column("min", justify="right", no_wrap=True)
    t.add_column("what you will see")
    if track is not None:
        for info in infos:
            t.add_row(f"{info.number:02d}", info.title, str(info.minutes), info.what)
        return t
    by_number = {info.number: info for info in infos}           # the full listing, grouped by track
    for tr in TRACKS:
        t.add_row("", f"[cyan]{tr.name} track[/]", "", f"[dim]builds on {tr.builds_on}[/]")
        for n in tr.lessons:
            if n in by_number:
                info = by_number[n]
                t.add_row(f"{info.number:02d}", info.title, str(info.minutes), info.what)
    placed = {n for tr in TRACKS for n in tr.lessons}
    for info in infos:                                          # a lesson no track names (none today)
        if info.number not in placed:
            t.add_row(f"{info.number:02d}", info.title, str(info.minutes), info.what)
    return t


def tracks_text() -> list[str]:
    """One line a track: its name, its lessons, its minutes, what it builds on."""
    minutes = {info.number: info.minutes for info in discover()}
    return [f"{t.name}: lessons {', '.join(str(n) for n in t.lessons)}, about "
            f"{sum(minutes.get(n, 0) for n in t.lessons)} minutes; {t.what}; builds on {t.builds_on}"
            for t in TRACKS]


def run(args: argparse.Namespace) -> int:
    """`minillm learn`: the list of lessons, or one lesson."""
    which = getattr(args, "lesson", None)
    track = getattr(args, "track", None)
    if which is not None and track is not None:
        raise MiniLLMError("give a lesson or --track, not both: --track lists a track's lessons")
    if which is None:
        from rich.console import Console
        from rich.markup import escape

        console = Console(emoji=False)
        if track is not None:
            t = find_track(track)
            console.print(listing(t))
            total = sum(info.minutes for info in discover() if info.number in t.lessons)
            console.print(f"  [dim]{len(t.lessons)} lessons, about {total} minutes. Run them in this order: "
                          f"minillm learn {t.lessons[0]}, then each lesson names the next.[/]")
            return 0
        console.print(listing())
        lessons = discover()
        total = sum(info.minutes for info in lessons)
        console.print("  [bold]Start with the core track[/] (`minillm learn --track core`): the "
                      "short path to why decode is memory-bound. The others build on it:")
        for line in tracks_text():
            console.print(f"  [dim]• {escape(line)}[/]")
        console.print(f"  [dim]{len(lessons)} lessons, about {total} minutes in all. Options: --fast (quick "
                      "run, smaller models), --no-pause, --model NAME, --threads N. Each lesson is also a script: "
                      "python lessons/01_tokens.py in a checkout[/]")
        return 0
    if str(which).strip().lower() == "glossary":
        from rich.console import Console
        tokens = next(info for info in discover() if info.number == 1)
        Console(emoji=False).print(importlib.import_module(tokens.module).glossary_table())
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
