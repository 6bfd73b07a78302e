"""Run every lesson twice, once as the machine is and once beside CPU-burning processes, and check that
each exits 0, that its checked sentences read the same once the numbers are masked, that no ranking
differs between the two runs except where the closeness rule said "no winner" in one of them, and that
no line is wider than 80 columns.

    python benchmarks/lessons_under_load.py [--fast] [--burners 2] [--only 1,2,3] [--out DIR] [--repeat N]
                                            [--modes quiet,busy] [--check-only] [--command NAME=ARGS ...]

Why: a lesson's claims must hold on a busy machine (claims rest on counts; timed sentences choose
their words from the numbers, and rank only when their rounds agree beyond their spread:
minillm/closeness.py). Each run's output is kept in DIR (default: lesson-runs/) as
NN-quiet.txt and NN-busy.txt, with the wall time of each run and every check in summary.txt.

With --repeat N the quiet and busy runs are made N times each (NN-quiet-2.txt, NN-busy-2.txt, ...) and every
run is checked against the first quiet one: the same checked sentences, no ranking flipped, and (the
stricter count issue 53 asks for) how many verdicts differ at all, a winner against "no winner" included.

With --command NAME=ARGS (repeatable) the same runs and checks are made of `minillm ARGS` (e.g.
--command "disagg=serve-sim --requests 16 --compare disagg"), its output kept as NAME-quiet.txt, ...;
with --command and no --only, only the commands run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shlex
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


# The sentences that rank (minillm/closeness.py's words, and the lessons' own): each pattern gives
# the subject (what is ranked, numbers masked) and the verdict (a name, or None for "no winner").
START = r"(?<!the time of )\b"             # not the other side of a faster_words sentence
RANKINGS = [
    # disagg_verdict's figures on a priced clock: "tok/s: best split (…), worst one engine (…)", or no winner
    re.compile(r"(?<![\w/])(?P<subject>tok/s|TTFT p95|TPOT p95|goodput): (?:best (?P<verdict>[^(]+?) \(|no winner \()"),
    re.compile(START + r"(?P<subject>[A-Z][^:.;()]{2,70}): (?:no winner|no (?:budget|run) stands out|"
               r"(?P<verdict>[^,:;()]+?) best)[,. (]"),
    re.compile(START + r"(?P<subject>[A-Z][^:.;()]{2,70}(?: \([^():;]*\))?) favours (?P<verdict>[^(;]+?) \("),
    re.compile(START + r"(?P<subject>tok/s): (?:no winner|(?P<verdict>[^,:;()]+?) best)[,. (]"),
    re.compile(r"(?P<subject>\b[\w' ]{2,60}) took [^:]*? the time of (?P<than>[\w' ]+?): "
               r"(?P<verdict>faster|slower|no winner)"),
    re.compile(r"(?P<subject>batching bought) (?:(?P<verdict>the dense model|the mixture) more|them about the same)"),
    re.compile(r"(?P<subject>the mixture) was ranked below it up to B = \d+, and (?P<verdict>above it at B = \d+)"),
    re.compile(r"(?P<subject>tokens per second) (?:(?P<verdict>peaked at [\w ]+?|grew up to the largest)[,:]|"
               r"showed no batch apart)"),
    re.compile(r"(?P<subject>The p99 gap between tokens, (?:median of|priced))[^:]*:[^:]*: (?:chunking "
               r"(?P<verdict>lowered|raised) it|no winner)"),
    re.compile(r"(?P<subject>the split) (?P<verdict>(?:wins on|loses on|has no winner against it on) [^(]+?)"
               r"(?:, by the verdict rule| \()"),
    re.compile(r"(?P<subject>output tokens per second of one at a time): (?P<verdict>more|fewer|no winner)"),
    re.compile(r"(?P<subject>and continuous batching's) [^:]{1,30}: (?P<verdict>continuous admitted late arrivals "
               r"sooner|continuous was later|no winner)"),
    re.compile(r"(?P<subject>tok/s per engine|TTFT p95|TBT p99) (?P<verdict>no chunking|budget \d+|"
               r"split|no winner) (?:[\d.,]+ ?(?:tok/s|ms|µs|s)|rounds close|within \d+%)"),
    re.compile(r"(?P<subject>In time, the hybrid's step) (?:was (?P<verdict>below the other's [^(]+?) \(|"
               r"was not ranked below)"),
    # minillm bench: kernel sets at each B, a weight format's decode against float32's, the step against the bare
    # pass (the tokens/s by batch and speculation rankings are "X: Y best" / "X: no winner" above)
    re.compile(r"(?P<subject>B = \d+) [\d.]+× \((?P<verdict>faster|slower|no winner)"),
    re.compile(r"(?P<subject>\b[\w.]+(?: [\w-]+)?): [^:]{0,60}?, decode [\d.]+× [^(]{0,40}\("
               r"(?P<verdict>faster|slower|no winner)"),
    re.compile(r"(?P<subject>the engine's step took) [\d.]+× the faster, (?:(?P<verdict>faster|slower) than the bare "
               r"pass|no winner against the bare pass)"),
    re.compile(r"(?P<subject>At B = 1 a step of the mixture)[^;]*?(?:; in tokens/s the rule ranks neither|, yet "
               r"(?P<verdict>the mixture|the twin) made more)"),
    # lesson 15 on the roofline clock (priced from counts): the twin at B = 1, where the gain reached the dense one's
    re.compile(r"(?P<subject>At B = 1 a step of the mixture)[^;]*?; priced, the mixture made [^:]*?: "
               r"(?P<verdict>more|fewer|no winner)"),
    re.compile(r"(?P<subject>the mixture's gain) (?P<verdict>stayed below it up to B = \d+|was below it up to "
               r"B = \d+, and (?:above|within \d+% of) it at B = \d+|was (?:above|within \d+% of) it "
               r"(?:already at|from) B = \d+)"),
    # priced from counts (lessons/_common.py priced_words): the same every run by design
    re.compile(r"(?P<subject>\b[\w' ]{2,60}) costs [^:]*? the time of (?P<than>[\w' -]+?) on the roofline: "
               r"(?P<verdict>faster|slower|no winner)"),
    # growth_words and fall_words: a time against the work (numbers masked from the verdict)
    re.compile(r"(?P<subject>the time per step) (?P<mverdict>hardly grew|grew [\d.,]+×, less than|grew about in "
               r"proportion|grew more than)"),
    re.compile(r"(?P<subject>the median time to first token) fell [\d.,]+×, (?P<verdict>more than|less than|"
               r"about as much as) the"),
    # lesson 8's cliff (ops.matmul against the plain product is stated, no verdict: the threads decide it)
    re.compile(r"(?P<subject>2 rows through the plain product) took [^:]*?: (?:(?P<verdict>the cliff)|this run "
               r"shows no cliff)"),
    # lesson 10's diagnosis (one run's shares, the closeness band) and lesson 12's prefill against decode
    re.compile(r"(?P<subject>long prompts|long answers): (?:\d+% of the model's time went to (?P<verdict>prefill|"
               r"decode) steps|prompt and decode steps took about the same share)"),
    re.compile(r"(?P<subject>Prefill ran) [^:]{1,80}: prefill was (?:(?P<verdict>faster per token in every answer)|"
               r"not faster per token)"),
    # lesson 14: what each format did to the loss (counted; where a step's time goes is stated, unranked)
    re.compile(r"(?P<subject>Q4_0 moved it) by [-+\d.]+: (?P<mverdict>no more than Q8_0|more than Q8_0|"
               r"[\d.,]+× Q8_0's change)"),
    # lesson 17: a batched step's FLOPs a byte against the GPUs' ridges (counted)
    re.compile(r"(?P<subject>per byte can only tend to one row's FLOPs ÷ its own KV bytes), [\d.,]+: "
               r"(?P<verdict>below|above) the"),
]
SUBJECT_NUMBER = re.compile(r"[-+]?\d[\d,.]*")


def rankings(text: str) -> list[tuple[str, str | None]]:
    """The (subject, verdict) of every ranking sentence in a lesson's output, in order; verdict None where
    the closeness rule said no winner. Wrapped lines are joined first."""
    flat = " ".join(text.replace("│", " ").split())
    out = []
    for pattern in RANKINGS:
        for m in pattern.finditer(flat):
            subject = SUBJECT_NUMBER.sub("#", m.group("subject") or pattern.pattern[:30]).strip()
            if "than" in pattern.groupindex and m.group("than"):
                subject += " / " + m.group("than")
            if "mverdict" in pattern.groupindex:          # a verdict that carries a measured number: masked
                verdict = SUBJECT_NUMBER.sub("#", m.group("mverdict") or "").strip()
            else:
                verdict = (m.group("verdict") or "").strip()
            out.append((subject, None if verdict in ("", "no winner") else verdict))
    return out


def flipped(a: list, b: list) -> list[str]:
    """Rankings that name different winners in the two runs (a "no winner" in either is not a flip)."""
    bad = []
    by = {}
    for subject, verdict in b:
        by.setdefault(subject, []).append(verdict)
    seen: dict = {}
    for subject, verdict in a:
        i = seen.get(subject, 0)
        seen[subject] = i + 1
        other = by.get(subject, [])
        if i < len(other) and verdict is not None and other[i] is not None and verdict != other[i]:
            bad.append(f"{subject}: {verdict} / {other[i]}")
    return bad


def changed(a: list, b: list) -> list[str]:
    """Rankings where one run named a winner and the other said no winner: not a reversal, but a
    learner of the two runs reads another conclusion, so the summary reports each (the review's
    recommendation: seen, not excused)."""
    by: dict = {}
    for subject, verdict in b:
        by.setdefault(subject, []).append(verdict)
    seen: dict = {}
    out = []
    for subject, verdict in a:
        i = seen.get(subject, 0)
        seen[subject] = i + 1
        other = by.get(subject, [])
        if i < len(other) and (verdict is None) != (other[i] is None):
            out.append(f"{subject}: {verdict or 'no winner'} / {other[i] or 'no winner'}")
    return out


def too_wide(text: str, columns: int = 80) -> list[str]:
    return [line for line in text.splitlines() if len(line) > columns]


class Target:
    """A lesson (its file) or a command (`minillm ARGS`), named for its output files."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name, self.argv = name, argv

    @classmethod
    def lesson(cls, f: Path, fast: bool) -> "Target":
        return cls(f.name[:2], [str(f), "--no-pause", *(["--fast"] if fast else [])])

    @classmethod
    def command(cls, spec: str) -> "Target":
        name, sep, args = spec.partition("=")
        if not sep or not re.fullmatch(r"[\w-]+", name) or not args.strip():
            raise ValueError(f"--command {spec!r}: give NAME=ARGS, e.g. disagg=serve-sim --compare disagg")
        return cls(name, ["-m", "minillm", *shlex.split(args)])


