"""`minillm hardware`: this machine's measured figures beside the published chips, and the decode
ceiling of a model size."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict

from rich import box
from rich.markup import escape
from rich.table import Table

from ..measure.chips import BYTES_PER_ELEMENT, CHIPS, Hardware, _dtype_key, decode_ceiling, get_chip, parse_count
from ..measure.gpu import as_hardware, gpu_figures
from ..measure.hardware import STALE_DAYS, age_seconds, cache_path, cached, fmt_age, is_stale, machine, was_busy
from ..measure.probe import MB, METHODS
from ..measure.shapes import KV_DTYPES, UTILISATION, gpus_needed, state_bytes
from ..ui.report import fmt_kib
from .common import note_if_busy, out



def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `minillm hardware`."""
    parser.add_argument("--chip", metavar="NAME", help=f"a known chip: {', '.join(CHIPS)}")
    parser.add_argument("--params", metavar="N", help="model size for the decode ceiling: 7B, 124M, 1.5e9, ...")
    parser.add_argument("--dtype", default=None, choices=list(BYTES_PER_ELEMENT),
                        help="bytes per weight for the decode ceiling (default fp16; with --shape: the "
                             "model's own release, e.g. DeepSeek-V3's FP8 with its tile scales)")
    parser.add_argument("--remeasure", action="store_true", help="measure this machine again at this thread count, replacing those cached figures")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")
    parser.add_argument("--shape", metavar="NAME", help="a model shape by name (llama-3-8b, llama-2-7b, mistral-7b, "
                        "qwen2.5-7b, smollm2-135m, gpt2-124m, mixtures of experts mixtral-8x7b, qwen3-30b-a3b, "
                        "deepseek-v3, ...): weights and KV bytes per token from it; a mixture's active and "
                        "total bytes and its GPU ceilings")
    parser.add_argument("--context", type=int, default=None, metavar="T",
                        help="with --shape: tokens in the KV cache for the decode step (default: the shape's context)")
    parser.add_argument("--fit", type=int, default=None, metavar="T",
                        help="with --shape: how many sequences of T tokens fit in --memory (or the --chip's "
                             "memory) beside the weights, e.g. --shape llama-2-7b --fit 4096 --memory 80GB "
                             "--kv-dtype int8")
    parser.add_argument("--memory", default=None, metavar="SIZE",
                        help="with --fit: the memory to fill, e.g. 80GB, 24GiB (default: the --chip's own memory)")
    parser.add_argument("--kv-dtype", default=None, choices=list(KV_DTYPES),
                        help="with --shape: bytes per KV value (default: --dtype); int8/fp8 caches halve fp16's")
    parser.add_argument("--kv-only", action="store_true",
                        help="with --fit: the memory holds the KV cache alone (the weights are elsewhere)")
    parser.add_argument("--utilisation", type=float, default=UTILISATION, metavar="U",
                        help=f"with --shape: the share of the memory the server takes (default {UTILISATION}, "
                             "vLLM's gpu_memory_utilization; the rest is the runtime's)")


def _sig(x: float, digits: int = 3) -> str:
    """A number to `digits` significant figures, never in scientific notation: 14.0, 0.497, 2,039."""
    if x == 0 or not math.isfinite(x):
        return str(x)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def _ms(x: float) -> str:
    return f"{x:,.1f}" if x >= 1 else _sig(x, 2)


def _peak(hw: Hardware) -> str:
    if hw.peak_gflops is None:
        return "—"
    return f"{hw.peak_gflops / 1000:,.0f} TFLOP/s" if hw.peak_gflops >= 10_000 else f"{hw.peak_gflops:,.1f} GFLOP/s"


