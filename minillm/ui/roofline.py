"""Roofline pictures: in the terminal with plotext, in a file (SVG or PNG) with matplotlib.

Both draw the same `measure.roofline.Picture`: log-log, x = FLOPs per byte (counted), y = GFLOP/s;
the roof min(peak, FLOP/byte × bandwidth) with its slope, flat roof and ridge labelled; each point a
key (1-9, a-z) on the picture and a row of the legend beside it (its label, FLOP/byte, GFLOP/s and
share of the roof). A run on a busy machine says so in the picture's title.

The terminal picture is drawn only on a terminal at least `MIN_COLUMNS` wide, at most 80 columns, and
without colours when NO_COLOR is set; elsewhere a command prints its tables (`can_draw`). plotext is a
dependency; matplotlib is the optional extra `minillm[plots]` (`write_file` says so in one line).
"""

from __future__ import annotations

import math
import os
import string
import sys
from pathlib import Path

from ..errors import MiniLLMError

MIN_COLUMNS = 80        # narrower terminals get the tables
HEIGHT = 22             # rows of the terminal picture
KEYS = string.digits[1:] + string.ascii_lowercase + string.ascii_uppercase
EXTENSIONS = (".svg", ".png")
PLOTS_HINT = "pip install 'minillm[plots]' (matplotlib)"
# the cells a key may move to when its own is taken: nearest first, along its row before above or below
NEAR = sorted(((dc, dr) for dc in range(-8, 9) for dr in (-1, 0, 1)), key=lambda o: (abs(o[0]) + 3 * abs(o[1]), -o[0]))


def keys(picture) -> list[str]:
    """The key each point is drawn with, in order."""
    if len(picture.points) > len(KEYS):
        raise MiniLLMError(f"{len(picture.points)} points: a picture holds at most {len(KEYS)}")
    return list(KEYS[:len(picture.points)])


def colour_wanted() -> bool:
    """Colours unless NO_COLOR is set to anything non-empty (no-color.org)."""
    return not os.environ.get("NO_COLOR")


def can_draw(stream=None, columns: int | None = None) -> bool:
    """Draw the terminal picture? Only on a terminal (a TTY) of at least MIN_COLUMNS columns."""
    stream = stream or sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    if columns is None:
        import shutil
        columns = shutil.get_terminal_size((0, 0)).columns
    return tty and columns >= MIN_COLUMNS


def _span(values: list[float], pad: float = 2.0) -> tuple[float, float]:
    lo, hi = min(values) / pad, max(values) * pad
    return 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))


def bounds(picture) -> tuple[tuple[float, float], tuple[float, float]]:
    """The x and y ranges: every point, the ridge and the roof; x in whole decades, y from a whole
    decade to a little over the highest of the peak and the points (room for the peak's label)."""
    roof = picture.roof
    xs = [p.intensity for p in picture.points] + [roof.ridge]
    x0, x1 = _span(xs)
    ys = [picture.y(p) for p in picture.points] + [roof.peak_gflops, roof.attainable(x0)]
    y0 = _span(ys, 1.5)[0]
    return (x0, x1), (y0, max(ys) * 2.5)


def placed(picture, xs: tuple, ys: tuple, cols: int, rows: int) -> list[tuple[float, float]]:
    """Where each point's key goes, on axes spanning `xs` and `ys` drawn in `cols` × `rows` character
    cells: at its (FLOP/byte, GFLOP/s), or, when an earlier key holds that cell, the nearest free cell
    beside it, on its row first (the legend has the figures)."""
    cx = math.log10(xs[1] / xs[0]) / max(1, cols - 1)             # one character, in decades
    cy = math.log10(ys[1] / ys[0]) / max(1, rows - 1)
    taken, out = set(), []
    for p in picture.points:
        x, y = p.intensity, picture.y(p)
        col, row = round(math.log10(x / xs[0]) / cx), round(math.log10(y / ys[0]) / cy)
        dc, dr = next((o for o in NEAR if (col + o[0], row + o[1]) not in taken
                       and 0 <= col + o[0] < cols and 0 <= row + o[1] < rows), (0, 0))
        taken.add((col + dc, row + dr))
        out.append((xs[0] * 10 ** ((col + dc) * cx), ys[0] * 10 ** ((row + dr) * cy)))
    return out


def title(picture) -> str:
    return f"BUSY: {picture.title}" if picture.busy else picture.title


def terminal(picture, width: int = 80, height: int = HEIGHT, color: bool | None = None,
             marks: list[str] | None = None) -> str:
    """The picture as text for a terminal `width` columns wide (plotext); `marks`: the points' keys
    (default `keys`). Drawn twice: first without the points, to read the size of the frame plotext
    chose, so that each key lands in a character cell of its own (`placed`)."""
    color = colour_wanted() if color is None else color
    frame = _draw(picture, width, height, False, [], []).splitlines()
    top = next(i for i, line in enumerate(frame) if "┌" in line)
    bottom = next(i for i, line in enumerate(frame) if "└" in line)
    cols = frame[top].index("┐") - frame[top].index("┌") - 1
    xy = placed(picture, *bounds(picture), cols, bottom - top - 1)
    return _draw(picture, width, height, color, marks or keys(picture), xy)


