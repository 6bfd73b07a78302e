"""Turning step records into what a learner reads: rich tables, selections and plain-words verdicts.

Every number printed here comes from a `StepRecord` the meter filled while the engine ran, or from
this machine's measured figures (`hardware.machine()`); nothing is typed in.
"""

from __future__ import annotations

from rich import box
from rich.table import Table

from ..measure.chips import Hardware, roofline
from ..meter import StepRecord


def fmt_units(n: float, unit: str) -> str:
    """A count in decimal multiples of `unit` (k, M, G, T = 10³ ...), three figures or the whole number."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:,.0f} {prefix}{unit}" if v >= 100 else f"{v:.3g} {prefix}{unit}"
    return f"{n:,.0f} {unit}"


def fmt_bytes(n: float) -> str:
    """Decimal units (1 MB = 10⁶ bytes), as bandwidths are quoted: 498 MB, 75.5 MB, 73.7 kB."""
    return fmt_units(n, "B")


def fmt_flops(n: float) -> str:
    return fmt_units(n, "FLOP")


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


NARROW = 120   # below this many columns, a table of steps drops the bytes-by-kind breakdown


def last_position(r: StepRecord) -> int:
    """The position of the last token a step runs through the blocks: the one whose logits it gives.

    A cached decode step runs one token (its own position); a prefill or a naive step runs every
    position from 0, so its last position is where the new token is predicted from."""
    return r.position + r.n_tokens - 1


def steps_table(records: list[StepRecord], hw: Hardware | None, title: str, rows: list[int] | None = None,
                width: int | None = None) -> Table:
    """One row per step: tokens processed, FLOPs, bytes, intensity, time, GB/s, % of bandwidth.

    `width` is the console's: below `NARROW` columns the bytes are one total (fits 80 columns);
    wider, they are split by kind (weights, KV read, KV write, activations)."""
    narrow = width is not None and width < NARROW
    t = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD,
              padding=(0, 1) if not narrow else (0, 0, 0, 1), collapse_padding=True)
    byte_cols = ("bytes",) if narrow else ("weights", "KV read", "KV write", "activations")
    for col in ("step", "kind", "pos", "tokens", "FLOPs", *byte_cols, "FLOP/B", "time", "GB/s"):
        t.add_column(col, justify="left" if col == "kind" else "right", no_wrap=True)
    if hw is not None:
        t.add_column("% BW" if narrow else "% of BW", justify="right", no_wrap=True)
    for i in rows if rows is not None else range(len(records)):
        r = records[i]
        b = r.bytes
        moved = ([fmt_bytes(r.total_bytes)] if narrow else
                 [fmt_bytes(b["weights"]), fmt_bytes(b["kv_read"]), fmt_bytes(b["kv_write"]), fmt_bytes(b["activations"])])
        row = [str(i), r.kind, str(last_position(r)), str(r.n_tokens), fmt_flops(r.total_flops), *moved,
               f"{r.intensity:.3g}", fmt_time(r.seconds), f"{r.gbps:.1f}"]
        if hw is not None:
            row.append(f"{100 * r.gbps / hw.bandwidth_gbs:.0f}%")
        t.add_row(*row)
    return t


def fused_bytes(r: StepRecord, config, itemsize: int) -> int:
    """The bytes of a step under **ideal fusion**: a lower bound on what a GPU engine moves.

    The meter counts the unfused view, as NumPy runs: every operation reads its inputs from memory
    and writes its outputs back, so a long prefill moves its activations many times over. Ideal
    fusion keeps the inside of a block on chip: it moves the weights, the KV cache read and written,
    each block's input and output ([T, d] each), the embedding's output and the logits it keeps.
    Real engines sit between the two: FlashAttention keeps attention's T×T scores on chip, but the
    separate matrix kernels still write their outputs (about 10-14·T·d per layer) to memory."""
    L, d, V = config.n_layer, config.n_embd, config.vocab_size
    T = r.n_tokens
    lm_rows = T if r.kind == "forward" else 1
    activations = (2 * L * T * d + T * d + lm_rows * V) * itemsize
    return r.bytes["weights"] + r.bytes["kv_read"] + r.bytes["kv_write"] + activations


def bound_of(r: StepRecord, hw: Hardware) -> str:
    """"memory" or "compute": which roof binds this step on this machine."""
    return roofline(r.total_bytes, r.total_flops, hw).bound


def verdict(r: StepRecord, hw: Hardware, path: str) -> str:
    """One sentence on a step, in plain words, with the numbers that decide it (bytes as the meter counts
    them: the unfused view, every operation's inputs and outputs through memory, as NumPy runs)."""
    bound = bound_of(r, hw)
    if r.kind == "prefill":
        what = f"prefill of {r.n_tokens} tokens"
    else:
        what = f"{path} step at position {last_position(r)}"
        if r.n_tokens > 1:
            what += f" recomputes {r.n_tokens} tokens"
    return (f"{what}: {r.intensity:.3g} FLOP/byte, {fmt_bytes(r.total_bytes)} moved (unfused) → {bound}-bound "
            f"(this machine's ridge is {hw.ridge:.3g} FLOP/byte); {r.gbps:.1f} GB/s and {r.gflops:.1f} GFLOP/s "
            f"achieved, {100 * r.gbps / hw.bandwidth_gbs:.0f}% of this machine's {hw.bandwidth_gbs:.1f} GB/s "
            f"and {100 * r.gflops / hw.peak_gflops:.0f}% of its {hw.peak_gflops:.0f} GFLOP/s")


def fmt_mib(n: float) -> str:
    """A cache size in binary units, as CPUs quote them: 32 MiB, 512 KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def cache_resident(model_bytes: int, hw: Hardware) -> bool:
    return bool(hw.llc_bytes) and model_bytes <= hw.llc_bytes


def cache_note(model_bytes: int, hw: Hardware) -> str | None:
    """When the weights fit in the last-level cache, DRAM is not what a decode step measures."""
    if cache_resident(model_bytes, hw):
        return (f"This model's weights ({fmt_mib(model_bytes)}) fit in this CPU's {fmt_mib(hw.llc_bytes)} "
                "last-level cache, so a decode step reads them from the cache, not from DRAM: the GB/s below "
                "are cache speeds, and this run cannot show decode waiting on memory. To see it, add "
                "--model large (the bundled 77 MB model, real text) or --model random-124m (GPT-2 small's "
                "size, about 500 MB a step).")
    return None
