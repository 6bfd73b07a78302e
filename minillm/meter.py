"""The counters: what every operation read, wrote and computed, one record per prefill or decode step.

How it works. `active()` is the meter the operations report to, or None. Each operation in `ops.py`
does its arithmetic, then `m = meter.active()` and, if that is not None, reports the bytes and FLOPs
of the arrays it actually touched (their shapes and dtypes at run time). With no meter active that
is the only cost: one context-variable lookup and one comparison per operation.

The active meter is a `contextvars.ContextVar`: each thread (and each asyncio task) has its own, so
a server's engine thread counts its steps into its meter while work on any other thread goes into
that thread's meter, or nowhere. A new thread starts with none.

The model of memory is the plain, unfused one: each operation streams its inputs from memory once
and writes its outputs once. Bytes are counted by kind:

    weights      parameters (an embedding lookup reads only the rows it gathers)
    kv_read      keys and values read from the KV cache
    kv_write     keys and values written into the KV cache
    activations  everything else: inputs and outputs of each operation

and FLOPs (a multiply-add is 2) by kind:

    matmul       the linear layers and the LM head
    attention    QK^T and the attention-weighted sum of V
    other        layer norms, GELU, softmax, residual adds, biases, scaling
    dequant      widening quantized weights to floats (models/quant.py; 0 for float weights)

Quantized weights also move bytes that never reach DRAM: each tile is widened into a float32
scratch buffer that stays in the CPU's cache, then multiplied there. That traffic is counted apart,
in `StepRecord.scratch`, not in `bytes`: `bytes` is what memory moves, the scratch is what the
cache moves so that memory moves less.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field

BYTE_KINDS = ("weights", "kv_read", "kv_write", "activations")
FLOP_KINDS = ("matmul", "attention", "other", "dequant")

_ACTIVE: ContextVar = ContextVar("minillm_meter", default=None)
active = _ACTIVE.get   # the meter operations report to in this thread, or None: no counting at all


@dataclass(frozen=True)
class Totals:
    """Step records of one kind added up: what a phase of a run counted and how long it took."""
    steps: int
    tokens: int
    bytes: int
    flops: int
    seconds: float
    weights: int          # the weight bytes among `bytes`

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else 0.0

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9 if self.seconds else 0.0


def totals(records, kind: str | None = None) -> Totals:
    """Add up step records (those of `kind` only, if given)."""
    rs = [r for r in records if r is not None and (kind is None or r.kind == kind)]
    return Totals(steps=len(rs), tokens=sum(r.n_tokens for r in rs), bytes=sum(r.total_bytes for r in rs),
                  flops=sum(r.total_flops for r in rs), seconds=sum(r.seconds for r in rs),
                  weights=sum(r.bytes["weights"] for r in rs))


@dataclass
class StepRecord:
    """One prefill or decode step: what it moved, what it computed, how long it took."""

    kind: str           # "prefill", "decode", "mixed" (a batch of both), "forward" (no cache), or
                        # "draft" / "verify" (speculative decoding's draft steps and checks)
    position: int       # index of the first token this step runs through the blocks
    n_tokens: int       # how many tokens it runs through the blocks
    bytes: dict = field(default_factory=lambda: dict.fromkeys(BYTE_KINDS, 0))
    flops: dict = field(default_factory=lambda: dict.fromkeys(FLOP_KINDS, 0))
    seconds: float = 0.0
    ops: dict = field(default_factory=dict)  # op name -> {"calls", "bytes", "flops"}: where it went
    attended: int = 0   # keys attended by the last token after this step (the largest, in a batch)
    seqs: list = field(default_factory=list)  # [(position, n_tokens)] per sequence in the step
    scratch: int = 0    # bytes widened quantized weights moved through the in-cache scratch (not DRAM)
    launches: int | None = None   # GPU kernels the step launched (counted from a CUDA graph capture), None: not counted

    @property
    def n_seqs(self) -> int:
        """How many sequences the step ran (1 for prefill, decode_step and forward)."""
        return len(self.seqs) or 1

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    @property
    def total_flops(self) -> int:
        return sum(self.flops.values())

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte moved."""
        return self.total_flops / self.total_bytes if self.total_bytes else 0.0

    @property
    def gbps(self) -> float:
        """Achieved bandwidth: bytes moved / wall time, in GB/s (10^9 bytes)."""
        return self.total_bytes / self.seconds / 1e9 if self.seconds else 0.0

    @property
    def gflops(self) -> float:
        return self.total_flops / self.seconds / 1e9 if self.seconds else 0.0

    def as_dict(self) -> dict:
        gpu = {} if self.launches is None else {"launches": self.launches}
        return {
            "kind": self.kind,
            "position": self.position,
            "n_tokens": self.n_tokens,
            "attended": self.attended,
            "n_seqs": self.n_seqs,
            "seqs": [list(s) for s in self.seqs],
            "bytes": dict(self.bytes),
            "scratch": self.scratch,
            "flops": dict(self.flops),
            "seconds": self.seconds,
            "total_bytes": self.total_bytes,
            "total_flops": self.total_flops,
            "intensity": self.intensity,
            "gbps": self.gbps,
            "gflops": self.gflops,
            **gpu,
        }


NO_STEP = nullcontext()   # the step context when no meter is active