def _draw(picture, width: int, height: int, color: bool, marks: list[str], xy: list) -> str:
    import plotext as plt

    roof = picture.roof
    (x0, x1), (y0, y1) = bounds(picture)
    n = 240
    xs = [x0 * (x1 / x0) ** (i / (n - 1)) for i in range(n)]
    plt.clear_figure()
    plt.plotsize(width, height)
    plt.xscale("log")
    plt.yscale("log")
    plt.xlim(math.log10(x0), math.log10(x1))       # plotext takes a log axis's limits as exponents
    plt.ylim(math.log10(y0), math.log10(y1))
    plt.plot(xs, [roof.attainable(x) for x in xs], marker="dot", color="blue")
    plt.vline(roof.ridge, "red")
    for k, (x, y) in zip(marks, xy):
        plt.scatter([x], [y], marker=k, color="magenta+")
    # the labels of the roof: the slope's bandwidth above it, top left, the peak over the flat, the ridge at the foot
    plt.text(f"slope {fmt(roof.bandwidth_gbs)} GB/s", x0 * 1.05,
             min(roof.peak_gflops / 2, roof.attainable(x0) * 30), color="blue", alignment="left")
    plt.text(f"peak {fmt(roof.peak_gflops)} GFLOP/s", roof.ridge, roof.peak_gflops * 1.25, color="blue",
             alignment="right" if roof.ridge > (x0 * x1) ** 0.5 else "left")
    plt.text(f"ridge {roof.ridge:.3g} FLOP/byte", roof.ridge, y0 * 1.1, color="red",
             alignment="right" if roof.ridge > (x0 * x1) ** 0.5 else "left")
    decades = lambda a, b: [10.0 ** e for e in range(round(math.log10(a)), round(math.log10(b)) + 1)]
    plt.xticks(decades(x0, x1), [f"{v:g}" for v in decades(x0, x1)])
    inside = [v for v in decades(y0, y1) if v < y1 / 1.01]      # the top decade would sit on the title
    plt.yticks(inside, [fmt(v) for v in inside])
    plt.title(title(picture))
    plt.xlabel("FLOP/byte (counted)")
    plt.ylabel("GFLOP/s")
    if not color:
        plt.theme("clear")
    text = plt.build()
    plt.clear_figure()
    if not color:
        text = plt.uncolorize(text)
    return "\n".join(line.rstrip() for line in text.splitlines())


