"""`minillm loadgen`: send a workload to a running `minillm serve` (or any OpenAI-compatible server)
and report what clients felt."""

from __future__ import annotations

import json
import os

from rich.table import Table

from ..serving.engines import TIE
from ..serving.loadgen import run_load
from ..serving.metrics import parse_slo
from ..serving.workloads import WORKLOADS
from ..measure.busy import conditions
from .common import err, load_model, out


def add_arguments(p) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000",
                   help="the server: minillm serve, or any OpenAI-compatible one such as vLLM or llama.cpp's "
                        "llama-server (default http://127.0.0.1:8000)")
    p.add_argument("--api-key", default=os.environ.get("MINILLM_API_KEY") or os.environ.get("OPENAI_API_KEY"),
                   help="sent as 'Authorization: Bearer KEY' (default: $MINILLM_API_KEY or $OPENAI_API_KEY)")
    p.add_argument("--model", default=None, help="the model field to send (default: the first of /v1/models)")
    p.add_argument("--tokenizer", metavar="MODEL", default=None,
                   help="measure the prompts' lengths with this model's tokenizer (a name or path minillm loads, "
                        "e.g. smollm2-135m): the served model's, for exact lengths (default: GPT-2's)")
    p.add_argument("--workload", default="poisson", metavar="NAME|FILE.jsonl",
                   help=f"{', '.join(WORKLOADS)} (serve-sim's workloads, same seed same requests), or a JSONL "
                        "trace (default poisson)")
    p.add_argument("--rate", type=float, default=2.0, help="requests per second, Poisson arrivals (default 2)")
    p.add_argument("--requests", type=int, default=32, help="how many requests (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrival times and lengths (default 0)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take (default 300)")
    p.add_argument("--slo", metavar="ttft=S,tpot=S", default=None,
                   help="latency targets in seconds (either alone): report goodput, the requests per second "
                        "that met every target, and the share that met each")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")


def run(args) -> int:
    slo = parse_slo(args.slo)
    enc, enc_name = None, "GPT-2"
    if args.tokenizer:
        from ..bpe import tokenizer
        model = load_model(args.tokenizer)
        enc, enc_name = tokenizer(model), model.name
    cond = conditions()                  # this machine: the clients' (and, on loopback, the server's)
    if cond["busy"]:
        err.print(f"[yellow]note:[/] {cond['busy']} (the client's machine: on loopback, the server's too)",
                  soft_wrap=False)
    with err.status(f"{args.requests} requests at {args.rate:g}/s to {args.url}…"):
        r = run_load(args.url, args.workload, args.rate, args.requests, args.seed, args.timeout, slo,
                     api_key=args.api_key, model=args.model, tokenizer=enc, tokenizer_name=enc_name)
    r["conditions"] = cond
    if args.json:
        print(json.dumps(r))
        return 0 if not r["errors"] else 2
    ms = lambda s: "-" if s is None else f"{s * 1e3:.0f} ms"  # noqa: E731
    t = Table(title=f"{r['workload']} at {r['rate']:g} req/s: {r['ok']} of {r['requests']} ok", title_justify="left")
    for col in ("", "p50", "p95"):
        t.add_column(col, justify="right")
    t.add_row("time to first token", ms(r["ttft_p50_s"]), ms(r["ttft_p95_s"]))
    t.add_row("time between tokens", ms(r["tbt_p50_s"]), ms(r["tbt_p95_s"]))
    t.add_row("time per output token", ms(r["tpot_p50_s"]), ms(r["tpot_p95_s"]))
    t.add_row("end to end", ms(r["e2e_p50_s"]), ms(r["e2e_p95_s"]))
    out.print(t)
    s = r["server"]
    out.print(f"output: {r['output_tokens']} tokens in {r['wall_s']:.1f} s = {r['output_tokens_per_s']:.1f} tokens/s"
              + (f"; errors: {r['errors']}" if r["errors"] else ""))
    if slo:
        met = ", ".join(f"{k.upper()} ≤ {ms(v)}: {r['slo_met'][k]:.0%}" for k, v in slo.items())
        out.print(f"goodput: {r['good_requests']} of {r['requests']} requests met every target = "
                  f"{r['goodput_rps']:.2f} requests/s ({met})")
    out.print(f"prompts: {r['prompt_tokens']} tokens by {r['prompt_tokenizer']}'s tokenizer"
              + (f", {r['server_prompt_tokens']} by the server's" if r["server_prompt_tokens"] is not None else ""))
    if s is None:
        out.print("server: no /metrics to read")
    elif s["bottleneck"] is None:
        out.print(f"server ({s['engine'] or 'unknown engine'}, from /metrics): {s['note']}")
    else:
        def tokens(k):
            return "" if s[k] is None else f" for {s[k]:.0f} tokens"
        out.print(f"server ({s['engine']}, from /metrics): prefill {s['prefill_s'] or 0:.2f} s"
                  f"{tokens('prefill_tokens')}, decode {s['decode_s'] or 0:.2f} s{tokens('decode_tokens')}"
                  + (f", {s['preemptions']:.0f} preemptions" if s["preemptions"] is not None else "")
                  + (f": [bold]{s['bottleneck']}[/] took the server's time (one run, beyond the closeness rule's "
                     f"{TIE - 1:.0%} band)" if s["bottleneck"] != "neither" else
                     f": prefill and decode took about the same time (within {TIE - 1:.0%})")
                  + (f"; {s['cancelled']:.0f} requests cancelled" if s["cancelled"] else ""))
    return 0 if not r["errors"] else 2
