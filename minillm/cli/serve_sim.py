"""`minillm serve-sim`: a workload through the scheduler, every step really run, and the numbers a
serving benchmark reports (throughput, time to first token, time between tokens, KV waste, prefix
hits, where the time went and what bound it)."""

from __future__ import annotations

import json

from rich import box
from rich.markup import escape
from rich.table import Table

from ..closeness import MIN_ROUNDS
from ..engine.scheduler import POLICIES
from ..errors import MiniLLMError
from ..measure.comparisons import comparison_threads
from ..paths import output_file
from ..measure.hardware import machine
from ..threads import blas_kernel, blas_threads, limited
from ..engine.engine import Engine
from ..serving.disagg import (OnThreads, colocated_summary, disaggregated_engines,
                              measure_copy_gbps, parse_split, run_interleaved)
from ..serving.metrics import RooflineClock, engine_for, merge_rounds, parse_slo, step_fit, summarize
from ..measure.busy import conditions
from ..serving.rates import ATTAINMENT, capacity_words, highest_rate, parse_rates, price_lines, rate_sweep, token_prices
from ..serving.workloads import WORKLOADS, WorkItem, load_workload, write_trace
from ..ui.live import LiveView
from ..ui.report import budget_verdict, diagnosis, disagg_verdict, favours, fmt_bytes, fmt_flops, fmt_time, slo_text
from ..measure.busy import busy_note
from .common import (add_batch_limits, add_kv_options, add_model, at_least_one, err, load_model, model_options, out,
                     parse_bytes, warm_up)

BUDGETS = (32, 128, 512, 2048, None)       # --compare budget; None: no chunking
COMPARE = {"policies": "sequential, static and continuous", "prefix-cache": "continuous without and with it",
           "block-size": "continuous at block sizes 8, 16, 32 and 64",
           "budget": "step token budgets 32, 128, 512, 2048 and no chunking",
           "disagg": "prefill/decode split against one engine, every engine on the same thread count, with "
                     "and without chunking"}
CLOCKS = ("roofline", "measured")          # --clock: what advances a run's simulated clock

def add_arguments(p) -> None:
    p.add_argument("--workload", default="poisson", metavar="NAME|FILE.jsonl",
                   help=f"{', '.join(WORKLOADS)}, or a JSONL trace of your own (default poisson)")
    p.add_argument("--rate", type=float, default=4.0, help="requests per second, Poisson arrivals (default 4)")
    p.add_argument("--rates", metavar="R1,R2,...", default=None,
                   help="sweep the request rate (the same seeded requests at each rate, interleaved) and find "
                        "the highest that keeps --attainment of requests within --slo: one engine's capacity "
                        "and its engine-hours per million tokens, e.g. --rates 0.5,1,2,4 --slo ttft=1,tpot=0.1")
    p.add_argument("--attainment", type=float, default=ATTAINMENT, metavar="SHARE",
                   help=f"with --rates: the share of requests that must meet every target (default {ATTAINMENT})")
    p.add_argument("--price-per-hour", type=float, default=None, metavar="USD",
                   help="with --rates: what an engine costs an hour, for the cost per million tokens")
    p.add_argument("--requests", type=int, default=64, help="how many requests (default 64)")
    p.add_argument("--repeats", type=int, default=None, metavar="N",
                   help="with --compare --clock measured: serve every configuration N times, all interleaved, "
                        "and rank a figure "
                        "only by a sign test on the paired rounds at 5%%, which needs 6 (default 6)")
    p.add_argument("--clock", default=None, metavar="{roofline,measured}",
                   help="what advances a run's clock each step. roofline: the step's price, max(its counted "
                        "bytes / bandwidth, its FLOPs / peak) at this machine's measured figures for the "
                        "threads asked for: the same every run, busy or not, so a comparison serves each "
                        "side once and no verdict can flip (the measured time is said beside it). measured: "
                        "the step's stopwatch time, this machine's real latency; a comparison serves "
                        "--repeats rounds and ranks by a sign test. Default: roofline with --compare or "
                        "--rates, measured for one run")
    p.add_argument("--seed", type=int, default=0, help="the workload's seed (default 0)")
    p.add_argument("--policy", default="continuous", choices=POLICIES, help="(default continuous)")
    p.add_argument("--compare", nargs="?", const="policies", choices=list(COMPARE), default=None, metavar="WHAT",
                   help="run the same workload several ways, side by side: " +
                        "; ".join(f"{k}: {v}" for k, v in COMPARE.items()) + " (default policies; WHAT is one of " + ", ".join(COMPARE) + ")")
    p.add_argument("--prefix-cache", action="store_true", help="share the KV blocks of common prompt prefixes")
    add_kv_options(p)
    add_batch_limits(p)
    p.add_argument("--slo", metavar="ttft=S,tpot=S", default=None,
                   help="latency targets in seconds (either alone): report goodput, the requests per second "
                        "that met every target, and the share that met each")
    p.add_argument("--disaggregate", metavar="P:D", default=None,
                   help="a prefill engine on P BLAS threads and a decode engine on D, KV sent between them")
    p.add_argument("--link-gbps", type=float, default=None,
                   help="the link the KV crosses, Gb/s (default: this machine's copy bandwidth; a real "
                        "link: 25 or 100)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); above, request i samples with seed SEED+i")
    add_model(p)
    p.add_argument("--json", action="store_true", help="a JSON list, one object per run, instead of tables")
    p.add_argument("--no-live", action="store_true", help="no live view (it is off anyway when stdout is not a terminal)")
    p.add_argument("--save-trace", metavar="FILE", help="write the workload as a JSONL trace, to replay or edit")


