"""`minillm serve`'s streaming bridge: from the engine thread's events to an HTTP reply.

The engine thread puts a request's events, ("token", id) ... ("done", reason), into an `Events`
queue; the handler on the event loop awaits them (one wake-up per put, nothing polls), turns ids
into text whole characters at a time with stop strings cut off (`Text`), and answers either
collected whole or as server-sent events (`Reply.sse`): OpenAI's chunks, a last chunk with the
finish reason ("abort" when the server ended the stream at shutdown), the usage if asked for, and
`data: [DONE]`. A client that leaves has its request cancelled at the engine's next step.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import queue
import time

from .api import completion, new_id, usage
from .chat_api import chat_chunk, new_chat_id


class Text:
    """Token ids to text as they come: whole UTF-8 characters only, and stop strings cut off.
    `push(id)` returns the text that may be shown now; text that could still turn into a stop
    string is held back until it cannot."""

    def __init__(self, stops: list[str], enc) -> None:
        self.enc = enc
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, token: int) -> str:
        self.text += self.utf8.decode(self.enc.decode_single_token_bytes(token))
        return self._release(final=False)

    def finish(self) -> str:
        if not self.stopped:
            self.text += self.utf8.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if not self.stopped:
            cut = min((i for i in (self.text.find(s) for s in self.stops) if i >= 0), default=-1)
            if cut >= 0:
                self.text, self.stopped = self.text[:cut], True
        end = len(self.text) if (final or self.stopped) else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent:end], end
        return out


class Events(queue.Queue):
    """A request's events: the engine thread puts (a plain queue.Queue to it), an asyncio handler
    awaits `get_async()`. Each put wakes the handler's event loop once; nothing polls, and no
    thread waits per request."""

    def __init__(self, aloop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.aloop = aloop
        self.ready = asyncio.Event()

    def _put(self, item) -> None:
        super()._put(item)
        try:
            self.aloop.call_soon_threadsafe(self.ready.set)
        except RuntimeError:                  # the event loop has closed: nobody is waiting
            pass

    async def get_async(self):
        while True:
            try:
                return self.get_nowait()
            except queue.Empty:
                pass
            self.ready.clear()
            try:                              # a put between the first try and clear() is not lost
                return self.get_nowait()
            except queue.Empty:
                pass
            await self.ready.wait()


class ClientGone(Exception):
    """The client closed its connection: nobody reads an answer."""


async def until_disconnect(receive) -> None:
    """Returns when the client has gone (after the request's body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def next_event(events: Events, gone: asyncio.Future, timeout: float | None):
    """The next event, or ClientGone if the client left first, or TimeoutError after `timeout`."""
    get = asyncio.ensure_future(events.get_async())
    done, _ = await asyncio.wait({get, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if get in done:
        return get.result()
    get.cancel()
    if gone in done:
        raise ClientGone
    raise TimeoutError


def chunk(body: dict) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Reply:
    """One request's answer, from its events. `front` gives the loop (to cancel), the model's name,
    whether the server is stopping, and the error for a failed request (`front.failure`)."""

    def __init__(self, front, served, creq, events: Events, chat: bool) -> None:
        self.front, self.served, self.creq, self.events, self.chat = front, served, creq, events, chat
        self.text = Text(creq.stop, front.enc)

    def take(self, event) -> tuple[str, str | None, bool]:
        """One event: (text to show, finish reason or None, whether the request has ended)."""
        what, value = event
        if what == "token":
            if value in self.served.request.seq.stop_ids:   # an end-of-sequence token ends the text, unshown
                return "", None, False
            piece = self.text.push(value)
            if self.text.stopped:
                self.front.loop.cancel(self.served)         # a stop string: the rest is not wanted
                return piece + self.text.finish(), "stop", True
            return piece, None, False
        return self.text.finish(), value, True

    async def sse(self, event):
        """The stream's bytes, from its first event on."""
        chat, front = self.chat, self.front
        cid, created, name = (new_chat_id() if chat else new_id()), int(time.time()), front.model_name
        ended = False
        try:
            if chat:
                yield chunk(chat_chunk(cid, name, created, role=True))
            while True:
                piece, finish, ended = self.take(event)
                if ended and finish == "cancelled" and front.stopping:
                    finish = "abort"          # the server is stopping: the stream still ends as streams end
                elif ended and finish not in ("stop", "length"):
                    yield b"data: " + json.dumps(front.failure(finish).body()).encode() + b"\n\n"
                    return                    # no [DONE]: the stream did not complete
                if chat and (piece or finish):
                    if piece:
                        yield chunk(chat_chunk(cid, name, created, content=piece))
                    if finish:
                        yield chunk(chat_chunk(cid, name, created, finish=finish))
                elif piece or finish:
                    yield chunk(completion(cid, name, piece, finish, None, created))
                if ended:
                    break
                event = await self.events.get_async()
            if self.creq.include_usage:
                used = usage(len(self.served.request.seq.prompt), self.served.request.n_tokens)
                if chat:
                    yield chunk(chat_chunk(cid, name, created, usage=used))
                else:
                    body = completion(cid, name, "", None, used, created)
                    body["choices"] = []
                    yield chunk(body)
            yield b"data: [DONE]\n\n"
        finally:
            if not ended:                     # the client left (Starlette cancelled us): stop the work
                front.loop.cancel(self.served)
                front.loop.metrics.inc("client_disconnects_total")
