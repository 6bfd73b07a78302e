"""How fast is this machine, and what would another chip do? Bandwidth, matmul peak and the roofline.

Decode reads every weight once per token and does about two FLOPs per weight it reads: it waits on
memory. Prefill reuses each weight for every token of the prompt: it waits on arithmetic. Which of
the two limits a piece of work is decided by two numbers of the machine:

- **memory bandwidth** (GB/s): how fast bytes stream from DRAM (or HBM) into the cores;
- **matmul peak** (GFLOP/s): how fast the cores multiply and add when the data is already close.

Their ratio, the **ridge point** (FLOPs per byte), is the arithmetic intensity at which a piece of
work stops waiting on memory and starts waiting on arithmetic. `probe` measures both numbers on this
machine, `chips` carries the published figures for well-known chips (`PRESETS`) and the roofline
model (`roofline`, `decode_ceiling`); this module caches the measurement (`machine()`, under
`cache_dir()/hardware.json`), says how old and how trustworthy it is (`provenance`), and is the
`minillm hardware` command (`add_arguments`, `run`). Every name of the three is importable from here.
"""

from __future__ import annotations

import argparse
import re
import contextlib
import json
import math
import os
from dataclasses import asdict, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..errors import MiniLLMError
from ..paths import atomic_write, cache_dir
from .chips import (_DENSE, ALIASES, BYTES_PER_ELEMENT, DTYPE_ALIASES, PRESETS, Hardware, Roofline, _chip, _dtype_key,  # noqa: F401
                    decode_ceiling, get_chip, parse_count, roofline)
from .probe import (BLOCK, FALLBACK_LLC_BYTES, MB, METHODS, _best_seconds, _parse_size,  # noqa: F401
                    available_memory_bytes, cpu_model, cpu_threads, default_buffer_mb, detect_llc_bytes,
                    fast_mode, load_average, measure_bandwidth, measure_matmul_peak)
from .threads import add_threads_option, blas_threads, limited

CACHE_VERSION = 2   # 2: more bandwidth methods, BLAS threads and NumPy version recorded
STALE_DAYS = 30     # an older measurement is shown with a note to measure again


def cache_path() -> Path:
    """`cache_dir()/hardware.json` (honours $MINILLM_HOME)."""
    return cache_dir() / "hardware.json"


_NUMBER = (int, float)
# The type each cached field must have (None allowed where the field is optional): a record that
# fails any of them is measured again, never trusted half-way.
_FIELD_TYPES = {
    "name": (str,), "bandwidth_gbs": _NUMBER, "peak_gflops": _NUMBER, "llc_bytes": (int,), "method": (str,),
    "measured_at": (str,), "source": (str,), "note": (str,), "cpu": (str,), "threads": (int,), "fast": (bool,),
    "methods": (dict,), "buffer_mb": (int,), "matmul_size": (int,), "load_avg": _NUMBER,
    "blas_threads": (int,), "numpy_version": (str,),
}
_REQUIRED = ("bandwidth_gbs", "peak_gflops", "measured_at", "cpu", "threads", "method", "methods")


def _positive(x) -> bool:
    return isinstance(x, _NUMBER) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def valid_record(record) -> Hardware | None:
    """The Hardware a cached JSON record describes, or None if any field is missing or of the wrong type."""
    if not isinstance(record, dict) or record.get("version") != CACHE_VERSION:
        return None
    known = {f.name for f in fields(Hardware)}
    values = {k: v for k, v in record.items() if k in known}
    if any(values.get(k) is None for k in _REQUIRED):
        return None
    for key, value in values.items():
        types = _FIELD_TYPES.get(key, (object,))
        if value is None:
            continue
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            return None
    if not (_positive(values["bandwidth_gbs"]) and _positive(values["peak_gflops"])):
        return None
    if not all(isinstance(k, str) and _positive(v) for k, v in values["methods"].items()):
        return None
    try:
        datetime.fromisoformat(values["measured_at"])
    except ValueError:
        return None
    return Hardware(**values)


def _load_cached(path: Path, want_full: bool) -> Hardware | None:
    """The cached record, or None if it is missing, unreadable, of wrong types, from another machine or
    another setup (NumPy version, BLAS threads), or not good enough.

    A fast-mode record is not reused for a full measurement; a corrupt file is simply measured again.
    """
    try:
        hw = valid_record(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, RecursionError):
        return None
    if hw is None:
        return None
    if hw.cpu != cpu_model() or hw.threads != cpu_threads():
        return None  # a shared $MINILLM_HOME seen from another machine
    if hw.numpy_version != np.__version__ or hw.blas_threads != blas_threads():
        return None  # another NumPy or another thread count: another ceiling
    if want_full and hw.fast:
        return None
    return hw


