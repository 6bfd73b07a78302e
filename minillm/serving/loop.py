"""The engine loop: one thread owns the model, the KV pool and the scheduler. HTTP handlers only
enqueue requests (and cancellations) and read the events each request gets back: ("token", id),
then ("done", finish_reason). Every step runs under a meter; its counts feed the metrics."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque

from ..cache.paged import PagedKVPool
from ..engine.batch import run_step
from ..engine.sequence import EOT, Sequence
from ..measure.meter import BYTE_KINDS, FLOP_KINDS, Meter
from .api import ApiError, CompletionRequest
from .prom import Registry


class Request:
    """One client's request inside the engine: its sequence and the events sent back to its handler."""

    def __init__(self, req: CompletionRequest) -> None:
        self.req = req
        self.seq = Sequence(req.prompt_ids, req.max_tokens, req.sampling, stop_at_eot=True, arrival=time.perf_counter())
        self.events: queue.Queue = queue.Queue()
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.done = False


class Batcher:
    """Continuous batching over one paged pool: every step, running sequences bring their decode
    token; waiting ones are admitted (first come, first served) while blocks and the token budget
    allow, their prompts in chunks. When a running sequence needs a block and none is free, the
    newest one is preempted: its blocks are freed and it waits to be recomputed (its random
    stream is untouched, so its tokens do not change)."""

    def __init__(self, model, pool: PagedKVPool, max_batch: int, token_budget: int) -> None:
        self.model, self.pool = model, pool
        self.max_batch, self.token_budget = max_batch, token_budget
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.cache = self.pool.sequence()
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.cache.free()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _fits(self, seqs: list[Sequence], chunks: list[int]) -> bool:
        need = sum(s.cache.blocks_needed(c) for s, c in zip(seqs, chunks))
        return need <= self.pool.allocator.n_free

    def schedule(self) -> tuple[list[Sequence], list[int]]:
        seqs, chunks = [], []
        for s in list(self.running):                       # decode tokens, and prompt chunks under way
            seqs.append(s)
            chunks.append(min(s.n_pending, max(1, self.token_budget - sum(chunks))) if s.n_pending > 1 else 1)
        while not self._fits(seqs, chunks) and seqs:      # out of blocks: preempt the newest
            victim = self.running.pop()
            i = seqs.index(victim)
            del seqs[i], chunks[i]
            victim.cache.free()
            self.waiting.appendleft(victim)
            self.preemptions += 1
        budget = self.token_budget - sum(chunks)
        while self.waiting and len(seqs) < self.max_batch and budget > 0:
            s = self.waiting[0]
            c = min(s.n_pending, budget)
            if not self._fits(seqs + [s], chunks + [c]):
                break
            self.waiting.popleft()
            self.running.append(s)
            seqs.append(s)
            chunks.append(c)
            budget -= c
        return seqs, chunks

    def step(self) -> list[tuple[Sequence, int]]:
        """One batched step; the (sequence, token) pairs it sampled. Finished sequences leave."""
        seqs, chunks = self.schedule()
        if not seqs:
            return []
        tokens = run_step(self.model, seqs, chunks)
        out = [(s, t) for s, t in zip(seqs, tokens) if t is not None]
        for s, _ in out:
            if s.finished:
                self.running.remove(s)
                s.cache.free()
        return out


