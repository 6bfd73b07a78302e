"""`minillm serve-sim`: a workload through the scheduler, every step really run, and the numbers a
serving benchmark reports (throughput, time to first token, time between tokens, KV waste, prefix
hits, where the time went and what bound it)."""

from __future__ import annotations

import json

from rich.markup import escape
from rich.table import Table

from ..engine.scheduler import POLICIES
from ..errors import MiniLLMError
from ..measure.hardware import machine
from ..serving.metrics import serve
from ..serving.workloads import WORKLOADS, WorkItem, load_workload, write_trace
from ..ui.live import LiveView
from ..ui.report import fmt_flops, fmt_time
from .common import (add_batch_limits, add_kv_options, add_model, at_least_one, err, load_model, note_if_busy, out,
                     parse_bytes)

COMPARE = {"policies": "sequential, static and continuous", "prefix-cache": "continuous without and with it",
           "block-size": "continuous at block sizes 8, 16, 32 and 64"}


def add_arguments(p) -> None:
    p.add_argument("--workload", default="poisson", metavar="NAME|FILE.jsonl",
                   help=f"{', '.join(WORKLOADS)}, or a JSONL trace of your own (default poisson)")
    p.add_argument("--rate", type=float, default=4.0, help="requests per second, Poisson arrivals (default 4)")
    p.add_argument("--requests", type=int, default=64, help="how many requests (default 64)")
    p.add_argument("--seed", type=int, default=0, help="the workload's seed (default 0)")
    p.add_argument("--policy", default="continuous", choices=POLICIES, help="(default continuous)")
    p.add_argument("--compare", nargs="?", const="policies", choices=list(COMPARE), default=None,
                   help="run the same workload several ways, side by side: " +
                        "; ".join(f"{k}: {v}" for k, v in COMPARE.items()) + " (default policies)")
    p.add_argument("--prefix-cache", action="store_true", help="share the KV blocks of common prompt prefixes")
    add_kv_options(p)
    add_batch_limits(p)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); above, request i samples with seed SEED+i")
    add_model(p)
    p.add_argument("--json", action="store_true", help="a JSON list, one object per run, instead of tables")
    p.add_argument("--no-live", action="store_true", help="no live view (it is off anyway when stdout is not a terminal)")
    p.add_argument("--save-trace", metavar="FILE", help="write the workload as a JSONL trace, to replay or edit")


def check(args) -> None:
    at_least_one(args, "requests", "block_size", "max_seqs", "max_batched_tokens")
    parse_bytes(args.kv_memory)
    if not args.rate > 0:
        raise MiniLLMError(f"--rate {args.rate}: requests per second must be more than 0")
    if not args.temperature >= 0:
        raise MiniLLMError(f"--temperature {args.temperature}: must be 0 (greedy) or more")


def runs(args) -> list[dict]:
    """The engine settings of each run."""
    base = dict(policy=args.policy, prefix_cache=args.prefix_cache, block_size=args.block_size)
    if args.compare == "policies":
        return [{**base, "policy": p} for p in ("sequential", "static", "continuous")]
    if args.compare == "prefix-cache":
        return [{**base, "policy": "continuous", "prefix_cache": pc} for pc in (False, True)]
    if args.compare == "block-size":
        return [{**base, "policy": "continuous", "block_size": bs} for bs in (8, 16, 32, 64)]
    return [base]


def label(run: dict, args) -> str:
    if args.compare == "prefix-cache":
        return "prefix cache" if run["prefix_cache"] else "no prefix cache"
    if args.compare == "block-size":
        return f"block size {run['block_size']}"
    return run["policy"]


def simulate(model, items: list[WorkItem], run: dict, args, live: bool, hw) -> dict:
    """One run of the workload, shown live (or with a spinner on stderr); its summary."""
    name = label(run, args)
    engine_kw = dict(kv_memory=parse_bytes(args.kv_memory), block_size=run["block_size"],
                     prefix_cache=run["prefix_cache"], policy=run["policy"], max_seqs=args.max_seqs,
                     max_batched_tokens=args.max_batched_tokens)
    if live:
        with LiveView(out, title=name) as view:
            return serve(model, items, label=name, hw=hw, on_step=view, **engine_kw)[0]
    with err.status(f"serving {len(items)} requests: {escape(name)}…"):
        return serve(model, items, label=name, hw=hw, **engine_kw)[0]


def _s(x) -> str:
    return "—" if x is None else fmt_time(x)


def table(results: list[dict]) -> Table:
    t = Table(title="serve-sim", title_justify="left")
    t.add_column("")
    for r in results:
        t.add_column(r["policy"], justify="right")

    def row(name, fn):
        t.add_row(name, *[fn(r) for r in results])

    row("output tokens/s", lambda r: f"{r['output_tokens_per_s']:.1f}")
    row("duration", lambda r: _s(r["duration_s"]))
    row("steps (mean batch)", lambda r: f"{r['steps']} ({r['mean_batch']:.1f})")
    for k in ("ttft", "tbt", "e2e"):
        row(f"{k.upper()} p50 / p95", lambda r, k=k: f"{_s(r[f'{k}_p50_s'])} / {_s(r[f'{k}_p95_s'])}")
    row("prefill tokens (FLOPs)", lambda r: f"{r['prefill_tokens']:,} ({fmt_flops(r['prefill_flops'])})")
    row("prefix hit rate", lambda r: f"{r['prefix_hit_rate']:.0%}" if r["prefix_cache"] else "off")
    row("preemptions", lambda r: str(r["preemptions"]))
    row("KV waste: paged (contiguous)",
        lambda r: f"{r['kv_waste']:.1%} ({r['kv_waste_contiguous']:.1%})")
    for kind in ("prefill", "mixed", "decode"):
        def ph(r, kind=kind):
            d = r["phases"].get(kind)
            if not d:
                return "—"
            bound = f", {d['bound']}-bound" if "bound" in d else ""
            return f"{d['share']:.0%} of time{bound}"
        row(f"{kind} steps", ph)
    return t


def diagnosis(r: dict) -> str:
    ph = r["phases"]
    pre = sum(ph[k]["seconds"] for k in ("prefill", "mixed") if k in ph)
    dec = ph.get("decode", {}).get("seconds", 0.0)
    if pre > dec:
        return (f"{escape(r['policy'])}: steps with prompt tokens took {pre / (pre + dec):.0%} of the time: prefill-bound "
                "work (compute); prefix caching and chunked prefill are what help")
    return (f"{escape(r['policy'])}: decode steps took {dec / (pre + dec or 1):.0%} of the time: decode is memory-bound; "
            "bigger batches (continuous batching, more KV memory) are what help")


def run(args) -> int:
    check(args)
    model = load_model(args.model)
    c = model.config
    items = load_workload(args.workload, rate=args.rate, n=args.requests, seed=args.seed,
                          vocab_size=c.vocab_size, n_ctx=c.n_ctx)
    if args.temperature > 0:
        items = [WorkItem(w.arrival, w.prompt, w.max_tokens, args.temperature, w.top_k, w.top_p,
                          args.seed + i if w.seed is None else w.seed) for i, w in enumerate(items)]
    if args.save_trace:
        write_trace(items, args.save_trace)
    hw = machine(progress=not args.json)
    if not args.json:
        note_if_busy(args)
    live = not args.json and not args.no_live and out.is_terminal
    results = [simulate(model, items, r, args, live, hw) for r in runs(args)]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    out.print(table(results))
    for r in results:
        out.print(diagnosis(r))
    return 0
