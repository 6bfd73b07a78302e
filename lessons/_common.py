"""What every lesson shares: options, pauses, narrative, checked claims and terminal bar charts.

A lesson is a module `NN_slug.py` with TITLE, MINUTES, WHAT_YOU_WILL_SEE, a `lesson(L)` function
that tells the story (one function per section, each taking what it needs), and

    def main(argv=None) -> int:
        return run_lesson(lesson, argv)

`run_lesson` reads the number and the script name from the file name and the rest from the module.
The lesson body calls the same public functions a user calls (minillm.load, minillm.tokenizer,
model.prefill, minillm.generate, minillm.Meter, minillm.measure.hardware); this file only formats
what they return, and chooses the words of every comparison from the numbers it compares (the
`*_words` functions below, which the tests feed both sides of each comparison).

Options every lesson takes:
    --no-pause   never wait for Enter (pauses happen only when stdin is a terminal anyway)
    --fast       smaller models and fewer steps, so the whole course runs in seconds
                 (also on with the environment variable MINILLM_FAST=1)
    --model M    run the lesson on another model (e.g. random-124m, or a downloaded gpt2)

Every claim a lesson makes about the numbers is checked with `L.claim(condition, text)`: if one
fails the lesson stops with a red message and exit status 1, so the tests catch a broken claim.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from rich.console import Console, Group
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

import minillm
from minillm.errors import MiniLLMError
from minillm import closeness
from minillm.measure import hardware, probe
from minillm.cli.commands import add_threads_option
from minillm.threads import blas_threads, limited
from minillm.ui.report import fmt_bytes, fmt_flops, fmt_kib, fmt_time  # noqa: F401  (re-exported to the lessons)

try:   # one line on a busy machine, with the fix (shared with the commands)
    from minillm.measure.busy import busy_note as _busy_line
except ImportError:   # pragma: no cover - until the shared check exists
    _busy_line = None

FAST_ENV = "MINILLM_FAST"

# ---------------------------------------------------------------------------------------------------
# Numbers as words
# ---------------------------------------------------------------------------------------------------


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def fmt_prob(p: float) -> str:
    return f"{p:.1%}" if p >= 0.001 else f"{p:.4%}"


def fmt_x(ratio: float) -> str:
    return f"{ratio:,.0f}×" if ratio >= 100 else f"{ratio:.3g}×"


# ---------------------------------------------------------------------------------------------------
# Words chosen by the numbers: every sentence that compares or ranks goes through one of these
# ---------------------------------------------------------------------------------------------------


def growth_words(ratio: float, work: float) -> str:
    """How a time grew (`ratio` = last ÷ first) while the work grew `work` times: the words follow the
    numbers. 'hardly grew' only below 1.25×; 'in proportion' only within 25% of `work`."""
    if ratio < 1.25:
        return f"hardly grew ({fmt_x(ratio)} for {fmt_x(work)} the work)"
    if ratio < 0.8 * work:
        return f"grew {fmt_x(ratio)}, less than the {fmt_x(work)} of the work"
    if ratio <= 1.25 * work:
        return f"grew about in proportion to the work ({fmt_x(ratio)} for {fmt_x(work)})"
    return f"grew more than the work ({fmt_x(ratio)} for {fmt_x(work)})"


def faster_words(a: "Timing", b: "Timing", what: str, than: str) -> str:
    """'X took 0.4× the time of Y: faster, 6 of 6 paired rounds over 5% apart, …' and the like: the ratio of
    the medians and of the rounds (`ratio_range`), and the one closeness rule's verdict on the two sides'
    rounds (closeness.py): faster or slower only when the sign test on their paired rounds ranks them."""
    how = closeness.verdict_words(a.seconds, b.seconds, lower_better=True)
    return f"{what} took {fmt_ratio(ratio_range(a, b))} the time of {than}: {how}"


def timed_words(a: Timing, b: Timing, what: str, than: str) -> str:
    """'X took 0.65× the time of Y (0.61×–0.70× in 6 paired rounds)': the ratio of the medians and of
    the same rounds' times, stated, with no verdict drawn from them: where the time is the point and
    a verdict drawn from it changed with the load (issue 53: lesson 20's kernels, lesson 8's price)."""
    mid, lo, hi = ratio_range(a, b)
    return f"{what} took {fmt_x(mid)} the time of {than} ({fmt_x(lo)}–{fmt_x(hi)} in {a.n} paired rounds)"


def priced_words(a_price: float, b_price: float, what: str, than: str, measured: "Timing | None" = None,
                 against: "Timing | None" = None, unit: float = 1.0) -> str:
    """'X costs 0.6× the time of Y on the roofline: faster (apart by over 5%; priced from counts, the
    same every run). Measured: 0.9× (0.8×–1.1× over 6 rounds).' The verdict is drawn from the two
    prices alone (each side's counted bytes and FLOPs at this machine's bandwidth and peak:
    `closeness.figures_apart`), so it cannot flip with the load; the measured ratio, when given, is
    said beside it with no verdict word of its own, and how many times its price each side took (the
    measured times in seconds × `unit`): what the roofline leaves out, where the two disagree."""
    side = closeness.figures_apart(a_price, b_price)
    band = f"{closeness.CLOSE:.0%}"
    how = (f"no winner (within {band}" if side == 0 else f"faster (apart by over {band}" if side < 0
           else f"slower (apart by over {band}")
    out = (f"{what} costs {fmt_x(a_price / b_price)} the time of {than} on the roofline: {how}; "
           f"priced from counts, the same every run).")
    if measured is not None and against is not None:
        mid, lo, hi = ratio_range(measured, against)
        out += (f" Measured: {fmt_x(mid)} ({fmt_x(lo)}–{fmt_x(hi)} over {plural(measured.n, 'round')}); the two "
                f"took {fmt_x(measured.median * unit / a_price)} and {fmt_x(against.median * unit / b_price)} their "
                "price: what the roofline leaves out (Python, dispatch, kernels below peak).")
    return out


def rank_words(sides: dict, what: str, fmt, higher: bool = True) -> str:
    """The one closeness rule's sentence on several sides' rounds ({name: values}): a winner only
    when its rounds lie beyond every other side's spread (closeness.py)."""
    return closeness.best_words(closeness.rank(sides, higher), what, fmt)


