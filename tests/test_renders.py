"""Issue 43, item 3: the chat renders' queue (minillm/serving/renders.py) sheds work nobody waits
for, bounds what waits, shares the slots between clients, and refuses at once a client whose
renders keep running past their budget. The renders here are threads that wait (a real template's
time is the worker's, tested end to end in tests/test_hostile.py); each test is one event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from minillm.chat import TemplateOverBudget
from minillm.serving.api import ApiError
from minillm.serving.prom import Registry
from minillm.serving.renders import RenderQueue
from minillm.serving.stream import ClientGone


class Renders:
    """Fake renders that record when each starts and wait for `release` (or their stop)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = threading.Event()
        self.stopped: list[str] = []

    def __call__(self, name: str, seconds: float = 5.0, over_budget: bool = False):
        def render(stop):
            self.started.append(name)
            t0 = time.monotonic()
            while not self.release.is_set() and time.monotonic() - t0 < seconds:
                if stop():
                    self.stopped.append(name)
                    from minillm.chat import RenderStopped
                    raise RenderStopped("stopped", 503)
                time.sleep(0.005)
            if over_budget:
                raise TemplateOverBudget("ran past its budget")
            return name
        return render


def run(main) -> None:
    """main() on a new event loop, failed (not hung) if it has not finished in 20 s."""
    asyncio.run(asyncio.wait_for(main(), 20))


def alive() -> asyncio.Future:
    return asyncio.get_running_loop().create_future()


async def settle(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0.01)


def test_a_chat_whose_client_has_gone_is_never_queued_nor_run():
    async def main():
        q, r = RenderQueue(2, metrics=Registry()), Renders()
        gone = alive()
        gone.set_result(None)
        with pytest.raises(ClientGone):
            await q.run("a", gone, r("dead"))
        assert r.started == [] and q.n_waiting == 0 and q.free == 2
        assert q.metrics.get("renders_shed_total", reason="client_gone") == 1
        full = RenderQueue(1, max_waiting=0)
        busy = asyncio.ensure_future(full.run("b", alive(), r("busy")))
        await settle()
        with pytest.raises(ClientGone):                            # not 429: it is dropped before it queues
            await full.run("a", gone, r("dead"))
        r.release.set()
        await busy
    run(main)


def test_a_waiting_chat_whose_client_leaves_is_dropped_before_it_takes_a_slot():
    async def main():
        q, r = RenderQueue(2), Renders()
        busy = [asyncio.ensure_future(q.run(c, alive(), r(c))) for c in ("a", "b")]
        await settle()
        left = alive()
        waiter = asyncio.ensure_future(q.run("c", left, r("c-dead")))
        later = asyncio.ensure_future(q.run("d", alive(), r("d")))
        await settle()
        assert q.n_waiting == 2 and sorted(r.started) == ["a", "b"]
        left.set_result(None)                                     # the client of c leaves while waiting
        with pytest.raises(ClientGone):
            await waiter
        assert q.n_waiting == 1
        r.release.set()
        assert await later == "d" and sorted(await asyncio.gather(*busy)) == ["a", "b"]
        assert "c-dead" not in r.started and q.free == 2
    run(main)


def test_a_waiter_dropped_at_dispatch_ends_as_client_gone():
    """The client leaves while its chat waits, and a slot frees in the same moment: _dispatch drops
    the waiter first. Its handler ends as ClientGone (it raised CancelledError: a 500 and a traceback)."""
    async def main():
        q, r = RenderQueue(1, metrics=Registry()), Renders()
        busy = asyncio.ensure_future(q.run("a", alive(), r("a", seconds=0.2)))
        await settle(2)
        left = alive()
        waiter = asyncio.ensure_future(q.run("b", left, r("b")))
        await settle(2)
        original = q._release

        def release_as_it_leaves(client):                       # gone, then the slot, in one moment
            if not left.done():
                left.set_result(None)
            original(client)
        q._release = release_as_it_leaves
        await busy
        with pytest.raises(ClientGone):
            await waiter
        assert "b" not in r.started and q.metrics.get("renders_shed_total", reason="client_gone") == 1
    run(main)


