"""A live view of the engine while it runs: the running sequences and their progress, the KV block
map filling and freeing, the queue, tokens/s, and (◆) the step in which prompt tokens held the
running decodes longest so far: seconds x decodes waiting. Drawn with rich's Live; only on a terminal.

    block map:  █ held by a running sequence   ▓ shared by several   ░ cached, nobody holds it
                (a hit takes it back; a new allocation may evict it)   · free
"""

from __future__ import annotations

import time

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

MAX_ROWS = 12          # running sequences shown
MAX_BLOCKS = 512       # block map cells shown (a bigger pool is sampled)


GLYPHS = {"shared": ("▓", "magenta"), "held": ("█", "green"), "cached": ("░", "cyan"), "free": ("·", "dim")}


def block_map(engine) -> Text:
    m = engine.blocks
    text = Text()
    for state in m.block_states(stride=max(1, -(-m.num_blocks // MAX_BLOCKS))):
        text.append(*GLYPHS[state])
    return text


def render(engine, title: str = "", stall: dict | None = None) -> Group:
    sched, steps = engine.scheduler, engine.steps
    now = engine.now()
    recent = [steps[-i] for i in range(1, min(20, len(steps)) + 1)]   # the last 20 steps
    span = sum(s.seconds for s in recent)
    through = sum(s.n_tokens for s in recent)     # positions run in the last steps
    done = sum(1 for r in engine.requests.values() if r.done)
    total_out = sum(len(r.output) for r in engine.requests.values())
    head = Text.assemble(                           # three short lines: each fits 80 columns
        (f"{title}\n", "bold"), f"t = {now:7.2f} s   ",
        f"running {len(sched.running):3d}   waiting {sum(1 for s in sched.waiting if s.arrival <= now):3d}   ",
        f"done {done}/{len(engine.requests)}\n",
        f"tokens out {total_out} ({total_out / now if now else 0.0:.1f}/s)   ",
        f"positions run {through / span if span else 0.0:.0f}/s   ",
        f"preemptions {sched.preemptions}")
    table = Table(box=None, pad_edge=False, show_edge=False)
    table.add_column("req", justify="right")
    table.add_column("prompt", justify="right")
    table.add_column("progress")
    table.add_column("KV blocks", justify="right")
    for s in sched.running[:MAX_ROWS]:
        req = engine.request_of(s)
        width = 30
        filled = int(width * len(s.output) / s.max_new_tokens)
        prefill = s.n_pending > 1
        bar = Text("█" * filled + "·" * (width - filled), style="yellow" if prefill else "green")
        bar.append(f" {len(s.output)}/{s.max_new_tokens}" + ("  prefill" if prefill else ""))
        table.add_row(str(req.id), str(len(s.prompt)), bar, str(engine.blocks.blocks_held(s)))
    if len(sched.running) > MAX_ROWS:
        table.add_row("…", "", Text(f"{len(sched.running) - MAX_ROWS} more"), "")
    m = engine.blocks
    kv = Text(f"KV blocks: {m.num_blocks - m.n_free} held, {m.n_free} free of {m.num_blocks} "
              f"(block size {m.block_size}); prefix hit rate {m.hit_rate:.0%}")
    parts = [head, table, kv, block_map(engine)]
    if stall is not None:      # the step in which a prompt held the running decodes longest so far
        parts.append(Text(f"◆ stall: step {stall['step']}, t {stall['start_s']:.2f} s: "
                          f"{stall['prefill_tokens']} prompt tokens held {stall['decode_tokens']} "
                          f"decodes {stall['seconds'] * 1e3:.0f} ms", style="red"))
    return Group(*parts)


class LiveView:
    """An engine's on_step callback that redraws the view (at most `fps` times a second)."""

    def __init__(self, console, title: str = "", fps: float = 8.0) -> None:
        self.live = Live(console=console, auto_refresh=False, transient=False)
        self.title, self.min_gap = title, 1.0 / fps
        self._last = -1.0
        self.stall: dict | None = None
        self._n = 0

    def __enter__(self) -> "LiveView":
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)

    def __call__(self, engine, info) -> None:
        self._n += 1
        if info.prefill_tokens and info.decode_tokens and (
                self.stall is None or info.seconds * info.decode_tokens
                > self.stall["seconds"] * self.stall["decode_tokens"]):
            self.stall = {"step": self._n, "start_s": info.start, "seconds": info.seconds,
                          "prefill_tokens": info.prefill_tokens, "decode_tokens": info.decode_tokens}
        t = time.perf_counter()
        if t - self._last < self.min_gap and engine.has_work:
            return
        self._last = t
        self.live.update(render(engine, self.title, self.stall), refresh=True)
