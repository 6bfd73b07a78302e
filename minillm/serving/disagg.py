"""Prefill/decode disaggregation, simulated honestly on one machine.

Two engines: a prefill engine whose steps run on P BLAS threads and a decode engine on D. Every step
of each really runs, with that many threads (threadpoolctl), and its measured time advances that
engine's own clock; the two clocks run side by side in simulated time (the engine whose clock is
behind steps next, so nothing sees the future). Compared with one engine, every side should run on
the same thread count (T:T beside one engine on T): `minillm serve-sim --compare disagg` does, and
ranks nothing otherwise.

A request arrives at the prefill engine, which runs its prompt (in chunks under its token budget)
and samples its first token: the client has it then. Its KV cache, every layer's keys and values of
the prompt's positions, is then copied out, the prefill engine's blocks freed, and the bytes sent
over a link of `link_gbps` gigabits per second: the decode engine takes the request when the bytes
have arrived and it has a free slot and free blocks, writes the KV into its own pool, and decodes
the rest. The sequence's random stream travels with it, so its tokens are those of `generate`.

This is what DistServe, Splitwise, Mooncake and the P/D modes of vLLM, SGLang and NVIDIA Dynamo do
across machines and real networks (NIXL, RDMA); minillm does it in one process to measure the
trade, not to scale: each phase gets an engine of its own, as if on a device of its own (no
interference, batch sizes and budgets tuned apart), at the price of the KV bytes moved and of an
engine that idles when its phase has no work.

The simulation is not neutral, in two ways, and says so where it ranks:
- one engine's step runs at a time, so the two never compete for memory bandwidth or cache as two
  engines on one box would: that favours the split;
- a prompt's KV leaves only after its whole prefill, where DistServe, Splitwise and Mooncake stream
  it layer by layer under the computation: that disfavours it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engine.engine import Engine, Request
from ..errors import MiniLLMError
from ..threads import limited
from .metrics import engine_for, latency, per_request, step_fit


@dataclass
class Handoff:
    """One request on the link: its prefill is done, its KV is on the way."""
    request_id: object
    prompt: list
    first: int                  # the token the prefill engine sampled (the client has it)
    max_new_tokens: int
    sampling: object
    rng: object                 # the sequence's own random stream, where it stands after `first`
    stop_ids: tuple
    arrival: float              # when the request reached the prefill engine
    first_at: float             # when the first token was sampled (prefill engine's clock)
    ready_at: float             # when the last byte arrived at the decode engine
    k: np.ndarray               # [L, Hkv, T, hd]
    v: np.ndarray
    nbytes: int = 0             # the bytes sent: K and V of every layer and prompt position

    def __post_init__(self) -> None:
        self.nbytes = self.k.nbytes + self.v.nbytes


def measure_copy_gbps(nbytes: int = 32 * 2**20, rounds: int = 5) -> float:
    """This machine's copy bandwidth in gigabits per second: the best of a few copies of an nbytes
    buffer (bytes copied per second, x 8). The default link: moving KV within one machine's memory."""
    import time
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return nbytes * 8 / best / 1e9


def parse_split(text: str) -> tuple[int, int]:
    """'1:1' -> (1, 1): BLAS threads of the prefill engine and of the decode engine."""
    p, sep, d = text.partition(":")
    try:
        pt, dt = int(p), int(d)
    except ValueError:
        pt = dt = 0
    if not sep or pt < 1 or dt < 1:
        raise MiniLLMError(f"--disaggregate {text!r}: write P:D, the BLAS threads of the prefill and the "
                           "decode engine, each at least 1 (e.g. 1:1)")
    return pt, dt


def export_kv(cache) -> tuple[np.ndarray, np.ndarray]:
    """Every layer's keys and values of a sequence's cached positions: [L, Hkv, T, hd] each (a copy)."""
    L, T = cache.config.n_layer, cache.length
    pairs = [cache.read(layer, T) for layer in range(L)]
    return np.stack([k for k, _ in pairs]), np.stack([v for _, v in pairs])


def import_kv(engine: Engine, h: Handoff) -> Request | None:
    """Give a handed-off request to the decode engine (`Engine.adopt`: blocks from its pool, the KV
    written into them, the sequence among the running with its first token pending). None (nothing
    taken) when the engine has no free slot or not enough free blocks now."""
    req = engine.new_request(h.prompt, h.max_new_tokens, h.sampling, arrival=h.arrival,
                             request_id=h.request_id, stop_ids=h.stop_ids)
    return req if engine.adopt(req, h.k, h.v, output=[h.first], rng=h.rng) else None


