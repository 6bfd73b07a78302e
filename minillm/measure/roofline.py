"""The roofline as data: a machine's two numbers and the steps minillm measured, placed on them.

A `Roof` is a machine's bandwidth (GB/s) and matmul peak (GFLOP/s): this machine's as `machine()`
measured them at the BLAS thread count the steps ran on, or a published chip's (`chips.CHIPS`). A
`Point` is one step: its FLOPs and bytes as the meter counted them and, on this machine, the seconds
it took as the run measured them. Its x is FLOPs per byte (counted), its y FLOP/s (counted FLOPs ÷
measured seconds): the gap between a point and the roof above it is what the step left on the table.
On a chip's roofline nothing was timed: the same counted intensities sit on the chip's roof, where
the roofline model says they would at best (the picture says so).

`collect` runs the measurements the points come from, with the functions `minillm bench` calls
(`run_bench`: decode, prefill and naive steps per context; `run_batch_benches`: decode at B = 1..32,
a mixture of experts, a latent-attention model's absorbed and decompressed step; `run_quant_bench`:
float32 against Q8_0 and Q4_0 with the kernel sets that can run here); `points` turns their results
into points without computing any number they did not hold. The pictures are `minillm.ui.roofline`'s;
the command is `minillm roofline`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..errors import MiniLLMError
from .chips import Hardware, get_chip

PARTS = ("batch", "contexts", "formats", "mixture", "latent")
BATCHES = (1, 2, 4, 8, 16, 32)
CONTEXTS = (16, 128, 512)
FORMATS = ("float32", "q8_0", "q4_0")
MIXTURE = "random-moe-16x2"
LATENT = "random-mla"
LATENT_CONTEXT = 256          # the latent model's prompts: long enough for the two ways to differ


@dataclass(frozen=True)
class Roof:
    """A machine's roofline: min(peak, FLOP/byte × bandwidth)."""

    name: str
    bandwidth_gbs: float
    peak_gflops: float
    threads: int | None = None      # BLAS threads the figures were measured with (this machine)
    measured: bool = False          # measured here (True) or published (False)
    note: str = ""                  # e.g. the load when measured

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the slope meets the roof (peak ÷ bandwidth)."""
        return self.peak_gflops / self.bandwidth_gbs

    def attainable(self, intensity: float) -> float:
        """GFLOP/s the roofline allows at `intensity` FLOPs per byte."""
        return min(self.peak_gflops, intensity * self.bandwidth_gbs)


@dataclass(frozen=True)
class Point:
    """One step on the roofline: counted FLOPs and bytes, measured seconds (None: not timed, a chip's)."""

    label: str
    kind: str                   # decode, prefill, naive, format, mixture, latent
    flops: float
    bytes: float
    seconds: float | None = None

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def gflops(self) -> float | None:
        """Measured GFLOP/s: counted FLOPs ÷ measured seconds."""
        return None if self.seconds is None else self.flops / self.seconds / 1e9


@dataclass
class Picture:
    """What a roofline picture shows: the roof, the points, and what to say about the run."""

    roof: Roof
    points: list[Point]
    title: str
    busy: str | None = None            # the busy note of the run (None: quiet), shown on the picture
    measured: bool = True              # points at their measured FLOP/s; False: on the roof (a chip's)
    notes: list[str] = field(default_factory=list)

    def y(self, p: Point) -> float:
        """A point's height: its measured GFLOP/s, or on a chip's picture the roof at its intensity."""
        return p.gflops if self.measured else self.roof.attainable(p.intensity)

    def of_roof(self, p: Point) -> float:
        """The share of the roof at its intensity that the point reached."""
        return self.y(p) / self.roof.attainable(p.intensity)

    def as_dict(self) -> dict:
        return {"roof": {**asdict(self.roof), "ridge": self.roof.ridge}, "title": self.title, "busy": self.busy,
                "measured": self.measured, "notes": list(self.notes),
                "points": [{**asdict(p), "intensity": p.intensity,
                            "gflops": self.y(p) if self.measured else None,
                            "roof_gflops": self.roof.attainable(p.intensity)} for p in self.points]}


def machine_roof(hw: Hardware) -> Roof:
    """This machine's roof from its measured figures (`hardware.machine()` at the run's thread count)."""
    if hw.peak_gflops is None:
        raise MiniLLMError(f"{hw.name} has no FLOP/s peak: a roofline needs one")
    note = f"measured at load {hw.load_avg:g}" if hw.load_avg is not None else ""
    return Roof(name=hw.name, bandwidth_gbs=hw.bandwidth_gbs, peak_gflops=hw.peak_gflops,
                threads=hw.blas_threads, measured=hw.measured, note=note)


def chip_roof(name: str) -> Roof:
    """A published chip's roof (CHIPS): bandwidth and dense FP16 tensor peak."""
    hw = get_chip(name)
    if hw.peak_gflops is None:
        raise MiniLLMError(f"chip {hw.name!r} has no published FLOP/s peak, so it has no roof to draw; "
                           "choose one with a peak, e.g. a100, h100, h200, b200")
    return Roof(name=hw.name, bandwidth_gbs=hw.bandwidth_gbs, peak_gflops=hw.peak_gflops, note=hw.source)


# -- the points of each measurement's result ---------------------------------------------------------

def batch_points(result: dict, kind: str = "decode", name: str = "") -> list[Point]:
    """`run_batch_bench`'s rows: one decode step of B sequences each (counted once, median time)."""
    pre = f"{name} " if name else ""
    return [Point(f"{pre}B={r['batch']}", kind, r["flops"], r["bytes"], r["ms_step"] / 1e3) for r in result["rows"]]


def context_points(result: dict) -> list[Point]:
    """`run_bench`'s rows: per context T, a cached decode step, a prefill of T tokens and a naive step
    (the whole sequence of T tokens again)."""
    out = []
    for r in result["rows"]:
        T = r["context"]
        out.append(Point(f"prefill {T}", "prefill", r["prefill_flops"], r["prefill_bytes"], r["prefill_s"]))
        out.append(Point(f"naive {T}", "naive", r["naive_flops"], r["naive_bytes"], r["naive_ms"] / 1e3))
    return out


def format_points(result: dict) -> list[Point]:
    """`run_quant_bench`'s rows: a batch-1 decode step per weight format and kernel set."""
    return [Point(f"{r['weights']} {r['kernels']}", "format", r["step_flops"], r["step_bytes"], r["decode_ms"] / 1e3)
            for r in result["rows"]]


def points(results: dict) -> list[Point]:
    """Every point of `collect`'s results, in the order of PARTS."""
    out: list[Point] = []
    if "batch" in results:
        out += batch_points(results["batch"], "decode", "decode")
    if "contexts" in results:
        out += context_points(results["contexts"])
    if "formats" in results:
        out += format_points(results["formats"])
    if "mixture" in results:
        out += batch_points(results["mixture"], "mixture", "moe")
    if "latent" in results:
        for way, res in results["latent"].items():
            out += batch_points(res, "latent", f"mla {way[:6]}.")
    return out


def picture(results: dict, hw: Hardware, busy: str | None = None) -> Picture:
    """This machine's roofline with the run's points (`hw`: the figures at the run's thread count)."""
    roof = machine_roof(hw)
    threads = f"{roof.threads} thread{'s' if roof.threads != 1 else ''}" if roof.threads else "threads unknown"
    title = f"this machine, {threads}: {roof.bandwidth_gbs:.1f} GB/s, {roof.peak_gflops:.0f} GFLOP/s"
    notes = [f"roof: bandwidth ({hw.method} reads) and float32 matmul peak, {roof.note}".rstrip(", ")]
    if hw.load_avg is not None and hw.threads and hw.load_avg > 0.5 * hw.threads:
        notes.append("the roof's figures were measured on a busy machine: minillm hardware --remeasure")
    return Picture(roof, points(results), title, busy=busy, notes=notes)


def chip_picture(results: dict, chip: str) -> Picture:
    """A published chip's roofline with the same steps' counted intensities, on its roof (not timed)."""
    roof = chip_roof(chip)
    title = f"{roof.name}, published: {roof.bandwidth_gbs:,.0f} GB/s, {roof.peak_gflops / 1000:,.0f} TFLOP/s"
    return Picture(roof, points(results), title, measured=False,
                   notes=[f"{roof.name}: {roof.note}; the points are this run's counted FLOP/byte (its bytes as "
                          "counted here), placed on the roof: the best the roofline allows, not a timing"])


# -- the measurements -------------------------------------------------------------------------------

def parse_parts(text: str | None) -> list[str]:
    """--parts: some of PARTS, comma-separated (None: all)."""
    if text is None:
        return list(PARTS)
    names = list(dict.fromkeys(w.strip().lower() for w in text.split(",") if w.strip()))
    if not names or any(n not in PARTS for n in names):
        raise MiniLLMError(f"--parts {text!r}: give some of {', '.join(PARTS)}, comma-separated")
    return names


def format_kernels() -> list[str]:
    """The kernel sets the formats part runs: fused and int8 where they can run here, else numpy."""
    from ..models import kernel_sets
    sets = []
    for k in ("fused", "int8"):
        try:
            kernel_sets.spec(k).check()
            sets.append(k)
        except MiniLLMError:
            pass
    return sets or ["numpy"]


def collect(hw: Hardware, parts=PARTS, model: str = "random-124m", batches=BATCHES, contexts=CONTEXTS,
            repeats: int = 3, kernels: str | None = None, progress=None) -> dict:
    """Run each part's measurement and return its result as the measurement returned it:
    {"batch": run_batch_bench's, "contexts": run_bench's, "formats": run_quant_bench's, "mixture":
    run_batch_bench's, "latent": {"absorbed": ..., "decompressed": ...}}. `progress(part)` before each."""
    from ..checkpoints.load import load
    from .batching import run_batch_bench, run_batch_benches
    from .bench import run_bench
    from .quantization import run_quant_bench

    say = progress or (lambda part: None)
    results: dict = {}
    if "batch" in parts:
        say("batch")
        results["batch"] = run_batch_bench(load(model, kernels=kernels), list(batches), hw, repeats=repeats)
    if "contexts" in parts:
        say("contexts")
        results["contexts"] = run_bench(load(model, kernels=kernels), list(contexts), repeats=repeats,
                                        decode_steps=4)
    if "formats" in parts:
        say("formats")
        results["formats"] = run_quant_bench(model, list(FORMATS), context=contexts[0], prefill=contexts[0],
                                             repeats=repeats, bandwidth_gbs=hw.bandwidth_gbs,
                                             kernels=format_kernels())
    if "mixture" in parts:
        say("mixture")
        results["mixture"] = run_batch_bench(load(MIXTURE, kernels=kernels), [1, 8], hw, repeats=repeats)
    if "latent" in parts:
        say("latent")
        m = load(LATENT, kernels=kernels)
        models = {way: m.with_options(mla_decode=way) for way in ("absorbed", "decompressed")}
        results["latent"] = run_batch_benches(models, [1], hw, context=LATENT_CONTEXT, repeats=repeats)
    return results


def finite(p: Point) -> bool:
    """A point that can sit on a log-log picture: positive, finite counts and time."""
    values = [p.flops, p.bytes] + ([p.seconds] if p.seconds is not None else [])
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)