def run(target: Target) -> tuple[int, str, float]:
    env = dict(os.environ, COLUMNS="80")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *target.argv],
                          cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()),
        epilog="A full run of all the lessons takes about half an hour on 2 cores; --fast about a minute.")
    p.add_argument("--fast", action="store_true", help="run each lesson with --fast (small sizes, seconds)")
    p.add_argument("--burners", type=int, default=2,
                   help="CPU-burning processes beside the busy run (default: 2)")
    p.add_argument("--only", default="", metavar="N,N,...", help="only these lessons, by number (e.g. 5,13)")
    p.add_argument("--out", default="lesson-runs", metavar="DIR",
                   help="where each run's output and summary.txt go (default: lesson-runs/)")
    p.add_argument("--modes", default="quiet,busy", metavar="quiet,busy",
                   help="which runs, in order (default: quiet,busy; the checks need both)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="make each run N times and compare every run with the first (default: 1)")
    p.add_argument("--command", action="append", default=[], metavar="NAME=ARGS",
                   help="also (or, without --only, instead) run `minillm ARGS` the same way, its output kept as "
                        "NAME-quiet.txt, ... (repeatable)")
    p.add_argument("--check-only", action="store_true",
                   help="run nothing: check the outputs already in DIR for these modes and repeats "
                        "(runs made at different times, e.g. the busy ones while other work ran)")
    args = p.parse_args()
    if args.repeat < 1:
        p.error(f"--repeat {args.repeat}: at least 1")
    if not set(args.modes.split(",")) <= {"quiet", "busy"}:
        p.error(f"--modes {args.modes!r}: name quiet, busy or both, e.g. --modes quiet,busy")
    lessons = sorted(ROOT.joinpath("lessons").glob("[0-9][0-9]_*.py"))
    if args.only:
        try:
            keep = {int(n) for n in args.only.split(",")}
        except ValueError:
            p.error(f"--only {args.only!r}: give lesson numbers separated by commas, e.g. --only 5,13")
        numbers = sorted(int(f.name[:2]) for f in lessons)
        if keep - set(numbers):
            p.error(f"--only {args.only!r}: no lesson {', '.join(map(str, sorted(keep - set(numbers))))} "
                    f"(they are numbered {numbers[0]}-{numbers[-1]})")
        lessons = [f for f in lessons if int(f.name[:2]) in keep]
    elif args.command:
        lessons = []
    try:
        targets = [Target.lesson(f, args.fast) for f in lessons] + [Target.command(c) for c in args.command]
    except ValueError as e:
        p.error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ok = True
    summary = []
    runs = [(mode, i) for i in range(1, args.repeat + 1) for mode in args.modes.split(",")]

    def path(f: Target, mode: str, i: int) -> Path:
        return out / (f"{f.name}-{mode}.txt" if i == 1 else f"{f.name}-{mode}-{i}.txt")

    for mode, i in ([] if args.check_only else runs):
        burners = []
        if mode == "busy":
            burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burners)]
            for b in burners:
                b.start()
        try:
            for f in targets:
                rc, text, secs = run(f)
                path(f, mode, i).write_text(text)
                summary.append(f"{f.name} {mode:5} run {i} rc={rc} {secs / 60:5.1f} min "
                               f"(load {os.getloadavg()[0]:.1f})")
                print(summary[-1], flush=True)
                ok &= rc == 0
        finally:
            for b in burners:
                b.terminate()
    differing = verdicts = 0
    for f in targets:
        texts = {}
        for mode, i in runs:
            q = path(f, mode, i)
            if not q.exists():
                if args.check_only:
                    summary.append(f"{q.name}: missing")
                    print(summary[-1], flush=True)
                    ok = False
                continue
            texts[mode, i] = q.read_text()
            if too_wide(texts[mode, i]):
                summary.append(f"{q.name}: {len(too_wide(texts[mode, i]))} lines over 80 columns")
                print(summary[-1], flush=True)
                ok = False
        first = runs[0]
        if first not in texts:
            continue
        ta = texts[first]
        n = len(rankings(ta))
        verdicts += n * (len(texts) - 1)
        for key, tb in texts.items():
            if key == first:
                continue
            label = f"{f.name} {first[0]} run {first[1]} / {key[0]} run {key[1]}"
            same = checked_sentences(ta) == checked_sentences(tb)
            summary.append(f"{label}: checked sentences, numbers masked: {'same' if same else 'DIFFER'}")
            print(summary[-1], flush=True)
            ok &= same
            flips = flipped(rankings(ta), rankings(tb))
            moved = changed(rankings(ta), rankings(tb))
            differing += len(flips) + len(moved)
            summary.append(f"{label}: rankings: {n} in the first run, "
                           + ("none flipped" if not flips else "FLIPPED: " + "; ".join(flips))
                           + (f"; {len(moved)} changed between a winner and no winner: " + "; ".join(moved)
                              if moved else "; none changed between a winner and no winner"))
            print(summary[-1], flush=True)
            ok &= not flips
    what = f"{len(lessons)} lessons" + (f" and {len(args.command)} commands" if args.command else "")
    summary.append(f"{len(runs)} runs of {what}; {verdicts} verdicts compared with the first run's: "
                   f"{differing} differ")
    print(summary[-1], flush=True)
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
