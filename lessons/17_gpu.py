"""Lesson 17: On a GPU. The same engine on an NVIDIA GPU (CuPy): a small model's step waits on kernel
launches, not bytes; a CUDA graph replays the step in one launch; a 7B-class model meets the memory wall
the article describes, measured on your card's own bandwidth; and batching turns the step compute-bound.
Without a GPU it says so and shows the figures minillm's developers measured on an H200 as data, with their source.

Run:  python lessons/17_gpu.py        (or: minillm learn 17)
"""

from __future__ import annotations

from minillm.lessons._common import Lesson, fmt_x, run_lesson

from rich import box
from rich.markup import escape
from rich.table import Table

import minillm
from minillm.backend import DeviceError, get_device
from minillm.models.llama import LlamaConfig
from minillm.meter import Meter
from minillm.measure.gpu import ARTICLE_7B, ISSUE_H200, SHAPES, decode_figures, free_bytes, gpu_figures
from minillm.ui.report import fmt_bytes

TITLE = "On a GPU: launches, graphs, the memory wall"
MINUTES = 4
WHAT_YOU_WILL_SEE = "kernels × launch cost, a CUDA graph, 7B on your card, where batching turns compute-bound"


def lesson(L: Lesson) -> None:
    operations(L)
    try:
        device = get_device("cuda")
    except DeviceError as e:
        L.note(f"no GPU here: {escape(str(e))}")
        the_issues_table(L)
    else:
        on_this_gpu(L, device)
    L.try_it("""
        On a machine with an NVIDIA GPU: `pip install 'minillm[gpu]'`, then `minillm hardware` (the card's
        bandwidth, peak, launch cost and ridge beside the CPU's), `minillm generate "ROMEO:" --device cuda
        --model random-124m`, and `python benchmarks/gpu_check.py` (the GPU tests, token equality with the
        CPU, and this lesson's figures, in one JSON file). In Python: `minillm.load(name, device="cuda")`.
    """)


# -- 1. what a step asks of a GPU: operations, each at least one kernel ---------------------------------

def operations(L: Lesson) -> None:
    L.say("""
        A GPU runs each operation of a step as one or more **kernels**, each launched by the host, at a
        few microseconds a launch. A small model's step is short enough that those microseconds, not its
        bytes, can set its time. How many operations does a decode step run? The meter counts each call
        (here on the CPU; on a GPU, `minillm.load(..., device="cuda")`, the code is the same).
    """)
    name = L.pick("random-124m", "random-tiny")
    model = minillm.load(name, quiet=True)
    logits, cache = model.prefill([1, 2, 3, 4])
    with Meter() as m:
        model.decode_step(int(logits.argmax()), cache)
    ops = m.steps[0].ops
    calls = sum(o["calls"] for o in ops.values())
    n = model.config.n_layer
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("operation", "calls a step"):
        t.add_column(col, justify="right" if col != "operation" else "left", no_wrap=True)
    for op, o in sorted(ops.items(), key=lambda kv: -kv[1]["calls"]):
        t.add_row(op, str(o["calls"]))
    t.add_row("[bold]all[/]", f"[bold]{calls}[/]")
    L.show(t, f"[dim]one decode step of {model.name} ({n} layers), counted by the meter[/]")
    L.claim(ops["linear"]["calls"] == 4 * n, f"{ops['linear']['calls']} linear products: 4 a layer × {n} layers "
            "(q|k|v, the attention's output, the MLP's two)")
    L.pause()
    L.say(f"""
        Each of these {calls} operations is at least one kernel on a GPU (an element-wise chain such as
        GELU is several: CuPy launches one kernel per array operation). Multiply by a launch cost of a few
        microseconds and a step has a floor that no memory bandwidth lowers. A **CUDA graph** records the
        step's kernels once and replays them with one launch from the host. `StaticDecode`
        (minillm/engine/static.py) is a decode step with fixed shapes, built to be captured that way:
        B slots, a fixed block table, the keys not written yet masked.
    """)


# -- 2a. no GPU: the issue's H200 figures, as data -------------------------------------------------------