class Disaggregated:
    """A prefill engine and a decode engine on their own threads and clocks, and the link between.

        d = Disaggregated(model, p_threads=1, d_threads=1, link_gbps=100)
        for w in items: d.add(w)
        d.run(); d.summary(slo)
    """

    def __init__(self, model, *, p_threads: int, d_threads: int, link_gbps: float, kv_memory: int | None = None,
                 num_blocks: int | None = None, block_size: int = 16, max_seqs: int = 16,
                 max_batched_tokens: int = 256, prefill_batched_tokens: int | None = None, on_step=None,
                 keep_kv: bool = False, step_time=None) -> None:
        """prefill_batched_tokens: the prefill engine's own budget (default: max_batched_tokens). With no
        decode beside it, that engine has nothing to chunk a prompt for; a budget above the longest
        prompt takes each whole, as DistServe's prefill instances do. step_time: both engines' clocks
        priced (`metrics.RooflineClock`) instead of measured."""
        if not link_gbps > 0:
            raise MiniLLMError(f"--link-gbps {link_gbps}: the link's speed must be above 0 Gb/s")
        kw = dict(kv_memory=kv_memory, num_blocks=num_blocks, block_size=block_size, max_seqs=max_seqs,
                  step_time=step_time)
        self.prefill = Engine(model, **kw, max_batched_tokens=prefill_batched_tokens or max_batched_tokens)
        self.decode = Engine(model, **kw, max_batched_tokens=max_batched_tokens)
        self.p_threads, self.d_threads = p_threads, d_threads
        self.link_gbps = float(link_gbps)
        self.on_step = on_step
        self.keep_kv = keep_kv               # keep each handoff's KV after the decode engine took it (tests)
        self.inbox: list[Handoff] = []       # on the link or arrived, not yet taken by the decode engine
        self.handed: list[Handoff] = []      # every handoff made (its KV dropped once taken)
        self.firsts: dict = {}               # request id -> (arrival, first token time, token)
        self.kv_bytes = 0
        self.link_seconds = 0.0
        self.order: list = []

    def add(self, prompt, max_new_tokens: int, sampling, *, arrival: float, request_id=None) -> None:
        r = self.prefill.add_request(prompt, max_new_tokens, sampling, arrival=arrival, request_id=request_id)
        self.order.append(r.id)

    # -- the two clocks ------------------------------------------------------------------------

    def _next_prefill(self) -> float:
        e = self.prefill
        if e.scheduler.running:
            return e.time
        nxt = e.next_arrival()
        return float("inf") if nxt is None else max(e.time, nxt)

    def _next_decode(self) -> float:
        e = self.decode
        if e.scheduler.running or e.scheduler.waiting:    # waiting: a preempted sequence, recomputed here
            return e.time
        ready = min((h.ready_at for h in self.inbox), default=None)
        return float("inf") if ready is None else max(e.time, ready)

    def _take(self) -> None:
        """The decode engine takes what has arrived, oldest first, while it has room."""
        e = self.decode
        while self.inbox and self.inbox[0].ready_at <= e.time:
            if import_kv(e, self.inbox[0]) is None:
                break
            h = self.inbox.pop(0)
            if not self.keep_kv:
                h.k = h.v = None                  # the bytes now live in the decode engine's pool

    def step(self) -> bool:
        """One step of whichever engine's clock is behind. False when both are done."""
        tp, td = self._next_prefill(), self._next_decode()
        if tp == td == float("inf"):
            return False
        if tp <= td:
            e = self.prefill
            e.time = max(e.time, tp)
            with limited(self.p_threads):
                info = e.step()
            for req, tok in (info.made if info else []):
                self._hand_over(req, tok)
        else:
            e = self.decode
            e.time = max(e.time, td)
            self._take()
            with limited(self.d_threads):
                info = e.step()
        if self.on_step is not None and info is not None:
            self.on_step(e, info)
        return True

    def _hand_over(self, req: Request, tok: int) -> None:
        e = self.prefill
        at = req.token_times[0]
        self.firsts[req.id] = (req.arrival, at, tok)
        if req.seq.finished:                   # one token asked for: done at the prefill engine
            return
        k, v = export_kv(req.seq.cache)
        nbytes = k.nbytes + v.nbytes
        link = nbytes * 8 / (self.link_gbps * 1e9)
        h = Handoff(req.id, list(req.seq.prompt), tok, req.seq.max_new_tokens, req.seq.sampling, req.seq.rng,
                    tuple(req.seq.stop_ids), req.arrival, at, at + link, k, v)
        e.abort(req.id)                        # the prefill engine's blocks back at once
        self.kv_bytes += nbytes
        self.link_seconds += link
        self.inbox.append(h)
        self.inbox.sort(key=lambda x: x.ready_at)
        self.handed.append(h)

    @property
    def has_work(self) -> bool:
        return min(self._next_prefill(), self._next_decode()) < float("inf")

    def run(self) -> None:
        while self.step():
            pass
        if self.inbox:
            raise MiniLLMError("a handed-off request never fit the decode engine (a bug)")

    # -- results -------------------------------------------------------------------------------

    def outputs(self) -> dict:
        """request id -> every token it got (the first from the prefill engine, the rest from decode)."""
        out = {}
        for rid in self.order:
            _, _, first = self.firsts[rid]
            d = self.decode.requests.get(rid)
            out[rid] = d.output if d is not None else [first]
        return out

    def token_times(self, rid) -> list[float]:
        _, first_at, _ = self.firsts[rid]
        d = self.decode.requests.get(rid)
        return [first_at] + (d.token_times if d is not None else [])

    def summary(self, slo: dict | None = None, label: str = "") -> dict:
        rows = []
        for rid in self.order:
            arrival = self.firsts[rid][0]
            d = self.decode.requests.get(rid)
            done = d is None or d.done
            rows.append((arrival, self.token_times(rid), done))
        return run_summary(rows, [self.prefill, self.decode], slo, label, ids=list(self.order),
                           threads=self.p_threads + self.d_threads,
                           kv_bytes_moved=self.kv_bytes, link_seconds=self.link_seconds,
                           link_gbps=self.link_gbps, handoffs=len(self.handed),
                           split=f"{self.p_threads}:{self.d_threads}")