def fall_words(time_ratio: float, work_ratio: float, what: str = "time") -> str:
    """A time fell `time_ratio`× (before ÷ after) while the work fell `work_ratio`×: which fell more."""
    if time_ratio > 1.1 * work_ratio:
        rel = "more than"
    elif time_ratio < work_ratio / 1.1:
        rel = "less than"
    else:
        rel = "about as much as"
    return f"{what} fell {fmt_x(time_ratio)}, {rel} the {fmt_x(work_ratio)} of the work"


GPUS = ("a100-80gb", "h200", "h100-sxm")     # the data-centre GPUs the lessons compare with
QUANT_SHOWN = ("float32", "q8_0", "q4_0")    # the weights lessons 14 and 20 load and compare
NVFP4_BLOCK = 16          # NVFP4: 16 E2M1 values share one E4M3 scale (and a float32 scale per tensor)


def gpu_ridge_range() -> str:
    """'153-295': the fp16 ridges (FLOPs per byte) of the GPUs the lessons name, from their published figures."""
    from minillm.measure.chips import get_chip
    ridges = [get_chip(g).ridge for g in GPUS]
    return f"{min(ridges):.0f}-{max(ridges):.0f}"


def token_text(enc, token: int) -> str:
    """A token as the learner should see it: spaces as ␣, newlines as ↵, broken UTF-8 as bytes."""
    text = enc.decode_single_token_bytes(token).decode("utf-8", errors="backslashreplace")
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")


# ---------------------------------------------------------------------------------------------------
# Timings: repeated, interleaved, shown with their spread
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Wall times of one piece of work over several rounds: the median, and the range it moved in."""

    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def lo(self) -> float:
        return min(self.seconds)

    @property
    def hi(self) -> float:
        return max(self.seconds)

    @property
    def n(self) -> int:
        return len(self.seconds)

    def text(self) -> str:
        """'148 µs (median of 5, 140 µs–160 µs)'; a single sample says so."""
        if self.n == 1:
            return f"{fmt_time(self.median)} (one run)"
        return f"{fmt_time(self.median)} (median of {self.n}, {fmt_time(self.lo)}–{fmt_time(self.hi)})"

    def short(self) -> str:
        """'148 µs ±8%': the median and half the range, relative."""
        if self.n == 1 or self.median <= 0:
            return fmt_time(self.median)
        return f"{fmt_time(self.median)} ±{50 * (self.hi - self.lo) / self.median:.0f}%"


def ratio_range(a: Timing, b: Timing) -> tuple[float, float, float]:
    """a ÷ b: the ratio of the medians, and the smallest and largest ratio of the same rounds' times."""
    return (a.median / b.median, *closeness.ratio_span(a.seconds, b.seconds))


