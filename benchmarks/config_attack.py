"""Every count of every family's config.json set to hostile values, each loaded: how long a refusal
takes and how much memory it costs, and whether it is one line.

For each checkpoint folder (the test fixtures: GPT-2, Llama, Qwen3-MoE, Mixtral, DeepSeek-V3,
Qwen3.5), every field of its config.json that holds an integer (found in the file, not listed by
hand: layers, heads, widths, vocabulary, experts, ranks, windows, ...) is set in turn to each of
VALUES (0, -1, 2^31, 2^40, 2^62, 2^64, 10^8, a float, a string, true, null), and the folder is
loaded with `minillm.load`; where the config has lists (Qwen3.5's `layer_types`), each case runs
again without them (" -lists"), as a reader then derives them from the counts. Each case runs in one worker process per folder, under an address-space
limit (--memory, default 2 GiB: a reader that sizes anything by the hostile count fails there rather
than swapping), with Python's allocations traced; the outcome is

    refused   a MiniLLMError, one line           (what hostile input should get)
    loaded    the model loaded (the count was ignored, or the file agrees with it)
    CRASH     any other exception, a traceback   (a bug)
    SLOW      more than --seconds (default 1) or more than --mb (default 100) MB traced

    python benchmarks/config_attack.py                      # all folders, a table of what was not refused
    python benchmarks/config_attack.py --only qwen35-tiny --values 2**62

Exit status 1 when any case crashed or was slow. What it does not try (next steps for an attacker):
the tensors' own headers (safetensors offsets, GGUF metadata counts: tests/test_hostile_files.py),
a tokenizer.json's sizes, and counts that only bite later (a context or batch that fits the file
but not the pool: the serving tests).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
FOLDERS = ("gpt2-tiny-a", "llama-tiny", "qwen3moe-tiny", "mixtral-tiny", "deepseekv3-direct-bf16", "w5/qwen35-tiny")
VALUES = ("0", "-1", "2**31", "2**40", "2**62", "2**64", "10**8", "1.5", "'4'", "True", "None")


def int_fields(cfg: dict, prefix: str = "") -> list[str]:
    """Dotted names of every integer (not bool) in a config, nested objects included."""
    out = []
    for k, v in cfg.items():
        if isinstance(v, dict):
            out += int_fields(v, f"{prefix}{k}.")
        elif isinstance(v, int) and not isinstance(v, bool):
            out.append(prefix + k)
    return out


def with_value(cfg: dict, dotted: str, value) -> dict:
    cfg = json.loads(json.dumps(cfg))
    *path, last = dotted.split(".")
    node = cfg
    for p in path:
        node = node[p]
    node[last] = value
    return cfg


def worker(folder: str, values: list[str], memory: int, out) -> None:
    """All cases of one folder, in this process (under an address-space limit)."""
    import resource
    import tracemalloc

    import minillm
    from minillm.errors import MiniLLMError
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    src = FIXTURES / folder
    base = json.loads((src / "config.json").read_text())
    minillm.load(src)                                   # imports done before anything is timed
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / src.name
        shutil.copytree(src, dst)
        lists = [k for k, v in base.items() if isinstance(v, list) and k != "architectures"]
        bare = {k: v for k, v in base.items() if k not in lists}     # the per-layer lists dropped: a reader
        variants = [("", base)] + ([(" -lists", bare)] if lists else [])   # then derives them from the counts
        for field, (suffix, cfg) in ((f, v) for f in int_fields(base) for v in variants):
            for text in values:
                value = eval(text)                      # noqa: S307 - the fixed table above
                (dst / "config.json").write_text(json.dumps(with_value(cfg, field, value)))
                tracemalloc.start()
                t0 = time.perf_counter()
                try:
                    minillm.load(dst)
                    kind, msg = "loaded", ""
                except MiniLLMError as e:
                    kind, msg = ("refused" if "\n" not in str(e) else "CRASH"), str(e)
                except BaseException as e:             # noqa: BLE001 - every other outcome is the finding
                    kind, msg = "CRASH", f"{type(e).__name__}: {e}"
                seconds = time.perf_counter() - t0
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                out.put((folder, field + suffix, text, kind, seconds, peak, msg[:160]))
    out.put(None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="folders, comma-separated (default: all of " + ", ".join(FOLDERS) + ")")
    ap.add_argument("--values", default=",".join(VALUES), help="Python literals, comma-separated (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=1.0, help="a case slower than this is a finding (default 1)")
    ap.add_argument("--mb", type=float, default=100.0, help="a case that traced more MB is a finding (default 100)")
    ap.add_argument("--memory", default="2GiB", help="the worker's address-space limit (default 2GiB)")
    ap.add_argument("--all", action="store_true", help="print every case, not only the findings")
    args = ap.parse_args(argv)
    units = {"GiB": 1 << 30, "MiB": 1 << 20}
    unit = next((u for u in units if args.memory.endswith(u)), None)
    if unit is None or not args.memory[:-3].isdigit():
        ap.error(f"--memory {args.memory!r}: give a size such as 2GiB or 512MiB")
    memory = int(args.memory[:-3]) * units[unit]
    folders = [f for f in FOLDERS if args.only is None or Path(f).name in args.only.split(",") or f in args.only.split(",")]
    if not folders:
        ap.error(f"--only {args.only!r}: none of {', '.join(FOLDERS)}")
    values = [v.strip() for v in args.values.split(",") if v.strip()]
    q = mp.get_context("spawn").Queue()
    counts: dict[str, int] = {}
    loaded: dict[str, set] = {}           # folder -> fields some hostile value of which still loaded
    findings = 0
    for folder in folders:
        p = mp.get_context("spawn").Process(target=worker, args=(folder, values, memory, q))
        p.start()
        while (row := q.get()) is not None:
            name, field, text, kind, seconds, peak, msg = row
            slow = seconds > args.seconds or peak > args.mb * 1e6
            kind = "SLOW" if slow and kind != "CRASH" else kind
            counts[kind] = counts.get(kind, 0) + 1
            findings += kind in ("CRASH", "SLOW")
            if kind == "loaded":
                loaded.setdefault(Path(name).name, set()).add(field)
            if args.all or kind in ("CRASH", "SLOW"):
                print(f"{kind:7} {Path(name).name:22} {field:28} {text:6} {seconds:6.2f} s {peak / 1e6:7.1f} MB  {msg}")
        p.join()
        if p.exitcode != 0:
            print(f"CRASH   {Path(folder).name}: the worker died (exit {p.exitcode}): the last case above")
            findings += 1
    for name, fields in loaded.items():
        print(f"loaded  {name}: some values of {', '.join(sorted(fields))} (not read, or checked against the file)")
    print("cases: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
