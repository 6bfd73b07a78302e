"""`minillm diagnose`: your workload mix (prompt and answer lengths), which phase dominates it here and
on a chosen chip, time to first token, the latency/throughput trade-off, and which optimization helps.

Every figure comes from the engine: the prompt is prefilled under the meter (its counters and its
wall time), then two decode steps are run from its cache. A decode step's counters grow exactly by
one token of KV cache per step (the meter's closed forms, tested), so the answer's later steps are
the second step's counters plus that growth; nothing else is extrapolated. Times on this machine
and on the chip are the roofline's: max(bytes ÷ bandwidth, FLOPs ÷ peak), in the view of memory
each column names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from rich import box
from rich.markup import escape
from rich.table import Table

from ..errors import PromptError
from ..measure import hardware
from ..measure.chips import get_chip, roofline
from ..measure.shapes import capacity, shape_of
from ..meter import Meter, totals
from ..ui import report
from .common import add_device, add_weights, load_model, MODEL_HELP, model_options, note_if_busy, out

FP16 = 0.5          # the chip columns assume fp16 weights and activations: half the float32 bytes
BATCHES = (1, 8, 32)


def add_arguments(p) -> None:
    p.add_argument("--prompt-tokens", type=int, default=500, metavar="P", help="tokens in a prompt (default 500)")
    p.add_argument("--answer-tokens", type=int, default=200, metavar="N", help="tokens in an answer (default 200)")
    p.add_argument("--shared-prefix", type=int, default=0, metavar="S",
                   help="tokens at the start of every prompt that all requests share, e.g. a system prompt")
    p.add_argument("--chip", default="a100", metavar="NAME", help="the chip to compare with (default a100)")
    p.add_argument("--model", default="random-124m", metavar="MODEL",
                   help=MODEL_HELP + " (default: random-124m, GPT-2 small's size, so the weights come from DRAM)")
    add_weights(p)
    add_device(p)


@dataclass
class Phase:
    flops: float
    bytes: float        # unfused, as the meter counts
    fused: float        # fused view: weights, KV, each block's input and output
    weights: float


def _phase(records, config) -> Phase:
    t = totals(records)
    return Phase(flops=t.flops, bytes=t.bytes, fused=sum(report.fused_bytes(r, config, 4) for r in records),
                 weights=t.weights)


def measure_workload(model, prompt_tokens: int, answer_tokens: int):
    """(prefill record, prefill seconds, decode Phase for the whole answer, per-step growth, first decode record)."""
    c = model.config
    ids = np.random.default_rng(0).integers(0, c.vocab_size, prompt_tokens)   # a seeded random prompt
    _, warm = model.prefill(ids[:4])   # warm-up: first touches of the weights, compiled kernels (not timed)
    model.decode_step(int(ids[4 % len(ids)]), warm)
    with Meter() as m:
        t0 = time.perf_counter()
        logits, cache = model.prefill(ids)
        seconds = time.perf_counter() - t0
        token = int(np.argmax(logits))
        for _ in range(min(2, answer_tokens - 1)):
            token = int(np.argmax(model.decode_step(token, cache)))
    pre = m.steps[0]
    steps = m.of_kind("decode")
    n_decode = answer_tokens - 1          # the prefill gives the first token; each decode step one more
    if not steps:
        return pre, seconds, Phase(0, 0, 0, 0), None, None, n_decode
    first = steps[0]
    grow = {k: steps[1].bytes[k] - steps[0].bytes[k] for k in steps[0].bytes} if len(steps) > 1 else None
    gflops = (steps[1].total_flops - steps[0].total_flops) if len(steps) > 1 else 0
    gbytes = sum(grow.values()) if grow else 0
    gfused = (report.fused_bytes(steps[1], c, 4) - report.fused_bytes(steps[0], c, 4)) if len(steps) > 1 else 0
    tri = n_decode * (n_decode - 1) / 2   # Σ over the steps of how many tokens each one is past the first
    decode = Phase(flops=n_decode * first.total_flops + tri * gflops, bytes=n_decode * first.total_bytes + tri * gbytes,
                   fused=n_decode * report.fused_bytes(first, c, 4) + tri * gfused,
                   weights=n_decode * first.bytes["weights"])
    return pre, seconds, decode, first, (gflops, gbytes), n_decode


def _t(seconds: float) -> str:
    return report.fmt_time(seconds)


def run(args) -> int:
    chip = get_chip(args.chip)
    if chip.peak_gflops is None:
        raise PromptError(f"--chip {args.chip}: {chip.name} has no published FLOP/s peak; choose a GPU preset "
                          "(a100, h100, h200, rtx-4090)")
    P, N, S = args.prompt_tokens, args.answer_tokens, args.shared_prefix
    if P < 1 or N < 1 or not 0 <= S < P:
        raise PromptError("--prompt-tokens and --answer-tokens must be at least 1, and --shared-prefix from 0 to "
                          "less than --prompt-tokens")
    model = load_model(args.model, args.weights, args.device, getattr(args, "kernels", None),
                       options=model_options(args))
    c = model.config
    if P >= c.n_ctx:
        raise PromptError(f"--prompt-tokens {P} does not fit {escape(model.name)}'s context of {c.n_ctx} with room "
                          f"for an answer: give at most {c.n_ctx - 1}")
    if P + N > c.n_ctx:
        raise PromptError(f"--prompt-tokens {P} + --answer-tokens {N} is beyond {escape(model.name)}'s context of "
                          f"{c.n_ctx}: with this prompt at most {c.n_ctx - P} answer tokens fit")
    hw = hardware.machine(progress=True)
    note_if_busy(args)
    with out.status(f"prefilling {P} tokens and running two decode steps on {escape(model.name)}…"):
        pre, pre_seconds, dec, first, growth, n_decode = measure_workload(model, P, N)
    prefill = _phase([pre], c)

    def here(ph: Phase) -> float:
        return roofline(ph.bytes, ph.flops, hw).seconds

    def on_chip(ph: Phase) -> float:
        return roofline(ph.fused * FP16, ph.flops, chip).seconds

    moe = (f", {c.active_params() / 1e6:,.0f}M active per token: top-{model.experts[1]} of {model.experts[0]} "
           "experts" if model.experts else "")
    out.print(f"[bold]Workload[/]: prompts of {P} tokens{f' ({S} shared by every request)' if S else ''}, "
              f"answers of {N} tokens, on {escape(model.name)} ({model.n_params() / 1e6:,.0f}M parameters{moe}); "
              f"this machine beside {chip.name}.")
    t = Table(box=box.SIMPLE_HEAD, header_style="bold", title="One request, phase by phase", title_justify="left")
    for col in ("phase", "FLOPs", "bytes", "here", chip.name):
        t.add_column(col, justify="left" if col == "phase" else "right", no_wrap=True)
    t.add_row(f"prefill ({P})", report.fmt_flops(prefill.flops), report.fmt_bytes(prefill.bytes),
              _t(here(prefill)), _t(on_chip(prefill)))
    t.add_row(f"decode ({n_decode} steps)", report.fmt_flops(dec.flops), report.fmt_bytes(dec.bytes),
              _t(here(dec)), _t(on_chip(dec)))
    out.print(t)
    out.print(f"[dim]here: the roofline with this machine's figures, bytes unfused (as NumPy runs); "
              f"{chip.name}: the roofline with published figures, ideal-fusion bytes in fp16 (a lower bound). "
              f"This machine: "
              f"{escape(hardware.provenance(hw))}.[/]")

    # Latency: time to first token, time per output token, the whole answer.
    tpot_here = roofline(first.total_bytes, first.total_flops, hw).seconds if first else 0.0
    tpot_chip = roofline(report.fused_bytes(first, c, 4) * FP16, first.total_flops, chip).seconds if first else 0.0
    lat = Table(box=box.SIMPLE_HEAD, header_style="bold", title="Latency of one request (roofline)",
                title_justify="left")
    for col in ("", "here", chip.name):
        lat.add_column(col, justify="left" if not col else "right", no_wrap=True)
    lat.add_row("time to first token (the prefill)", _t(here(prefill)), _t(on_chip(prefill)))
    lat.add_row("time per output token (a decode step)", _t(tpot_here), _t(tpot_chip))
    lat.add_row("the whole answer", _t(here(prefill) + here(dec)), _t(on_chip(prefill) + on_chip(dec)))
    out.print(lat)
    if first is not None:
        out.print(f"[dim]measured here, one run each: the prefill {_t(pre_seconds)}, a decode step "
                  f"{_t(first.seconds)}. The roofline is the best case; the gap is what the engine leaves.[/]")

    # Throughput against latency: B sequences share each read of the weights (a mixture's: the union
    # of their experts, `model.step_weight_bytes(B)` under uniform routing, beyond the one token's).
    batched = {}                             # B -> seconds of one decode step of B requests on the chip
    if first is not None:
        own_fused = report.fused_bytes(first, c, 4) - first.bytes["weights"]
        union = " (a mixture: the union of their experts, uniform routing)" if model.experts else ""
        bt = Table(box=box.SIMPLE_HEAD, header_style="bold", title_justify="left",
                   title=f"Batched decode on {chip.name}: B requests share each weight read{union} (roofline, "
                         "fused, fp16)")
        for col in ("B", "time per step", "tokens/s in all", "tokens/s per request", "bound"):
            bt.add_column(col, justify="right", no_wrap=True)
        for B in BATCHES:
            weights = first.bytes["weights"] + model.step_weight_bytes(B) - model.step_weight_bytes(1)
            r = roofline((weights + B * own_fused) * FP16, B * first.total_flops, chip)
            batched[B] = r.seconds
            bt.add_row(str(B), _t(r.seconds), f"{B / r.seconds:,.0f}", f"{1 / r.seconds:,.0f}", r.bound)
        out.print(bt)

    # The diagnosis: which phase dominates here, on the chip alone, and on the chip batched (lesson 7's
    # rule: B requests share each decode step, so a request's share of decode falls about B times).
    dom_here = "prefill" if here(prefill) > here(dec) else "decode"
    dom_chip = "prefill" if on_chip(prefill) > on_chip(dec) else "decode"
    out.print("[bold]Diagnosis[/]")
    out.print(f"• here, {dom_here} takes most of a request ({_t(here(prefill))} prefill against "
              f"{_t(here(dec))} decode); on {chip.name} alone (B = 1), {dom_chip} does ({_t(on_chip(prefill))} "
              f"against {_t(on_chip(dec))}).")
    dom_served = dom_chip
    if batched and n_decode:
        # a request's share of its decode at batch B: its steps, each shared by B requests (the first step's
        # time: later ones grow by one token of KV each, a small share of a step at these contexts)
        share = {B: n_decode * t / B for B, t in batched.items()}
        words = []
        for B, d in share.items():
            if B == 1:
                continue
            side = "prefill" if on_chip(prefill) > d else "decode"
            words.append(f"B = {B}: prefill {_t(on_chip(prefill))} against {_t(d)} of shared decode, {side}")
        top = max(share)
        dom_served = "prefill" if on_chip(prefill) > share[top] else "decode"
        out.print(f"• served in batches on {chip.name} (each request's share of the decode steps): "
                  + "; ".join(words) + f". A server runs batches: the advice below is for B = {top}.")
    pre_roof = roofline(prefill.fused * FP16, prefill.flops, chip)
    line = (f"• on {chip.name} the prefill is {pre_roof.bound}-bound ({pre_roof.intensity:.3g} FLOP/byte against a "
            f"ridge of {pre_roof.ridge:.0f})")
    if first is not None:
        dec_roof = roofline(report.fused_bytes(first, c, 4) * FP16, first.total_flops, chip)
        line += (f"; a decode step is {dec_roof.bound}-bound ({dec_roof.intensity:.3g} FLOP/byte): it reads "
                 f"{report.fmt_bytes(first.bytes['weights'] * FP16)} of weights for one token")
    out.print(line + ".")
    if chip.memory_gb:
        cap = capacity(shape_of(c, model.name), P + N, chip.memory_gb * 1e9)
        out.print(f"• memory: {cap['sequences']:,} requests of {P + N} tokens fit on one {chip.name} beside the weights "
                  f"in fp16 ({chip.memory_gb:g} GB × {cap['utilisation']:g} − {report.fmt_bytes(cap['weight_bytes'])}, "
                  f"÷ {report.fmt_bytes(cap['kv_bytes_per_sequence'])} of KV each): the most the batch above can "
                  "hold (`minillm hardware --fit` for a named shape).")
    tips = []
    if dom_served == "decode":
        tips.append("batching: the table above, more requests per weight read")
        tips.append("quantization: fewer bytes per weight, and decode's time is bytes ÷ bandwidth")
    else:
        tips.append("more FLOP/s: 8-bit math (W8A8, FP8) or several GPUs (tensor parallelism); fewer prompt "
                    "tokens; chunked prefill does not shorten a prefill, it keeps one from stalling other "
                    "requests' decode")
    if S:
        saved = S / P
        tips.append(f"prefix caching: the {S} shared tokens are {saved:.0%} of every prompt's prefill, computed "
                    "once instead of per request")
    out.print(f"• what attacks {dom_served}, the phase that dominates on {chip.name} in batches: " + "; ".join(tips)
              + ".")
    return 0