def the_issues_table(L: Lesson) -> None:
    g, big = ISSUE_H200["gpt2_124m_fp16_b1"], ISSUE_H200["llama2_7b_fp16_b1"]
    batched, gqa = ISSUE_H200["llama2_7b_fp16_graph_ms"], ISSUE_H200["llama3_8b_gqa_fp16"]
    L.section("What a GPU did with this work: an H200's figures (not this machine's)")
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("decode step", "eager", "graph", "bytes a step"):
        t.add_column(col, justify="left" if col == "decode step" else "right", no_wrap=True)
    t.add_row("GPT-2-124M shape, fp16, B=1", f"{g['eager_ms']} ms", f"{g['graph_ms']} ms", fmt_bytes(g["bytes"]))
    t.add_row("  transformers generate", f"{g['transformers_eager_ms']} ms", "—", "")
    t.add_row("Llama-2-7B shape, fp16, B=1", f"{big['eager_ms']} ms", f"{big['graph_ms']} ms", fmt_bytes(big["bytes"]))
    for b, ms in batched.items():
        t.add_row(f"Llama-2-7B shape, fp16, B={b}", "", f"{ms} ms", "")
    for b, ms in gqa["graph_ms"].items():
        t.add_row(f"Llama-3-8B shape (GQA), B={b}", "", f"{ms} ms", "")
    L.show(t, f"[dim]source: {ISSUE_H200['source']}[/]")
    copy = big["copy_tbs"] * 1e12
    small_share = g["bytes"] / (g["graph_ms"] * 1e-3) / copy
    big_gbs = big["bytes"] / (big["graph_ms"] * 1e-3)
    per_kernel = (g["eager_ms"] - g["graph_ms"]) * 1e3 / g["kernels"]
    ceiling_ms = big["bytes"] / copy * 1e3
    b1 = 1 / (big["graph_ms"] * 1e-3)
    L.say(f"""
        What those figures say, computed from them alone:

        - **A small model is bound by launches.** GPT-2-124M's graph step moved {fmt_bytes(g['bytes'])} in
          {g['graph_ms']} ms: {g['bytes'] / (g['graph_ms'] * 1e-3) / 1e9:,.0f} GB/s, {small_share:.0%} of the
          {big['copy_tbs']} TB/s a device copy reached on that card. Eager, the same step took {g['eager_ms']} ms:
          the graph saved {g['eager_ms'] - g['graph_ms']:.2f} ms, {per_kernel:.1f} µs for each of its about
          {g['kernels']} kernels.
        - **A 7B-class model meets the memory wall.** {fmt_bytes(big['bytes'])} in {big['graph_ms']} ms is
          {big_gbs / 1e12:.2f} TB/s, {big_gbs / copy:.0%} of the copy bandwidth; streaming the weights at the full
          copy speed would take {ceiling_ms:.1f} ms. The article's {ARTICLE_7B['ms']:g} ms is
          {fmt_bytes(ARTICLE_7B['bytes'])} at an {ARTICLE_7B['chip']}'s bandwidth.
        - **Batching.** B = 1 makes {b1:,.0f} tokens/s; B = 64 {64 / (batched['64'] * 1e-3):,.0f} and B = 256
          {256 / (batched['256'] * 1e-3):,.0f}: 256 sequences for {fmt_x(batched['256'] / big['graph_ms'])} the
          time of one. The Llama-3-8B shape ran {'–'.join(str(x) for x in gqa['tflops'])} TFLOP/s at
          B = {' and '.join(gqa['graph_ms'])}, which the issue reads as turning compute-bound.
    """)


# -- 2b. a GPU: the same, measured on it -----------------------------------------------------------------

