"""Metrics in Prometheus's text format: counters, gauges and histograms, written by the engine loop
and read by `GET /metrics` (one lock between them)."""

from __future__ import annotations

import bisect
import threading

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    def __init__(self, buckets=LATENCY_BUCKETS) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.n += 1


class Registry:
    """name -> (help, type, {labels: value}); histograms by name. Names get the `minillm_` prefix."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, tuple[str, str, dict]] = {}
        self.histograms: dict[str, tuple[str, Histogram]] = {}

    def _slot(self, name, help_, kind):
        return self.values.setdefault(name, (help_, kind, {}))[2]

    def inc(self, name: str, help_: str, amount: float = 1.0, **labels) -> None:
        with self.lock:
            slot = self._slot(name, help_, "counter")
            key = tuple(sorted(labels.items()))
            slot[key] = slot.get(key, 0) + amount

    def set(self, name: str, help_: str, value: float, **labels) -> None:
        with self.lock:
            self._slot(name, help_, "gauge")[tuple(sorted(labels.items()))] = value

    def observe(self, name: str, help_: str, value: float) -> None:
        with self.lock:
            self.histograms.setdefault(name, (help_, Histogram()))[1].observe(value)

    def get(self, name: str, **labels) -> float:
        with self.lock:
            return self.values.get(name, ("", "", {}))[2].get(tuple(sorted(labels.items())), 0)

    def render(self) -> str:
        lines = []
        with self.lock:
            for name, (help_, kind, slot) in sorted(self.values.items()):
                lines += [f"# HELP minillm_{name} {help_}", f"# TYPE minillm_{name} {kind}"]
                for key, value in sorted(slot.items()):
                    lab = ",".join(f'{k}="{v}"' for k, v in key)
                    lines.append(f"minillm_{name}{{{lab}}} {value:.10g}" if lab else f"minillm_{name} {value:.10g}")
            for name, (help_, h) in sorted(self.histograms.items()):
                lines += [f"# HELP minillm_{name} {help_}", f"# TYPE minillm_{name} histogram"]
                total = 0
                for le, c in zip(h.buckets, h.counts):
                    total += c
                    lines.append(f'minillm_{name}_bucket{{le="{le:g}"}} {total}')
                lines.append(f'minillm_{name}_bucket{{le="+Inf"}} {h.n}')
                lines.append(f"minillm_{name}_sum {h.sum:.10g}")
                lines.append(f"minillm_{name}_count {h.n}")
        return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, float]:
    """The samples of a Prometheus text page, `name{labels}` -> value (for tests and loadgen)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