def budget_of(args) -> int:
    """The step token budget (--max-batched-tokens)."""
    return args.max_batched_tokens


def check(args) -> None:
    clock = getattr(args, "clock", None)
    if clock is not None and clock not in CLOCKS:
        raise MiniLLMError(f"--clock {clock}: give roofline (each step priced from its counted bytes and "
                           "FLOPs) or measured (each step's stopwatch time)")
    at_least_one(args, "requests", "block_size", "max_seqs", "max_batched_tokens")
    if args.repeats is not None and args.repeats < 1:
        raise MiniLLMError(f"--repeats {args.repeats}: must be at least 1")
    parse_bytes(args.kv_memory)
    if not args.rate > 0:
        raise MiniLLMError(f"--rate {args.rate}: requests per second must be more than 0")
    if not args.temperature >= 0:
        raise MiniLLMError(f"--temperature {args.temperature}: must be 0 (greedy) or more")
    args.slo_targets = parse_slo(args.slo)
    args.split = parse_split(args.disaggregate) if args.disaggregate else None
    args.rate_list = parse_rates(args.rates) if args.rates else None
    if args.rate_list is not None:
        if args.compare or args.disaggregate:
            raise MiniLLMError("--rates sweeps one engine's request rate: leave out --compare and --disaggregate")
        if not args.slo_targets:
            raise MiniLLMError("--rates needs latency targets to meet: add --slo ttft=S,tpot=S (either alone)")
        if not 0 < args.attainment <= 1:
            raise MiniLLMError(f"--attainment {args.attainment}: give a share above 0 and at most 1 (e.g. 0.9)")
    if clock is None:                      # comparisons and sweeps rank: on counts; one run: real latency
        clock = "roofline" if args.compare or args.rate_list is not None else "measured"
    args.clock = clock
    if clock == "roofline" and args.repeats is not None:
        raise MiniLLMError(f"--repeats {args.repeats}: the roofline clock serves each side once (its prices are "
                           "the same every run); rounds are for --clock measured")
    if args.price_per_hour is not None and not 0 < args.price_per_hour < float("inf"):
        raise MiniLLMError(f"--price-per-hour {args.price_per_hour}: must be a finite number above 0")
    if args.link_gbps is not None and not args.link_gbps > 0:
        raise MiniLLMError(f"--link-gbps {args.link_gbps}: the link's speed must be above 0 Gb/s")
    if args.disaggregate and args.compare not in (None, "disagg"):
        raise MiniLLMError(f"--disaggregate runs alone or with --compare disagg, not --compare {args.compare}")
    if (args.disaggregate or args.compare == "disagg") and args.kernels == "batch-invariant":
        raise MiniLLMError("--kernels batch-invariant does not work with disaggregation here: leave one of them out")
    if (args.disaggregate or args.compare == "disagg") and args.prefix_cache:
        raise MiniLLMError("--prefix-cache does not work with disaggregation here: leave one of them out")