def test_dispatch_skips_a_waiter_whose_client_has_gone():
    """The second look: the slot comes free in the same moment the client leaves."""
    async def main():
        q = RenderQueue(1)
        loop = asyncio.get_running_loop()
        dead, live = (loop.create_future(), alive()), (loop.create_future(), alive())
        dead[1].set_result(None)
        q.waiting["x"] = __import__("collections").deque([dead])
        q.waiting["y"] = __import__("collections").deque([live])
        q.n_waiting, q.free = 2, 1
        q._dispatch()
        assert dead[0].cancelled() and live[0].done() and not live[0].cancelled()
        assert q.held == {"y": 1} and q.free == 0 and q.n_waiting == 0
    run(main)


def test_a_chat_that_leaves_while_rendering_has_its_render_stopped():
    async def main():
        q, r = RenderQueue(2), Renders()
        gone = alive()
        task = asyncio.ensure_future(q.run("a", gone, r("a")))
        await settle()
        gone.set_result(None)
        with pytest.raises(ClientGone):
            await task
        assert r.stopped == ["a"] and q.free == 2
    run(main)


def test_waiting_chats_are_bounded_in_all_and_per_client():
    async def main():
        q, r = RenderQueue(1, max_waiting=3, per_client=2), Renders()
        running = asyncio.ensure_future(q.run("a", alive(), r("a0")))
        waiting = [asyncio.ensure_future(q.run("a", alive(), r(f"a{i}"))) for i in (1, 2)]
        await settle()
        with pytest.raises(ApiError) as e:                         # a third of a's: over its share
            await q.run("a", alive(), r("a3"))
        assert e.value.status == 429 and "2 of your chats" in e.value.message
        assert int(e.value.headers["Retry-After"]) >= 1
        waiting.append(asyncio.ensure_future(q.run("b", alive(), r("b1"))))      # b may still wait
        await settle()
        with pytest.raises(ApiError) as e:                         # the queue is full for everyone
            await q.run("c", alive(), r("c1"))
        assert e.value.status == 429 and "3 chats are" in e.value.message
        r.release.set()
        await asyncio.gather(running, *waiting)
        assert "a3" not in r.started and "c1" not in r.started
    run(main)


def test_one_clients_renders_cannot_take_every_slot_from_another():
    async def main():
        q, r = RenderQueue(4), Renders()
        flood = [asyncio.ensure_future(q.run("attacker", alive(), r(f"a{i}"))) for i in range(11)]
        await settle()
        assert len(r.started) == 3 and q.free == 1                  # the last slot is kept
        benign = asyncio.ensure_future(q.run("benign", alive(), r("benign", seconds=0)))
        assert await asyncio.wait_for(benign, 2) == "benign"         # at once, ahead of eight waiting
        assert r.started[3] == "benign"
        r.release.set()
        await asyncio.gather(*flood)
    run(main)


