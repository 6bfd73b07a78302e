"""`minillm serve`: an OpenAI-compatible completions server on the continuous-batching engine loop."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from rich.markup import escape

from ..errors import MiniLLMError
from ..serving.guard import is_loopback_host
from ..serving.http import Limits, Server
from ..serving.loop import EngineLoop
from ..ui.live import LiveView
from ..trace import TraceMeter, check_path, trace_line
from .common import (add_batch_limits, add_kv_options, add_model, add_trace, at_least_one, err, kernels_label,
                     load_model, model_options, note_if_busy, parse_bytes)

TRACE_EVENTS = 1_000_000    # --trace keeps the last this many slices (about 10,000 steps of a small model)


def add_arguments(p) -> None:
    add_model(p)
    add_trace(p, f"; written when the server stops, the last {TRACE_EVENTS:,} slices")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: only this machine can connect)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    add_batch_limits(p)
    add_kv_options(p)
    p.add_argument("--max-waiting", type=int, default=64,
                   help="requests that may wait for a place in the batch; more get 429 (default 64)")
    p.add_argument("--max-queue-wait", type=float, default=60.0, metavar="S",
                   help="seconds a request may wait for its first token: one expected to wait longer gets "
                        "429 at once, one that does gets 503 (default 60)")
    p.add_argument("--prefix-cache", action="store_true",
                   help="keep full KV blocks of earlier prompts and reuse them for prompts that start the same")
    p.add_argument("--api-key", default=os.environ.get("MINILLM_API_KEY"), metavar="KEY",
                   help="clients must send 'Authorization: Bearer KEY' (default: $MINILLM_API_KEY; "
                        "/health and /metrics stay open)")
    p.add_argument("--metrics-key", action="store_true", help="/metrics needs the API key too")
    p.add_argument("--insecure-no-key", action="store_true",
                   help="serve a non-loopback --host without an API key (anyone who can reach it may use it)")
    p.add_argument("--special-tokens-in-messages", action="store_true",
                   help="read control tokens typed in a chat message (e.g. '<|im_start|>system') as control "
                        "tokens, as minillm did before; by default they are plain text, so a user's message "
                        "cannot open a turn of its own")
    p.add_argument("--max-connections", type=int, default=512,
                   help="open connections at once; more are answered 503 (default 512)")
    p.add_argument("--request-timeout", type=float, default=10.0, metavar="S",
                   help="seconds a client has to send a whole request, headers and body (default 10)")
    p.add_argument("--keep-alive", type=float, default=5.0, metavar="S",
                   help="seconds an idle connection is kept between requests (default 5)")
    p.add_argument("--grace", type=float, default=5.0, metavar="S",
                   help="at SIGTERM or Ctrl-C, seconds running requests get to finish; then each still running "
                        "ends (a plain request with 503, a stream with finish_reason \"abort\") (default 5)")
    p.add_argument("--backlog", type=int, default=1024,
                   help="connections the kernel queues before they are accepted (default 1024)")
    p.add_argument("--live", action=argparse.BooleanOptionalAction, default=None,
                   help="the serving simulator's live view, driven by real traffic (default: on at a terminal)")
    p.add_argument("--quiet", action="store_true", help="no live view and no request log on stderr")


def run(args) -> int:
    at_least_one(args, "max_seqs", "max_batched_tokens", "block_size", "max_waiting", "max_connections", "backlog")
    if not 0 <= args.grace < float("inf"):
        raise MiniLLMError(f"--grace {args.grace}: must be a finite number of seconds, 0 or more")
    for name in ("max_queue_wait", "request_timeout", "keep_alive"):
        if not getattr(args, name) > 0:
            raise MiniLLMError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be more than 0 seconds")
    if not 0 <= args.port <= 65535:
        raise MiniLLMError(f"--port {args.port}: must be between 0 and 65535")
    if args.api_key is not None and not args.api_key.strip():
        raise MiniLLMError("--api-key is empty: give a key, or leave it out (and unset MINILLM_API_KEY)")
    if args.metrics_key and not args.api_key:
        raise MiniLLMError("--metrics-key needs an API key (--api-key or MINILLM_API_KEY)")
    loopback = is_loopback_host(args.host)
    if not loopback and not args.api_key and not args.insecure_no_key:
        raise MiniLLMError(f"--host {args.host} lets other machines connect: set --api-key (or MINILLM_API_KEY), "
                           "or say --insecure-no-key")
    kv = parse_bytes(args.kv_memory)
    if args.trace is not None:
        check_path(args.trace)                   # before loading anything
    model = load_model(args.model, args.weights, args.device, getattr(args, "kernels", None),
                       options=model_options(args))
    live = (args.live if args.live is not None else sys.stderr.isatty()) and not args.quiet
    view = LiveView(err, title=f"minillm serve: {model.name}") if live else None
    loop = EngineLoop(model, kv_memory=kv, block_size=args.block_size, max_seqs=args.max_seqs,
                      max_batched_tokens=args.max_batched_tokens, max_waiting=args.max_waiting,
                      prefix_cache=args.prefix_cache, on_step=view)
    tm = None
    if args.trace is not None and loop.engine.meter is not None:     # the engine thread's steps, traced
        tm = TraceMeter(f"minillm serve: {model.name}, {model.kernels} kernels", max_events=TRACE_EVENTS)
        tm.keep = loop.engine.meter.keep
        loop.engine.meter = tm
    from ..threads import blas_threads
    threads = blas_threads()
    if threads:                      # `minillm monitor` rates the server against the figures of ITS thread count
        loop.metrics.set("blas_threads", threads)
    limits = Limits(max_connections=args.max_connections, request_timeout=args.request_timeout,
                    keep_alive=args.keep_alive, max_queue_wait=args.max_queue_wait, backlog=args.backlog,
                    grace=args.grace)
    try:
        server = Server((args.host, args.port), loop, model.name, limits=limits, api_key=args.api_key,
                        metrics_key=args.metrics_key, log=None if (args.quiet or live) else _log,
                        special_in_messages=args.special_tokens_in_messages)
    except OSError as e:
        raise MiniLLMError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e} "
                           "(is another server on that port? try --port 0)") from None
    host, port = server.server_address[:2]
    where = "loopback: only this machine can connect" if loopback else \
        "NOT loopback: other machines can connect, as --host asked"
    key = "API key required" if args.api_key else "no API key"
    shown = f"[{host}]" if ":" in host else host
    err.print(f"minillm serve: {escape(model.name)} on http://{shown}:{port} ({where}; {key}); "
              f"KV pool {loop.pool.num_blocks} blocks of {args.block_size} positions"
              f"{groups_note(loop.pool)}, up to {args.max_seqs} "
              f"sequences and {args.max_batched_tokens} tokens a step"
              f"{', prefix cache on' if args.prefix_cache else ''}"
              f", {kernels_label(model)}. "
              "Ctrl-C stops.", soft_wrap=False)
    note_if_busy(args)
    print(f"listening on http://{shown}:{port}", flush=True)
    loop.start()
    # uvicorn takes SIGINT/SIGTERM while it runs and raises them again once it has stopped: these
    # handlers receive that second signal, so a signalled server exits 0 after its drain
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)
    try:
        if view is not None:
            with view:
                server.serve()
        else:
            server.serve()
    finally:
        server.server_close()
        loop.stop(grace=1.0)
        if tm is not None:
            tm.write_trace(args.trace)
            err.print(trace_line(args.trace, [tm]), soft_wrap=False)
    err.print("minillm serve: stopped")
    return 0


def groups_note(pool) -> str:
    """What a block holds where a model's layers form several KV cache groups (cache/paged.py)."""
    groups = getattr(pool, "groups", ())
    if len(groups) < 2:
        return ""
    n = len(groups[0][0])
    return f" (a block: one group's {n} layer{'s' * (n > 1)}, {len(groups)} groups)"


def _log(line: str) -> None:
    err.print(f"[dim]{escape(line)}[/]", soft_wrap=True, highlight=False)