def runs(args) -> list[dict]:
    """The engine settings of each run."""
    base = dict(policy=args.policy, prefix_cache=args.prefix_cache, block_size=args.block_size)
    if args.compare == "policies":
        return [{**base, "policy": p} for p in ("sequential", "static", "continuous")]
    if args.compare == "prefix-cache":
        return [{**base, "policy": "continuous", "prefix_cache": pc} for pc in (False, True)]
    if args.compare == "block-size":
        return [{**base, "policy": "continuous", "block_size": bs} for bs in (8, 16, 32, 64)]
    if args.compare == "budget":
        return [{**base, "policy": "continuous", "budget": b} for b in BUDGETS]
    return [base]


def label(run: dict, args) -> str:
    if args.compare == "prefix-cache":
        return "prefix cache" if run["prefix_cache"] else "no prefix cache"
    if args.compare == "block-size":
        return f"block size {run['block_size']}"
    if args.compare == "budget":
        return "no chunking" if run["budget"] is None else f"budget {run['budget']}"
    return run["policy"]


def no_chunking(model, args) -> int:
    """A budget no step can fill: every prompt runs whole, in the step that admits it."""
    return model.config.n_ctx * args.max_seqs


def make_engine(model, items: list[WorkItem], run: dict, args) -> Engine:
    budget = run.get("budget", budget_of(args)) or no_chunking(model, args)
    return engine_for(model, items, kv_memory=parse_bytes(args.kv_memory), block_size=run["block_size"],
                      prefix_cache=run["prefix_cache"], policy=run["policy"], max_seqs=args.max_seqs,
                      max_batched_tokens=budget, step_time=getattr(args, "step_time", None))


def result(engine: Engine, name: str, args, hw) -> dict:
    r = summarize(engine, name, hw, args.slo_targets)
    r["fit"] = step_fit(engine.steps)
    r["threads"], r["blas"] = blas_threads(), blas_kernel()
    return r


def simulate(model, items: list[WorkItem], run: dict, args, live: bool, hw) -> dict:
    engine = make_engine(model, items, run, args)
    name = label(run, args)
    if live:
        with LiveView(out, title=name) as view:
            engine.on_step = view
            engine.run()
    else:
        with err.status(f"serving {len(items)} requests: {escape(name)}…"):
            engine.run()
    return result(engine, name, args, hw)


def repeats_of(args) -> int:
    """Rounds of each configuration in a comparison: one on the roofline clock (every run the same);
    else --repeats, or closeness.MIN_ROUNDS (6: the fewest the verdict rule's sign test ranks)."""
    if getattr(args, "clock", None) == "roofline":
        return 1
    return args.repeats if args.repeats is not None else MIN_ROUNDS


def priced(args) -> str | None:
    """The roofline clock's words when the run is on it (the verdicts rank priced figures), else None."""
    c = getattr(args, "step_time", None)
    return c.words() if c is not None else None


def clock_line(args, hw) -> str:
    """The first line of a run's text: which clock its times are on."""
    if args.clock == "roofline":
        return (f"Clock: {args.step_time.words()} at {_threads(hw.blas_threads or 1)}: each step priced "
                "from its counted bytes and FLOPs, the same every run, busy or not; the measured time "
                "is said beside it.")
    rounds = f"; {repeats_of(args)} rounds of each, interleaved" if args.compare else ""
    return f"Clock: measured: each step advances the clock by its stopwatch time on this machine{rounds}."


def clock_json(args, hw) -> dict:
    """What --json carries of the clock, first in every object."""
    if args.clock != "roofline":
        return {"clock": "measured"}
    return {"clock": "roofline", "clock_priced_at": {"bandwidth_gbs": hw.bandwidth_gbs,
                                                     "peak_gflops": hw.peak_gflops,
                                                     "blas_threads": hw.blas_threads}}


