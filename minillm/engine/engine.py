"""The engine loop: requests in, one scheduled batched step at a time, tokens out.

    engine = Engine(model, kv_memory=256 * 2**20, prefix_cache=True)
    r = engine.add_request(prompt_ids, 32, SamplingParams(), on_token=print)
    while engine.has_work:
        engine.step()

One thread runs the loop; everything else only enqueues (`add_request`) or cancels (`abort`, which
gives the request's blocks back at once). Each `step` asks the scheduler for a batch, runs it as one
`model.step` (every weight read once for all its sequences), calls each request's `on_token` with
the token it made, and stamps the times a serving benchmark reports.

Time. By default it is simulated: a clock that starts at 0 and advances by each step's measured
duration, and jumps ahead to the next arrival when nothing can run. Every step really runs, so
the numbers are this machine's, but a run does not depend on what else the computer did between
steps, and policies compare on the same arrivals. Give `clock=time.monotonic` for wall time (a
server).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from ..cache.paged import PagedKVPool
from .sampling import check_fits
from ..errors import MiniLLMError
from ..meter import Meter
from .batch import run_step
from .block_manager import BlockManager
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence


@dataclass
class Request:
    """One request and its times (seconds on the engine's clock)."""
    id: object
    seq: Sequence
    arrival: float
    on_token: object = None
    token_times: list = field(default_factory=list)
    finished_at: float | None = None
    aborted: bool = False

    @property
    def output(self) -> list[int]:
        return self.seq.output

    @property
    def done(self) -> bool:
        return self.finished_at is not None

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

    @property
    def n_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens


class Engine:
    def __init__(self, model, *, kv_memory: int | None = None, num_blocks: int | None = None,
                 block_size: int = 16, prefix_cache: bool = False, policy: str = "continuous",
                 max_seqs: int = 16, max_tokens: int = 256, clock=None, meter: bool = True,
                 on_step=None) -> None:
        self.model = model
        if num_blocks is not None:
            pool = PagedKVPool(model.config, num_blocks, block_size, model.dtype)
        else:
            pool = PagedKVPool.from_memory(model.config, kv_memory or 256 * 2**20, block_size, model.dtype)
        self.pool = pool
        self.blocks = BlockManager(pool, prefix_cache)
        self.scheduler = Scheduler(self.blocks, policy, max_seqs, max_tokens)
        self.requests: dict = {}
        self._by_seq: dict[int, Request] = {}
        self._ids = itertools.count()
        self.clock = clock
        self._t0 = clock() if clock is not None else 0.0
        self.time = 0.0
        self.meter = Meter() if meter else None
        self.steps: list[StepInfo] = []
        self.on_step = on_step

    # -- the clock -----------------------------------------------------------------------------

    def now(self) -> float:
        return self.clock() - self._t0 if self.clock is not None else self.time

    # -- requests ------------------------------------------------------------------------------

    def add_request(self, prompt, max_new_tokens: int, sampling: SamplingParams = SamplingParams(), *,
                    arrival: float | None = None, request_id=None, on_token=None,
                    stop_at_eot: bool = False) -> Request:
        """Queue a request (it waits until the clock reaches `arrival`; default: now)."""
        ids = self.model.check_ids(prompt)
        if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise MiniLLMError(f"max_new_tokens={max_new_tokens!r}: must be an integer of at least 1")
        check_fits(ids.size, int(max_new_tokens), self.model.config.n_ctx)
        rid = next(self._ids) if request_id is None else request_id
        if rid in self.requests:
            raise MiniLLMError(f"request id {rid!r} is already in use")
        seq = Sequence(ids, int(max_new_tokens), sampling, stop_at_eot=stop_at_eot,
                       arrival=self.now() if arrival is None else arrival)
        self.scheduler.add(seq)
        req = Request(rid, seq, seq.arrival, on_token)
        self.requests[rid] = req
        self._by_seq[seq.id] = req
        return req

    def abort(self, request_id) -> None:
        """Stop a request now; its blocks go back to the pool at once."""
        req = self.requests.get(request_id)
        if req is None or req.done:
            return
        self.scheduler.abort(req.seq)
        req.aborted = True
        req.finished_at = self.now()

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def next_arrival(self) -> float | None:
        w = self.scheduler.waiting
        return min((s.arrival for s in w), default=None)

    # -- the loop ------------------------------------------------------------------------------

    def step(self) -> list[tuple[Request, int]]:
        """Run one scheduled step. Returns the (request, token) pairs it made; [] if nothing ran
        (the simulated clock then jumps to the next arrival)."""
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
        if self.meter is not None:
            with self.meter:
                tokens = run_step(self.model, seqs, chunks)
            record = self.meter.steps[-1]
        else:
            tokens = run_step(self.model, seqs, chunks)
            record = None
        used, reserved = self.kv_usage()          # at the step's peak: before the finished let go
        lengths = [s.cache.length for s in self.scheduler.running]
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
                req.finished_at = end
            if req.on_token is not None:
                req.on_token(req, tok)
        info = StepInfo(start, end - start, spans, sum(chunks) - decode, decode, firsts, lengths, used, reserved,
                        len(self.scheduler.waiting), len(self.scheduler.running), self.blocks.n_free, record)
        self.steps.append(info)
        if self.on_step is not None:
            self.on_step(self, info)
        return made

    def kv_usage(self) -> tuple[int, int]:
        """(positions stored, positions reserved) in the blocks running sequences hold; a shared
        block counts once."""
        bs, filled = self.blocks.block_size, {}
        for s in self.scheduler.running:
            c = s.cache
            for j, b in enumerate(c.table):
                filled[b] = max(filled.get(b, 0), min(bs, max(0, c.length - j * bs)))
        return sum(filled.values()), len(filled) * bs

    def run(self) -> list[Request]:
        """Step until every request is done (simulated time: idle gaps jump to the next arrival)."""
        while self.has_work:
            n, t = len(self.steps), self.time
            self.step()
            if len(self.steps) == n and self.time == t:
                if self.clock is None:
                    raise MiniLLMError("the scheduler can run nothing and no request is on its way (a bug)")
                time.sleep(0.001)
        return list(self.requests.values())
