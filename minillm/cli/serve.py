"""`minillm serve`: an OpenAI-compatible completions server on the continuous-batching engine loop."""

from __future__ import annotations

import argparse
import ipaddress
import signal
import sys
import threading

from rich.markup import escape

from ..errors import MiniLLMError
from ..serving.http import Server
from ..serving.loop import EngineLoop
from ..ui.live import LiveView
from .common import add_batch_limits, add_kv_options, add_model, at_least_one, err, load_model, note_if_busy, parse_bytes


def add_arguments(p) -> None:
    add_model(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: only this machine can connect)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    add_batch_limits(p)
    add_kv_options(p)
    p.add_argument("--max-waiting", type=int, default=64,
                   help="requests that may wait for a place in the batch; more get 429 (default 64)")
    p.add_argument("--prefix-cache", action="store_true",
                   help="keep full KV blocks of earlier prompts and reuse them for prompts that start the same")
    p.add_argument("--live", action=argparse.BooleanOptionalAction, default=None,
                   help="the serving simulator's live view, driven by real traffic (default: on at a terminal)")
    p.add_argument("--quiet", action="store_true", help="no live view and no request log on stderr")


def run(args) -> int:
    at_least_one(args, "max_seqs", "max_batched_tokens", "block_size", "max_waiting")
    if not 0 <= args.port <= 65535:
        raise MiniLLMError(f"--port {args.port}: must be between 0 and 65535")
    kv = parse_bytes(args.kv_memory)
    model = load_model(args.model)
    live = (args.live if args.live is not None else sys.stderr.isatty()) and not args.quiet
    view = LiveView(err, title=f"minillm serve: {model.name}") if live else None
    loop = EngineLoop(model, kv_memory=kv, block_size=args.block_size, max_seqs=args.max_seqs,
                      max_batched_tokens=args.max_batched_tokens, max_waiting=args.max_waiting,
                      prefix_cache=args.prefix_cache, on_step=view)
    try:
        server = Server((args.host, args.port), loop, model.name,
                        log=None if (args.quiet or live) else _log)
    except OSError as e:
        raise MiniLLMError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e} "
                           "(is another server on that port? try --port 0)") from None
    host, port = server.server_address[:2]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    where = "loopback: only this machine can connect" if loopback else \
        "NOT loopback: other machines can connect, as --host asked"
    err.print(f"minillm serve: {escape(model.name)} on http://{host}:{port} ({where}); "
              f"KV pool {loop.pool.num_blocks} blocks of {args.block_size} positions, up to {args.max_seqs} "
              f"sequences and {args.max_batched_tokens} tokens a step"
              f"{', prefix cache on' if args.prefix_cache else ''}. "
              "Ctrl-C stops.", soft_wrap=False)
    note_if_busy(args)
    print(f"listening on http://{host}:{port}", flush=True)
    loop.start()

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        if view is not None:
            with view:
                server.serve_forever(poll_interval=0.2)
        else:
            server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        loop.stop(grace=5.0)
    err.print("minillm serve: stopped")
    return 0


def _log(line: str) -> None:
    err.print(f"[dim]{escape(line)}[/]", soft_wrap=True)