def test_clients_whose_renders_ran_past_budget_wait_behind_the_others():
    """24 attackers from 24 addresses each hold one slot at most: the share per client alone lets
    their slow renders fill every slot. A client whose last render ran past its budget never takes
    the last slot, and waits behind clients whose renders kept to theirs."""
    async def main():
        q, r = RenderQueue(2, trip_after=9), Renders()
        for c in ("s1", "s2", "s3"):                                     # each has one slow render behind it
            with pytest.raises(TemplateOverBudget):
                await q.run(c, alive(), r(f"{c}-first", seconds=0, over_budget=True))
        slow = [asyncio.ensure_future(q.run(c, alive(), r(c))) for c in ("s1", "s2", "s3")]
        await settle()
        assert r.started[3:] == ["s1"] and q.free == 1                   # s2, s3 may not take the last slot
        clean = asyncio.ensure_future(q.run("c1", alive(), r("c1", seconds=0)))
        assert await asyncio.wait_for(clean, 2) == "c1"                  # at once
        q2, r2 = RenderQueue(1), Renders()
        with pytest.raises(TemplateOverBudget):
            await q2.run("s", alive(), r2("s-first", seconds=0, over_budget=True))
        busy = asyncio.ensure_future(q2.run("x", alive(), r2("x", seconds=0.1)))
        await settle(1)
        queued = [asyncio.ensure_future(q2.run("s", alive(), r2("s", seconds=0))),
                  asyncio.ensure_future(q2.run("c", alive(), r2("c", seconds=0)))]
        await asyncio.gather(busy, *queued)
        assert r2.started[1:] == ["x", "c", "s"]                         # c after s in the queue, first served
        r.release.set()
        await asyncio.gather(*slow)
    run(main)


def test_waiting_clients_take_turns():
    async def main():
        q, r = RenderQueue(1), Renders()
        first = asyncio.ensure_future(q.run("a", alive(), r("a0", seconds=0.05)))
        await settle(2)
        rest = [asyncio.ensure_future(q.run("a", alive(), r(f"a{i}", seconds=0.02))) for i in (1, 2, 3)]
        await settle(2)
        rest += [asyncio.ensure_future(q.run("b", alive(), r(f"b{i}", seconds=0.02))) for i in (1, 2)]
        await asyncio.gather(first, *rest)
        assert r.started == ["a0", "a1", "b1", "a2", "b2", "a3"]
    run(main)


def test_a_client_whose_renders_keep_running_past_their_budget_is_refused_at_once_for_a_while():
    async def main():
        now = [0.0]
        q, r = RenderQueue(2, trip_after=2, refuse_for=30, clock=lambda: now[0]), Renders()
        for i in range(2):
            with pytest.raises(TemplateOverBudget):
                await q.run("a", alive(), r(f"slow{i}", seconds=0, over_budget=True))
        with pytest.raises(ApiError) as e:
            await q.run("a", alive(), r("refused"))
        assert e.value.status == 429 and e.value.headers["Retry-After"] == "30" and "refused" not in r.started
        assert await q.run("b", alive(), r("other", seconds=0)) == "other"       # another client is not
        now[0] = 31.0                                                             # the while has passed...
        with pytest.raises(TemplateOverBudget):
            await q.run("a", alive(), r("slow-again", seconds=0, over_budget=True))
        with pytest.raises(ApiError):                                             # ...one more slow: refused
            await q.run("a", alive(), r("refused2"))
        now[0] = 62.0
        assert await q.run("a", alive(), r("again", seconds=0)) == "again"
        with pytest.raises(TemplateOverBudget):                                   # one in a row: not yet
            await q.run("a", alive(), r("slow2", seconds=0, over_budget=True))
        assert await q.run("a", alive(), r("fine", seconds=0)) == "fine"         # and a good one resets it
        with pytest.raises(TemplateOverBudget):
            await q.run("a", alive(), r("slow3", seconds=0, over_budget=True))
        assert await q.run("a", alive(), r("still", seconds=0)) == "still"
    run(main)


def test_close_answers_the_waiting_with_503_and_stops_the_running():
    async def main():
        q, r = RenderQueue(1), Renders()
        running = asyncio.ensure_future(q.run("a", alive(), r("run")))
        waiting = asyncio.ensure_future(q.run("b", alive(), r("wait")))
        await settle()
        q.close()
        for task in (running, waiting):
            with pytest.raises(ApiError) as e:
                await task
            assert e.value.status == 503 and "shutting down" in e.value.message
        assert r.started == ["run"] and r.stopped == ["run"]
        with pytest.raises(ApiError):
            await q.run("c", alive(), r("late"))
    run(main)
