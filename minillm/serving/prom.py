"""Metrics in Prometheus's text format: counters, gauges and histograms, written by the engine loop
and the HTTP layer, read by `GET /metrics` (one lock between them).

Every series a Prometheus server should keep is declared in SERIES and shown from the start at 0
(a counter that appears only at its first event makes `rate()` miss that event). Counters are
exact: integers print as integers and floats with `repr`, never rounded to 10 digits.

Latency histograms have buckets around the targets a service states (issue: goodput): time to first
token near 0.1-2 s, time per output token near 20-200 ms, so `histogram_quantile` and the share of
requests under a target can be read from them."""

from __future__ import annotations

import bisect
import threading

from ..meter import BYTE_KINDS, FLOP_KINDS

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
REJECT_CODES = (400, 401, 403, 404, 405, 408, 413, 414, 415, 429, 431, 500, 501, 503)

# name -> (type, help, label sets shown at 0 from the start, buckets for a histogram). The help shown
# by /metrics is written here only: the code that counts names the series and gives its value.
SERIES: dict[str, tuple] = {
    "requests_total": ("counter", "requests admitted to the queue", [{}]),
    "requests_cancelled_total": ("counter", "requests cancelled before they ended (client gone, stop string, "
                                 "queue deadline, shutdown)", [{}]),
    "client_disconnects_total": ("counter", "requests whose client left before the reply was complete", [{}]),
    "requests_rejected_total": ("counter", "requests refused with an HTTP error status, by status code",
                                [{"code": str(c)} for c in REJECT_CODES]),
    "engine_errors_total": ("counter", "steps that raised", [{}]),
    "generated_tokens_total": ("counter", "tokens generated for clients", [{}]),
    "preemptions_total": ("counter", "sequences preempted (their KV blocks freed, recomputed later)", [{}]),
    "steps_total": ("counter", "model steps, by phase", [{"phase": "prefill"}, {"phase": "decode"}]),
    "step_seconds_total": ("counter", "seconds spent in model steps, by phase (a step with any prompt tokens "
                           "counts as prefill)", [{"phase": "prefill"}, {"phase": "decode"}]),
    "tokens_processed_total": ("counter", "tokens run through the model, by phase",
                               [{"phase": "prefill"}, {"phase": "decode"}]),
    "bytes_total": ("counter", "bytes moved by the model's steps, by kind", [{"kind": k} for k in BYTE_KINDS]),
    "flops_total": ("counter", "FLOPs done by the model's steps, by kind", [{"kind": k} for k in FLOP_KINDS]),
    "requests_running": ("gauge", "requests in the running batch", [{}]),
    "requests_waiting": ("gauge", "requests waiting for admission", [{}]),
    "kv_blocks_used": ("gauge", "KV-cache blocks held by requests", [{}]),
    "kv_blocks_free": ("gauge", "KV-cache blocks free (cached prefixes nobody holds included)", [{}]),
    "achieved_gbps": ("gauge", "GB/s moved by the last step", [{}]),
    "step_intensity": ("gauge", "FLOPs per byte of the last step", [{}]),
    "blas_threads": ("gauge", "BLAS threads the engine's steps run on (set at start; 0: unknown)", [{}]),
    "queue_expected_wait_seconds": ("gauge", "the queue's expected wait for a request arriving now", [{}]),
    "renders_waiting": ("gauge", "chats waiting for a slot to render their chat template", [{}]),
    "renders_running": ("gauge", "chat templates rendering now (each in a worker process)", [{}]),
    "renders_shed_total": ("counter", "chat renders dropped unrun or stopped, by reason (the client had gone, "
                           "or the server was shutting down)", [{"reason": "client_gone"}, {"reason": "shutdown"}]),
    "time_to_first_token_seconds": ("histogram", "arrival to first token", TTFT_BUCKETS),
    "time_per_output_token_seconds": ("histogram", "per request: (last token - first token) / (tokens - 1)",
                                      TPOT_BUCKETS),
    "time_between_tokens_seconds": ("histogram", "time between a request's tokens", LATENCY_BUCKETS),
    "queue_wait_seconds": ("histogram", "arrival to the start of the step that made the request's first token "
                           "(a prompt prefilled in chunks: its earlier chunks' steps included)", WAIT_BUCKETS),
}