class EngineLoop:
    def __init__(self, model, *, kv_memory: int, block_size: int = 16, max_batch: int = 16,
                 max_waiting: int = 64, token_budget: int = 512) -> None:
        self.model = model
        self.pool = PagedKVPool.from_memory(model.config, kv_memory, block_size, model.dtype)
        self.batcher = Batcher(model, self.pool, max_batch, token_budget)
        self.max_waiting = max_waiting
        self.inbox: queue.Queue = queue.Queue()
        self.metrics = Registry()
        self.live: dict[int, Request] = {}
        self.accepting = True
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
        self._gauges()

    # -- from the HTTP handlers ----------------------------------------------------------------

    def submit(self, req: CompletionRequest) -> Request:
        if not self.accepting:
            raise ApiError(503, "the server is shutting down", kind="server_error", headers={"Retry-After": "5"})
        if len(self.batcher.waiting) + self.inbox.qsize() >= self.max_waiting:
            raise ApiError(429, f"{self.max_waiting} requests are already waiting: try again shortly",
                           kind="rate_limit_error", headers={"Retry-After": "1"})
        r = Request(req)
        self.inbox.put(("add", r))
        return r

    def cancel(self, r: Request) -> None:
        self.inbox.put(("cancel", r))

    # -- the loop ----------------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def stop(self, grace: float = 5.0) -> None:
        """Stop accepting; let running requests finish for up to `grace` seconds; cancel the rest."""
        self.accepting = False
        deadline = time.perf_counter() + grace
        while self.live and time.perf_counter() < deadline:
            time.sleep(0.02)
        for r in list(self.live.values()):
            self.cancel(r)
        self._stop.set()
        self.inbox.put(("wake", None))
        self.thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain(block=not self.batcher.has_work())
            if self.batcher.has_work():
                try:
                    self._step()
                except Exception as e:                  # a bug must not kill the loop: fail what ran
                    for r in list(self.live.values()):
                        self._finish(r, "error")
                        self.batcher.abort(r.seq)
                    self.metrics.inc("engine_errors_total", "steps that raised", 1)
                    self.last_error = repr(e)
            self._gauges()

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            what, r = item
            if what == "add":
                self.live[r.seq.id] = r
                self.batcher.add(r.seq)
                self.metrics.inc("requests_total", "requests admitted to the queue")
            elif what == "cancel" and not r.done:
                self.batcher.abort(r.seq)
                self._finish(r, "cancelled")
                self.metrics.inc("requests_cancelled_total", "requests cancelled (client gone, or shutdown)")
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _step(self) -> None:
        with Meter() as m:
            got = self.batcher.step()
        now = time.perf_counter()
        for rec in m.steps:
            phase = "decode" if rec.kind == "decode" else "prefill"
            self.metrics.inc("step_seconds_total", "seconds spent in model steps, by phase", rec.seconds, phase=phase)
            self.metrics.inc("steps_total", "model steps, by phase", 1, phase=phase)
            for k in BYTE_KINDS:
                self.metrics.inc("bytes_total", "bytes moved by the model's steps, by kind", rec.bytes[k], kind=k)
            for k in FLOP_KINDS:
                self.metrics.inc("flops_total", "FLOPs done by the model's steps, by kind", rec.flops[k], kind=k)
            self.metrics.set("achieved_gbps", "GB/s moved by the last step", rec.gbps)
            self.metrics.set("step_intensity", "FLOPs per byte of the last step", rec.intensity)
            self.metrics.inc("tokens_processed_total", "tokens run through the model, by phase", rec.n_tokens,
                             phase=phase)
        for seq, token in got:
            r = self.live.get(seq.id)
            if r is None:
                continue
            if r.first_token_at is None:
                r.first_token_at = now
                self.metrics.observe("time_to_first_token_seconds", "arrival to first token", now - seq.arrival)
            else:
                self.metrics.observe("time_between_tokens_seconds", "time between a request's tokens",
                                     now - r.last_token_at)
            r.last_token_at = now
            self.metrics.inc("generated_tokens_total", "tokens generated for clients")
            r.events.put(("token", token))
            if seq.finished:
                self._finish(r, "stop" if seq.output[-1] == EOT else "length")

    def _finish(self, r: Request, reason: str) -> None:
        r.done = True
        self.live.pop(r.seq.id, None)
        r.events.put(("done", reason))

    def _gauges(self) -> None:
        a, b = self.pool.allocator, self.batcher
        self.metrics.set("requests_running", "requests in the running batch", len(b.running))
        self.metrics.set("requests_waiting", "requests waiting for admission", len(b.waiting))
        self.metrics.set("kv_blocks_used", "KV-cache blocks in use", a.n_used)
        self.metrics.set("kv_blocks_free", "KV-cache blocks free", a.n_free)
        self.metrics.set("preemptions", "sequences preempted (recomputed) so far", b.preemptions)
