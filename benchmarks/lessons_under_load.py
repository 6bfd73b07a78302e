"""Run every lesson twice, once as the machine is and once beside CPU-burning processes, and check that
each exits 0 and that its checked sentences read the same once the numbers are masked.

    python benchmarks/lessons_under_load.py [--fast] [--burners 2] [--only 1,2,3] [--out DIR]

Why: a lesson's claims must hold on a busy machine (claims rest on counts; timed sentences choose
their words from the numbers). Each run's output is kept in DIR (default: lesson-runs/) as
NN-quiet.txt and NN-busy.txt, with the wall time of each run in summary.txt.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?")


def burn() -> None:
    while True:
        pass


def checked_sentences(text: str) -> list[str]:
    """The '✓ checked:' sentences, joined across their wrapped lines, numbers masked as #."""
    out, cur = [], None
    for line in text.splitlines():
        if line.startswith("✓ checked:"):
            if cur is not None:
                out.append(cur)
            cur = line[len("✓ checked:"):].strip()
        elif cur is not None and line.strip() and not line.startswith(("=", "✗", "╭", "note:")):
            cur += " " + line.strip()
        else:
            if cur is not None:
                out.append(cur)
            cur = None
    if cur is not None:
        out.append(cur)
    return [NUMBER.sub("#", s) for s in out]


def run(lesson: Path, fast: bool) -> tuple[int, str, float]:
    env = dict(os.environ, COLUMNS="80")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(lesson), "--no-pause", *(["--fast"] if fast else [])],
                          cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fast", action="store_true")
    p.add_argument("--burners", type=int, default=2)
    p.add_argument("--only", default="")
    p.add_argument("--out", default="lesson-runs")
    p.add_argument("--modes", default="quiet,busy")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lessons = sorted(ROOT.joinpath("lessons").glob("[0-9][0-9]_*.py"))
    if args.only:
        keep = {int(n) for n in args.only.split(",")}
        lessons = [f for f in lessons if int(f.name[:2]) in keep]
    ok = True
    summary = []
    for mode in args.modes.split(","):
        burners = []
        if mode == "busy":
            burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burners)]
            for b in burners:
                b.start()
        try:
            for f in lessons:
                rc, text, secs = run(f, args.fast)
                (out / f"{f.name[:2]}-{mode}.txt").write_text(text)
                summary.append(f"{f.name[:2]} {mode:5} rc={rc} {secs / 60:5.1f} min")
                print(summary[-1], flush=True)
                ok &= rc == 0
        finally:
            for b in burners:
                b.terminate()
    for f in lessons:
        a, b = (out / f"{f.name[:2]}-{m}.txt" for m in ("quiet", "busy"))
        if a.exists() and b.exists():
            same = checked_sentences(a.read_text()) == checked_sentences(b.read_text())
            summary.append(f"{f.name[:2]} checked sentences, numbers masked: {'same' if same else 'DIFFER'}")
            print(summary[-1], flush=True)
            ok &= same
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
