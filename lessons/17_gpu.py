"""Lesson 17: On a GPU. The same engine on an NVIDIA GPU (CuPy): eager, a small model's step waits on the
host's kernel launches, not bytes; a CUDA graph replays the step in one launch, and what is left is the
device's own time per kernel; a 7B-class model meets the memory wall the article describes, measured on
your card's own bandwidth; and batching a grouped-query (GQA) model raises its FLOPs per byte toward the
ridge, every row set against both roofs (a model with one KV head per query head never gets there).
Without a GPU it says so and shows the figures minillm's developers measured on an H200 as data, with their
source, read against the same roofline.

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
from minillm.measure.chips import CHIPS
from minillm.measure.gpu import (ARTICLE_7B, H200_RUN, SHAPES, batched_step, crossing_batch, decode_figures,
                                 free_bytes, gpu_figures, roof_shares)
from minillm.ui.report import fmt_bytes

TITLE = "On a GPU: launches, graphs, the memory wall"
MINUTES = 5  # 991 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "launches, a CUDA graph, 7B on your card, batching against both roofs"


def lesson(L: Lesson) -> None:
    operations(L)
    try:
        device = get_device("cuda")
    except DeviceError as e:
        L.note(f"no GPU here: {escape(str(e))}")
        h200_table(L)
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


# -- 2a. no GPU: minillm's developers' H200 figures, as data --------------------------------------------

H200_ROWS = (("llama-2-7b", 1, "llama2_7b_fp16_b1"), ("llama-2-7b", 64, "64"), ("llama-2-7b", 256, "256"),
             ("llama-3-8b", 256, "256"), ("llama-3-8b", 384, "384"))


def h200_rows() -> list[dict]:
    """The developers' measured steps on the H200, each with its bytes and FLOPs by the shape's arithmetic
    (weights once, every sequence's KV of 256 positions) and its shares of the H200's two roofs."""
    chip, ctx = CHIPS["h200"], H200_RUN["context"]
    out = []
    for shape, B, key in H200_ROWS:
        if key == "llama2_7b_fp16_b1":
            ms = H200_RUN[key]["graph_ms"]
        elif shape == "llama-2-7b":
            ms = H200_RUN["llama2_7b_fp16_graph_ms"][key]
        else:
            ms = H200_RUN["llama3_8b_gqa_fp16"]["graph_ms"][key]
        step = batched_step(shape, B, ctx)
        out.append({"shape": shape, "batch": B, "ms": ms, **step,
                    **roof_shares(step, ms, chip.bandwidth_gbs, chip.peak_gflops / 1e3)})
    return out


def gpu_ridges() -> dict:
    """The fp16 ridges of the GPUs in minillm's chip table (those with their own memory and a peak)."""
    return {c.name: c.ridge for c in CHIPS.values() if c.memory_gb and c.ridge}


def cap_words(cap: float) -> str:
    """Whether a batched step's FLOP/byte cap can reach any GPU's ridge in the chip table."""
    ridges = gpu_ridges()
    low = min(ridges, key=ridges.get)
    if cap < ridges[low]:
        return (f"below the lowest fp16 ridge in minillm's chip table ({ridges[low]:.0f}, the {low}'s), so it "
                "never turns compute-bound at this context on any of them.")
    return f"above the {low}'s ridge of {ridges[low]:.0f}: a batch large enough crosses it there."


def h200_table(L: Lesson) -> None:
    g, big = H200_RUN["gpt2_124m_fp16_b1"], H200_RUN["llama2_7b_fp16_b1"]
    chip = CHIPS["h200"]
    L.section("What a GPU did with this work: an H200's figures (not this machine's)")
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("decode step, B = 1", "eager", "graph", "bytes a step"):
        t.add_column(col, justify="left" if col.startswith("decode") else "right", no_wrap=True)
    t.add_row("GPT-2-124M shape, fp16", f"{g['eager_ms']} ms", f"{g['graph_ms']} ms", fmt_bytes(g["bytes"]))
    t.add_row("  transformers generate", f"{g['transformers_eager_ms']} ms", "—", "")
    t.add_row("Llama-2-7B shape, fp16", f"{big['eager_ms']} ms", f"{big['graph_ms']} ms", fmt_bytes(big["bytes"]))
    L.show(t, f"[dim]source: {H200_RUN['source']}[/]")
    copy = big["copy_tbs"] * 1e12
    small_share = g["bytes"] / (g["graph_ms"] * 1e-3) / copy
    big_gbs = big["bytes"] / (big["graph_ms"] * 1e-3)
    per_kernel = (g["eager_ms"] - g["graph_ms"]) * 1e3 / g["kernels"]
    in_graph = g["graph_ms"] * 1e3 / g["kernels"]
    ceiling_ms = big["bytes"] / copy * 1e3
    L.say(f"""
        What those figures say, computed from them alone:

        - **Eager, a small model's step waits on the host.** GPT-2-124M's eager step took {g['eager_ms']} ms,
          its graph {g['graph_ms']} ms: the graph saved {g['eager_ms'] - g['graph_ms']:.2f} ms,
          {per_kernel:.1f} µs for each of its about {g['kernels']} kernels, the host's launch and the
          framework's dispatch.
        - **As a graph, it waits on its kernels.** The graph step moved {fmt_bytes(g['bytes'])} in
          {g['graph_ms']} ms: {g['bytes'] / (g['graph_ms'] * 1e-3) / 1e9:,.0f} GB/s, {small_share:.0%} of the
          {big['copy_tbs']} TB/s a device copy reached on that card. That is {in_graph:.1f} µs a kernel on the
          device, however few bytes each moves: the next fix is fusion (fewer, larger kernels), not bandwidth.
        - **A 7B-class model meets the memory wall.** {fmt_bytes(big['bytes'])} in {big['graph_ms']} ms is
          {big_gbs / 1e12:.2f} TB/s, {big_gbs / copy:.0%} of the copy bandwidth and {big_gbs / 1e9 / chip.bandwidth_gbs:.0%}
          of the {chip.bandwidth_gbs / 1e3:g} TB/s datasheet figure; streaming the weights at the full copy speed
          would take {ceiling_ms:.1f} ms. The article's {ARTICLE_7B['ms']:g} ms is
          {fmt_bytes(ARTICLE_7B['bytes'])} at an {ARTICLE_7B['chip']}'s bandwidth. This was a minimal step of
          separate kernels; lesson 6's 80-90% of the datasheet is what tuned engines with fused kernels reach.
    """)
    rows = h200_rows()
    one = next(r for r in rows if r["shape"] == "llama-2-7b" and r["batch"] == 1)
    L.claim(abs(one["bytes"] - big["bytes"]) < 0.01 * big["bytes"],
            f"the Llama-2-7B shape's arithmetic (weights once, 256 positions of KV) gives "
            f"{fmt_bytes(one['bytes'])} a step, within 1% of the {fmt_bytes(big['bytes'])} that run counted")
    L.pause()
    batched_rows(L, rows, chip)


def batched_rows(L: Lesson, rows: list[dict], chip) -> None:
    """The batched steps against both roofs of the H200's published figures: FLOP/byte against the ridge,
    where the bytes go (weights, KV), and the shares of the bandwidth and the peak each step reached."""
    ridge = chip.ridge
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("shape", "B", "ms", "weights", "KV", "FLOP/B", "bound", "% BW", "% peak"):
        t.add_column(col, justify="left" if col == "shape" else "right", no_wrap=True)
    for r in rows:
        t.add_row(r["shape"], str(r["batch"]), f"{r['ms']:g}", fmt_bytes(r["weights"]), fmt_bytes(r["kv"]),
                  f"{r['intensity']:.0f}", r["bound"], f"{r['of_bandwidth']:.0%}", f"{r['of_peak']:.0%}")
    L.show(t, f"[dim]graph steps over {H200_RUN['context']} positions; weights, KV, FLOP/B by each shape's "
              f"arithmetic; bound: the roofline of the {chip.name.upper()}'s published {chip.bandwidth_gbs:,.0f} "
              f"GB/s and {chip.peak_gflops / 1e3:,.0f} TFLOP/s (ridge {ridge:.0f}); % BW, % peak: the step's "
              "bytes and FLOPs over its measured time, against each[/]")
    mha = next(r for r in rows if r["shape"] == "llama-2-7b" and r["batch"] == max(
        x["batch"] for x in rows if x["shape"] == "llama-2-7b"))
    gqa = [r for r in rows if r["shape"] == "llama-3-8b"]
    first = next((r for r in gqa if r["intensity"] >= ridge), None)
    below = [r for r in gqa if r["intensity"] < ridge]
    one = next(r for r in rows if r["shape"] == "llama-2-7b" and r["batch"] == 1)
    cross = crossing_batch(batched_step("llama-3-8b", 1, H200_RUN["context"]), ridge)
    L.say(f"""
        Batching shares the weight read, never the KV read (lesson 6). Llama-2-7B (one KV head per query
        head) at B = {mha['batch']}: {mha['batch']} sequences took {fmt_x(mha['ms'] / one['ms'])} the time of
        one, and {fmt_bytes(mha['kv'])} of the step's {fmt_bytes(mha['bytes'])} were KV
        ({fmt_bytes(mha['kv_per_row'])} a sequence), {fmt_x(mha['kv'] / mha['weights'])} the weights. Its FLOPs
        per byte can only tend to one row's FLOPs ÷ its own KV bytes, **{mha['cap']:.0f}**:
        {cap_words(mha['cap'])}

        Llama-3-8B keeps 8 KV heads for 32 query heads: its cap is {gqa[0]['cap']:.0f}, and it reaches the
        H200's ridge near **B ≈ {cross:,.0f}** by the same arithmetic. At B = {', '.join(str(r['batch']) for r in below)}
        its step did {', '.join(f"{r['intensity']:.0f}" for r in below)} FLOP/byte, below the ridge of {ridge:.0f}:
        memory-bound by the roofline, though it reached only {below[-1]['of_bandwidth']:.0%} of the bandwidth
        and {below[-1]['of_peak']:.0%} of the peak, {fmt_x(1 / below[-1]['of_roofline'])} its roofline time: bound by
        neither roof. {f"At B = {first['batch']} ({first['intensity']:.0f} FLOP/byte) it passes the ridge." if first
        else "No measured batch passes the ridge."}
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

    # a small model: launches, then the device's own time per kernel
    small = minillm.load("random-124m", device=device)                       # float16 on the GPU
    with L.status("GPT-2-124M shape, float16, B = 1: eager, then one graph…"):
        s = decode_figures(small, 1, 256, steps)
    launches_ms = s["kernels"] * hw["launch_us"] / 1e3
    per_kernel = s["graph_ms"] * 1e3 / s["kernels"]
    L.say(f"""
        **GPT-2-124M shape, float16, one sequence.** A step launches {s['kernels']} kernels (counted from
        its CUDA graph's nodes). Eager it took {s['eager_ms']:.2f} ms; {s['kernels']} × {hw['launch_us']:.2f} µs
        of launches is {launches_ms:.2f} ms of that ({launches_ms / s['eager_ms']:.0%}): eager, the host sets the
        time. As one graph it took {s['graph_ms']:.2f} ms ({fmt_x(s['eager_ms'] / s['graph_ms'])} the eager
        speed), moving {fmt_bytes(s['bytes'])}: {s['graph_gbs']:,.0f} GB/s, {s['graph_gbs'] * 1e9 / copy:.0%} of
        this card's copy bandwidth. That is {per_kernel:.1f} µs a kernel on the device, against
        {hw['graph_launch_us']:.2f} µs for an empty kernel inside a graph: the number and size of the kernels
        set the graph's time, and fusion (fewer, larger kernels) is the next fix, not bandwidth. Minillm's
        developers' H200 did it in {H200_RUN['gpt2_124m_fp16_b1']['graph_ms']} ms with torch ({H200_RUN['source']}).
    """)
    L.claim(s["kernels"] > 0 and s["bytes"] > 0, f"the captured step has {s['kernels']} kernels and moves "
            f"{fmt_bytes(s['bytes'])}, as the meter counts it")
    del small
    L.pause()

    # a 7B-class model: the wall
    big, cfg, what = _load_shape(L, device, "llama2-7b", "the Llama-2-7B shape")
    with L.status(f"{what}: one decode step…"):
        b = decode_figures(big, 1, 256, steps)
    ceiling_ms = b["bytes"] / copy * 1e3
    L.say(f"""
        **{what[0].upper() + what[1:]}, float16, one sequence.** A graph step moves {fmt_bytes(b['bytes'])} in {b['graph_ms']:.2f} ms:
        {b['graph_gbs']:,.0f} GB/s, {b['graph_gbs'] * 1e9 / copy:.0%} of the copy bandwidth measured above.
        At the full copy speed those bytes take {ceiling_ms:.2f} ms: that is this card's wall for this step.
        The article's wall is {ARTICLE_7B['ms']:g} ms for {fmt_bytes(ARTICLE_7B['bytes'])} on an
        {ARTICLE_7B['chip']}; here {fmt_bytes(b['bytes'])} took {b['graph_ms']:.2f} ms. This is a plain step of
        separate kernels: engines with fused kernels reach more of the bandwidth (lesson 6's 80-90%).
    """)
    del big
    L.pause()
    batching_on_this_gpu(L, device, hw, steps)


def _load_shape(L: Lesson, device, key: str, name: str):
    """A Llama-family shape (measure/gpu.SHAPES) with random float16 weights on the GPU, cut to the layers
    that fit its free memory (and to 4 in fast mode): (model, config, what it is in words)."""
    from minillm.checkpoints.load import random_model
    c = dict(SHAPES[key])
    d, F, Hkv, hd = c["n_embd"], c["ffn"], c["n_kv_head"], c["head_dim"]
    per_layer = 2 * (2 * d * d + 2 * d * Hkv * hd + 3 * d * F)              # float16 bytes of one block
    room = free_bytes(device) * 0.8 - 2 * 2 * c["vocab_size"] * d
    layers = max(1, min(c["n_layer"], L.pick(c["n_layer"], 4), int(room // (per_layer * 1.15))))
    cfg = LlamaConfig(**{**c, "n_layer": layers})
    what = name if layers == c["n_layer"] else \
        f"{name} cut to {layers} of its {c['n_layer']} layers (what fits{' in fast mode' if L.fast else ''})"
    with L.status(f"{what}: random float16 weights on the GPU…"):
        model = random_model(cfg, dtype="float16", device=device)
    return model, cfg, what


def batching_on_this_gpu(L: Lesson, device, hw, steps: int) -> None:
    """Llama-3-8B's shape (GQA: 8 KV heads for 32 query heads), B sequences over 256 positions: each row's
    FLOP/byte against this card's ridge, and its shares of both roofs."""
    ridge = hw["ridge_flop_per_byte"]["float16"]
    big, cfg, what = _load_shape(L, device, "llama3-8b", "the Llama-3-8B shape (GQA)")
    at1 = batched_step("llama-3-8b", 1, 256)
    mha = batched_step("llama-2-7b", 1, 256)
    cross = crossing_batch(at1, ridge)
    L.say(f"""
        **Batching, against both roofs.** A step of B sequences reads the weights once and each
        sequence's KV of 256 positions, so its FLOPs per byte tend to one row's FLOPs ÷ its own KV bytes:
        {mha['cap']:.0f} for Llama-2-7B (one KV head per query head: below every GPU ridge, it never
        crosses) and {at1['cap']:.0f} for Llama-3-8B, whose 8 KV heads serve 32 query heads. On this card
        (ridge {ridge:,.0f} in float16) the full Llama-3-8B shape turns compute-bound near
        **B ≈ {'never' if cross is None else f'{cross:,.0f}'}** by that arithmetic. Below, {what}, measured:
    """)
    rows = []
    for B in L.pick((1, 8, 32, 64, 128, 256, 384, 512), (1, 8, 32)):
        kv = 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * 256 * 2 * B
        if kv * 2.5 > free_bytes(device):
            break
        with L.status(f"B = {B}…"):
            r = decode_figures(big, B, 256, max(3, steps // 3), eager=B == 1)
        r.update(roof_shares({"bytes": r["bytes"], "flops": r["flops"]}, r["graph_ms"], hw["copy_gbs"],
                             hw["matmul_tflops"]["float16"]))
        rows.append(r)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("B", "ms/step", "tokens/s", "FLOP/byte", "bound", "% BW", "% peak"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        t.add_row(str(r["batch"]), f"{r['graph_ms']:.2f}", f"{r['batch'] / r['graph_ms'] * 1e3:,.0f}",
                  f"{r['intensity']:.1f}", r["bound"], f"{r['of_bandwidth']:.0%}", f"{r['of_peak']:.0%}")
    L.show(t, f"[dim]{what}, float16, graph replays over a static KV of 256 positions; FLOP/byte: the meter's; "
              f"bound: this card's roofline (copy {hw['copy_gbs']:,.0f} GB/s, matmul "
              f"{hw['matmul_tflops']['float16']:,.1f} TFLOP/s, ridge {ridge:,.0f}); % BW, % peak: of each, reached[/]")
    over = next((r for r in rows if r["intensity"] >= ridge), None)
    last = rows[-1]
    L.say(f"""
        A step's FLOPs per byte grow with B: the weights are read once for all B sequences.
        {f"From B = {over['batch']} the step does more FLOPs per byte than the ridge: compute-bound by the roofline."
         if over else f"Up to B = {last['batch']} it stays under the ridge: memory-bound by the roofline (the KV "
         "cache grows with B too)."} The largest batch reached {last['of_bandwidth']:.0%} of the bandwidth and
        {last['of_peak']:.0%} of the peak: {fmt_x(1 / last['of_roofline'])} its roofline time.
    """)
    L.claim(all(r2["intensity"] > r1["intensity"] for r1, r2 in zip(rows, rows[1:])),
            "FLOP/byte rises with every larger batch")


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