def measured_beside(results: list[dict], threads) -> str | None:
    """On the roofline clock: what the model steps really took against their price (no verdict rests on it)."""
    shares = [r["roofline_share"] for r in results if r.get("roofline_share")]
    if not shares:
        return None
    x = lambda v: f"{v:,.0f}×" if v >= 100 else f"{v:.2g}×"  # noqa: E731
    lo, hi = x(1 / max(shares)), x(1 / min(shares))
    span = lo if lo == hi else f"{lo}-{hi}"
    return (f"[dim]Measured on {_threads(threads or 1)}, the model steps took {span} their price (every "
            "figure and verdict above is priced)[/]")


def sweep(model, items: list[WorkItem], args, hw, threads: int | None = None) -> tuple[list[dict], dict | None]:
    """--compare (policies, prefix-cache, block-size, budget): every configuration's engine on the same
    requests, each `repeats_of(args)` times, all stepped in turn (interleaved, on `threads`), merged per
    configuration with its rounds (`merge_rounds`); and one fit of step time against tokens over all
    their steps."""
    R = repeats_of(args)
    configs = runs(args)
    engines = [(label(r, args), [make_engine(model, items, r, args) for _ in range(R)]) for r in configs]
    with err.status(f"serving {len(items)} requests, {len(engines)} ways × {R} rounds, interleaved…"):
        run_interleaved([OnThreads(e, threads) for _, es in engines for e in es])
    results = [merge_rounds([result(e, name, args, hw) for e in es]) for name, es in engines]
    for r, c in zip(results, configs):
        r["budget"] = c.get("budget")
    return results, step_fit([s for _, es in engines for e in es for s in e.steps])


def _threads(n: int) -> str:
    return f"{n} BLAS thread{'s' if n != 1 else ''}"


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
    row("TBT p99 (TPOT p95)", lambda r: f"{_s(r['tbt_p99_s'])} ({_s(r['tpot_p95_s'])})")
    if results and "slo" in results[0]:
        row(f"goodput ({slo_text(results[0]['slo'])})",
            lambda r: f"{r['goodput_rps']:.2f}/s ({r['slo_met']['all']:.0%})")
        for k in results[0]["slo"]:
            row(f"  met {k.upper()}", lambda r, k=k: f"{r['slo_met'][k]:.0%}")
    row("worst stall: prompt tok, time", lambda r: "—" if not r.get("worst_stall") else
        f"{r['worst_stall']['prefill_tokens']}, {_s(r['worst_stall']['seconds'])}")
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