def fmt(x: float) -> str:
    """A figure in three significant digits, without an exponent (1,650; 12.2; 0.492)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def legend_rows(picture) -> list[tuple[str, str, str, str, str]]:
    """(key, label, FLOP/byte, GFLOP/s, % of the roof) for each point, the numbers beside the picture;
    on a chip's picture (nothing timed) the last is the roof's verdict, memory- or compute-bound."""
    rows = []
    for k, p in zip(keys(picture), picture.points):
        last = (f"{100 * picture.of_roof(p):.0f}%" if picture.measured else
                "memory" if p.intensity < picture.roof.ridge else "compute")
        rows.append((k, p.label, fmt(p.intensity), fmt(picture.y(p)), last))
    return rows


def legend(picture, width: int = 80):
    """The legend as a rich table: two points a row where that fits `width` columns, else one."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    what, last = ("GFLOP/s", "%roof") if picture.measured else ("roof", "bound")
    rows = legend_rows(picture)
    for across in (2, 1):
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
        for _ in range(across):
            for col, just in (("", "right"), ("step", "left"), ("F/B", "right"), (what, "right"), (last, "right")):
                t.add_column(col, justify=just, no_wrap=True)
        n = -(-len(rows) // across)
        for i in range(n):
            t.add_row(*(cell for j in range(across)
                        for cell in (rows[i + j * n] if i + j * n < len(rows) else ("",) * 5)))
        if Console(width=10_000).measure(t).maximum <= width:
            break
    return t


def describe(picture) -> list[str]:
    """The lines under the picture: what its axes are, where its numbers come from, the busy note."""
    roof = picture.roof
    lines = [f"roof min({roof.peak_gflops:,.0f} GFLOP/s, FLOP/byte × {roof.bandwidth_gbs:,.1f} GB/s); "
             f"ridge {roof.ridge:.3g} FLOP/byte"]
    if picture.measured:
        lines.append("points: FLOPs and bytes as the meter counted them, FLOP/s as the run timed them "
                     "(median); %roof: of the roof at the point's FLOP/byte")
    lines += picture.notes
    if picture.busy:
        lines.append(picture.busy)
    return lines


def show(console, pictures: list, columns: int | None = None) -> bool:
    """Print each picture and its legend on `console` if it can be drawn there (`can_draw`); returns
    whether it was (else the caller prints its tables)."""
    from rich.markup import escape
    from rich.text import Text

    width = console.width if columns is None else columns
    if not can_draw(console.file, width):
        return False
    for pic in pictures:
        console.print(Text.from_ansi(terminal(pic, width=min(width, 80))), soft_wrap=False)
        console.print(legend(pic))
        for line in describe(pic):
            console.print(f"[dim]{escape(line)}[/]")
    return True


# -- the file picture ---------------------------------------------------------------------------------

def check_plot_path(path: str | os.PathLike) -> Path:
    """--plot FILE, checked before any work: .svg or .png, its folder there, not a folder itself, and
    matplotlib importable (else one line saying how to get it)."""
    path = Path(path).expanduser()
    if path.suffix.lower() not in EXTENSIONS:
        raise MiniLLMError(f"--plot {path}: give a file name ending in .svg or .png")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise MiniLLMError(f"--plot {path}: folder {folder} does not exist")
    if path.is_dir():
        raise MiniLLMError(f"--plot {path}: it is a folder; give a file name such as roofline.svg")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MiniLLMError(f"--plot needs matplotlib, the optional extra: {PLOTS_HINT}") from None
    return path


def figure(pictures: list):
    """A matplotlib figure, the same data as `terminal`: one log-log axes per picture, side by side,
    each point its key (keys in one spot stepped apart), and under each the legend's rows."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    n = max(len(p.points) for p in pictures)
    rows = -(-n // 2)
    fig = Figure(figsize=(6.4 * len(pictures), 5.2 + 0.19 * rows + 0.4), layout="constrained")
    grid = fig.add_gridspec(2, len(pictures), height_ratios=[5.2, 0.19 * rows + 0.4])
    for i, pic in enumerate(pictures):
        ax = fig.add_subplot(grid[0, i])
        roof = pic.roof
        (x0, x1), (y0, y1) = bounds(pic)
        m = 240
        xs = [x0 * (x1 / x0) ** (j / (m - 1)) for j in range(m)]
        ax.loglog(xs, [roof.attainable(x) for x in xs], color="tab:blue", lw=2, label="roof")
        ax.axvline(roof.ridge, color="tab:red", ls="--", lw=1)
        ax.text(roof.ridge * 1.1, y0 * 1.3, f"ridge {roof.ridge:.3g} FLOP/byte", color="tab:red", fontsize=8)
        ax.text(x0 * 1.3, roof.attainable(x0 * 1.3) * 1.4, f"{fmt(roof.bandwidth_gbs)} GB/s", color="tab:blue",
                fontsize=8, rotation=30)
        ax.text(roof.ridge * 1.2, roof.peak_gflops * 1.1, f"peak {fmt(roof.peak_gflops)} GFLOP/s",
                color="tab:blue", fontsize=8)
        seen: list = []                                # keys already drawn, in decades: step apart
        for k, p in zip(keys(pic), pic.points):
            y = pic.y(p)
            at = (math.log10(p.intensity), math.log10(y))
            near = sum(abs(a - at[0]) < 0.06 and abs(b - at[1]) < 0.06 for a, b in seen)
            seen.append(at)
            ax.scatter([p.intensity], [y], s=14, color="tab:purple", zorder=3)
            ax.annotate(k, (p.intensity, y), textcoords="offset points", xytext=(4 + 7 * near, 2),
                        fontsize=8, fontweight="bold", color="tab:purple")
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
        ax.set_xlabel("FLOP/byte (counted)")
        ax.set_ylabel("GFLOP/s" + (" (counted FLOPs ÷ measured time)" if pic.measured else " (on the roof)"))
        ax.set_title(title(pic), fontsize=9, color="tab:red" if pic.busy else "black")
        ax.grid(True, which="major", alpha=0.3)
        key = fig.add_subplot(grid[1, i])              # the legend's rows, two columns
        key.axis("off")
        head = ("step", "F/B", "GFLOP/s" if pic.measured else "roof", "%roof" if pic.measured else "bound")
        lines = legend_rows(pic)
        for col in range(2):
            left = 0.5 * col
            for j, cell in enumerate(head):
                key.text(left + (0, 0.26, 0.36, 0.46)[j], 1.0, cell, fontsize=7, weight="bold", va="top",
                         transform=key.transAxes, ha="left" if j == 0 else "right")
            for r, (k, label, fb, gf, last) in enumerate(lines[col * rows:(col + 1) * rows]):
                y = 1.0 - (r + 1) / (rows + 1)
                for j, cell in enumerate((f"{k} {label}", fb, gf, last)):
                    key.text(left + (0, 0.26, 0.36, 0.46)[j], y, cell, fontsize=7, va="top",
                             transform=key.transAxes, ha="left" if j == 0 else "right")
    return fig


def write_file(pictures: list, path: str | os.PathLike) -> Path:
    """Write the pictures to `path` (.svg or .png), whole or not at all."""
    from ..paths import atomic_write

    path = check_plot_path(path)
    fig = figure(pictures)
    fmt = path.suffix.lower().lstrip(".")
    import matplotlib
    try:
        # SVG: the words stay text (searchable, small), not outlines
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "minillm"}), atomic_write(path) as f:
            fig.savefig(f, format=fmt, dpi=110, metadata={"Date": None} if fmt == "svg" else None)
    except OSError as e:
        raise MiniLLMError(f"cannot write the picture to {path}: {e.strerror or e}") from None
    return path
