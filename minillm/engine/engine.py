"""The engine loop: requests in, one scheduled batched step at a time, tokens out.

    engine = Engine(model, kv_memory=256 * 2**20, prefix_cache=True)
    r = engine.add_request(prompt_ids, 32, SamplingParams())
    while engine.has_work:
        for req, token in engine.step():
            print(req.id, token)

One thread runs the loop. Each `step` asks the scheduler for a batch (the block manager has
reserved its KV blocks), runs it as one batched model step (`runner.run_step`: every weight read
once for all its sequences), and returns the (request, token) pairs it made, with the times a
serving benchmark reports stamped on each request. A step that raises fails the requests that were
in it (`StepFailed`: their blocks freed, finish reason "error"); the others go on.

Time. By default it is simulated: a clock that starts at 0 and advances by each step's measured
duration, and jumps ahead to the next arrival when nothing can run. Every step really runs, so
the numbers are this machine's, but a run does not depend on what else the computer did between
steps, and policies compare on the same arrivals. Give `clock=time.monotonic` for wall time (a
server).

What it keeps. Every request until `forget(id)` (a server forgets each one it has answered), and
the records of its last `keep_steps` steps (None: all; a simulation reads them all at the end).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..cache.paged import PagedKVPool
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
    a server's HTTP handler to the engine: `events` is where a server streams its tokens."""
    id: object
    seq: Sequence
    arrival: float
    token_times: list = field(default_factory=list)
    finished_at: float | None = None
    finish_reason: str | None = None   # "stop" (a stop token), "length", "abort" or "error"
    events: object = None              # a server's queue of ("token", id) / ("done", reason)
    api: object = None                 # a server's parsed API request (stop strings, stream, ...)

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
    """What one engine step ran and what it held: the metrics and the live view read these."""
    start: float
    seconds: float
    seqs: list            # [(request id, position, n tokens)]
    prefill_tokens: int
    decode_tokens: int
    prefill_scored: int   # prompts that reached their end this step (the LM head ran for their first token)
    lengths: list         # every running sequence's cached length after the step ran
    kv_used: int          # positions stored in the pool's held blocks (a shared block once)
    kv_reserved: int      # positions of the blocks held
    waiting: int
    running: int
    free_blocks: int
    record: object = None  # the meter's StepRecord
    sequences: list = field(default_factory=list, repr=False)   # the Sequence objects that ran

    @property
    def n_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens


class Engine:
    def __init__(self, model, *, kv_memory: int | None = None, num_blocks: int | None = None,
                 block_size: int = 16, cache: str = "paged", prefix_cache: bool = False,
                 policy: str = "continuous", max_seqs: int = 16, max_batched_tokens: int = 256, clock=None,
                 meter: bool = True, keep_steps: int | None = None, on_step=None) -> None:
        self.model = model
        if cache == "contiguous":
            if prefix_cache:
                raise MiniLLMError("prefix_cache needs cache='paged': contiguous caches share no blocks")
            self.pool = None
            self.blocks = ContiguousBlocks(model.config, model.dtype)
        elif cache == "paged":
            if num_blocks is not None:
                self.pool = PagedKVPool(model.config, num_blocks, block_size, model.dtype)
            else:
                if kv_memory is not None and kv_memory <= 0:
                    raise MiniLLMError(f"kv_memory={kv_memory}: give the KV cache's size in bytes, more than 0")
                self.pool = PagedKVPool.from_memory(model.config, kv_memory or DEFAULT_KV_MEMORY,
                                                    block_size, model.dtype)
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

    def step(self) -> list[tuple[Request, int]]:
        """Run one scheduled step. Returns the (request, token) pairs it made; [] if nothing ran
        (the simulated clock then jumps to the next arrival). Raises StepFailed if the model step
        raised: the requests in it have ended, the rest go on."""
        start = self.now()
        t0 = time.perf_counter()
        batch = self.scheduler.schedule(start)
        if not batch:
            nxt = self.next_arrival()
            if self.clock is None and nxt is not None and nxt > self.time:
                self.time = nxt
            return []
        seqs, chunks = [s for s, _ in batch], [n for _, n in batch]
        spans = [(self._by_seq[s.id].id, s.n_computed, n) for s, n in batch]
        decode = sum(n for s, n in batch if s.output and s.n_pending == 1)
        firsts = sum(1 for s, n in batch if not (s.output and s.n_pending == 1) and n == s.n_pending)
        try:
            if self.meter is not None:
                with self.meter, self.meter.capture() as recs:
                    tokens = run_step(self.model, seqs, chunks)
                record = recs[-1] if recs else None
            else:
                tokens, record = run_step(self.model, seqs, chunks), None
        except Exception as e:
            failed = [self._by_seq[s.id] for s in seqs]
            for req in failed:
                self.abort(req.id, "error")
            raise StepFailed(failed, e) from e
        used, reserved = self.kv_usage()          # at the step's peak: before the finished let go
        lengths = [s.n_computed for s in self.scheduler.running]
        self.scheduler.finish_step(batch)
        seconds = time.perf_counter() - t0
        if self.clock is None:
            self.time += seconds
        end = self.now()
        made = []
        for s, tok in zip(seqs, tokens):
            if tok is None:
                continue
            req = self._by_seq[s.id]
            req.token_times.append(end)
            made.append((req, tok))
            if s.finished:
                req.finished_at, req.finish_reason = end, "stop" if s.stopped else "length"
        info = StepInfo(start, end - start, spans, sum(chunks) - decode, decode, firsts, lengths, used, reserved,
                        len(self.scheduler.waiting), len(self.scheduler.running), self.blocks.n_free, record,
                        seqs)
        self.steps.append(info)
        self.n_steps += 1
        if self.on_step is not None:
            self.on_step(self, info)
        return made

    def run(self) -> list[Request]:
        """Step until every request is done (simulated time: idle gaps jump to the next arrival)."""
        while self.has_work:
            n, t = self.n_steps, self.time
            self.step()
            if self.n_steps == n and self.time == t:
                if self.clock is None:
                    raise MiniLLMError("the scheduler can run nothing and no request is on its way (a bug)")
                time.sleep(0.001)
        return list(self.requests.values())
