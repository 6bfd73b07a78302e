"""`minillm roofline`: the picture's points are the run's own counted FLOPs and bytes and measured times,
its roof the measurement at the points' thread count; a busy run says so on the picture; it renders in
a real terminal (tmux, 80 columns) and in a file (SVG parsed, PNG read back); without matplotlib,
--plot is one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from minillm.cli.commands import main
from minillm.errors import MiniLLMError
from minillm.measure import roofline as rl
from minillm.measure.chips import CHIPS, Hardware
from minillm.ui import roofline as draw

REPO = Path(__file__).resolve().parent.parent
HW = Hardware(name="this machine", bandwidth_gbs=10.0, peak_gflops=120.0, measured_at="2026-01-01T00:00:00+00:00",
              method="copy", cpu="test", threads=2, blas_threads=1, load_avg=0.2, methods={"copy": 10.0})


@pytest.fixture(scope="module")
def results():
    """A real run of two parts on random-tiny: the measurements the command calls."""
    return rl.collect(HW, ["batch", "contexts"], "random-tiny", batches=[1, 2], contexts=[8, 24], repeats=1)


def test_the_points_are_the_runs_counted_flops_and_bytes_and_measured_times(results):
    pic = rl.picture(results, HW)
    by_label = {p.label: p for p in pic.points}
    rows = results["batch"]["rows"]
    assert [p.label for p in pic.points[:len(rows)]] == [f"decode B={r['batch']}" for r in rows]
    for r in rows:
        p = by_label[f"decode B={r['batch']}"]
        assert (p.flops, p.bytes, p.seconds) == (r["flops"], r["bytes"], r["ms_step"] / 1e3)
        assert p.gflops == pytest.approx(r["gflops"]) and p.intensity == pytest.approx(r["intensity"])
    for r in results["contexts"]["rows"]:
        T = r["context"]
        pre, naive = by_label[f"prefill {T}"], by_label[f"naive {T}"]
        assert (pre.flops, pre.bytes, pre.seconds) == (r["prefill_flops"], r["prefill_bytes"], r["prefill_s"])
        assert (naive.flops, naive.bytes, naive.seconds) == (r["naive_flops"], r["naive_bytes"], r["naive_ms"] / 1e3)
    assert len(pic.points) == len(rows) + 2 * len(results["contexts"]["rows"])
    # the legend's numbers are the points' (nothing else on the picture is a figure of the run)
    for (key, label, fb, gf, share), p in zip(draw.legend_rows(pic), pic.points):
        assert (label, fb, gf) == (p.label, draw.fmt(p.intensity), draw.fmt(p.gflops))
        assert share == f"{100 * p.gflops / min(HW.peak_gflops, p.intensity * HW.bandwidth_gbs):.0f}%"


def test_the_prefill_and_naive_counts_are_the_meters(results):
    """run_bench's new counts: a prefill and a naive step of T tokens under the meter, as a user runs them."""
    import numpy as np

    import minillm
    model = minillm.load("random-tiny", quiet=True)
    r = results["contexts"]["rows"][1]                  # the counts hang on the length, not the ids
    with minillm.Meter() as m:
        model.prefill(np.zeros(r["context"], dtype=np.int64))
    assert (m.totals().flops, m.totals().bytes) == (r["prefill_flops"], r["prefill_bytes"])
    with minillm.Meter() as m:
        model.forward(np.zeros(r["context"], dtype=np.int64), last_only=True)
    assert (m.totals().flops, m.totals().bytes) == (r["naive_flops"], r["naive_bytes"])


def test_the_roof_is_the_measurement_at_the_threads_the_points_ran_on(results):
    pic = rl.picture(results, HW)
    assert (pic.roof.bandwidth_gbs, pic.roof.peak_gflops, pic.roof.threads) == (10.0, 120.0, 1)
    assert pic.roof.ridge == 12.0 and "1 thread: 10.0 GB/s, 120 GFLOP/s" in pic.title
    chip = rl.chip_picture(results, "h100")
    assert (chip.roof.bandwidth_gbs, chip.roof.peak_gflops) == (CHIPS["h100-sxm"].bandwidth_gbs,
                                                                 CHIPS["h100-sxm"].peak_gflops)
    assert [p.intensity for p in chip.points] == [p.intensity for p in pic.points]
    assert all(chip.y(p) == min(chip.roof.peak_gflops, p.intensity * chip.roof.bandwidth_gbs) for p in chip.points)
    with pytest.raises(MiniLLMError, match="no published FLOP/s peak"):
        rl.chip_picture(results, "m2")