# Series only some servers have (a prefix cache's hit rate), shown once set: name -> (type, help).
SOMETIMES: dict[str, tuple] = {
    "prefix_cache_hit_rate": ("gauge", "prompt positions found in the prefix cache"),
}


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


def number(value) -> str:
    """A sample's value, exact: integers (and integral floats below 2**53) as integers, floats by repr."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(value)


def key_of(labels: dict) -> tuple:
    """A sample's labels as a sorted tuple of (name, value as text): its key in a series."""
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def label_value(v) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Registry:
    """name -> (help, type, {labels: value}); histograms by name. Names get the `minillm_` prefix.
    A series' type and help come from SERIES or SOMETIMES (a name declared in neither is a
    counter or gauge without help)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, tuple[str, str, dict]] = {}
        self.histograms: dict[str, tuple[str, Histogram]] = {}
        for name, (kind, help_, extra) in SERIES.items():
            if kind == "histogram":
                self.histograms[name] = (help_, Histogram(extra))
            else:
                slot = self._slot(name, kind)
                for labels in extra:
                    slot[key_of(labels)] = 0

    def _slot(self, name: str, kind: str) -> dict:
        kind, help_ = (SERIES.get(name) or SOMETIMES.get(name) or (kind, ""))[:2]
        return self.values.setdefault(name, (help_, kind, {}))[2]

    def inc(self, name: str, amount: float = 1, **labels) -> None:
        with self.lock:
            slot = self._slot(name, "counter")
            key = key_of(labels)
            slot[key] = slot.get(key, 0) + amount

    def set(self, name: str, value: float, **labels) -> None:
        with self.lock:           # a cumulative count set whole stays a counter (SERIES says which)
            self._slot(name, "gauge")[key_of(labels)] = value

    def observe(self, name: str, value: float) -> None:
        with self.lock:
            if name not in self.histograms:
                self.histograms[name] = ("", Histogram())
            self.histograms[name][1].observe(value)

    def get(self, name: str, **labels) -> float:
        with self.lock:
            return self.values.get(name, ("", "", {}))[2].get(key_of(labels), 0)

    def render(self) -> str:
        lines = []
        with self.lock:
            for name, (help_, kind, slot) in sorted(self.values.items()):
                lines += [f"# HELP minillm_{name} {help_}", f"# TYPE minillm_{name} {kind}"]
                for key, value in sorted(slot.items()):
                    lab = ",".join(f'{k}="{label_value(v)}"' for k, v in key)
                    lines.append(f"minillm_{name}{{{lab}}} {number(value)}" if lab else
                                 f"minillm_{name} {number(value)}")
            for name, (help_, h) in sorted(self.histograms.items()):
                lines += [f"# HELP minillm_{name} {help_}", f"# TYPE minillm_{name} histogram"]
                total = 0
                for le, c in zip(h.buckets, h.counts):
                    total += c
                    lines.append(f'minillm_{name}_bucket{{le="{le!r}"}} {total}')
                lines.append(f'minillm_{name}_bucket{{le="+Inf"}} {h.n}')
                lines.append(f"minillm_{name}_sum {number(h.sum)}")
                lines.append(f"minillm_{name}_count {h.n}")
        return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, float]:
    """The samples of a Prometheus text page, `name{labels}` -> value (for tests, loadgen and monitor).
    Lines it cannot read (a timestamp after the value is dropped) are skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "}" in line:
            key, _, rest = line.rpartition("}")
            key += "}"
        else:
            key, _, rest = line.partition(" ")
        parts = rest.split()
        if not parts:
            continue
        try:
            out[key.strip()] = float(parts[0])
        except ValueError:
            continue
    return out
