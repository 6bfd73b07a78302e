"""Run the README's main command, `minillm compare`, several times on the machine as it is and several
times beside CPU-burning processes, rounds alternated, and check the one thread rule's promise: the
KV cache's speed-up read beside the burners (their median) lies within the range of the quiet runs.

    python benchmarks/compare_under_load.py [--rounds 5] [--burners 2] [--out DIR] [-- compare args]

Why: on a busy machine two BLAS threads fight the other processes for the cores, and the cached and
naive sides slow by different amounts; `compare` then said "busy" and measured garbage (a 1.54×
speed-up where one thread gave 5.02×). Now every command that times runs every side on one thread
when busy, says so first, and this script checks that what the learner reads stays in the quiet
range. A test of the thread rule, not of speed: the figures are this machine's, now.

Each round runs the command once quiet and once beside the burners, the order swapped every round.
The run's outputs go to DIR (default: compare-runs/), one file a run, and a summary.txt.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

SPEEDUP = re.compile(r"speedup of the KV cache: ([\d.]+)× in time \(one run of each, both on (\d+|\?) BLAS thread")
DEFAULT = ["ROMEO:", "--model", "random-124m", "--max-new-tokens", "20"]


def burn() -> None:
    while True:
        pass


def one(argv: list[str], busy: int) -> tuple[float, str, bool, str]:
    """Run compare once, with `busy` burners beside it -> (speed-up, threads, said busy, output)."""
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(busy)]
    for b in burners:
        b.start()
    try:
        if busy:
            time.sleep(2)          # the burners running before compare probes the machine
        env = {**os.environ, "COLUMNS": "100"}
        proc = subprocess.run([sys.executable, "-m", "minillm", "compare", *argv], capture_output=True,
                              text=True, env=env, timeout=900)
    finally:
        for b in burners:
            b.terminate()
    text = proc.stdout + proc.stderr
    m = SPEEDUP.search(" ".join(text.split()))
    if proc.returncode != 0 or m is None:
        raise SystemExit(f"compare exited {proc.returncode} without its speed-up line:\n{text[-2000:]}")
    return float(m.group(1)), m.group(2), "note: busy" in " ".join(proc.stderr.split()), text


def main() -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--rounds", type=int, default=5, help="quiet and busy runs of each (default: 5)")
    p.add_argument("--burners", type=int, default=2, help="CPU-burning processes beside the busy runs (default: 2)")
    p.add_argument("--out", default="compare-runs", metavar="DIR", help="where the outputs go (default: compare-runs/)")
    p.add_argument("compare", nargs=argparse.REMAINDER,
                   help=f"after --: compare's arguments (default: {' '.join(DEFAULT)})")
    args = p.parse_args()
    if args.rounds < 2:
        p.error(f"--rounds {args.rounds}: at least 2 (a spread needs two runs)")
    argv = [a for a in args.compare if a != "--"] or DEFAULT
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    got = {"quiet": [], "busy": []}
    lines = [f"minillm compare {' '.join(argv)}; {args.rounds} rounds, {args.burners} burners beside the busy runs"]
    print(lines[0], flush=True)
    for r in range(args.rounds):
        for mode in (("quiet", "busy") if r % 2 == 0 else ("busy", "quiet")):
            load = os.getloadavg()[0]
            s, threads, said, text = one(argv, args.burners if mode == "busy" else 0)
            (out / f"{mode}-{r + 1}.txt").write_text(text)
            got[mode].append(s)
            lines.append(f"round {r + 1} {mode:5}: speed-up {s:.2f}× on {threads} BLAS thread"
                         f"{'s' if threads != '1' else ''}, {'said busy' if said else 'said nothing'} "
                         f"(load before {load:.1f})")
            print(lines[-1], flush=True)
    lo, hi = min(got["quiet"]), max(got["quiet"])
    busy = statistics.median(got["busy"])
    inside = [lo <= s <= hi for s in got["busy"]]
    n = len(got["quiet"])
    lines.append(f"quiet: median {statistics.median(got['quiet']):.2f}× ({lo:.2f}-{hi:.2f}×); busy: median "
                 f"{busy:.2f}× ({min(got['busy']):.2f}-{max(got['busy']):.2f}×): the busy median "
                 f"{'within' if lo <= busy <= hi else 'OUTSIDE'} the quiet runs' range; {sum(inside)} of "
                 f"{len(inside)} busy runs within it one by one (a run like the quiet ones falls outside the "
                 f"range of {n} of them 2 times in {n + 1})")
    print(lines[-1], flush=True)
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    return 0 if lo <= busy <= hi else 1


if __name__ == "__main__":
    raise SystemExit(main())