def on_this_gpu(L: Lesson, device) -> None:
    L.section(f"This machine's GPU: {device.description}")
    with L.status("measuring the GPU (copy bandwidth, matmul peak, launch cost)…"):
        hw = gpu_figures(quick=L.fast)
    t = Table(show_header=False, box=box.SIMPLE, pad_edge=False)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(justify="right", no_wrap=True)
    t.add_row("device copy bandwidth", f"{hw['copy_gbs']:,.0f} GB/s")
    t.add_row("float16 matmul peak", f"{hw['matmul_tflops']['float16']:,.1f} TFLOP/s")
    t.add_row("launch from Python", f"{hw['launch_us']:.2f} µs a kernel")
    t.add_row("launch inside a graph", f"{hw['graph_launch_us']:.2f} µs a kernel")
    t.add_row("ridge, float16", f"{hw['ridge_flop_per_byte']['float16']:,.0f} FLOP/byte")
    L.show(t)
    copy = hw["copy_gbs"] * 1e9
    steps = L.pick(30, 8)

    # a small model: launches
    small = minillm.load("random-124m", device=device)                       # float16 on the GPU
    with L.status("GPT-2-124M shape, float16, B = 1: eager, then one graph…"):
        s = decode_figures(small, 1, 256, steps)
    launches_ms = s["kernels"] * hw["launch_us"] / 1e3
    L.say(f"""
        **GPT-2-124M shape, float16, one sequence.** A step launches {s['kernels']} kernels (counted from
        its CUDA graph's nodes). Eager it took {s['eager_ms']:.2f} ms; {s['kernels']} × {hw['launch_us']:.2f} µs
        of launches is {launches_ms:.2f} ms of that ({launches_ms / s['eager_ms']:.0%}). As one graph it took
        {s['graph_ms']:.2f} ms ({fmt_x(s['eager_ms'] / s['graph_ms'])} the eager speed), moving
        {fmt_bytes(s['bytes'])}: {s['graph_gbs']:,.0f} GB/s, {s['graph_gbs'] * 1e9 / copy:.0%} of this card's copy
        bandwidth. The issue's H200 did it in {ISSUE_H200['gpt2_124m_fp16_b1']['graph_ms']} ms with torch
        ({ISSUE_H200['source']}).
    """)
    L.claim(s["kernels"] > 0 and s["bytes"] > 0, f"the captured step has {s['kernels']} kernels and moves "
            f"{fmt_bytes(s['bytes'])}, as the meter counts it")
    del small
    L.pause()

    # a 7B-class model: the wall
    c = dict(SHAPES["llama2-7b"])
    per_layer = 2 * (4 * c["n_embd"] ** 2 + 3 * c["n_embd"] * c["ffn"])     # float16 bytes of one block
    room = free_bytes(device) * 0.8 - 2 * 2 * c["vocab_size"] * c["n_embd"]
    layers = max(1, min(c["n_layer"], L.pick(c["n_layer"], 4), int(room // (per_layer * 1.15))))
    cfg = LlamaConfig(**{**c, "n_layer": layers})
    what = "the Llama-2-7B shape" if layers == c["n_layer"] else \
        f"the Llama-2-7B shape cut to {layers} of its {c['n_layer']} layers (what fits{' in fast mode' if L.fast else ''})"
    with L.status(f"{what}: random float16 weights on the GPU, one decode step…"):
        from minillm.checkpoints.load import random_model
        big = random_model(cfg, dtype="float16", device=device)
        b = decode_figures(big, 1, 256, steps)
    ceiling_ms = b["bytes"] / copy * 1e3
    L.say(f"""
        **{what[0].upper() + what[1:]}, float16, one sequence.** A graph step moves {fmt_bytes(b['bytes'])} in {b['graph_ms']:.2f} ms:
        {b['graph_gbs']:,.0f} GB/s, {b['graph_gbs'] * 1e9 / copy:.0%} of the copy bandwidth measured above.
        At the full copy speed those bytes take {ceiling_ms:.2f} ms: that is this card's wall for this step.
        The article's wall is {ARTICLE_7B['ms']:g} ms for {fmt_bytes(ARTICLE_7B['bytes'])} on an
        {ARTICLE_7B['chip']}; here {fmt_bytes(b['bytes'])} took {b['graph_ms']:.2f} ms.
    """)

    # batching: where the step turns compute-bound
    ridge = hw["ridge_flop_per_byte"]["float16"]
    rows = []
    for B in L.pick((1, 8, 32, 64, 128, 256), (1, 8, 32)):
        kv = 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * 256 * 2 * B
        if kv * 2.5 > free_bytes(device):
            break
        with L.status(f"B = {B}…"):
            r = b if B == 1 else decode_figures(big, B, 256, max(3, steps // 3), eager=False)
        rows.append(r)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("B", "ms/step", "tokens/s", "FLOP/byte", "TFLOP/s", "GB/s"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        t.add_row(str(r["batch"]), f"{r['graph_ms']:.2f}", f"{r['batch'] / r['graph_ms'] * 1e3:,.0f}",
                  f"{r['intensity']:.1f}", f"{r['graph_tflops']:.1f}", f"{r['graph_gbs']:,.0f}")
    L.show(t, f"[dim]{what}, float16, graph replays over a static KV of 256 positions; ridge {ridge:,.0f} "
              "FLOP/byte[/]")
    over = next((r["batch"] for r in rows if r["intensity"] >= ridge), None)
    L.say(f"""
        A step's FLOPs per byte grow with B: the weights are read once for all B sequences. {'From B = ' + str(over)
        + ' the step does more FLOPs per byte than the ridge: compute-bound.' if over else 'Up to B = '
        + str(rows[-1]['batch']) + ' it stays under the ridge: still memory-bound (the KV cache grows with B too).'}
    """)
    L.claim(all(r2["intensity"] > r1["intensity"] for r1, r2 in zip(rows, rows[1:])),
            "FLOP/byte rises with every larger batch")


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