def time_interleaved(work: dict[str, Callable[[], object]], rounds: int, warmup: bool = True,
                     settle: bool = True) -> dict[str, Timing]:
    """Time each piece of work once per round, in turn, for `rounds` rounds (after one untimed warm-up each),
    the order reversed every other round (`closeness.round_order`).

    Interleaving puts every piece of work under the same passing load: a busy moment of the machine
    slows one round of each, not every sample of one of them; the rounds are paired, for the verdict
    rule (closeness.py). Two pieces of work given `rounds` >= closeness.MIN_ROUNDS get more rounds, up to
    closeness.CAP, until the rule ranks them or can no longer (`closeness.settled`); `settle=False` where
    no verdict is drawn from the times (a ratio stated, or a verdict priced from counts): `rounds` alone."""
    if warmup:
        for fn in work.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in work}
    names = list(work)
    adaptive = settle and len(names) == 2 and rounds >= closeness.MIN_ROUNDS
    i = 0
    while True:
        for name in closeness.round_order(names, i):
            t0 = time.perf_counter()
            work[name]()
            times[name].append(time.perf_counter() - t0)
        i += 1
        if i >= max(1, rounds) and not (adaptive and not closeness.settled(*(times[n] for n in names))):
            break
    return {name: Timing(tuple(ts)) for name, ts in times.items()}


def fmt_ratio(r: tuple[float, float, float]) -> str:
    """(median ratio, lo, hi) → '3.1× (2.8×–3.4× over the rounds)'."""
    mid, lo, hi = r
    return f"{fmt_x(mid)} ({fmt_x(lo)}–{fmt_x(hi)} over the rounds)"


# ---------------------------------------------------------------------------------------------------
# Terminal charts
# ---------------------------------------------------------------------------------------------------

_EIGHTHS = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"]


def bar(value: float, vmax: float, width: int = 36) -> str:
    """A horizontal bar of `value` on a scale where `vmax` fills `width` cells, in eighths of a cell."""
    if vmax <= 0 or value <= 0:
        return ""
    cells = max(0.0, min(1.0, value / vmax)) * width
    full = int(cells)
    s = "█" * full + _EIGHTHS[int((cells - full) * 8)]
    return s or "▏"


def fit_bar(width: int, label: int, text: int, columns: int = 80) -> int:
    """The bar width that keeps a chart's row (label, bar, value, padding) within `columns`."""
    return max(8, min(width, columns - label - text - 6))


def bar_chart(title: str, rows: Iterable[tuple[str, float, str]], *, style: str = "cyan",
              width: int = 36, vmax: float | None = None) -> Group:
    """One bar per row: (label, value, value as text). All bars share one scale (the largest value)."""
    rows = list(rows)
    top = vmax if vmax is not None else max((v for _, v, _ in rows), default=0.0)
    width = fit_bar(width, max((len(label) for label, _, _ in rows), default=0),
                    max((len(text) for _, _, text in rows), default=0))
    t = Table(box=None, show_header=False, padding=(0, 1))
    t.add_column(justify="right", no_wrap=True)
    t.add_column(no_wrap=True, style=style)
    t.add_column(justify="right", no_wrap=True)
    for label, value, text in rows:
        t.add_row(label, bar(value, top, width), text)
    return Group(Text.from_markup(f"[bold]{title}[/]"), t)


def paired_chart(title: str, rows: Iterable[tuple[str, float, float, str, str]], names: tuple[str, str],
                 styles: tuple[str, str] = ("red", "green"), width: int = 36) -> Group:
    """Two bars per row on one shared scale: (label, a, b, a as text, b as text)."""
    rows = list(rows)
    top = max((max(a, b) for _, a, b, _, _ in rows), default=0.0)
    width = fit_bar(width, max((len(r[0]) for r in rows), default=0) + max(len(n) for n in names) + 1,
                    max((max(len(r[3]), len(r[4])) for r in rows), default=0))
    t = Table(box=None, show_header=False, padding=(0, 1))
    t.add_column(justify="right", no_wrap=True)
    t.add_column(no_wrap=True)
    t.add_column(no_wrap=True)
    t.add_column(justify="right", no_wrap=True)
    for label, a, b, ta, tb in rows:
        t.add_row(label, Text(names[0], style=styles[0]), Text(bar(a, top, width), style=styles[0]), ta)
        t.add_row("", Text(names[1], style=styles[1]), Text(bar(b, top, width), style=styles[1]), tb)
    return Group(Text.from_markup(f"[bold]{title}[/]"), t)