def run(args: argparse.Namespace) -> int:
    """`minillm hardware`: this machine beside the presets, and the decode ceiling if --params is given."""
    # Check the user's input before spending seconds on measuring.
    if getattr(args, "shape", None):
        return run_shape(args)
    chip = get_chip(args.chip) if args.chip else None
    n_params = parse_count(args.params) if args.params else None
    dtype = _dtype_key(args.dtype or "fp16")

    if args.remeasure or cached() is None:
        note_if_busy(args)                      # before measuring: a busy machine measures low
    here = machine(remeasure=args.remeasure, progress=not args.json)
    gpu = gpu_figures()                         # None without a GPU: then nothing below changes
    gpu_hw = as_hardware(gpu) if gpu else None
    targets = [chip] if chip else [here, *([gpu_hw] if gpu_hw else []), *CHIPS.values()]
    ceilings = [decode_ceiling(n_params, dtype, hw) for hw in targets] if n_params else []

    from ..kernels import int8
    dot = {"isa": int8.isa(), "supported": list(int8.supported()), "words": int8.describe()}
    if args.json:
        print(json.dumps({
            "machine": {**asdict(here), "ridge": here.ridge},
            "int8_dot": dot,
            "presets": {name: {**asdict(hw), "ridge": hw.ridge} for name, hw in CHIPS.items()},
            "decode_ceiling": ceilings,
            **({"gpu": gpu} if gpu else {}),
        }, indent=2))
        return 0

    console = out
    mine = Table(title="This machine (measured)", show_header=False, title_justify="left", box=box.SIMPLE)
    mine.add_column(style="bold", no_wrap=True)
    mine.add_column()
    mine.add_row("CPU", f"{escape(str(here.cpu))}, {here.threads} thread{'' if here.threads == 1 else 's'}")
    mine.add_row("memory read bandwidth", f"{here.bandwidth_gbs:,.1f} GB/s (best method: {here.method})")
    for name, gbs in here.methods.items():
        mine.add_row(f"  {name}", f"{gbs:,.1f} GB/s  [dim]{escape(METHODS.get(name, ''))}[/]")
    mine.add_row("float32 matmul peak", f"{here.peak_gflops:,.1f} GFLOP/s ({here.matmul_size}² sgemm)")
    mine.add_row("ridge point", f"{here.ridge:,.1f} FLOP/byte (peak ÷ bandwidth)")
    mine.add_row("integer dot (--kernels int8)",
                 f"{escape(dot['words'].removeprefix('int8 dot: '))}  [dim]this CPU runs: {', '.join(dot['supported'])}[/]")
    if here.llc_bytes:
        mine.add_row("last-level cache", f"{here.llc_bytes / MB:g} MiB (buffer {here.buffer_mb} MiB)")
    mine.add_row("BLAS threads", f"{here.blas_threads or 'unknown'} (set with --threads N; NumPy {here.numpy_version})")
    age = age_seconds(here)
    load = f", load average {here.load_avg:g}" if here.load_avg is not None else ""
    mine.add_row("measured", f"{here.measured_at} ({fmt_age(age)}{load})  [dim]{escape(str(cache_path()))}[/]")
    if here.fast:
        mine.add_row("[yellow]note[/]", escape(here.note))
    if was_busy(here):
        mine.add_row("[yellow]note[/]", f"load average was {here.load_avg} while measuring: other work may have "
                     "lowered these figures; rerun with --remeasure when the machine is idle")
    if is_stale(here):
        mine.add_row("[yellow]note[/]", f"measured more than {STALE_DAYS} days ago: rerun with --remeasure")
    console.print(mine)
    if gpu:
        console.print(gpu_table(gpu))

    chips = Table(title="Known chips (published figures) beside this machine", title_justify="left",
                  box=box.SIMPLE_HEAD)
    chips.add_column("chip", style="bold", no_wrap=True)
    chips.add_column("bandwidth", justify="right", no_wrap=True)
    chips.add_column("peak", justify="right", no_wrap=True)
    chips.add_column("ridge", justify="right", no_wrap=True)
    chips.add_column("source", overflow="fold")
    notes: list[str] = []
    for hw in [here, *([gpu_hw] if gpu_hw else []), *CHIPS.values()]:
        ridge = "—" if hw.ridge is None else f"{hw.ridge:,.0f}" if hw.ridge >= 10 else f"{hw.ridge:.1f}"
        style = "reverse" if chip is not None and hw is chip else None
        mark = ""
        if hw.note and hw.measured_at is None:
            if hw.note not in notes:
                notes.append(hw.note)
            mark = f" [{notes.index(hw.note) + 1}]"
        chips.add_row(hw.name, f"{_sig(hw.bandwidth_gbs)} GB/s", _peak(hw), ridge, escape(hw.source + mark), style=style)
    console.print(chips)
    console.print("  [dim]ridge: FLOPs per byte above which work is compute-bound. "
                  "peak: FP16 for the GPUs, float32 as measured for this machine.[/]")
    for i, text in enumerate(notes, 1):
        console.print(f"  [dim]\\[{i}] {escape(text)}[/]")

    if ceilings:
        table = Table(title=f"Decode ceiling, batch 1: {n_params:,} parameters in {dtype}", title_justify="left",
                      box=box.SIMPLE_HEAD)
        for heading in ("chip", "GB per token", "ms per token", "tokens/s", "compute ms/token"):
            table.add_column(heading, justify="left" if heading == "chip" else "right", no_wrap=True)
        for c in ceilings:
            compute = "—" if c["compute_ms_per_token"] is None else _ms(c["compute_ms_per_token"])
            table.add_row(c["chip"], _sig(c["gb_per_token"]), _ms(c["ms_per_token"]), f"{c['tokens_per_s']:,.0f}", compute)
        console.print(table)
        c = ceilings[0]
        console.print(
            f"{c['n_params']:,} parameters × {c['bytes_per_param']:g} bytes ({dtype}) = {_sig(c['gb_per_token'])} GB "
            f"per token; at {_sig(c['bandwidth_gbs'])} GB/s ({c['chip']}) that is {_ms(c['ms_per_token'])} ms per token, "
            f"about {c['tokens_per_s']:,.0f} tokens/s, whatever the compute.")
        if any(not hw.measured for hw in targets):
            console.print("[dim]A published bandwidth is a peak: real decode kernels reach only part of it "
                          "(lesson 6 measures the share this machine's steps reach).[/]")
        for hw, c in zip(targets, ceilings):
            if hw.memory_gb and c["gb_per_token"] > hw.memory_gb * UTILISATION:
                n = gpus_needed(c["gb_per_token"] * 1e9, hw.memory_gb * 1e9)     # the one capacity rule
                console.print(f"[yellow]{hw.name}:[/] {_sig(c['gb_per_token'])} GB of weights do not fit "
                              f"{UTILISATION:g} of its {hw.memory_gb:g} GB: no single {hw.name} runs this model, and its ceiling above is "
                              f"arithmetic only. Tensor parallelism splits every matrix over {n} or more, each "
                              f"reading 1/{n} of the weights per step (and the KV cache needs room too).")
    return 0