class OnThreads:
    """An engine whose every step runs on `threads` BLAS threads."""

    def __init__(self, engine: Engine, threads: int | None) -> None:
        self.engine, self.threads = engine, threads

    @property
    def has_work(self) -> bool:
        return self.engine.has_work

    def step(self) -> None:
        with limited(self.threads):
            self.engine.step()


def run_interleaved(runners: list) -> None:
    """Step each runner (anything with `has_work` and `step()`: an engine, OnThreads, Disaggregated)
    in turn, one step each, until all are done: each keeps its own simulated clock, and a passing
    load on the machine slows a step of each of them, not the whole run of one. (An engine that can
    run nothing with no request on its way raises from its own `step`.)"""
    live = list(runners)
    sweep = 0
    while live:
        sweep += 1                          # the order reversed every other sweep: no side always first
        for r in (list(live) if sweep % 2 else list(reversed(live))):
            if not r.has_work:
                live.remove(r)
                continue
            r.step()


def run_summary(rows: list[tuple], engines: list[Engine], slo: dict | None, label: str, ids=None,
                **extra) -> dict:
    """Throughput, latency and goodput from each request's (arrival, token times, finished), and
    how busy each engine was (the share of the run its steps took)."""
    start = min((a for a, _, _ in rows), default=0.0)
    end = max((t[-1] for _, t, _ in rows if t), default=start)
    duration = end - start
    out_tokens = sum(len(t) for _, t, _ in rows)
    steps = [s for e in engines for s in e.steps]
    clock = {"clock": "measured"}
    if all(getattr(e, "step_time", None) is not None for e in engines):
        priced, measured = sum(s.seconds for s in steps), sum(s.model_seconds for s in steps)
        clock = {"clock": "roofline", "measured_model_s": measured,
                 "roofline_share": priced / measured if measured > 0 else None}
    busy = [sum(s.seconds for s in e.steps) / duration if duration > 0 else 0.0 for e in engines]
    return {"label": label, "requests": len(rows), "duration_s": duration, "output_tokens": out_tokens,
            "output_tokens_per_s": out_tokens / duration if duration > 0 else 0.0,
            **latency(rows, duration, slo or {}),
            "steps": len(steps), "busy": busy,
            "prefill_tokens": sum(s.prefill_tokens for s in steps),
            "fit": [step_fit(e.steps) for e in engines],
            "per_request": per_request(rows, ids if ids is not None else list(range(len(rows)))), **clock,
            **extra}


def colocated_summary(e: Engine, threads: int | None, slo: dict | None = None, label: str = "") -> dict:
    rows = [(r.arrival, r.token_times, r.done) for r in e.requests.values()]
    return run_summary(rows, [e], slo, label, ids=list(e.requests), threads=threads, kv_bytes_moved=0, link_seconds=0.0,
                       handoffs=0, split="colocated")


def colocated(model, items, *, threads: int, slo: dict | None = None, label: str = "",
              **engine_kw) -> tuple[dict, Engine]:
    """The same requests through one engine on `threads` BLAS threads; summarised as the split is."""
    e = engine_for(model, items, **engine_kw)
    with limited(threads):
        e.run()
    return colocated_summary(e, threads, slo, label), e


def disaggregated_engines(model, items, *, p_threads: int, d_threads: int, link_gbps: float,
                          **engine_kw) -> Disaggregated:
    d = Disaggregated(model, p_threads=p_threads, d_threads=d_threads, link_gbps=link_gbps, **engine_kw)
    for w in items:
        d.add(w.prompt, w.max_tokens, w.sampling, arrival=w.arrival)
    return d


def disaggregated(model, items, *, slo: dict | None = None, label: str = "", **kw) -> tuple[dict, Disaggregated]:
    d = disaggregated_engines(model, items, **kw)
    d.run()
    return d.summary(slo, label), d