def stacked_bar(parts: list[tuple[float, str]], vmax: float, width: int = 50) -> Text:
    """One bar cut into coloured segments (value, style), on a scale where vmax fills `width`."""
    out = Text()
    done, start = 0.0, 0
    for value, style in parts:
        done += value
        end = round(done / vmax * width) if vmax > 0 else 0
        out.append("█" * max(0, end - start), style=style)
        start = max(start, end)
    return out


class RooflinePlot:
    """A roofline that draws itself for the console it is printed on: on a terminal of 80 columns or
    more, the picture `minillm roofline` draws (plotext, `minillm.ui.roofline`: slope, roof and ridge
    labelled, each point's key at its counted FLOP/byte and measured GFLOP/s); elsewhere (a pipe, a
    file, the tests, a narrow window) the same points in characters (`roofline_chars`)."""

    def __init__(self, bandwidth_gbs: float, peak_gflops: float, points: list[tuple[str, float, float]],
                 width: int = 64, height: int = 15):
        self.args = (bandwidth_gbs, peak_gflops, points, width, height)

    def picture(self):
        """The lesson's points as a `measure.roofline.Picture`: each (key, FLOP/byte, GFLOP/s) as a
        second's work at that rate (FLOPs = GFLOP/s × 10⁹, bytes = FLOPs ÷ FLOP/byte)."""
        from minillm.measure.roofline import Picture, Point, Roof
        bw, peak, points = self.args[:3]
        roof = Roof("this machine", bw, peak, threads=blas_threads(), measured=True)
        pts = [Point(key, "lesson", y * 1e9, y * 1e9 / x, 1.0) for key, x, y in points if x > 0 and y > 0]
        return Picture(roof, pts, f"this machine: {bw:,.1f} GB/s, {peak:,.0f} GFLOP/s (measured)")

    def __rich_console__(self, console, options):
        from minillm.ui import roofline as draw
        if console.is_terminal and options.max_width >= draw.MIN_COLUMNS:
            pic = self.picture()
            marks = [p.label for p in pic.points]
            yield Text.from_ansi(draw.terminal(pic, width=min(80, options.max_width), marks=marks,
                                               color=draw.colour_wanted() and not console.no_color))
        else:
            yield roofline_chars(*self.args)


roofline_plot = RooflinePlot


def roofline_chars(bandwidth_gbs: float, peak_gflops: float, points: list[tuple[str, float, float]],
                   width: int = 64, height: int = 15) -> Text:
    """A log-log roofline in characters: x = FLOPs per byte, y = GFLOP/s.

    The roof is min(peak, intensity × bandwidth), drawn with dots; each point (letter, intensity,
    achieved GFLOP/s) is a letter; the ridge (peak ÷ bandwidth) is marked on the x axis with ▲.
    """
    import math

    ridge = peak_gflops / bandwidth_gbs
    xs = [p[1] for p in points if p[1] > 0] + [ridge]
    ys = [p[2] for p in points if p[2] > 0] + [peak_gflops]
    x0 = math.floor(math.log10(min(xs) / 2))
    x1 = math.ceil(math.log10(max(xs) * 2))
    y1 = math.ceil(math.log10(peak_gflops * 1.5))
    y0 = min(math.floor(math.log10(min(ys) / 2)), math.floor(math.log10(bandwidth_gbs * 10**x0)))
    y0 = max(y0, y1 - 6)

    def col(x: float) -> int:
        return round((math.log10(x) - x0) / (x1 - x0) * (width - 1))

    def row(y: float) -> int:  # 0 = top
        v = (math.log10(max(y, 10**y0)) - y0) / (y1 - y0)
        return height - 1 - round(min(1.0, max(0.0, v)) * (height - 1))

    grid = [[(" ", "") for _ in range(width)] for _ in range(height)]
    for c in range(width):
        x = 10 ** (x0 + c / (width - 1) * (x1 - x0))
        grid[row(min(peak_gflops, x * bandwidth_gbs))][c] = ("·", "blue")
    for label, x, y in points:
        if x > 0 and y > 0:
            r, c = row(y), col(x)
            for dc in (0, 1, -1, 2, -2, 3, -3):   # two points in one cell: put the second beside it
                if 0 <= c + dc < width and grid[r][c + dc][0] in " ·":
                    grid[r][c + dc] = (label, "bold magenta")
                    break
    out = Text()
    for r, line in enumerate(grid):
        # a label at each decade of the y axis
        y_here = 10 ** (y0 + (height - 1 - r) / (height - 1) * (y1 - y0))
        decade = round(math.log10(y_here))
        label = f"{10**decade:g}" if row(10**decade) == r else ""
        out.append(f"{label:>8} ┤", style="dim")
        for ch, style in line:
            out.append(ch, style=style or None)
        out.append("\n")
    out.append(" " * 9 + "└" + "─" * width + "\n", style="dim")
    mark = f"▲ ridge {ridge:.3g}"
    at = col(ridge)
    out.append(" " * (10 + at) + mark + "\n" if at + len(mark) <= width + 8
               else " " * (10 + at + 1 - len(mark)) + f"ridge {ridge:.3g} ▲" + "\n", style="blue")
    ticks = [" "] * (width + 8)
    for e in range(x0, x1 + 1):
        text = f"{10**e:g}"
        c = col(10**e)
        for i, ch in enumerate(text):
            if c + i < len(ticks):
                ticks[c + i] = ch
    out.append(" " * 10 + "".join(ticks).rstrip() + "\n", style="dim")
    out.append(" " * 10 + "FLOP/byte (log) · roof: min(peak, FLOP/byte × bandwidth), GFLOP/s (log)",
               style="dim")
    return out