def test_the_commands_roof_is_the_cached_measurement_at_its_thread_count(tmp_path):
    env = {**os.environ, "MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1"}
    r = subprocess.run([sys.executable, "-m", "minillm", "roofline", "--model", "random-tiny", "--parts", "batch",
                        "--batch", "1,2", "--repeats", "1", "--threads", "1", "--json"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    roof = data["pictures"][0]["roof"]
    records = json.loads((tmp_path / "hardware.json").read_text())["records"]
    mine = [x for x in records if x["blas_threads"] == data["threads"]]
    assert data["threads"] == roof["threads"] == 1 and len(mine) == 1
    assert (roof["bandwidth_gbs"], roof["peak_gflops"]) == (mine[0]["bandwidth_gbs"], mine[0]["peak_gflops"])
    rows = data["results"]["batch"]["rows"]
    for p, row in zip(data["pictures"][0]["points"], rows):
        assert (p["flops"], p["bytes"], p["seconds"]) == (row["flops"], row["bytes"], row["ms_step"] / 1e3)
    assert data["pictures"][1]["roof"]["name"] == "a100-80gb"


def test_a_busy_run_says_so_on_the_picture_and_in_the_file(results, tmp_path):
    quiet, busy = rl.picture(results, HW), rl.picture(results, HW, busy="busy machine (test)")
    assert "BUSY" in draw.terminal(busy, color=False).splitlines()[0]
    assert "BUSY" not in draw.terminal(quiet, color=False)
    assert "busy machine (test)" in draw.describe(busy)
    svg = draw.write_file([busy], tmp_path / "busy.svg")
    assert any("BUSY" in t for t in _svg_texts(svg))


def test_the_command_on_a_busy_machine_says_so(monkeypatch, capsys, tmp_path):
    from minillm.cli import roofline as cli
    monkeypatch.setenv("MINILLM_HOME", str(tmp_path))
    monkeypatch.setenv("MINILLM_FAST", "1")
    monkeypatch.setattr(cli, "comparison_threads", lambda requested, default=None: (1, "busy machine (test)"))
    monkeypatch.setattr(cli, "machine", lambda progress=True: HW)
    assert main(["roofline", "--model", "random-tiny", "--parts", "batch", "--batch", "1,2", "--repeats", "1",
                 "--chip", "none"]) == 0
    out = capsys.readouterr().out          # not a terminal: the tables, their title says it
    assert "BUSY: this machine" in out and "busy machine (test)" in out and "┤" not in out


def test_the_picture_draws_axes_roof_ridge_and_keys_in_80_columns(results, monkeypatch):
    pic = rl.picture(results, HW)
    text = draw.terminal(pic, width=80, color=False)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80 and "\x1b" not in text
    for words in ("FLOP/byte (counted)", "GFLOP/s", "ridge 12 FLOP/byte", "slope 10 GB/s", "peak 120 GFLOP/s",
                  "┤", "┬"):
        assert words in text, words
    plot = plot_area(text)                  # inside the axes: the points' keys are drawn
    assert "1" in plot and "2" in plot
    assert "\x1b[" in draw.terminal(pic, color=True)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not draw.colour_wanted() and "\x1b" not in draw.terminal(pic)


def test_it_is_drawn_only_on_a_terminal_of_80_columns(tmp_path):
    class Tty:
        def isatty(self):
            return True
    assert draw.can_draw(Tty(), 80) and not draw.can_draw(Tty(), 79)
    with open(tmp_path / "f", "w") as f:
        assert not draw.can_draw(f, 200)


def plot_area(text: str) -> str:
    """What is drawn inside the axes: between the top and bottom frame, right of the y axis, less the
    roof's three labels (whose figures hold digits too)."""
    import re
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if "┌" in line)
    bottom = next(i for i, line in enumerate(lines) if "└" in line)
    inside = [re.split("[┤│]", line, maxsplit=1)[1] for line in lines[top + 1:bottom]]
    return re.sub(r"(slope|peak|ridge) [\d.,]+ (GB/s|GFLOP/s|FLOP/byte)", "", "\n".join(inside))


def _svg_texts(path) -> list[str]:
    root = ET.parse(path).getroot()
    return ["".join(el.itertext()) for el in root.iter() if el.tag.endswith("text")]


def test_the_file_picture_holds_the_same_data(results, tmp_path):
    pics = [rl.picture(results, HW), rl.chip_picture(results, "h200")]
    texts = _svg_texts(draw.write_file(pics, tmp_path / "r.svg"))
    for k, p in zip(draw.keys(pics[0]), pics[0].points):
        assert f"{k} {p.label}" in texts
    assert "ridge 12 FLOP/byte" in texts and any(t.startswith("h200") for t in texts)
    import matplotlib.image as mpimg
    import numpy as np
    png = draw.write_file(pics, tmp_path / "r.png")
    img = mpimg.imread(png)
    assert img.shape[0] > 300 and img.shape[1] > 2 * img.shape[0] * 0.9     # two pictures side by side
    blue = np.array([0x1f, 0x77, 0xb4]) / 255                             # the roof's colour (tab:blue)
    assert (np.abs(img[..., :3] - blue).max(axis=-1) < 0.02).sum() > 200


def test_without_matplotlib_plot_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)        # as if the extra were not installed
    with pytest.raises(MiniLLMError, match=r"pip install 'minillm\[plots\]'"):
        draw.check_plot_path(tmp_path / "r.svg")
    assert main(["roofline", "--plot", str(tmp_path / "r.svg")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "minillm[plots]" in err and not (tmp_path / "r.svg").exists()


@pytest.mark.parametrize("args, words", [
    (["--plot", "r.pdf"], ".svg or .png"),
    (["--plot", "no/such/folder/r.svg"], "does not exist"),
    (["--parts", "decode"], "--parts"),
    (["--chip", "m2"], "no published FLOP/s peak"),
    (["--batch", "0"], "at least 1"),
])
def test_bad_input_is_one_line(args, words, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main(["roofline", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) <= 2 and words in err and "Traceback" not in err


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed: the real-terminal check needs it")
def test_it_renders_in_a_real_terminal_of_80_columns(tmp_path):
    """The command in tmux at 80 columns; capture-pane shows the axes, the ridge and the labelled points."""
    sock, done = str(tmp_path / "tmux.sock"), tmp_path / "done"
    cmd = (f"cd {REPO} && MINILLM_HOME={tmp_path} MINILLM_FAST=1 {sys.executable} -m minillm roofline "
           f"--model random-tiny --parts batch --batch 1,2,4 --repeats 1 --chip h100 2>{tmp_path}/err; "
           f"echo $? > {done}; sleep 60")
    subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-x", "80", "-y", "120", cmd], check=True, timeout=30)
    try:
        t0 = time.time()
        while not done.exists() and time.time() - t0 < 240:
            time.sleep(0.5)
        assert done.read_text().strip() == "0", (tmp_path / "err").read_text()
        screen = subprocess.run(["tmux", "-S", sock, "capture-pane", "-p", "-S", "-200"], capture_output=True,
                                text=True, check=True).stdout
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True)
    lines = screen.splitlines()
    assert max(len(line) for line in lines) <= 80
    for words in ("this machine", "FLOP/byte (counted)", "GFLOP/s", "ridge", "slope", "peak", "┤", "└",
                  "1  decode B=1", "2  decode B=2", "3  decode B=4", "h100-sxm, published"):
        assert words in screen, f"{words!r} not on the screen:\n{screen}"
    mine = screen[:screen.index("h100-sxm, published")]      # this machine's picture: its three points
    assert all(k in plot_area(mine) for k in "123"), screen


def test_the_lessons_roofline_is_the_picture_on_a_terminal_and_characters_elsewhere():
    """Lessons 6, 7, 8, 14 and 18 show their points with `roofline_plot`: plotext's picture on a terminal
    of 80 columns, the characters in a pipe or a narrower one; the same keys at the same points."""
    import io

    from rich.console import Console

    from minillm.lessons._common import roofline_plot
    points = [("a", 0.5, 2.0), ("b", 4.0, 30.0)]
    pic = roofline_plot(10.0, 120.0, points).picture()
    assert [(p.label, p.intensity, p.gflops) for p in pic.points] == [
        (k, pytest.approx(x), pytest.approx(y)) for k, x, y in points]

    def shown(width, terminal):
        c = Console(file=io.StringIO(), width=width, force_terminal=terminal, color_system=None)
        c.print(roofline_plot(10.0, 120.0, points))
        return c.file.getvalue()
    wide = shown(80, True)
    assert "FLOP/byte (counted)" in wide and "ridge 12 FLOP/byte" in wide and max(map(len, wide.splitlines())) <= 80
    assert "a" in plot_area(wide) and "b" in plot_area(wide)
    for text in (shown(79, True), shown(120, False)):
        assert "▲ ridge 12" in text and "FLOP/byte (counted)" not in text


def test_every_point_gets_a_key_on_the_picture_and_a_row_in_an_80_column_legend():
    """Points in one character cell each keep a key (the later beside the first); the legend of the
    longest labels the command makes still fits 80 columns, one point a row if two do not fit."""
    import io

    from rich.console import Console
    labels = [f"decode B={B}" for B in (1, 2, 4, 8, 16, 32)] + ["prefill 512", "naive 512"] + \
        [f"{w} {k}" for w in ("float32", "q8_0", "q4_0") for k in ("fused", "int8")] + \
        ["moe B=1", "moe B=8", "mla absorb. B=1", "mla decomp. B=1"]
    pts = [rl.Point(label, "decode", 1e9, 2e9, 0.5 + 0.01 * i) for i, label in enumerate(labels)]   # one spot
    for pic in (rl.Picture(rl.Roof("this machine", 10.0, 120.0, 1, True), pts, "t"),
                rl.Picture(rl.Roof("a100-80gb", 2039.0, 312000.0), pts, "t", measured=False)):
        area = plot_area(draw.terminal(pic, color=False))
        assert all(k in area for k in draw.keys(pic)), area
        for width in (80, 50):                      # at 50 columns, one point a row
            c = Console(file=io.StringIO(), width=width)
            c.print(draw.legend(pic, width=width))
            text = c.file.getvalue()
            assert "…" not in text and max(map(len, text.splitlines())) <= width
            assert all(label in text for label in labels)
