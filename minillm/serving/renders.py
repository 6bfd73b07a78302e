"""`minillm serve`'s chat renders: who renders next, and what is refused or dropped.

A chat's template runs in a worker process (minillm/chat_pool.py) for up to its budget of seconds,
and a client chooses the messages it runs on: 100 chats whose template runs its whole budget, sent
and reset at once, used to queue 200 seconds of renders nobody waited for, first in, first out. The
queue here decides, on the event loop, which chat renders next; a render runs on a thread only once
it holds one of the pool's `slots`:

    dead work     a chat whose client has gone is dropped before it queues, again when a slot comes
                  to it, and while it renders (the worker is killed)
    bounded       past `max_waiting` waiting chats, or `per_client` from one client, 429 with a
                  Retry-After from the recent renders' median time
    a fair share  a free slot goes first to the waiting clients whose last render kept to its
                  budget, among them to the one that holds the fewest (in turn among equals); the
                  last free slot (of several) only to such a client holding none: one client's
                  templates, or many clients' slow ones, cannot take every slot while a
                  well-behaved client waits
    a breaker     a client whose last `trip_after` renders all ran past their budget is refused at
                  once (429, Retry-After) for `refuse_for` seconds: its next chats cost no slot; its
                  count goes back to 0 only with a render within budget (so after the while, one
                  more slow render refuses it again)
    shutdown      `close()`: waiting and running renders end at once (503)

A client is its peer address (behind a proxy every client is the proxy: one share for all).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, OrderedDict, deque

from ..chat import RenderStopped, TemplateOverBudget
from .api import ApiError
from .stream import ClientGone


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down: the request was not started", kind="server_error",
                    headers={"Retry-After": "5"})


class RenderQueue:
    def __init__(self, slots: int, *, max_waiting: int = 64, per_client: int = 8, trip_after: int = 3,
                 refuse_for: float = 30.0, metrics=None, clock=time.monotonic) -> None:
        self.slots, self.free = slots, slots
        self.max_waiting, self.per_client = max_waiting, per_client
        self.trip_after, self.refuse_for = trip_after, refuse_for
        self.metrics, self.clock = metrics, clock
        self.waiting: OrderedDict[str, deque] = OrderedDict()   # client -> its waiters, in turn order
        self.n_waiting = 0
        self.held: Counter = Counter()                           # client -> slots it holds
        self.streak: Counter = Counter()                         # client -> over-budget renders in a row
        self.refused_until: dict[str, float] = {}
        self.seconds: deque = deque(maxlen=32)                   # the recent renders' times
        self.closed = False

    async def run(self, client: str, gone: asyncio.Future, render):
        """render(stop) on a thread once this chat holds a slot (stop: a function, true when nobody
        waits any more); its result. ClientGone if the client left, ApiError 429/503 when refused."""
        if gone.done():
            self._shed("client_gone")
            raise ClientGone                                     # nobody waits: not even queued
        if self.closed:
            raise shutting_down()
        self._check_breaker(client)
        if not self._may_take(client):
            await self._wait(client, gone)
        else:
            self._take(client)
        try:
            if gone.done():                                      # it left while the slot came to it
                self._shed("client_gone")
                raise ClientGone
            t0 = self.clock()
            try:
                result = await asyncio.to_thread(render, lambda: gone.done() or self.closed)
            except RenderStopped:
                self._shed("shutdown" if self.closed else "client_gone")
                raise (shutting_down() if self.closed else ClientGone()) from None
            except TemplateOverBudget:
                self.seconds.append(self.clock() - t0)
                self._over_budget(client)
                raise
            self.seconds.append(self.clock() - t0)
            self.streak.pop(client, None)
            return result
        finally:
            self._release(client)

    def close(self) -> None:
        """Shutdown: every waiting chat is answered 503; running renders are stopped."""
        self.closed = True
        for waiters in self.waiting.values():
            for fut, _ in waiters:
                if not fut.done():
                    fut.set_exception(shutting_down())
        self.waiting.clear()
        self.n_waiting = 0
        self._gauge()

    # -- inside ------------------------------------------------------------------------------------

    def _may_take(self, client: str) -> bool:
        """A free slot this client may have now: the last one (of several) only if it holds none and
        its last render kept to its budget."""
        return self.free > 1 or (self.free == 1 and (self.slots == 1 or self.held[client] == 0
                                                     and self.streak[client] == 0))

    def _take(self, client: str) -> None:
        self.free -= 1
        self.held[client] += 1
        self._gauge()

    def _release(self, client: str) -> None:
        self.free += 1
        self.held[client] -= 1
        if self.held[client] <= 0:
            del self.held[client]
        self._dispatch()

    async def _wait(self, client: str, gone: asyncio.Future) -> None:
        """Queue this chat, bounded, until a slot is given to it (`_dispatch`)."""
        mine = self.waiting.get(client, ())
        if self.n_waiting >= self.max_waiting or len(mine) >= self.per_client:
            whose = (f"{self.max_waiting} chats are" if self.n_waiting >= self.max_waiting
                     else f"{self.per_client} of your chats are")
            wait = math.ceil((self.n_waiting / self.slots + 1) * self._median())
            raise ApiError(429, f"{whose} already waiting for their chat template to be rendered: try again "
                           "shortly", kind="rate_limit_error", headers={"Retry-After": str(max(1, wait))})
        fut = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(client, deque()).append((fut, gone))
        self.n_waiting += 1
        self._gauge()
        try:
            await asyncio.wait({fut, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._leave(client, fut)
            raise
        if fut.cancelled():                                      # _dispatch found its client gone (counted)
            raise ClientGone
        if not fut.done():                                       # the client left while it waited
            self._leave(client, fut)
            self._shed("client_gone")
            raise ClientGone
        fut.result()                                             # a slot, or 503 at shutdown

    def _leave(self, client: str, fut: asyncio.Future) -> None:
        """A waiter goes: out of the queue, or, if a slot had just been given to it, the slot back."""
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            self._release(client)
            return
        fut.cancel()
        waiters = self.waiting.get(client)
        if waiters is not None:
            for entry in list(waiters):
                if entry[0] is fut:
                    waiters.remove(entry)
                    self.n_waiting -= 1
            if not waiters:
                del self.waiting[client]
        self._gauge()

    def _dispatch(self) -> None:
        """Give free slots to waiters: clients whose last render kept to its budget first, then the
        one holding the fewest, in turn among equals; a waiter whose client has gone is dropped here,
        before it takes a slot."""
        while self.free > 0 and self.waiting:
            ready = [c for c in self.waiting if self._may_take(c)]
            if not ready:
                break
            client = min(ready, key=lambda c: (self.streak[c] > 0, self.held[c]))   # min keeps the turn order
            waiters = self.waiting[client]
            fut, gone = waiters.popleft()
            self.n_waiting -= 1
            if waiters:
                self.waiting.move_to_end(client)                 # its next chat waits for its next turn
            else:
                del self.waiting[client]
            if fut.done():
                continue
            if gone.done():
                fut.cancel()
                self._shed("client_gone")
                continue
            self._take(client)
            fut.set_result(None)
        self._gauge()

    def _check_breaker(self, client: str) -> None:
        until = self.refused_until.get(client)
        if until is None:
            return
        left = until - self.clock()
        if left <= 0:
            del self.refused_until[client]
            return
        raise ApiError(429, f"your last {self.trip_after} chats ran this model's chat template past its budget: "
                       f"chats from this client are refused for {left:.0f} s more", "messages",
                       kind="rate_limit_error", headers={"Retry-After": str(max(1, math.ceil(left)))})

    def _over_budget(self, client: str) -> None:
        if len(self.streak) > 10_000:                            # many clients, each short of the limit
            self.streak.clear()
        self.streak[client] += 1
        if self.streak[client] >= self.trip_after:
            self.refused_until[client] = self.clock() + self.refuse_for
            if len(self.refused_until) > 10_000:                 # a server runs for days: forget the expired
                now = self.clock()
                self.refused_until = {c: t for c, t in self.refused_until.items() if t > now}

    def _median(self) -> float:
        times = sorted(self.seconds)
        return times[len(times) // 2] if times else 1.0

    def _shed(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.inc("renders_shed_total", reason=reason)

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.set("renders_waiting", self.n_waiting)
            self.metrics.set("renders_running", self.slots - self.free)