def age_seconds(hw: Hardware, now: datetime | None = None) -> float | None:
    """How long ago `hw` was measured, in seconds (None for a published figure)."""
    if not hw.measured_at:
        return None
    then = datetime.fromisoformat(hw.measured_at)
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    return max(0.0, ((now or datetime.now(timezone.utc)) - then).total_seconds())


def fmt_age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def was_busy(hw: Hardware) -> bool:
    """The machine was busy while `hw` was measured: the load average above half its hardware threads."""
    return hw.load_avg is not None and bool(hw.threads) and hw.load_avg > 0.5 * hw.threads


def is_stale(hw: Hardware) -> bool:
    age = age_seconds(hw)
    return age is not None and age > STALE_DAYS * 86400


def provenance(hw: Hardware) -> str:
    """One line on where this machine's figures came from: method, threads, age, load when measured."""
    parts = [f"{hw.bandwidth_gbs:.1f} GB/s (best of {len(hw.methods) or 1} read methods: {hw.method})",
             f"{hw.peak_gflops:.0f} GFLOP/s float32 matmul" if hw.peak_gflops else "no matmul peak"]
    if hw.blas_threads:
        parts.append(f"{hw.blas_threads} BLAS thread{'s' if hw.blas_threads != 1 else ''}")
    age = age_seconds(hw)
    if age is not None:
        when = f"measured {fmt_age(age)}"
        if hw.load_avg is not None:
            when += f" at load {hw.load_avg:g}"
        parts.append(when)
    line = ", ".join(parts)
    if is_stale(hw):
        line += f"; older than {STALE_DAYS} days: minillm hardware --remeasure"
    elif was_busy(hw):
        line += "; the machine was busy then: minillm hardware --remeasure when it is idle"
    return line


def _write_atomically(path: Path, text: str) -> None:
    """Readers see the old figures or the new ones, never half (paths.atomic_write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, text=True) as f:
        f.write(text)


@contextlib.contextmanager
def _status(message: str, progress: bool) -> Iterator[Callable[[str], None]]:
    """A rich spinner on stderr while measuring (nothing when progress=False). Yields an `update(msg)`."""
    if not progress:
        yield lambda _msg: None
        return
    from rich.console import Console

    with Console(stderr=True).status(message) as status:
        yield lambda msg: status.update(msg)


def measure_machine(progress: bool = True) -> Hardware:
    """Measure this machine now (bandwidth, then matmul peak) without touching the cache."""
    fast = fast_mode()
    load = load_average()
    with _status("Measuring memory bandwidth…", progress) as update:
        bw = measure_bandwidth()
        update("Measuring matmul peak…")
        mm = measure_matmul_peak()
    cpu = cpu_model()
    return Hardware(
        name="this machine",
        bandwidth_gbs=bw["bandwidth_gbs"],
        peak_gflops=mm["peak_gflops"],
        llc_bytes=detect_llc_bytes(),
        method=bw["method"],
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        source=f"measured: {bw['method']}, {bw['buffer_mb']} MB; sgemm {mm['size']}²",
        note="fast mode (MINILLM_FAST): small buffers, rough figures" if fast else "",
        cpu=cpu,
        threads=cpu_threads(),
        fast=fast,
        methods=bw["methods"],
        buffer_mb=bw["buffer_mb"],
        matmul_size=mm["size"],
        load_avg=load,
        blas_threads=blas_threads(),
        numpy_version=np.__version__,
    )


def machine(remeasure: bool = False, progress: bool = True) -> Hardware:
    """This machine's figures: read from `cache_dir()/hardware.json`, or measured (a few seconds) and cached.

    `remeasure=True` measures again and replaces the cache. With `progress`, a spinner on stderr
    says what is being measured. If the cache cannot be written the figures are still returned.
    """
    path = cache_path()
    if not remeasure:
        cached = _load_cached(path, want_full=not fast_mode())
        if cached is not None:
            return cached
    hw = measure_machine(progress=progress)
    record = {"version": CACHE_VERSION, **asdict(hw)}
    try:
        _write_atomically(path, json.dumps(record, indent=2) + "\n")
    except OSError as exc:
        if progress:
            from rich.console import Console
            from rich.markup import escape

            # mkdir of a folder whose name is taken by a file raises FileExistsError: say what is wrong
            reason = (f"{exc.filename} is not a directory" if isinstance(exc, FileExistsError)
                      else exc.strerror or str(exc))
            Console(stderr=True).print(f"[yellow]note:[/] could not cache hardware figures at {escape(str(path))} "
                                       f"({escape(str(reason))}); they will be measured again next time: set "
                                       "MINILLM_HOME to a writable folder to keep them")
    return hw


# --------------------------------------------------------------------------------------------------
# `minillm hardware`
# --------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `minillm hardware`."""
    parser.add_argument("--chip", metavar="NAME", help=f"a known chip: {', '.join(PRESETS)}")
    parser.add_argument("--params", metavar="N", help="model size for the decode ceiling: 7B, 124M, 1.5e9, ...")
    parser.add_argument("--shape", metavar="NAME", help="a model shape by name (llama-3-8b, llama-2-7b, mistral-7b, "
                        "qwen2.5-7b, smollm2-135m, gpt2-124m, ...): weights and KV bytes per token from it")
    parser.add_argument("--context", type=int, default=None, metavar="T",
                        help="with --shape: tokens in the KV cache for the decode step (default: the shape's context)")
    parser.add_argument("--dtype", default="fp16", choices=list(BYTES_PER_ELEMENT),
                        help="bytes per weight for the decode ceiling (default fp16)")
    parser.add_argument("--remeasure", action="store_true", help="measure this machine again, replacing the cache")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    add_threads_option(parser)