def capacity_lines(cap: dict, s: dict, weight_dtype: str, kv_dtype: str, where: str) -> list[str]:
    """The capacity answer and the arithmetic it is made of, one figure per line."""
    n, T = cap["sequences"], cap["context"]
    window = (f"; {s['local_layers']} of its {s['n_layer']} layers keep only the last {s['window']:,} tokens"
              if s.get("window") and s["window"] < T else "")
    lines = [f"  sequences of {T:,} tokens that fit {where}: {n:,}",
             f"    memory × utilisation: {_sig(cap['memory_bytes'] / 1e9)} GB × {cap['utilisation']:g} = "
             f"{_sig(cap['usable_bytes'] / 1e9)} GB",
             f"    − weights ({weight_dtype}): {_sig(cap['weight_bytes'] / 1e9)} GB, leaving "
             f"{_sig(cap['left_bytes'] / 1e9) if cap['left_bytes'] > 0 else 'nothing'}"
             + (" GB" if cap["left_bytes"] > 0 else ": the weights alone do not fit"),
             f"    ÷ KV of one sequence ({kv_dtype}): {_sig(cap['kv_bytes_per_sequence'] / 1e9)} GB "
             f"({fmt_kib(cap['kv_bytes_per_token'])} per token)"] + ([f"    {window[2:]}"] if window else [])
    if cap.get("state_bytes_per_sequence"):
        lines.append(f"      of which a fixed state of {_sig(cap['state_bytes_per_sequence'] / 1e9)} GB "
                     "(the linear layers')")
    return lines


