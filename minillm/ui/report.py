"""Turning step records into what a learner reads: rich tables, selections and plain-words verdicts.

Every number printed here comes from a `StepRecord` the meter filled while the engine ran, or from
this machine's measured figures (`hardware.machine()`); nothing is typed in.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from ..measure.hardware import Hardware, roofline
from ..measure.meter import StepRecord


def console(stderr: bool = False) -> Console:
    """A rich console. Tables are wide: sent to a file or a pipe, they are laid out for 150 columns."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(highlight=False, stderr=stderr, soft_wrap=stderr,
                   width=None if stream.isatty() else 150)


def fmt_bytes(n: float) -> str:
    """Decimal units (1 MB = 10⁶ bytes), as bandwidths are quoted: 498 MB, 75.5 MB, 73.7 kB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:,.0f} {unit}" if v >= 100 else f"{v:.3g} {unit}"
    return f"{n:,.0f} B"


def fmt_flops(n: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:,.0f} {unit}" if v >= 100 else f"{v:.3g} {unit}"
    return f"{n:,.0f} FLOP"


def fmt_time(s: float) -> str:
    if s >= 10:
        return f"{s:,.1f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def select(records: list[StepRecord], most: int = 12) -> list[int]:
    """Indexes of the records to show: all of them when few, else the first ones, evenly spaced
    middle ones and the last one."""
    n, most = len(records), max(most, 2)
    if n <= most:
        return list(range(n))
    head = list(range(min(3, most - 1)))                 # the prefill and the first decode steps
    k = most - len(head) - 1                              # evenly spaced ones between them and the last
    middle = [round(len(head) + (i + 1) * (n - 1 - len(head)) / (k + 1)) for i in range(k)]
    return sorted(set(head + middle + [n - 1]))


def steps_table(records: list[StepRecord], hw: Hardware | None, title: str, rows: list[int] | None = None) -> Table:
    """One row per step: tokens processed, FLOPs, bytes by kind, intensity, time, GB/s, % of bandwidth."""
    t = Table(title=title, title_justify="left", header_style="bold")
    for col in ("step", "kind", "pos", "tokens", "FLOPs", "weights", "KV read", "KV write",
                "activations", "FLOP/B", "time", "GB/s"):
        t.add_column(col, justify="left" if col == "kind" else "right")
    if hw is not None:
        t.add_column("% of BW", justify="right")
    for i in rows if rows is not None else range(len(records)):
        r = records[i]
        b = r.bytes
        row = [str(i), r.kind, str(r.position), str(r.n_tokens), fmt_flops(r.total_flops),
               fmt_bytes(b["weights"]), fmt_bytes(b["kv_read"]), fmt_bytes(b["kv_write"]),
               fmt_bytes(b["activations"]), f"{r.intensity:.3g}", fmt_time(r.seconds), f"{r.gbps:.1f}"]
        if hw is not None:
            row.append(f"{100 * r.gbps / hw.bandwidth_gbs:.0f}%")
        t.add_row(*row)
    return t


def bound_of(r: StepRecord, hw: Hardware) -> str:
    """"memory" or "compute": which roof binds this step on this machine."""
    return roofline(r.total_bytes, r.total_flops, hw).bound


def verdict(r: StepRecord, hw: Hardware, path: str) -> str:
    """One sentence on a step, in plain words, with the numbers that decide it."""
    bound = bound_of(r, hw)
    if r.kind == "prefill":
        what = f"prefill of {r.n_tokens} tokens"
    else:
        what = f"{path} step at position {r.position + r.n_tokens - 1}"
        if r.n_tokens > 1:
            what += f" recomputes {r.n_tokens} tokens"
    return (f"{what}: {r.intensity:.3g} FLOP/byte, {fmt_bytes(r.total_bytes)} moved → {bound}-bound "
            f"(this machine's ridge is {hw.ridge:.3g} FLOP/byte); {r.gbps:.1f} GB/s and {r.gflops:.1f} GFLOP/s "
            f"achieved, {100 * r.gbps / hw.bandwidth_gbs:.0f}% of this machine's {hw.bandwidth_gbs:.1f} GB/s "
            f"and {100 * r.gflops / hw.peak_gflops:.0f}% of its {hw.peak_gflops:.0f} GFLOP/s")


def cache_note(model_bytes: int, hw: Hardware) -> str | None:
    """When the weights fit in the last-level cache, DRAM is not what a decode step measures."""
    if hw.llc_bytes and model_bytes <= hw.llc_bytes:
        return (f"Note: this model's weights ({fmt_bytes(model_bytes)}) fit in the {fmt_bytes(hw.llc_bytes)} "
                "last-level cache, so decode reads them from cache, not DRAM: GB/s above the DRAM bandwidth is "
                "possible. Use --model random-124m to measure DRAM.")
    return None