def _sig(x: float, digits: int = 3) -> str:
    """A number to `digits` significant figures, never in scientific notation: 14.0, 0.497, 2,039."""
    if x == 0 or not math.isfinite(x):
        return str(x)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def _ms(x: float) -> str:
    return f"{x:,.1f}" if x >= 1 else _sig(x, 2)


def _peak(hw: Hardware) -> str:
    if hw.peak_gflops is None:
        return "—"
    return f"{hw.peak_gflops / 1000:,.0f} TFLOP/s" if hw.peak_gflops >= 10_000 else f"{hw.peak_gflops:,.1f} GFLOP/s"


def run(args: argparse.Namespace) -> int:
    """`minillm hardware`: this machine beside the presets, and the decode ceiling if --params is given."""
    with limited(getattr(args, "threads", None)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Check the user's input before spending seconds on measuring.
    if getattr(args, "shape", None):
        return _run_shape(args)
    chip = get_chip(args.chip) if args.chip else None
    n_params = parse_count(args.params) if args.params else None
    dtype = _dtype_key(args.dtype)

    here = machine(remeasure=args.remeasure, progress=not args.json)
    targets = [chip] if chip else [here, *PRESETS.values()]
    ceilings = [decode_ceiling(n_params, dtype, hw) for hw in targets] if n_params else []

    if args.json:
        print(json.dumps({
            "machine": {**asdict(here), "ridge": here.ridge},
            "presets": {name: {**asdict(hw), "ridge": hw.ridge} for name, hw in PRESETS.items()},
            "decode_ceiling": ceilings,
        }, indent=2))
        return 0

    console = Console()
    mine = Table(title="This machine (measured)", show_header=False, title_justify="left", box=box.SIMPLE)
    mine.add_column(style="bold", no_wrap=True)
    mine.add_column()
    mine.add_row("CPU", f"{escape(str(here.cpu))}, {here.threads} threads")
    mine.add_row("memory read bandwidth", f"{here.bandwidth_gbs:,.1f} GB/s (best method: {here.method})")
    for name, gbs in here.methods.items():
        mine.add_row(f"  {name}", f"{gbs:,.1f} GB/s  [dim]{escape(METHODS.get(name, ''))}[/]")
    mine.add_row("float32 matmul peak", f"{here.peak_gflops:,.1f} GFLOP/s ({here.matmul_size}² sgemm)")
    mine.add_row("ridge point", f"{here.ridge:,.1f} FLOP/byte (peak ÷ bandwidth)")
    if here.llc_bytes:
        mine.add_row("last-level cache", f"{here.llc_bytes / MB:g} MiB (buffer {here.buffer_mb} MiB)")
    mine.add_row("BLAS threads", f"{here.blas_threads or 'unknown'} (set with --threads N; NumPy {here.numpy_version})")
    age = age_seconds(here)
    load = f", load average {here.load_avg:g}" if here.load_avg is not None else ""
    mine.add_row("measured", f"{here.measured_at} ({fmt_age(age)}{load})  [dim]{escape(str(cache_path()))}[/]")
    if here.fast:
        mine.add_row("[yellow]note[/]", escape(here.note))
    if was_busy(here):
        mine.add_row("[yellow]note[/]", f"load average was {here.load_avg} while measuring: other work may have "
                     "lowered these figures; rerun with --remeasure when the machine is idle")
    if is_stale(here):
        mine.add_row("[yellow]note[/]", f"measured more than {STALE_DAYS} days ago: rerun with --remeasure")
    console.print(mine)

    chips = Table(title="Known chips (published figures) beside this machine", title_justify="left",
                  box=box.SIMPLE_HEAD)
    chips.add_column("chip", style="bold", no_wrap=True)
    chips.add_column("bandwidth", justify="right", no_wrap=True)
    chips.add_column("peak", justify="right", no_wrap=True)
    chips.add_column("ridge", justify="right", no_wrap=True)
    chips.add_column("source", overflow="fold")
    notes: list[str] = []
    for hw in [here, *PRESETS.values()]:
        ridge = "—" if hw.ridge is None else f"{hw.ridge:,.0f}" if hw.ridge >= 10 else f"{hw.ridge:.1f}"
        style = "reverse" if chip is not None and hw is chip else None
        mark = ""
        if hw.note and hw.measured_at is None:
            if hw.note not in notes:
                notes.append(hw.note)
            mark = f" [{notes.index(hw.note) + 1}]"
        chips.add_row(hw.name, f"{_sig(hw.bandwidth_gbs)} GB/s", _peak(hw), ridge, escape(hw.source + mark), style=style)
    console.print(chips)
    console.print("  [dim]ridge: FLOPs per byte above which work is compute-bound. "
                  "peak: FP16 for the GPUs, float32 as measured for this machine.[/]")
    for i, text in enumerate(notes, 1):
        console.print(f"  [dim]\\[{i}] {escape(text)}[/]")

    if ceilings:
        table = Table(title=f"Decode ceiling, batch 1: {n_params:,} parameters in {dtype}", title_justify="left",
                      box=box.SIMPLE_HEAD)
        for heading in ("chip", "GB per token", "ms per token", "tokens/s", "compute ms/token"):
            table.add_column(heading, justify="left" if heading == "chip" else "right", no_wrap=True)
        for c in ceilings:
            compute = "—" if c["compute_ms_per_token"] is None else _ms(c["compute_ms_per_token"])
            table.add_row(c["chip"], _sig(c["gb_per_token"]), _ms(c["ms_per_token"]), f"{c['tokens_per_s']:,.0f}", compute)
        console.print(table)
        c = ceilings[0]
        console.print(
            f"{c['n_params']:,} parameters × {c['bytes_per_param']:g} bytes ({dtype}) = {_sig(c['gb_per_token'])} GB "
            f"per token; at {_sig(c['bandwidth_gbs'])} GB/s ({c['chip']}) that is {_ms(c['ms_per_token'])} ms per token, "
            f"about {c['tokens_per_s']:,.0f} tokens/s, whatever the compute.",
            soft_wrap=True,
        )
    return 0


def _run_shape(args: argparse.Namespace) -> int:
    """`minillm hardware --shape NAME [--chip C] [--context T]`: a decode step's bytes from the shape."""
    from rich.console import Console
    from .shapes import decode_step_bytes, kv_bytes_per_token, sequences_that_fit, shape
    s = shape(args.shape)
    if args.params:
        raise MiniLLMError("--params and --shape both give the model's size: choose one")
    context = args.context if args.context is not None else s["n_ctx"]
    if context < 1:
        raise MiniLLMError(f"--context {context}: must be at least 1")
    b = BYTES_PER_ELEMENT[_dtype_key(args.dtype)]
    hw = get_chip(args.chip) if args.chip else machine(progress=True)
    step = decode_step_bytes(s, context, b)
    kv_tok = kv_bytes_per_token(s, b)
    mha = kv_tok * s["n_head"] / s["n_kv_head"]
    ms = step["total"] / (hw.bandwidth_gbs * 1e9) * 1e3
    out = [f"{s['name']} ({args.dtype}): {s['n_params'] / 1e9:.2f}B params, {s['n_layer']} layers, "
           f"{s['n_head']} heads, {s['n_kv_head']} KV heads of {s['head_dim']}",
           f"  KV per token: 2·L·Hkv·hd·b = {kv_tok / 1024:,.0f} KiB"
           + (f" ({mha / 1024:,.0f} KiB with a KV head per query head)" if mha != kv_tok else ""),
           f"  weights per decode step: {step['weights'] / 1e9:,.2f} GB",
           f"  KV read at context {context:,}: {step['kv'] / 1e9:,.2f} GB "
           f"({step['kv'] / step['weights']:.0%} of the weights)",
           f"  decode, batch 1, on {hw.name} ({_sig(hw.bandwidth_gbs)} GB/s): {ms:,.2f} ms/token, "
           f"~{1e3 / ms:,.0f} tokens/s"]
    gb = re.search(r"(\d+)gb", hw.name)
    if gb:
        n = sequences_that_fit(s, context, b, int(gb.group(1)) * 1e9)
        out.append(f"  sequences of {context:,} tokens whose KV fits beside the weights in "
                   f"{gb.group(1)} GB: {n:,}")
    Console().print("\n".join(out), highlight=False, soft_wrap=True)
    return 0