def step(kind: str, position: int, n_tokens: int, attended: int, seqs=None, clock=None):
    """The step context of the active meter, or a do-nothing context when no meter is active."""
    m = _ACTIVE.get()
    return NO_STEP if m is None else m.step(kind, position, n_tokens, attended, seqs, clock)


@contextmanager
def label(kind: str, *, unless_labelled: bool = False):
    """Record the steps run inside as `kind` instead of the kind their shape gives ("prefill",
    "decode", "mixed"): speculative decoding's "draft" and "verify", the naive loop's "prefill" and
    "decode" (each of its steps is a cache-less forward), a plain forward's "forward".
    unless_labelled: keep a label set further out (the naive loop's, around a forward)."""
    m = _ACTIVE.get()
    if m is None or (unless_labelled and m.label is not None):
        yield
        return
    before, m.label = m.label, kind
    try:
        yield
    finally:
        m.label = before


class Meter:
    """A context manager: while it is active, every operation on this thread reports to it. Use one
    Meter per thread (its open step and label are its own, not the thread's).

    >>> with Meter() as m:
    ...     ids = generate(model, prompt, 10)
    >>> m.steps[0].kind, m.steps[0].intensity
    """

    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self._open: StepRecord | None = None
        self._t0 = 0.0
        self._clock = time.perf_counter
        self._tokens: list = []   # one per `with`, to restore what was active before it
        self.label: str | None = None   # set by `meter.label(...)`: the kind of the steps opened now
        self.keep: int | None = None    # keep only the last `keep` records (a server runs for days)
        self._captures: list[list] = []

    def __enter__(self) -> "Meter":
        self._tokens.append(_ACTIVE.set(self))
        return self

    def __exit__(self, *exc) -> None:
        _ACTIVE.reset(self._tokens.pop())
        self._open = None

    # -- steps: opened and closed by the model's entry points (forward, prefill, decode_step) --

    @contextmanager
    def step(self, kind: str, position: int, n_tokens: int, attended: int, seqs=None, clock=None):
        """One record around a prefill, decode step or forward, given as the `with` target (None inside
        a step already open: a forward called by the naive loop adds nothing). A step that raises is
        dropped, not recorded. clock: what to read the time with (default time.perf_counter; on a GPU
        `backend.clock(xp)`, which waits for the device's queued work first)."""
        opened = self.begin(kind, position, n_tokens, clock)
        if opened and seqs:
            self._open.seqs = list(seqs)
        try:
            yield self._open if opened else None
        except BaseException:
            if opened:
                self._open = None
            raise
        if opened:
            self.end(attended)

    def begin(self, kind: str, position: int, n_tokens: int, clock=None) -> bool:
        """Open a step record. Returns False (and opens nothing) if a step is already open."""
        if self._open is not None:
            return False
        self._open = StepRecord(self.label or kind, position, n_tokens)
        self._clock = clock or time.perf_counter
        self._t0 = self._clock()
        return True

    def end(self, attended: int = 0) -> StepRecord:
        record = self._open
        record.seconds = self._clock() - self._t0
        record.attended = attended
        self._open = None
        self.steps.append(record)
        if self.keep is not None and len(self.steps) > self.keep:
            del self.steps[:len(self.steps) - self.keep]
        for recs in self._captures:
            recs.append(record)
        return record

    # -- reports from the operations --

    def count(self, op: str, *, weights=0, kv_read=0, kv_write=0, activations=0,
              matmul=0, attention=0, other=0, dequant=0, scratch=0) -> None:
        record = self._open
        if record is None:  # an operation called on its own, outside any step: still recorded
            self.begin("op", 0, 0)
            self.count(op, weights=weights, kv_read=kv_read, kv_write=kv_write,
                       activations=activations, matmul=matmul, attention=attention, other=other,
                       dequant=dequant, scratch=scratch)
            self.end()
            return
        b, f = record.bytes, record.flops
        b["weights"] += weights
        b["kv_read"] += kv_read
        b["kv_write"] += kv_write
        b["activations"] += activations
        f["matmul"] += matmul
        f["attention"] += attention
        f["other"] += other
        f["dequant"] += dequant
        record.scratch += scratch
        per_op = record.ops.setdefault(op, {"calls": 0, "bytes": 0, "flops": 0})
        per_op["calls"] += 1
        per_op["bytes"] += weights + kv_read + kv_write + activations
        per_op["flops"] += matmul + attention + other + dequant
        if scratch:
            per_op["scratch"] = per_op.get("scratch", 0) + scratch

    # -- summaries --

    def of_kind(self, kind: str) -> list[StepRecord]:
        return [s for s in self.steps if s.kind == kind]

    def totals(self, kind: str | None = None) -> Totals:
        """The steps of one kind ("prefill", "decode", ...; None: all) added up."""
        return totals(self.steps, kind)

    @contextmanager
    def capture(self):
        """The records of the steps that end inside the block, as a list filled as they end:
        `with m.capture() as recs: ...` (speculative rounds take their steps this way)."""
        recs: list[StepRecord] = []
        self._captures.append(recs)
        try:
            yield recs
        finally:
            self._captures = [c for c in self._captures if c is not recs]   # by identity: lists compare by value

    def total(self, attr: str) -> float:
        return sum(getattr(s, attr) for s in self.steps)
