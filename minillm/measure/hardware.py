"""How fast is this machine, and what would another chip do? Bandwidth, matmul peak and the roofline.

Decode reads every weight once per token and does about two FLOPs per weight it reads: it waits on
memory. Prefill reuses each weight for every token of the prompt: it waits on arithmetic. Which of
the two limits a piece of work is decided by two numbers of the machine:

- **memory bandwidth** (GB/s): how fast bytes stream from DRAM (or HBM) into the cores;
- **matmul peak** (GFLOP/s): how fast the cores multiply and add when the data is already close.

Their ratio, the **ridge point** (FLOPs per byte), is the arithmetic intensity at which a piece of
work stops waiting on memory and starts waiting on arithmetic. `probe` measures both numbers on this
machine, `chips` carries the published figures for well-known chips (`CHIPS`) and the roofline
model (`roofline`, `decode_ceiling`); this module caches the measurement (`machine()`, under
`cache_dir()/hardware.json`, one record per machine, NumPy and BLAS thread count) and says how old
and how trustworthy it is (`provenance`). The `minillm hardware` command is `minillm.cli.hardware`.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import asdict, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..paths import atomic_write, cache_dir
from .chips import Hardware
from .probe import cpu_model, cpu_threads, detect_llc_bytes, fast_mode, load_average, measure_bandwidth, measure_matmul_peak
from ..threads import blas_threads

CACHE_VERSION = 3   # 3: one record per machine, NumPy version and BLAS thread count, all kept
STALE_DAYS = 30     # an older measurement is measured again


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
    "blas_threads": (int,), "numpy_version": (str,), "memory_gb": _NUMBER,
}
_REQUIRED = ("bandwidth_gbs", "peak_gflops", "measured_at", "cpu", "threads", "method", "methods")


def _positive(x) -> bool:
    return isinstance(x, _NUMBER) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def valid_record(record) -> Hardware | None:
    """The Hardware a cached JSON record describes, or None if any field is missing or of the wrong type."""
    if not isinstance(record, dict):
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


def _cached_records(path: Path) -> list[dict]:
    """The records in the cache file (none if it is missing, unreadable or of another version)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, TypeError, RecursionError):
        return []
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("records"), list):
        return []
    return data["records"]


def _setup() -> tuple:
    """What a measurement holds for: this machine (CPU, hardware threads), NumPy, BLAS threads now."""
    return cpu_model(), cpu_threads(), np.__version__, blas_threads()


def _setup_of(hw: Hardware) -> tuple:
    return hw.cpu, hw.threads, hw.numpy_version, hw.blas_threads


def _load_cached(path: Path, want_full: bool) -> Hardware | None:
    """The cached record for this machine, NumPy and BLAS thread count, or None if there is none that
    is whole, of the right types, fresh (under STALE_DAYS) and good enough.

    Each thread count has its own record: figures measured on 2 threads are never used for a run on
    1. A fast-mode record is not reused for a full measurement; a corrupt file is simply measured again.
    """
    setup = _setup()
    for record in _cached_records(path):
        hw = valid_record(record)
        if hw is None or _setup_of(hw) != setup or is_stale(hw):
            continue
        if want_full and hw.fast:
            continue
        return hw
    return None


def cached() -> Hardware | None:
    """This setup's cached figures, if `machine()` would use them without measuring."""
    return _load_cached(cache_path(), want_full=not fast_mode())


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

    with Console(stderr=True, emoji=False).status(message) as status:
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
    """This machine's figures at the BLAS thread count in force now: read from `cache_dir()/hardware.json`,
    or measured (a few seconds) and cached beside those of other thread counts.

    `remeasure=True` measures again and replaces this thread count's record. With `progress`, a spinner on stderr
    says what is being measured. If the cache cannot be written the figures are still returned.
    """
    path = cache_path()
    if not remeasure:
        hw = cached()
        if hw is not None:
            return hw
    hw = measure_machine(progress=progress)
    others = [r for r in _cached_records(path)
              if (kept := valid_record(r)) is not None and _setup_of(kept) != _setup_of(hw)]
    try:
        _write_atomically(path, json.dumps({"version": CACHE_VERSION, "records": [*others, asdict(hw)]},
                                           indent=2) + "\n")
    except OSError as exc:
        if progress:
            from rich.console import Console
            from rich.markup import escape

            # mkdir of a folder whose name is taken by a file raises FileExistsError: say what is wrong
            reason = (f"{exc.filename} is not a directory" if isinstance(exc, FileExistsError)
                      else exc.strerror or str(exc))
            Console(stderr=True, emoji=False).print(f"[yellow]note:[/] could not cache hardware figures at {escape(str(path))} "
                                       f"({escape(str(reason))}); they will be measured again next time: set "
                                       "MINILLM_HOME to a writable folder to keep them")
    return hw