# ---------------------------------------------------------------------------------------------------
# The lesson
# ---------------------------------------------------------------------------------------------------


class ClaimFailed(AssertionError):
    """A claim the lesson makes about the numbers did not hold on this run."""


@dataclass
class Lesson:
    number: int
    title: str
    fast: bool = False
    no_pause: bool = False
    model_name: str | None = None
    console: Console = field(default_factory=lambda: Console(highlight=False))
    claims: list[str] = field(default_factory=list)
    _after_claim: bool = False
    _commands: list[str] = field(default_factory=list)    # shell lines to print whole, under the next try_it
    _hw: object = None                                      # the hardware figures, once shown
    _busy: bool | None = None                               # busy at the last probe (recheck())
    _busy_said: bool = False                                # the busy-machine note printed already
    _probed: bool = False                                   # this section's timings probed the machine
    _threads_free: bool = False                             # no --threads: a busy machine may drop to one
    _stack: contextlib.ExitStack | None = None              # run_lesson's: a thread limit set mid-lesson
    _asked_threads: int | None = None                       # the thread count asked for (or BLAS's at start)

    def _gap(self) -> None:
        """A blank line between a run of checked claims and what follows."""
        if self._after_claim:
            self.console.print()
            self._after_claim = False

    # -- narrative ----------------------------------------------------------------------------

    def say(self, markdown: str) -> None:
        """A paragraph (or list, or code block) of Markdown."""
        self._gap()
        self.console.print(Markdown(textwrap.dedent(markdown).strip()))
        self.console.print()

    def section(self, title: str) -> None:
        self._after_claim = False
        self._probed = False                 # the next timing probes the machine again
        self.console.print()
        self.console.rule(f"[bold]{title}[/]", align="left")
        self.console.print()

    def show(self, *renderables) -> None:
        self._gap()
        for r in renderables:
            self.console.print(r)
        self.console.print()

    def takeaway(self, markdown: str) -> None:
        self._gap()
        self.console.print(Panel(Markdown(textwrap.dedent(markdown).strip()), border_style="green",
                                 title="the point", title_align="left", padding=(0, 1)))
        self.console.print()

    def note(self, text: str) -> None:
        self._gap()
        self.console.print(f"[yellow]note:[/] {text}")
        self.console.print()

    def pause(self) -> None:
        """Wait for Enter, only when someone is at a terminal and --no-pause was not given."""
        if self.no_pause or not sys.stdin.isatty():
            return
        try:
            self.console.input("[dim]── press Enter to go on (Ctrl-C to stop) ──[/]")
        except EOFError:
            self.no_pause = True

    def busy_note(self) -> None:
        """Say so when other programs are keeping this machine busy: measured times suffer, counts do not.
        (Probes the machine at most once per section; the note is printed once per lesson.)"""
        self.recheck()

    def recheck(self) -> bool:
        """Before a section's timings: probe the machine again (a lull at the start can hide a busy
        machine later), once per section. The first time it is busy, say so; and when the learner chose
        no thread count and BLAS runs on several, run the rest of the lesson on one thread, every side of
        each comparison alike. Returns whether the machine is busy now."""
        if self._probed:
            return bool(self._busy)
        self._probed = True
        line = busy_line()
        self._busy = line is not None
        if line and not self._busy_said:
            self._busy_said = True
            if self._threads_free and self._stack is not None and (blas_threads() or 1) > 1:
                self._stack.enter_context(limited(1))
                line += ("; so from here this lesson runs on 1 BLAS thread, every side of each comparison "
                         "alike (--threads N to choose)")
            self.note(line)
        return self._busy

    def status(self, message: str):
        """A spinner while something slow runs (nothing is printed when output is not a terminal)."""
        return self.console.status(message)

    @contextlib.contextmanager
    def progress(self, description: str, total: int) -> Iterator[Callable[[], None]]:
        """A progress bar on stderr for long work (shown only at a terminal); yields `advance()`."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda: bar.advance(task)

    def progress_range(self, n: int, description: str):
        """range(n) with a progress bar on stderr (at a terminal)."""
        with self.progress(description, n) as advance:
            for i in range(n):
                yield i
                advance()

    def sample_panel(self, prompt: str, text: str, title: str, lines: int = 4) -> None:
        """A generated sample in a panel, cut to its first few lines so the story stays on screen."""
        from rich.markup import escape

        text = text.rstrip("\n")         # a leading newline is the model's: "ROMEO:" then a new line
        shown = text.split("\n")
        cut = len(shown) > lines or len(text) > 80 * lines
        body = "\n".join(shown[:lines])[: 80 * lines]
        self.show(Panel(escape(prompt) + "[bold]" + escape(body) + "[/]" + (" [dim](cut here)[/]" if cut else ""),
                        title=title, title_align="left"))

    def try_it(self, markdown: str) -> None:
        self._gap()
        self.console.print(Panel(Markdown(textwrap.dedent(markdown).strip()), border_style="magenta",
                                 title="Try it yourself", title_align="left", padding=(0, 1)))
        for command in self._commands:      # whole lines, outside the box: a path is never broken in two
            self.console.print(Text("  $ " + command), soft_wrap=True)
        self._commands.clear()

    def copy_hint(self, lesson_file: str, slug: str) -> str:
        """How to run an edited copy of this lesson: a copy runs anywhere, the installed file stays as it is."""
        here = Path(lesson_file).resolve()
        try:
            here = here.relative_to(Path.cwd())
        except ValueError:
            pass
        mine = f"my_{self.number:02d}_{slug}.py"
        self._commands.append(f"cp {here} {mine}")
        return (f"Copy this lesson out of the package and run your copy: the `cp` command below the box, then "
                f"`python {mine} --no-pause`.")

    # -- checked claims -----------------------------------------------------------------------

    def claim(self, ok: bool, text: str) -> None:
        """State a claim about the numbers just measured; stop the lesson if it does not hold."""
        if not ok:
            raise ClaimFailed(text)
        self.claims.append(text)
        self.console.print(f"[green]✓ checked:[/] {text}")
        self._after_claim = True

    def fact(self, text: str) -> None:
        """A fact true by construction (a definition, a formula, a published constant): shown, not checked."""
        self.console.print(f"[blue]= by definition:[/] {text}")
        self._after_claim = True

    # -- what lessons need from minillm -------------------------------------------------------

    def rounds(self) -> int:
        """How many interleaved rounds a timing gets: closeness.MIN_ROUNDS (6, the fewest the verdict
        rule's sign test can rank; two sides get more until it decides, `time_interleaved`) in full
        mode, busy or not (fewer rounds would rank noise more often, not less); 2 in fast mode, whose
        verdicts say "not ranked" with that reason. Probes the machine first, once per section."""
        self.recheck()
        return 2 if self.fast else closeness.MIN_ROUNDS

    def serve_rounds(self) -> int:
        """Rounds of a served workload in a comparison (each round serves every side's whole workload):
        closeness.MIN_ROUNDS in full mode, busy or not, the fewest the verdict rule ranks; 2 in fast mode."""
        self.recheck()
        return 2 if self.fast else closeness.MIN_ROUNDS

    @property
    def busy(self) -> bool:
        """Whether the last probe found the machine busy."""
        return bool(self._busy)

    def conditions(self) -> str:
        """The conditions the times were measured under: BLAS threads and the load average."""
        threads = blas_threads()
        load = probe.load_average()
        parts = [f"{threads} BLAS thread{'s' if threads != 1 else ''}" if threads else "BLAS threads unknown"]
        if load is not None:
            parts.append(f"load average {load:.2f} on {plural(probe.cpu_threads(), 'hardware thread')}")
        return ", ".join(parts)

    def timing_note(self, ranked: bool = True) -> None:
        """A dim line under a timing: how it was measured, and under what conditions. `ranked=False`:
        the times are stated beside the figures, and no verdict is drawn from them."""
        n = self.rounds()
        why = (", stated, not ranked" if not ranked else
               " (fast mode: too few for a verdict)" if n < closeness.MIN_ROUNDS else
               " or more, until the verdict rule decides")
        self.console.print(f"[dim]times: median and range of {n} interleaved rounds{why}; "
                           f"{self.conditions()}[/]")
        self.console.print()

    def pick(self, full, fast):
        """The full-experience value, or the fast one under --fast / MINILLM_FAST=1."""
        return fast if self.fast else full

    def load_model(self, default: str | None = None, fast: str | None = None, kernels: str | None = None):
        """The model for this lesson: --model if given, else `default` (fast mode: `fast`), with the
        NumPy reference kernels unless `kernels` names another set.

        `None` means minillm.load()'s own default, the bundled model (a small random model, with a
        note, when none is installed yet)."""
        name = self.model_name or (fast if self.fast and fast is not None else default)
        with self.status(f"loading {name or 'the bundled model'}…"):
            model = minillm.load(name, quiet=True, kernels=kernels)
        if name is None and model.name == "random-tiny":
            self.note("no bundled model is installed yet, so this lesson uses a small random model "
                      "(random-tiny): the numbers are real, the text it writes is gibberish.")
        return model

    def roofline(self, hw, points: list[tuple[str, float, float]]) -> None:
        """Show (label, FLOP/byte as counted, GFLOP/s as measured) points on this machine's roofline
        (`roofline_plot`), each with a key, and the keys' legend under it."""
        keys = "123456789abcdefghijklmnopqrstuvwxyz"[:len(points)]
        self.show(roofline_plot(hw.bandwidth_gbs, hw.peak_gflops, [(k, x, y) for k, (_, x, y) in zip(keys, points)]),
                  "   ".join(f"[bold magenta]{k}[/] {escape(label)}" for k, (label, _, _) in zip(keys, points)))

    def machine(self):
        """This machine's measured bandwidth and matmul peak (measured once, then cached). The first call
        of a lesson says where the figures came from and when: a cache can be days old."""
        hw = hardware.machine(progress=self.console.is_terminal)
        if self._hw is None:
            self._hw = hw
            when = f" on {hw.measured_at[:10]}" if hw.measured_at else ""
            self.console.print(f"[dim]this machine's figures{when}: {escape(hardware.provenance(hw))}[/]")
            self.console.print()
        return hw


def roofline_clock(L: Lesson):
    """The serving lessons' clock: each step priced on this machine's roofline (`RooflineClock`), at
    the thread count the lesson was asked for (BLAS's own when none was), even where a busy machine
    made the steps run on one: so a busy run prices the same steps the same and reaches the same
    verdicts as a quiet one."""
    from minillm.serving.metrics import RooflineClock
    now = blas_threads()
    with limited(L._asked_threads):
        hw = hardware.machine(progress=L.console.is_terminal)
    if now is not None and blas_threads() != now and L._stack is not None:
        # a BLAS loaded while measuring kept its own thread count: the rest of the lesson on the lesson's
        L._stack.enter_context(limited(now))
    return RooflineClock(hw)


def add_options(parser: argparse.ArgumentParser) -> None:
    add_threads_option(parser)
    parser.add_argument("--no-pause", action="store_true", help="never wait for Enter between parts")
    parser.add_argument("--fast", action="store_true",
                        help="smaller models and fewer steps (also: environment MINILLM_FAST=1)")
    parser.add_argument("--model", default=None, metavar="MODEL",
                        help="run on another model: random-124m, random-tiny, a checkpoint path, gpt2, ...")


def fast_from_env() -> bool:
    return os.environ.get(FAST_ENV, "").strip().lower() not in ("", "0", "false", "no")


@contextlib.contextmanager
def _reference_kernels() -> Iterator[None]:
    """While a lesson runs, the models it loads compute with the NumPy kernels, the reference the
    lessons count and explain (MINILLM_KERNELS=numpy: minillm.load's default). A lesson that shows
    the fused kernels asks for them by name (`minillm.load(..., kernels="fused")`: lessons 20, 16)."""
    from minillm.models.kernel_sets import ENV
    old = os.environ.get(ENV)
    os.environ[ENV] = "numpy"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


@contextlib.contextmanager
def _fast_env(on: bool) -> Iterator[None]:
    """While a fast lesson runs, MINILLM_FAST=1 so the hardware measurement is the quick one too."""
    old = os.environ.get(FAST_ENV)
    if on:
        os.environ[FAST_ENV] = "1"
    try:
        yield
    finally:
        if on:
            if old is None:
                os.environ.pop(FAST_ENV, None)
            else:
                os.environ[FAST_ENV] = old


def busy_line() -> str | None:
    """One line when other programs keep this machine busy, with the fix; None when it is quiet."""
    threads = blas_threads()
    if _busy_line is not None:
        return _busy_line(threads)
    load = probe.load_average()
    if load is None:
        return None
    cores = probe.cpu_threads()
    if load - 1 <= 0.5 * cores:
        return None
    return (f"this machine is busy (load average {load:.1f} on {plural(cores, 'hardware thread')}): measured times "
            "are slower and noisier than it can do; the counted FLOPs and bytes are not affected. For steadier "
            "times, run again with --threads 1 or when the machine is quieter.")


def make_console() -> Console:
    # Piped or captured output (tests, `| less`) gets 80 columns, the narrowest terminal, or $COLUMNS.
    return Console(highlight=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 80)


def run_lesson(body: Callable[[Lesson], None], argv: list[str] | None = None, *, number: int | None = None,
               title: str | None = None, minutes: int | None = None, what: str | None = None,
               prog: str | None = None) -> int:
    """Parse the options, tell the lesson, and turn a failed claim or a user error into exit status 1.

    The number and the script name come from the lesson's file name (`03_prefill.py`), the title,
    minutes and summary from its TITLE, MINUTES and WHAT_YOU_WILL_SEE; keywords override them."""
    module = sys.modules.get(getattr(body, "__module__", ""), None)
    file = Path(getattr(module, "__file__", "") or "lesson.py")
    if number is None:
        number = int(file.name[:2]) if file.name[:2].isdigit() else 0
    title = title if title is not None else getattr(module, "TITLE", "")
    minutes = minutes if minutes is not None else getattr(module, "MINUTES", 0)
    what = what if what is not None else getattr(module, "WHAT_YOU_WILL_SEE", "")
    timed = getattr(module, "TIMED", True)
    prog = prog or (f"python lessons/{file.name}" if file.name[:2].isdigit() else f"lesson {number:02d}")
    parser = argparse.ArgumentParser(prog=prog, description=f"Lesson {number}: {title}")
    add_options(parser)
    args = parser.parse_args(argv)
    console = make_console()
    fast = bool(args.fast) or fast_from_env()
    L = Lesson(number, title, fast=fast, no_pause=args.no_pause, model_name=args.model, console=console)
    threads, busy = args.threads, busy_line() if timed else None
    L._threads_free, L._busy_said, L._busy = args.threads is None, bool(busy), busy is not None if timed else None
    L._asked_threads = args.threads if args.threads is not None else blas_threads()
    if busy and threads is None and (blas_threads() or 1) > 1:
        # runs on different thread counts rank upside down on a contended machine: every side on one
        threads = 1
        busy += ("; so this lesson runs on 1 BLAS thread, every side of each comparison alike "
                 "(--threads N to choose)")
    try:
        with limited(threads), _fast_env(fast), _reference_kernels(), contextlib.ExitStack() as stack:
            L._stack = stack
            console.print(Panel(f"[bold]Lesson {number}: {title}[/]\n[dim]about {minutes} minutes · {what}[/]"
                                f"\n[dim]{L.conditions()}[/]"
                                + ("\n[yellow]fast mode: smaller models and fewer steps[/]" if fast else ""),
                                border_style="blue", padding=(0, 1)))
            if busy:            # before the first number: a busy machine makes every time below slower
                L.note(busy)
            body(L)
    except ClaimFailed as e:
        console.print(f"[bold red]✗ a claim of this lesson did not hold on this run:[/] {e}")
        return 1
    except MiniLLMError as e:
        console.print(f"[bold red]error:[/] {e}")
        return 1
    except KeyboardInterrupt:
        console.print("\n[dim]stopped.[/]")
        return 130
    console.print(f"\n[dim]Lesson {number} done: {plural(len(L.claims), 'claim')} checked against this run's "
                  "numbers.[/]")
    console.print(f"[dim]{next_words(number)}[/]")
    return 0


def next_words(number: int) -> str:
    """Where to go after lesson `number`: the next lesson of its track, or, at a track's end, the tracks
    that build on it (`minillm learn --track NAME`, minillm/cli/learn.py)."""
    from minillm.cli.learn import TRACKS, next_in_track, track_of
    track, after = track_of(number), next_in_track(number)
    if track is None:
        return "Next: `minillm learn` lists the lessons and their tracks."
    if after is not None:
        return f"Next in the {track.name} track: `minillm learn {after}`."
    if track.name == "core":
        return ("You have the core. The other tracks are independent parts, each building on it: "
                + ", ".join(t.name for t in TRACKS if t.name != "core") + " (`minillm learn --track NAME`).")
    return f"The {track.name} track is done; `minillm learn` lists the others."
