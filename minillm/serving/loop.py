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
                             clock=time.monotonic, keep_steps=KEEP_STEPS)
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
                    self.metrics.inc("engine_errors_total")
                    for r in e.requests:
                        self._finish(r, "error")
                except Exception as e:            # a bug outside the model step: end what is live, go on
                    self.last_error = f"{e.__class__.__name__}: {e}"
                    self.metrics.inc("engine_errors_total")
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
                    self.metrics.inc("requests_total")
                    if r.done:                    # it asked for no new token: answered at once
                        self._finish(r, r.finish_reason)
                except MiniLLMError:
                    self._finish(r, "error")
            elif what == "cancel" and r.id in self.live:
                self.engine.abort(r.id)
                self._finish(r, "cancelled")
                self.metrics.inc("requests_cancelled_total")
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _step(self) -> None:
        info = self.engine.step()                 # the one channel: what ran, and the tokens it made
        if info is None:
            return
        self._view(self.engine, info)
        if info.record is not None:
            self._count(info)
        for r, token in info.made:
            if r.id not in self.live:
                continue
            if len(r.token_times) == 1:
                self.metrics.observe("time_to_first_token_seconds", r.ttft)
                self.metrics.observe("queue_wait_seconds", max(0.0, info.start - r.arrival))
            else:
                self.metrics.observe("time_between_tokens_seconds", r.token_times[-1] - r.token_times[-2])
            self.metrics.inc("generated_tokens_total")
            r.events.put(("token", token))
            if r.done:
                self._finish(r, r.finish_reason)

    def _count(self, info) -> None:
        rec, m = info.record, self.metrics
        phase = "decode" if info.prefill_tokens == 0 else "prefill"
        m.inc("step_seconds_total", info.model_seconds, phase=phase)
        m.inc("steps_total", 1, phase=phase)
        for k in BYTE_KINDS:
            m.inc("bytes_total", rec.bytes[k], kind=k)
        for k in FLOP_KINDS:
            m.inc("flops_total", rec.flops[k], kind=k)
        m.set("achieved_gbps", rec.gbps)
        m.set("step_intensity", rec.intensity)
        m.inc("tokens_processed_total", info.prefill_tokens, phase="prefill")
        m.inc("tokens_processed_total", info.decode_tokens, phase="decode")

    def _view(self, engine, info) -> None:
        """The live view, drawn from this thread after each step (before its metrics are counted); a
        view that fails is switched off."""
        if self.view is not None:
            try:
                self.view(engine, info)
            except Exception:
                self.view = None

    def _finish(self, r: Request, reason: str) -> None:
        """The request's last event; the engine forgets it (a server runs for days)."""
        if reason in ("stop", "length") and len(r.token_times) > 1:
            t = r.token_times
            self.metrics.observe("time_per_output_token_seconds", (t[-1] - t[0]) / (len(t) - 1))
        self.live.pop(r.id, None)
        self.engine.forget(r.id)
        r.events.put(("done", reason))

    def _gauges(self) -> None:
        e, m = self.engine, self.metrics
        free = e.blocks.n_free
        m.set("requests_running", len(e.scheduler.running))
        m.set("requests_waiting", len(e.scheduler.waiting))
        m.set("kv_blocks_used", e.blocks.num_blocks - free)
        m.set("kv_blocks_free", free)
        m.set("preemptions_total", e.scheduler.preemptions)
        m.set("queue_expected_wait_seconds", self.expected_wait())
        if e.blocks.prefix_cache:
            m.set("prefix_cache_hit_rate", e.blocks.hit_rate)

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
        times = [s.model_seconds for s in list(e.steps)[-16:] if s.record is not None]
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