def run(args) -> int:
    check(args)
    model = load_model(args.model, args.weights, args.device, getattr(args, "kernels", None),
                       options=model_options(args))
    c = model.config
    items = load_workload(args.workload, rate=args.rate, n=args.requests, seed=args.seed,
                          vocab_size=c.vocab_size, n_ctx=c.n_ctx)
    if args.temperature > 0:
        items = [WorkItem(w.arrival, w.prompt, w.max_tokens, args.temperature, w.top_k, w.top_p,
                          args.seed + i if w.seed is None else w.seed) for i, w in enumerate(items)]
    if args.save_trace:
        write_trace(items, output_file(args.save_trace, "--save-trace"))
    hw = machine(progress=not args.json)        # at the threads asked for: the roofline clock's figures
    args.step_time = RooflineClock(hw) if args.clock == "roofline" else None
    live = not args.json and not args.no_live and out.is_terminal
    # every side of a comparison on one thread count: the one asked for, or one on a busy machine
    threads, why = comparison_threads(getattr(args, "threads", None), default=blas_threads())
    compares = bool(args.compare or args.split or args.rate_list)
    if not compares:                       # one run: its own threads, and the plain busy note
        threads = getattr(args, "threads", None)
        why = busy_note(threads)
    if why:                                # on stderr, --json too (the JSON carries it in `conditions`)
        err.print(f"[yellow]note:[/] {escape(why)}", soft_wrap=False)
    args.conditions = conditions(threads, why)
    args.run_threads = threads or blas_threads()
    if not args.json:
        out.print(clock_line(args, hw))
    warm_up(model, items[0].prompt, engine=True)    # compile time and first touches: not a step of any run
    if args.rate_list is not None:
        return rates(model, args, threads, hw)
    if args.split or args.compare == "disagg":
        return disagg(model, items, args, hw, threads)
    fit = None
    with limited(threads):
        if args.compare:
            results, fit = sweep(model, items, args, hw, threads)
        else:
            results = [simulate(model, items, r, args, live, hw) for r in runs(args)]
    if args.json:
        print(json.dumps([{**clock_json(args, hw), **r, "conditions": args.conditions} for r in results],
                         indent=2))
        return 0
    out.print(budget_table(results) if args.compare == "budget" else table(results))
    beside = measured_beside(results, args.run_threads)
    if beside:
        out.print(beside)
    if args.compare == "budget":
        out.print("[dim]budget: tokens one step may run (none: every prompt whole, no chunking); good/s: "
                  "requests per second that met every target; met: their share[/]")
        out.print(f"[dim]{escape(setting(args, results[0]))}; {rounds_words(args)}[/]")
        read = (model.nbytes() / (hw.bandwidth_gbs * 1e9)
                if priced(args) or hw.blas_threads == results[0].get("threads") else None)
        for line in budget_verdict(results, fit, args.slo_targets, weight_read_s=read, priced=priced(args)):
            out.print(line)
        return 0
    if args.compare:
        out.print(f"[dim]{escape(setting(args, results[0]))}; {rounds_words(args)}[/]")
        for key, what, high in (("output_tokens_per_s", "Throughput", True), ("ttft_p95_s", "TTFT p95", False),
                                ("tbt_p99_s", "The p99 gap between tokens", False)):
            out.print(favours(results, key, high, what, (lambda v: f"{v:.1f} tok/s") if high else fmt_time,
                              lambda r: r["policy"], priced(args)).replace("no budget stands out",
                                                                           "no run stands out"))
    for r in results:
        out.print(diagnosis(r))
    return 0


def rounds_words(args) -> str:
    return "one run of each (priced)" if priced(args) else f"{repeats_of(args)} rounds of each, interleaved"


def setting(args, r: dict) -> str:
    return (f"{args.requests} requests of {args.workload}, {args.rate:g}/s, seed {args.seed}; BLAS "
            f"threads {r.get('threads')}, kernel {r.get('blas') or 'unknown'}; steps interleaved"
            f"{'; batch-invariant kernels' if args.kernels == 'batch-invariant' else ''}")


REAL_LINK_GBPS = 25.0     # a real network link (25 GbE) beside this machine's memory copy


