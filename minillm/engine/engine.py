"""The engine loop: requests in, one scheduled batched step at a time, tokens out.

    engine = Engine(model, kv_memory=256 * 2**20, prefix_cache=True)
    r = engine.add_request(prompt_ids, 32, SamplingParams())
    while engine.has_work:
        info = engine.step()
        for req, token in (info.made if info else []):
            print(req.id, token)

One thread runs the loop. Each `step` asks the scheduler for a batch (the block manager has
reserved its KV blocks), runs it as one batched model step (`runner.run_step`: every weight read
once for all its sequences), and returns its `StepInfo`: what ran, what the pool held, and the
(request, token) pairs it made (`info.made`), with the times a serving benchmark reports stamped on
each request. A step that raises fails the requests that were in it (`StepFailed`: their blocks
freed, finish reason "error"); the others go on.

A request whose prompt ran on another engine (disaggregation's prefill engine) joins with `adopt`:
its keys and values written into this engine's blocks, it decodes from there.

Time. By default it is simulated: a clock that starts at 0 and advances by each step's measured
duration, and jumps ahead to the next arrival when nothing can run. Every step really runs, so
the numbers are this machine's, but a run does not depend on what else the computer did between
steps, and policies compare on the same arrivals. Give `clock=time.monotonic` for wall time (a
server). Give `step_time=` (a function of the step's StepInfo, its meter record in `info.record`)
to advance the simulated clock by a price instead of the measured duration: the serving lessons
and `serve-sim --clock roofline` price each step by the roofline (`serving.metrics.RooflineClock`:
its counted bytes and FLOPs at this machine's measured bandwidth and peak), so a run's schedule,
and every verdict drawn from it, is the same however busy the machine is.

Batch invariance. A model loaded with kernels="batch-invariant" (models/kernel_sets.py) runs every
step in a fixed order per row: each request's tokens, greedy or seeded, are bit-identical to the
same request alone, whatever else shares its steps, with or without a prefix-cache hit or chunked
prefill. It costs throughput (`minillm bench --batch --kernels fused,batch-invariant` measures how
much) and needs numba.

What it keeps. Every request until `forget(id)` (a server forgets each one it has answered), and
the records of its last `keep_steps` steps (None: all; a simulation reads them all at the end).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import MiniLLMError
from ..meter import Meter
from .block_manager import BlockManager, ContiguousBlocks
from .runner import run_step
from .sampling import check_fits
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence

DEFAULT_KV_MEMORY = 256 * 2**20


class StepFailed(MiniLLMError):
    """A step raised: the requests that were in it have ended with finish reason "error"."""

    def __init__(self, requests: list, cause: BaseException) -> None:
        super().__init__(f"a model step failed ({cause.__class__.__name__}: {cause}); "
                         f"{len(requests)} request(s) in it ended")
        self.requests, self.cause = requests, cause


@dataclass
class Request:
    """One request and its times (seconds on the engine's clock). The one record of a request, from
    a server's HTTP handler to the engine (where a server sends its tokens is the server's own table)."""
    id: object
    seq: Sequence
    arrival: float
    token_times: list = field(default_factory=list)
    finished_at: float | None = None
    finish_reason: str | None = None   # "stop" (a stop token), "length", "abort" or "error"

    @property
    def output(self) -> list[int]:
        return self.seq.output

    @property
    def n_tokens(self) -> int:
        return len(self.seq.output)

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    @property
    def aborted(self) -> bool:
        return self.finish_reason in ("abort", "error")

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def tbt(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass
class StepInfo:
    """What one engine step ran and what it held: the metrics and the live view read these.

    Two durations: `seconds`, the whole step on the engine's clock (scheduling, the model step,
    sampling and the bookkeeping after it), and `model_seconds`, the model step alone (the meter's
    record's time when the engine meters, else timed around the step)."""
    start: float
    seqs: list            # [(request id, position, n tokens)]
    prefill_tokens: int
    decode_tokens: int
    prefill_scored: int   # prompts that reached their end this step (the LM head ran for their first token)
    sequences: list = field(default_factory=list, repr=False)   # the Sequence objects that ran
    # -- after the step ran
    seconds: float = 0.0
    model_seconds: float = 0.0
    lengths: list = field(default_factory=list)   # every running sequence's cached length after the step ran
    kv_used: int = 0      # positions stored in the pool's held blocks (a shared block once)
    kv_reserved: int = 0  # positions of the blocks held
    waiting: int = 0
    running: int = 0
    free_blocks: int = 0
    record: object = None  # the meter's StepRecord
    made: list = field(default_factory=list, repr=False)        # [(Request, token)] sampled this step

    @property
    def n_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    @classmethod
    def of(cls, start: float, batch: list, ids: list) -> StepInfo:
        """A step's record as it is scheduled, before it runs: `batch` [(sequence, n tokens)], `ids`
        each one's request id. A decode token is a sequence's one sampled token; the rest are prompt
        positions (a preempted sequence's tokens made so far included)."""
        decode = sum(n for s, n in batch if s.output and s.n_pending == 1)
        firsts = sum(1 for s, n in batch if not (s.output and s.n_pending == 1) and n == s.n_pending)
        return cls(start, [(rid, s.n_computed, n) for rid, (s, n) in zip(ids, batch)],
                   sum(n for _, n in batch) - decode, decode, firsts, [s for s, _ in batch])


class Engine:
    def __init__(self, model, *, kv_memory: int | None = None, num_blocks: int | None = None,
                 block_size: int = 16, cache: str = "paged", prefix_cache: bool = False,
                 policy: str = "continuous", max_seqs: int = 16, max_batched_tokens: int = 256, clock=None,
                 meter: bool = True, keep_steps: int | None = None, on_step=None, step_time=None) -> None:
        self.model = model
        if step_time is not None and (clock is not None or not meter):
            raise MiniLLMError("step_time prices a step from its meter record on simulated time: it needs "
                               "meter=True and no clock")
        self.step_time = step_time
        if cache == "contiguous":
            if prefix_cache:
                raise MiniLLMError("prefix_cache needs cache='paged': contiguous caches share no blocks")
            self.pool = None
            self.blocks = ContiguousBlocks(model.config, model.dtype, model.xp, model.new_cache)
        elif cache == "paged":
            Pool = model.POOL                               # a hybrid's pool also pays for its states
            if num_blocks is not None:
                self.pool = Pool(model.config, num_blocks, block_size, model.dtype, model.xp)
            else:
                if kv_memory is not None and kv_memory <= 0:
                    raise MiniLLMError(f"kv_memory={kv_memory}: give the KV cache's size in bytes, more than 0")
                self.pool = Pool.from_memory(model.config, kv_memory or DEFAULT_KV_MEMORY,
                                                    block_size, model.dtype, model.xp)
            self.blocks = BlockManager(self.pool, prefix_cache)
        else:
            raise MiniLLMError(f"cache={cache!r}: 'paged' or 'contiguous'")
        self.scheduler = Scheduler(self.blocks, policy, max_seqs, max_batched_tokens)
        self.requests: dict = {}
        self._by_seq: dict[int, Request] = {}
        self._ids = itertools.count()
        self.clock = clock
        self._t0 = clock() if clock is not None else 0.0
        self.time = 0.0
        self.meter = Meter() if meter else None
        if self.meter is not None:
            self.meter.keep = keep_steps
        self.steps: deque[StepInfo] = deque(maxlen=keep_steps)
        self.n_steps = 0
        self.on_step = on_step

    # -- the clock -----------------------------------------------------------------------------

    def now(self) -> float:
        return self.clock() - self._t0 if self.clock is not None else self.time

    # -- requests ------------------------------------------------------------------------------

    def new_request(self, prompt, max_new_tokens: int, sampling: SamplingParams = SamplingParams(), *,
                    arrival: float | None = None, request_id=None, stop_ids=()) -> Request:
        """A checked request, not queued yet (`add` queues it). Safe from any thread: it reads only
        the model's config."""
        ids = self.model.check_ids(prompt)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
                or max_new_tokens < 0:
            raise MiniLLMError(f"max_new_tokens={max_new_tokens!r}: must be a whole number, 0 or more")
        check_fits(ids.size, int(max_new_tokens), self.model.config.n_ctx)
        rid = next(self._ids) if request_id is None else request_id
        seq = Sequence(ids, int(max_new_tokens), sampling, stop_ids=stop_ids,
                       arrival=self.now() if arrival is None else arrival)
        self.scheduler.check(seq)
        return Request(rid, seq, seq.arrival)

    def add(self, req: Request) -> Request:
        """Queue a request (it waits until the clock reaches its arrival). One that asks for no new
        token is done at once."""
        if req.id in self.requests:
            raise MiniLLMError(f"request id {req.id!r} is already in use")
        self.requests[req.id] = req
        if req.seq.max_new_tokens == 0:
            req.finished_at, req.finish_reason = req.arrival, "length"
            return req
        self.scheduler.add(req.seq)
        self._by_seq[req.seq.id] = req
        return req

    def add_request(self, prompt, max_new_tokens: int, sampling: SamplingParams = SamplingParams(), *,
                    arrival: float | None = None, request_id=None, stop_ids=()) -> Request:
        """Queue a request (it waits until the clock reaches `arrival`; default: now)."""
        return self.add(self.new_request(prompt, max_new_tokens, sampling, arrival=arrival,
                                         request_id=request_id, stop_ids=stop_ids))

    def adopt(self, req: Request, k: np.ndarray, v: np.ndarray, *, output: list[int], rng) -> bool:
        """Take a request whose prompt ran on another engine (disaggregation's prefill engine): `req`
        from `new_request`; k, v [L, Hkv, T, hd] the keys and values of its T prompt positions; `output`
        the tokens it made there (the last one not yet run through the model); `rng` its random
        stream where it stands after them. The block manager admits it and writes its KV, the
        scheduler puts it among the running: it decodes from there, its tokens those it would have
        made here. False, and nothing taken, when there is no free slot or not enough free blocks
        now (try again after a step)."""
        if req.id in self.requests:
            raise MiniLLMError(f"request id {req.id!r} is already in use")
        seq = req.seq
        seq.output, seq.rng = [int(t) for t in output], rng
        if not self.scheduler.adopt(seq, k, v):
            return False
        self.requests[req.id] = req
        self._by_seq[seq.id] = req
        return True

    def abort(self, request_id, reason: str = "abort") -> None:
        """Stop a request now; its blocks go back to the pool at once."""
        req = self.requests.get(request_id)
        if req is None or req.done:
            return
        self.scheduler.abort(req.seq)
        self._finish(req, reason)

    def forget(self, request_id) -> None:
        """Drop a finished request's record (a server keeps only what is live)."""
        req = self.requests.get(request_id)
        if req is not None and req.done:
            del self.requests[request_id]
            self._by_seq.pop(req.seq.id, None)

    def request_of(self, seq: Sequence) -> Request:
        return self._by_seq[seq.id]

    def _finish(self, req: Request, reason: str) -> None:
        req.finished_at, req.finish_reason = self.now(), reason

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def next_arrival(self) -> float | None:
        w = self.scheduler.waiting
        return min((s.arrival for s in w), default=None)

    def kv_usage(self) -> tuple[int, int]:
        """(positions stored, positions reserved) in the blocks running sequences hold."""
        return self.blocks.usage(self.scheduler.running)

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> StepInfo | None:
        """Run one scheduled step. Returns its StepInfo (`info.made`: the (request, token) pairs it
        made); None if nothing ran (the simulated clock then jumps to the next arrival). Raises
        StepFailed if the model step raised: the requests in it have ended, the rest go on; and a
        MiniLLMError if, on simulated time, nothing can run and no request is on its way (a bug)."""
        start, t0 = self.now(), time.perf_counter()
        batch = self.scheduler.schedule(start)
        if not batch:
            self._idle()
            return None
        seqs = [s for s, _ in batch]
        info = StepInfo.of(start, batch, [self._by_seq[s.id].id for s in seqs])
        tokens = self._run(info, seqs, [n for _, n in batch])
        info.kv_used, info.kv_reserved = self.kv_usage()   # at the step's peak: before the finished let go
        info.lengths = [s.n_computed for s in self.scheduler.running]
        self.scheduler.finish_step(batch)
        if self.clock is None:
            self.time += self.step_time(info) if self.step_time is not None else time.perf_counter() - t0
        end = self.now()
        info.made = self._stamp(seqs, tokens, end)
        info.seconds, info.free_blocks = end - start, self.blocks.n_free
        info.waiting, info.running = len(self.scheduler.waiting), len(self.scheduler.running)
        self.steps.append(info)
        self.n_steps += 1
        if self.on_step is not None:
            self.on_step(self, info)
        return info

    def _idle(self) -> None:
        """Nothing could run: on simulated time, jump to the next arrival (none: a scheduler stuck)."""
        if self.clock is not None:
            return
        nxt = self.next_arrival()
        if nxt is not None and nxt > self.time:
            self.time = nxt
        elif self.has_work:
            raise MiniLLMError("the scheduler can run nothing and no request is on its way (a bug)")

    def _run(self, info: StepInfo, seqs: list[Sequence], chunks: list[int]) -> list[int | None]:
        """The model step (metered when the engine meters: its record goes in `info`); a step that
        raises ends the requests in it (StepFailed)."""
        try:
            t = time.perf_counter()
            if self.meter is None:
                tokens = run_step(self.model, seqs, chunks)
            else:
                with self.meter, self.meter.capture() as recs:
                    tokens = run_step(self.model, seqs, chunks)
                info.record = recs[-1] if recs else None
            info.model_seconds = info.record.seconds if info.record is not None else time.perf_counter() - t
            return tokens
        except Exception as e:
            failed = [self._by_seq[s.id] for s in seqs]
            for req in failed:
                self.abort(req.id, "error")
            raise StepFailed(failed, e) from e

    def _stamp(self, seqs: list[Sequence], tokens: list, end: float) -> list[tuple[Request, int]]:
        """The (request, token) pairs the step made, each token's time stamped; a finished request closed."""
        made = []
        for s, tok in zip(seqs, tokens):
            if tok is None:
                continue
            req = self._by_seq[s.id]
            req.token_times.append(end)
            made.append((req, tok))
            if s.finished:
                req.finished_at, req.finish_reason = end, "stop" if s.stopped else "length"
        return made

    def run(self) -> list[Request]:
        """Step until every request is done (simulated time: idle gaps jump to the next arrival; a
        scheduler that can run nothing with no request on its way raises, see `step`)."""
        while self.has_work:
            if self.step() is None and self.clock is not None:
                time.sleep(0.001)
        return list(self.requests.values())