def gpu_table(g: dict) -> Table:
    """This machine's GPU, measured (measure/gpu.py), printed under the CPU's table."""
    t = Table(title="This machine's GPU (measured with CuPy)", show_header=False, title_justify="left", box=box.SIMPLE)
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    t.add_row("GPU", escape(g["device"]))
    t.add_row("memory bandwidth", f"{g['copy_gbs']:,.0f} GB/s device copy (read + written), {g['read_gbs']:,.0f} GB/s "
              f"read (a sum), {g['buffer_mb']:,} MiB buffer")
    for dt, tf in g["matmul_tflops"].items():
        t.add_row(f"{dt} matmul peak", f"{tf:,.1f} TFLOP/s ({g['matmul_size']}² product)")
    t.add_row("launch cost", f"{g['launch_us']:.2f} µs a kernel launched from Python, {g['graph_launch_us']:.2f} µs "
              "replayed in a CUDA graph")
    for dt, r in g["ridge_flop_per_byte"].items():
        t.add_row(f"ridge point, {dt}", f"{r:,.1f} FLOP/byte (peak ÷ copy bandwidth)")
    return t


WIDTH = 80     # `hardware --shape` prints lines of at most this many columns


def _wrap(lines: list[str], width: int = WIDTH) -> list[str]:
    """Each line folded at words within `width` columns, its continuation indented under its text."""
    import textwrap
    out = []
    for line in lines:
        lead = len(line) - len(line.lstrip(" "))
        out += textwrap.wrap(line, width, subsequent_indent=" " * (lead + 2), break_on_hyphens=False) or [""]
    return out