def rates(model, args, threads: int | None, hw=None) -> int:
    """--rates: the same seeded workload at each rate, one engine each, interleaved; the highest rate
    whose attainment meets the target, and what a token costs there."""
    with err.status(f"serving {args.requests} requests at {len(args.rate_list)} rates, interleaved…"):
        runs_ = rate_sweep(model, args.rate_list, args.slo_targets, workload=args.workload, n=args.requests,
                           seed=args.seed, threads=threads, kv_memory=parse_bytes(args.kv_memory),
                           block_size=args.block_size, prefix_cache=args.prefix_cache, policy=args.policy,
                           max_seqs=args.max_seqs, max_batched_tokens=budget_of(args),
                           step_time=getattr(args, "step_time", None))
    h = highest_rate(runs_, args.attainment)
    prices = None
    if h["run"] is not None and hw is not None:
        c = model.config
        kv_tok = 2 * c.n_layer * c.n_kv_head * c.head_dim * model.dtype.itemsize
        prices = token_prices(h["run"], kv_tok, hw.bandwidth_gbs)
        h["prices"] = prices
    if args.json:
        print(json.dumps({**clock_json(args, hw), "runs": runs_,
                          "capacity": {k: v for k, v in h.items() if k != "run"},
                          "conditions": args.conditions}, indent=2))
        return 0
    slo = slo_text(args.slo_targets)
    t = Table(title=f"serve-sim: goodput against the request rate; targets {slo}", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("rate", "tok/s", "TTFT p95", "TPOT p95", "goodput", "met"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in runs_:
        mark = " ◆" if r is h["run"] else ""
        t.add_row(f"{r['rate']:g}/s{mark}", f"{r['output_tokens_per_s']:.1f}", _s(r["ttft_p95_s"]),
                  _s(r["tpot_p95_s"]), f"{r['goodput_rps']:.2f}/s", f"{r['attainment']:.0%}")
    out.print(t)
    beside = measured_beside(runs_, threads)
    if beside:
        out.print(beside)
    out.print(f"[dim]{args.requests} requests of {args.workload}, seed {args.seed}, the same at every rate; "
              f"{_threads(threads or blas_threads() or 1)} for every rate; met: the share that met every "
              f"target; ◆ the highest rate where {args.attainment:.0%} did[/]")
    for line in capacity_words(h, slo, args.price_per_hour, priced=priced(args)):
        out.print(line)
    if prices:
        for line in price_lines(prices, args.price_per_hour):
            out.print(line)
    return 0


def clock_at(args, hw, n: int):
    """The roofline clock at n BLAS threads (this machine's figures for n, measured once and cached)."""
    if args.step_time is None or n == hw.blas_threads:
        return args.step_time
    with limited(n):
        return RooflineClock(machine(progress=not args.json))


def disagg(model, items: list[WorkItem], args, hw, threads: int | None = None) -> int:
    """--disaggregate P:D, and --compare disagg: the split against one engine, every engine's steps on
    the same thread count (T:T beside T; one thread when the machine is busy). On the roofline clock
    each engine is priced, and named, at the threads asked for (busy or not: the same run), and the
    link, unless given, is priced as a copy in this machine's memory."""
    T = threads or 1
    p, d = args.split or (T, T)
    if args.split and threads == 1 and (p, d) != (1, 1) and comparison_threads(getattr(args, "threads", None),
                                                                                default=blas_threads())[1]:
        p, d = 1, 1                          # busy: every side on one thread (the note above said so)
    A = hw.blas_threads or T                 # the threads asked for: what the roofline clock prices at
    pp, pd = (args.split or (A, A)) if priced(args) else (p, d)     # the split's names and prices
    kv = parse_bytes(args.kv_memory)
    if args.link_gbps is not None:
        link, link_name = args.link_gbps, "given"
    elif priced(args):
        link, link_name = args.step_time.copy_gbps(), "priced as a copy in this machine's memory"
    else:
        with err.status("measuring this machine's copy bandwidth…"):
            link = measure_copy_gbps()
        link_name = "this machine's copy"
    kw = dict(block_size=args.block_size, max_seqs=args.max_seqs)
    budget = budget_of(args)
    R = repeats_of(args) if args.compare == "disagg" else 1
    runners = []                                   # (name, [one runner per round])
    if args.compare == "disagg":
        one = clock_at(args, hw, pp if pp == pd else A)
        for b, name in ((budget, f"one, chunk {budget}"), (no_chunking(model, args), "one, whole")):
            runners.append((name, [OnThreads(engine_for(model, items, kv_memory=2 * kv, max_batched_tokens=b,
                                                        step_time=one, **kw),
                                             p if p == d else T) for _ in range(R)]))
    links = [link] + ([REAL_LINK_GBPS] if args.compare == "disagg" and abs(link - REAL_LINK_GBPS) > 1e-9 else [])
    for g in links:
        splits = [disaggregated_engines(model, items, p_threads=p, d_threads=d, link_gbps=g, kv_memory=kv,
                                        max_batched_tokens=budget, step_time=clock_at(args, hw, pp), **kw)
                  for _ in range(R)]
        for sp in splits:
            if priced(args) and pd != pp:
                sp.decode.step_time = clock_at(args, hw, pd)     # each engine at its own thread count's figures
        runners.append((f"split {pp}:{pd} {g:.3g}G", splits))
    with err.status(f"serving {len(items)} requests, {len(runners)} ways × {R} rounds, interleaved…"):
        run_interleaved([r for _, rs in runners for r in rs])
    results = []
    for name, rs in runners:
        summaries = [colocated_summary(r.engine, r.threads, args.slo_targets, name) if isinstance(r, OnThreads)
                     else r.summary(args.slo_targets, name) for r in rs]
        s = merge_rounds(summaries)
        s["blas"] = blas_kernel()
        if priced(args):                   # priced at the threads asked for; the steps ran on run_threads
            s["run_threads"] = s["threads"]
            s["threads"] = (pp if pp == pd else A) if s["split"] == "colocated" else pp + pd
            if s["split"] != "colocated":
                s["split"] = f"{pp}:{pd}"
        results.append(s)
    if args.json:
        print(json.dumps([{**clock_json(args, hw), **r, "conditions": args.conditions} for r in results],
                         indent=2))
        return 0
    out.print(disagg_table(results))
    beside = measured_beside(results, p if p == d else f"{p}:{d}")
    if beside:
        out.print(beside)
    out.print(f"[dim]{escape(setting(args, {'threads': f'{p}:{d}', 'blas': blas_kernel()}))}; link "
              f"{link:.3g} Gb/s ({link_name}); the split's engines have {args.kv_memory} of KV each, the one "
              f"engine both; {rounds_words(args)}[/]")
    for line in disagg_verdict(results, priced=priced(args)):
        out.print(line)
    return 0


def disagg_table(results: list[dict]) -> Table:
    """One row per run, so it fits 80 columns."""
    slo = results[0].get("slo") if results else None
    cols = [("run", lambda r: escape(r["label"])), ("tok/s", lambda r: f"{r['output_tokens_per_s']:.1f}"),
            ("TTFT95", lambda r: _s(r["ttft_p95_s"])), ("TPOT95", lambda r: _s(r["tpot_p95_s"])),
            ("TBT99", lambda r: _s(r["tbt_p99_s"]))]
    if slo:
        cols.append(("good/s", lambda r: f"{r['goodput_rps']:.2f}"))
    cols += [("KV sent", lambda r: fmt_bytes(r["kv_bytes_moved"])),
             ("busy", lambda r: "/".join(f"{b:.0%}" for b in r["busy"]))]
    t = Table(title="serve-sim: prefill/decode split" + (f"; goodput: {slo_text(slo)}" if slo else ""),
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, caption_justify="left",
              padding=(0, 1, 0, 1), collapse_padding=True,
              caption="one: one engine on as many threads as each of the split's, prompts in chunks or whole; "
                      "split P:D at a link of G Gb/s; 95, 99: percentiles; busy: share of the run each "
                      "engine's steps took")
    for name, _ in cols:
        t.add_column(name, justify="left" if name == "run" else "right", no_wrap=True, min_width=len(name))
    for r in results:
        t.add_row(*[fn(r) for _, fn in cols])
    return t


def budget_table(results: list[dict]) -> Table:
    """--compare budget: one row per budget, so it fits 80 columns."""
    slo = results[0].get("slo") if results else None
    cols = [("budget", lambda r: "none" if r["budget"] is None else str(r["budget"])),
            ("tok/s", lambda r: f"{r['output_tokens_per_s']:.1f}"),
            ("TTFT p50", lambda r: _s(r["ttft_p50_s"])), ("p95", lambda r: _s(r["ttft_p95_s"])),
            ("TBT p95", lambda r: _s(r["tbt_p95_s"])), ("p99", lambda r: _s(r["tbt_p99_s"]))]
    if slo:
        cols.append(("good/s", lambda r: f"{r['goodput_rps']:.2f}"))
        cols.append(("met", lambda r: f"{r['slo_met']['all']:.0%}"))
    t = Table(title="serve-sim: step token budget" + (f"; goodput: {slo_text(slo)}" if slo else ""),
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, _ in cols:
        t.add_column(name, justify="right")
    for r in results:
        t.add_row(*[fn(r) for _, fn in cols])
    return t
