"""The engine loop of `minillm serve`: one thread owns the engine (the model, the KV pool, the
scheduler of `minillm serve-sim`, on wall-clock time). HTTP handlers only submit requests and
cancellations and read the events each request gets back: ("token", id), then ("done", reason).
Every step's meter record feeds the Prometheus metrics.

A request is one record from the HTTP handler to the engine: `engine.Request`, made (and checked)
on the handler's thread by `Engine.new_request`, with the events queue and the parsed API request
attached, then queued to the engine thread, which alone touches the scheduler and the KV pool.
"""

from __future__ import annotations

import heapq
import queue
import threading
import time

from ..engine.engine import Engine, Request, StepFailed
from ..errors import MiniLLMError
from ..meter import BYTE_KINDS, FLOP_KINDS
from .api import ApiError, CompletionRequest
from .prom import Registry

KEEP_STEPS = 64      # step records the live view looks back on; older ones are dropped (a server runs for days)


class EngineLoop:
    def __init__(self, model, *, kv_memory: int, block_size: int = 16, max_seqs: int = 16,
                 max_waiting: int = 64, max_batched_tokens: int = 256, prefix_cache: bool = False,
                 on_step=None) -> None:
        self.model = model
        self.engine = Engine(model, kv_memory=kv_memory, block_size=block_size, prefix_cache=prefix_cache,
                             policy="continuous", max_seqs=max_seqs, max_batched_tokens=max_batched_tokens,
                             clock=time.monotonic, keep_steps=KEEP_STEPS, on_step=self._view)
        self.view = on_step
        self.pool = self.engine.pool
        self.max_waiting = max_waiting
        self.inbox: queue.Queue = queue.Queue()
        self.metrics = Registry()
        self.live: dict = {}
        self.accepting = True
        self.last_error: str | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
        self._gauges()

    @property
    def preemptions(self) -> int:
        return self.engine.scheduler.preemptions

    # -- from the HTTP handlers ----------------------------------------------------------------

    def submit(self, creq: CompletionRequest, events: queue.Queue | None = None) -> Request:
        if not self.accepting:
            raise ApiError(503, "the server is shutting down", kind="server_error", headers={"Retry-After": "5"})
        try:
            r = self.engine.new_request(creq.prompt_ids, creq.max_tokens, creq.sampling,
                                        stop_ids=self.model.eos_ids)
        except MiniLLMError as e:
            param = "max_tokens" if "KV blocks" in str(e) or "new tokens" in str(e) else "prompt"
            raise ApiError(400, f"{param}: {e}", param) from None
        if len(self.engine.scheduler.waiting) + self.inbox.qsize() >= self.max_waiting:
            raise ApiError(429, f"{self.max_waiting} requests are already waiting: try again shortly",
                           kind="rate_limit_error", headers={"Retry-After": "1"})
        r.events, r.api = queue.Queue() if events is None else events, creq
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
        while self.live and time.perf_counter() < deadline and self.thread.is_alive():
            time.sleep(0.02)
        for r in list(self.live.values()):
            self.cancel(r)
        self.inbox.put(("wake", None))
        deadline = time.perf_counter() + 5
        while self.live and time.perf_counter() < deadline and self.thread.is_alive():
            time.sleep(0.02)
        self._stop.set()
        self.inbox.put(("wake", None))
        self.thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain(block=not self.engine.has_work)
            if self.engine.has_work:
                try:
                    self._step()
                except StepFailed as e:           # the requests of that step end; the rest go on
                    self.last_error = str(e)
                    self.metrics.inc("engine_errors_total", "steps that raised")
                    for r in e.requests:
                        self._finish(r, "error")
                except Exception as e:            # a bug outside the model step: end what is live, go on
                    self.last_error = f"{e.__class__.__name__}: {e}"
                    self.metrics.inc("engine_errors_total", "steps that raised")
                    for r in list(self.live.values()):
                        self.engine.abort(r.id, "error")
                        self._finish(r, "error")
            self._gauges()

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            what, r = item
            if what == "add":
                try:
                    self.engine.add(r)
                    self.live[r.id] = r
                    self.metrics.inc("requests_total", "requests admitted to the queue")
                    if r.done:                    # it asked for no new token: answered at once
                        self._finish(r, r.finish_reason)
                except MiniLLMError:
                    self._finish(r, "error")
            elif what == "cancel" and r.id in self.live:
                self.engine.abort(r.id)
                self._finish(r, "cancelled")
                self.metrics.inc("requests_cancelled_total", "requests cancelled (client gone, or shutdown)")
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _step(self) -> None:
        before = self.engine.n_steps
        made = self.engine.step()
        if self.engine.n_steps > before and self.engine.steps[-1].record is not None:
            self._count(self.engine.steps[-1])
        for r, token in made:
            if r.id not in self.live:
                continue
            if len(r.token_times) == 1:
                self.metrics.observe("time_to_first_token_seconds", "arrival to first token", r.ttft)
                self.metrics.observe("queue_wait_seconds", "", max(0.0, self.engine.steps[-1].start - r.arrival))
            else:
                self.metrics.observe("time_between_tokens_seconds", "time between a request's tokens",
                                     r.token_times[-1] - r.token_times[-2])
            self.metrics.inc("generated_tokens_total", "tokens generated for clients")
            r.events.put(("token", token))
            if r.done:
                self._finish(r, r.finish_reason)

    def _count(self, info) -> None:
        rec = info.record
        phase = "decode" if info.prefill_tokens == 0 else "prefill"
        self.metrics.inc("step_seconds_total", "seconds spent in model steps, by phase (a step with any "
                         "prompt tokens counts as prefill)", rec.seconds, phase=phase)
        self.metrics.inc("steps_total", "model steps, by phase", 1, phase=phase)
        for k in BYTE_KINDS:
            self.metrics.inc("bytes_total", "bytes moved by the model's steps, by kind", rec.bytes[k], kind=k)
        for k in FLOP_KINDS:
            self.metrics.inc("flops_total", "FLOPs done by the model's steps, by kind", rec.flops[k], kind=k)
        self.metrics.set("achieved_gbps", "GB/s moved by the last step", rec.gbps)
        self.metrics.set("step_intensity", "FLOPs per byte of the last step", rec.intensity)
        self.metrics.inc("tokens_processed_total", "tokens run through the model, by phase",
                         info.prefill_tokens, phase="prefill")
        self.metrics.inc("tokens_processed_total", "tokens run through the model, by phase",
                         info.decode_tokens, phase="decode")

    def _view(self, engine, info) -> None:
        """The live view, drawn from this thread after each step; a view that fails is switched off."""
        if self.view is not None:
            try:
                self.view(engine, info)
            except Exception:
                self.view = None

    def _finish(self, r: Request, reason: str) -> None:
        """The request's last event; the engine forgets it (a server runs for days)."""
        if reason in ("stop", "length") and len(r.token_times) > 1:
            t = r.token_times
            self.metrics.observe("time_per_output_token_seconds", "", (t[-1] - t[0]) / (len(t) - 1))
        self.live.pop(r.id, None)
        self.engine.forget(r.id)
        r.events.put(("done", reason))

    def _gauges(self) -> None:
        e = self.engine
        free = e.blocks.n_free
        self.metrics.set("requests_running", "requests in the running batch", len(e.scheduler.running))
        self.metrics.set("requests_waiting", "requests waiting for admission", len(e.scheduler.waiting))
        self.metrics.set("kv_blocks_used", "KV-cache blocks held by requests", e.blocks.num_blocks - free)
        self.metrics.set("kv_blocks_free", "KV-cache blocks free (cached prefixes nobody holds included)", free)
        self.metrics.set("preemptions_total", "", e.scheduler.preemptions)
        self.metrics.set("queue_expected_wait_seconds", "", self.expected_wait())
        if e.blocks.prefix_cache:
            self.metrics.set("prefix_cache_hit_rate", "prompt positions found in the prefix cache",
                             e.blocks.hit_rate)

    # -- added for the HTTP front end (issue 21) ------------------------------------------------------

    def expected_wait(self) -> float:
        """Seconds a request submitted now would wait for a place in the batch: the running
        sequences' remaining tokens and the queue ahead played out on the batch's slots (each slot
        frees when its sequence has made its last token), at the median time of the recent steps.
        An estimate: it ignores KV-block limits and stop tokens. Engine thread only (`_gauges`
        publishes it as the gauge queue_expected_wait_seconds for other threads)."""
        e = self.engine
        sched = e.scheduler
        running, waiting, ahead = list(sched.running), list(sched.waiting), self.inbox.qsize()
        if len(running) < sched.max_seqs and not waiting and not ahead:
            return 0.0
        times = [s.record.seconds for s in list(e.steps)[-16:] if s.record is not None]
        step_s = sorted(times)[len(times) // 2] if times else 0.05
        slots = sorted(max(0, s.max_new_tokens - len(s.output)) for s in running)
        slots = [0] * max(0, sched.max_seqs - len(slots)) + slots
        if not slots:
            return 0.0
        heapq.heapify(slots)
        queued = [s.max_new_tokens for s in waiting]
        mean_new = sum(queued) / len(queued) if queued else \
            sum(s.max_new_tokens for s in running) / max(1, len(running))
        for n in queued + [mean_new] * ahead:
            heapq.heappush(slots, heapq.heappop(slots) + n)
        return slots[0] * step_s