def run_shape(args: argparse.Namespace) -> int:
    """`minillm hardware --shape NAME [--chip C] [--context T] [--fit T --memory M --kv-dtype D]`: a decode
    step's bytes from the shape, and how many sequences fit. Without --dtype the weights are sized as
    the model was released (`measure/shapes.py`: DeepSeek-V3 in FP8 with its tile scales, GPT-2 in
    float32, the others in 16 bits), and bf16 is shown beside a smaller release as the doubling it is."""
    from ..errors import MiniLLMError
    from ..measure.experts import held_bytes
    from ..measure.shapes import capacity, decode_step_bytes, kv_bytes_per_token, shape
    from .common import parse_bytes
    s = shape(args.shape)
    if args.params:
        raise MiniLLMError("--params and --shape both give the model's size: choose one")
    fit = getattr(args, "fit", None)
    if fit is not None and args.context is not None and fit != args.context:
        raise MiniLLMError("--fit T and --context T both give the tokens per sequence: choose one")
    if getattr(args, "kv_only", False) and fit is None:
        raise MiniLLMError("--kv-only counts the KV cache alone in --fit's memory: give --fit T too")
    context = fit if fit is not None else args.context if args.context is not None else s["n_ctx"]
    if context < 1:
        raise MiniLLMError(f"--{'fit' if fit is not None else 'context'} {context}: must be at least 1")
    if context > s["n_ctx"]:                  # a sequence the model cannot hold: no count of them is an answer
        raise MiniLLMError(f"--{'fit' if fit is not None else 'context'} {context:,}: beyond {s['name']}'s "
                           f"context of {s['n_ctx']:,} tokens; give at most {s['n_ctx']}")
    if args.dtype is None:                           # as released
        wd, b, wlabel = None, None, f"{s['released']}, as released"
    else:
        wd = _dtype_key(args.dtype)
        b, wlabel = BYTES_PER_ELEMENT[wd], wd
    kvd = getattr(args, "kv_dtype", None)
    if kvd is None:                                  # the weights' own, where it is a KV dtype; else 16 bits
        kvd = (wd if wd in KV_DTYPES else "fp16") if wd else ("fp32" if s.get("released") == "fp32" else "bf16")
    kvb = KV_DTYPES[kvd]
    util = getattr(args, "utilisation", UTILISATION)
    memory = parse_bytes(args.memory, "--memory") if getattr(args, "memory", None) else None
    if fit is not None and memory is None and not args.chip:
        raise MiniLLMError("--fit needs the memory to fill: give --memory SIZE (e.g. 80GB) or --chip NAME")
    hw = get_chip(args.chip) if args.chip else (None if fit is not None else machine(progress=True))
    if memory is None and hw is not None and hw.memory_gb:
        memory = hw.memory_gb * 1e9
    if fit is not None and memory is None:
        raise MiniLLMError(f"--chip {args.chip}: {hw.name} has no memory figure here: give --memory SIZE")
    step = decode_step_bytes(s, context, b, kvb)
    kv_tok = kv_bytes_per_token(s, kvb)
    moe = (f" ({s['n_active'] / 1e9:.2f}B active: top-{s['top_k']} of {s['n_expert']} experts in "
           f"{s['sparse_layers']} of the layers)" if "n_active" in s else "")
    lines = [f"{s['name']} (weights {wlabel}; KV {kvd}): {s['n_params'] / 1e9:.2f}B params{moe}, "
             f"{s['n_layer']} layers, {s['n_head']} heads, "
             + (f"a latent of {s['kv_latent']} values per layer cached (multi-head latent attention)"
                if s.get("kv_latent") else f"{s['n_kv_head']} KV heads of {s['head_dim']}")]
    beside = kv_dtype_words(kv_bytes_per_token(s, KV_DTYPES["bf16"]), kvb)
    if s.get("kv_latent"):
        lines.append(f"  KV per token ({kvd}, b = {kvb:g}): L·(d_c + d_rope)·b = {fmt_kib(kv_tok)}{beside}")
    else:
        mha = kv_tok * s["n_head"] / s["n_kv_head"]
        lines.append(f"  KV per token ({kvd}, b = {kvb:g}): 2·L·Hkv·hd·b = {fmt_kib(kv_tok)}"
                     + (f" ({fmt_kib(mha)} with a KV head per query head)" if mha != kv_tok else "")
                     + beside)
    if s.get("state_values"):
        lines += [f"  hybrid: only {s['kv_layers']} of the {s['n_layer']} layers keep K and V; the other "
                  f"{s['linear_layers']} (linear",
                  f"  attention) keep a fixed state per sequence: {state_bytes(s, kvb) / 1e6:,.1f} MB at any "
                  "context" + (f" (its matrices in {'float32' if s['ssm_bytes'] == 4 else s['ssm_bytes']} "
                               "as released)" if "ssm_bytes" in s else "")]
    if s.get("window"):
        lines.append(f"  sliding window: {s['local_layers']} of {s['n_layer']} layers keep only the last "
                     f"{s['window']:,} tokens")
    held = held_bytes(s, b)
    lines.append(f"  weights held: {held / 1e9:,.2f} GB" + (" (every expert)" if moe else "")
                 + (f"; read by one token: {step['weights'] / 1e9:,.2f} GB (its experts)" if moe else ""))
    if b is None and s.get("bytes_per_weight", 2.0) < 2.0:      # a smaller release: bf16 is the doubling
        bf16 = held_bytes(s, 2.0)
        lines.append(f"  in bf16 throughout (an upcast): {bf16 / 1e9:,.2f} GB held, {fmt_ratio(bf16 / held)} the "
                     "release")
    if fit is None and hw is not None:
        ms = step["total"] / (hw.bandwidth_gbs * 1e9) * 1e3
        lines += [f"  weights per decode step: {step['weights'] / 1e9:,.2f} GB",
                  f"  KV read at context {context:,}: {step['kv'] / 1e9:,.2f} GB "
                  f"({step['kv'] / step['weights']:.0%} of the weights)",
                  *([f"  state read and written: {step['state'] / 1e9:,.2f} GB, at any context"] if step["state"] else []),
                  f"  decode, batch 1, on {hw.name} ({_sig(hw.bandwidth_gbs)} GB/s), the weights and the KV of "
                  f"{context:,} tokens{' (the default: the model' + chr(39) + 's context; --context T)' if args.context is None else ''}: "
                  f"{ms:,.2f} ms/token, ~{1e3 / ms:,.0f} tokens/s"]
    if memory is not None:
        kv_only = bool(getattr(args, "kv_only", False))
        cap = capacity(s, context, memory, bytes_per_weight=b, kv_bytes_per_value=kvb, utilisation=util,
                       kv_only=kv_only)
        where = (f"in {args.memory}" if getattr(args, "memory", None) else f"in {hw.name}'s {hw.memory_gb:g} GB")
        lines += capacity_lines(cap, s, "none: --kv-only" if kv_only else wlabel, kvd, where)
    out.print("\n".join(_wrap(lines)), highlight=False, soft_wrap=True)
    if moe and fit is None:
        moe_ceilings(s, context, b, kvb, [hw] if args.chip else [c for c in CHIPS.values() if c.memory_gb])
    return 0


def kv_dtype_words(bf16_bytes: float, kvb: float) -> str:
    """Beside a KV size in another dtype than bf16, the same in bf16: shapes of different KV dtypes
    (GPT-2's float32 against SmolLM2's bf16) are then compared byte for byte, and the dtype's factor
    is not read as the layout's."""
    if kvb == KV_DTYPES["bf16"]:
        return ""
    f = kvb / KV_DTYPES["bf16"]
    does = {2.0: "doubles it", 0.5: "halves it"}.get(f, f"makes it {f:g}×")
    return f"; {fmt_kib(bf16_bytes)} in bf16, as the 16-bit shapes: the dtype alone {does}"


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}×"


MOE_BATCH = 32


def moe_ceilings(s: dict, context: int, b: float | None, kvb: float, chips: list) -> None:
    """A mixture's decode ceilings on each chip, by the roofline: batch 1 reading the active weights,
    the same if a token read every expert (the total: a dense model of its size), and a step of
    MOE_BATCH tokens reading uniform routing's union of experts (`experts.params_read`); each with
    the KV of `context` tokens per sequence and 2 FLOPs per weight a token multiplies (attention's
    FLOPs aside). And whether the weights fit the chip's memory. `b` None: the weights as released."""
    from ..measure.chips import roofline
    from ..measure.experts import held_bytes, params_read, read_bytes
    from ..models.mixture import expected_distinct_experts
    from ..measure.shapes import kv_bytes_per_sequence
    B, kv = MOE_BATCH, kv_bytes_per_sequence(s, context, kvb)
    held = held_bytes(s, b) / 1e9
    t = Table(title=f"GPU ceilings at context {context:,} (roofline): ms a step, tokens/s", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("chip", "B=1 ms", "tok/s", "all read ms", "tok/s", f"B={B} ms", "tok/s", "GPUs"):
        t.add_column(col, justify="left" if col == "chip" else "right", no_wrap=True)
    for hw in chips:
        one = roofline(read_bytes(s, 1, b) + kv, 2 * s["n_active"], hw)
        dense = roofline(held * 1e9 + kv, 2 * s["n_params"], hw)
        many = roofline(read_bytes(s, B, b) + B * kv, 2 * B * s["n_active"], hw)
        fits = str(gpus_needed(held * 1e9, hw.memory_gb * 1e9))        # every weight split evenly
        t.add_row(hw.name, _ms(one.seconds * 1e3), f"{1 / one.seconds:,.0f}", _ms(dense.seconds * 1e3),
                  f"{1 / dense.seconds:,.0f}", _ms(many.seconds * 1e3), f"{B / many.seconds:,.0f}", fits)
    out.print(t)
    E, k = s["n_expert"], s["top_k"]
    union = expected_distinct_experts(E, k, B)
    note = (f"B=1: the active weights; all read: every expert, as a dense model of its size; B={B}: "
            f"E·(1 − (1 − k/E)^{B}) = {union:.1f} of E = {E} experts read per sparse layer (k = {k}, uniform "
            f"routing), {params_read(s, B) / 1e9:,.1f}B parameters, {params_read(s, B) / params_read(s):.2g}× one "
            f"token's; GPUs: the fewest whose memory at {UTILISATION:g} of it (what a server takes, as --fit "
            f"counts) holds the {held:,.0f} GB of weights alone, split evenly; the KV cache needs room beyond (--fit)")
    out.print("\n".join(_wrap(["  " + note])), style="dim", highlight=False, soft_wrap=True)
