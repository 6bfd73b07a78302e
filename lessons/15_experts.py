"""Lesson 15: Experts: reading only part of the model. A mixture of experts holds E MLPs per layer and
runs k of them per token: active against total bytes on a random preset and on published shapes
(Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3); the bytes a decode step reads at B = 1 to 32, counted,
against the union of experts uniform routing predicts and the router really chose; tokens/s against B
beside a dense model of the same active bytes (where each turns compute-bound); the load on the
busiest expert in a served run; expert parallelism across GPUs, on paper.

Run:  python lessons/15_experts.py        (or: minillm learn 15)
"""

from __future__ import annotations

from minillm.lessons._common import Lesson, fmt_ratio, fmt_x, plural, roofline_clock, run_lesson

import statistics

import numpy as np
from rich import box
from rich.table import Table

import minillm
from minillm.engine.engine import Engine
from minillm import closeness
from minillm.measure import batching
from minillm.measure.chips import CHIPS, LINKS
from minillm.measure.experts import PUBLISHED, RELEASED, SOURCE, kept_params, published_params, uniform_busiest
from minillm.measure.shapes import gpus_needed
from minillm.meter import Meter
from minillm.models import llama, moe
from minillm.models.moe import MoE, MoEConfig, expected_distinct_experts, routes
from minillm.ui.report import fmt_bytes

TITLE = "Experts: reading only part of the model"
MINUTES = 13  # 2,582 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "active and total bytes, the union of experts a batch reads, EP on paper"

MOE_NAME, DENSE_NAME = "random-moe-16x2", "random-moe-16x2-dense"
BATCHES = (1, 2, 4, 8, 16, 32)
CONTEXT = 16                       # tokens of prompt behind every sequence of the batch sweep
TRY_EXPERTS = (128, 8)             # the try-it's E and k: Qwen3-30B-A3B's (k/E = 1/16, the presets' 1/8)


# -- the models: the one place they are built ---------------------------------------------------------
#
# Fast mode runs small stand-ins of the same E and k (building the real presets takes seconds); full
# mode loads the presets by name, as `minillm bench --model random-moe-16x2` does.

_SMALL = dict(n_layer=2, n_head=2, n_kv_head=1, head_dim=32, n_embd=64, n_ctx=128, vocab_size=512,
              eps=1e-5, theta=1e4, tied=True)
FAST_PRESETS = {
    MOE_NAME: MoEConfig(**_SMALL, ffn=64, n_expert=16, top_k=2, expert_ffn=64),
    DENSE_NAME: llama.LlamaConfig(**_SMALL, ffn=2 * 64),
}


def mix_ratio() -> int:
    """E/k of the small mixture the lesson runs."""
    c = FAST_PRESETS[MOE_NAME]
    return c.n_expert // c.top_k


def preset(L: Lesson, name: str):
    """The preset `name` (full mode), or its small stand-in of the same E and k (fast mode)."""
    with L.status(f"building {name}…"):
        if not L.fast:
            return minillm.load(name)
        c = FAST_PRESETS[name]
        cls = MoE if isinstance(c, MoEConfig) else llama.Llama
        return cls(c, llama.random_params(c, moe.RANDOM_SEED, expected=cls.manifest), name=f"{name} (small)")


# -- the lesson ---------------------------------------------------------------------------------------

def lesson(L: Lesson) -> None:
    if L.model_name:
        L.note(f"--model {L.model_name} is not used: this lesson compares its two presets, {MOE_NAME} and "
               f"{DENSE_NAME}.")
    mix, dense = preset(L, MOE_NAME), preset(L, DENSE_NAME)
    active_and_total(L, mix, dense)
    published(L)
    models = {"dense": dense, "mixture": mix}
    runs = start_runs(L, models)
    counts = union_of_experts(L, models, runs)
    crit, bound = speed(L, models, runs, counts)
    busiest = imbalance(L, mix, bound)
    expert_parallelism(L, mix, busiest, crit, bound)
    E, k = TRY_EXPERTS
    L.try_it(f"""
        `minillm bench --batch 1,2,4,8,16,32 --model {MOE_NAME},{DENSE_NAME}` measures this lesson's
        two curves as a command, in the same interleaved rounds. Change `BATCHES` at the top of this lesson to
        sweep past 32 and watch the mixture read all of its experts; in `FAST_PRESETS` (the models
        `--fast` runs; full mode loads the presets by name), give the small mixture {E} experts and
        top-{k}, Qwen3-30B-A3B's k/E = 1/{E // k} against the presets' 1/{mix_ratio()}, and see how far
        the union falls behind B·k.
    """)


# -- 1. active and total ------------------------------------------------------------------------------

def active_and_total(L: Lesson, mix, dense) -> None:
    c = mix.config
    L.say(f"""
        A **mixture of experts** (MoE) replaces each layer's MLP by E smaller MLPs, the *experts*, and a
        *router*: a `d × E` matrix whose softmax scores each expert for each token. A token runs only
        the k experts with the highest scores, weighted. So memory holds all E experts (the **total**
        parameters), and a token multiplies only k of them (the **active** ones).

        `{mix.name}`: {c.n_layer} layers, each with E = {c.n_expert} experts of width {c.expert_ffn},
        top-k = {c.top_k}. Its twin `{dense.name}` has the same attention and one MLP as wide as the
        k experts together ({dense.config.ffn}): what one token of the mixture multiplies, minus the router.
    """)
    b = np.dtype(mix.dtype).itemsize
    one, picked = decode_once(mix)
    one_dense, _ = decode_once(dense)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("", "params", "bytes held", "active/token", "read, B = 1"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_row("mixture", f"{c.n_params() / 1e6:.2g}M", fmt_bytes(mix.nbytes()), fmt_bytes(b * c.active_params()),
              fmt_bytes(one))
    t.add_row("dense twin", f"{dense.config.n_params() / 1e6:.2g}M", fmt_bytes(dense.nbytes()),
              fmt_bytes(b * dense.config.n_params()), fmt_bytes(one_dense))
    L.show(t, "[dim]float32; read: the meter's weight bytes of one decode step (the embedding table "
              "counted whole as the tied head, plus the token's row)[/]")
    L.claim(one == mix.step_weight_bytes() and all(n == c.top_k for n in picked),
            f"one decode step read {one:,} weight bytes, the closed form for {c.top_k} experts in each of "
            f"{len(c.sparse_layers)} layers ({mix.step_weight_bytes():,}); the router picked {c.top_k} per layer")
    routers = b * len(c.sparse_layers) * c.n_embd * c.n_expert
    L.claim(one == one_dense + routers,
            f"the dense twin's step read {one_dense:,}: the mixture's bytes less its routers' "
            f"{fmt_bytes(routers)}, though the mixture holds {fmt_x(mix.nbytes() / dense.nbytes())} its bytes")
    L.pause()


def decode_once(model) -> tuple[int, list[int]]:
    """One decode step after a short prompt: the meter's weight bytes, and how many distinct experts
    each sparse layer's router picked (empty for a dense model)."""
    _, cache = model.prefill([1, 2, 3])
    with Meter() as m, routes() as r:
        model.decode_step(4, cache)
    return m.steps[0].bytes["weights"], [len(set(a.ravel())) for a in r]


# -- 2. published shapes ------------------------------------------------------------------------------
#
# Each model's config.json on the Hugging Face hub, the numbers the arithmetic needs, and the formulas
# (MLA included): minillm/measure/experts.py, which `minillm hardware --shape` reads too.

def published(L: Lesson) -> None:
    from minillm.measure.experts import held_bytes, read_bytes
    from minillm.measure.shapes import shape
    L.section("Published mixtures: total against active")
    L.say(f"""
        The same arithmetic on three released models, from the numbers in their {SOURCE}, each sized
        **as released**: Mixtral and Qwen3 ship bf16 (2 bytes a parameter); DeepSeek-V3 ships its
        matrices in FP8 (1 byte) with a float32 scale per 128×128 tile, and its embedding, head, routers
        and norms in bf16. The memory must hold the total; a token reads the active part (less the
        embedding table, of which it reads one row).
    """)
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("model", "experts", "total", "active", "held", "read/tok", "share"):
        t.add_column(col, justify="right", no_wrap=True)
    got = {}
    for name, s in PUBLISHED.items():
        total, active = got[name] = published_params(s)
        sh = shape(name.lower())
        fmt = "fp8" if RELEASED[name][1] < 2 else RELEASED[name][0]
        t.add_row(name, f"{s['E']}{'+1' if s['shared'] else ''}, top-{s['k']}", f"{total / 1e9:.1f}B",
                  f"{active / 1e9:.2f}B", f"{fmt_bytes(held_bytes(sh))} {fmt}", fmt_bytes(read_bytes(sh)),
                  f"{active / total:.0%}")
    L.show(t, "[dim]" + "; ".join(f"{n}: {s['repo']}" for n, s in PUBLISHED.items())
           + "; held and read/token in the released format[/]")
    for name, s in PUBLISHED.items():
        total, active = got[name]
        L.fact(f"{name}: {total / 1e9:.1f}B parameters, {active / 1e9:.2f}B active by these formulas; its "
               f"makers say {s['said'][0] / 1e9:g}B and {s['said'][1] / 1e9:g}B")
    ds = shape("deepseek-v3")
    ratio = held_bytes(ds, 2.0) / held_bytes(ds)
    L.fact(f"DeepSeek-V3 as released holds {fmt_bytes(held_bytes(ds))}: {kept_params(PUBLISHED['DeepSeek-V3']) / 1e9:.2f}B "
           f"parameters in bf16, the rest at 1 + 4/16,384 bytes; upcast to bf16 it would hold "
           f"{fmt_bytes(held_bytes(ds, 2.0))}, {fmt_x(ratio)} that")
    L.say("""
        What the table leaves out or changes. DeepSeek-V3 runs one **shared expert** in every sparse layer
        for every token (the "+1": counted in both columns), keeps its first 3 layers dense, and its
        attention is **MLA**: queries and keys/values pass through low-rank latents, so its attention
        weights follow the formula in `measure.experts.attention_params`, not `d·(H + 2·Hkv)·hd`, and its KV cache
        holds the 512 + 64 latent per layer instead of keys and values. Its multi-token-prediction (MTP)
        module (about 14B more in the released files, 685B in all) is not counted: plain decode does not
        run it, but engines can use it as the draft of lesson 11 (DeepSeek's report: the second token
        accepted 85-90% of the time, about 1.8× the tokens per second). Routers and norms are counted;
        none of these matrices has a bias.
    """)
    L.pause()


# -- 3. the union of experts --------------------------------------------------------------------------

def steps_per_sample(L: Lesson) -> int:
    return L.pick(4, 2)


def start_runs(L: Lesson, models: dict) -> dict:
    """For each model and batch size, B sequences with CONTEXT-token prompts prefilled in one batched
    step: the sweep `minillm bench --batch` runs (`measure.batching`)."""
    rng = np.random.default_rng(0)
    with L.status("prefilling the batches…"):
        return {(name, B): batching.start(model, B, CONTEXT, steps_per_sample(L), rng)
                for name, model in models.items() for B in BATCHES}


def union_of_experts(L: Lesson, models: dict, runs: dict) -> dict:
    L.section("A batch reads the union of its tokens' experts")
    mix = models["mixture"]
    c = mix.config
    E, k, S = c.n_expert, c.top_k, len(c.sparse_layers)
    L.say(f"""
        Batching shares a weight read among B tokens (lesson 8). In a mixture each token picks its own k
        experts, and a step reads every expert that *any* of its tokens picked, once (the engine groups
        the rows by expert). If the router picked k of E at random, an expert would escape one token with
        probability 1 − k/E and all B with (1 − k/E)^B: a layer would read **E·(1 − (1 − k/E)^B)**
        experts. Below, one decode step of B sequences at each B: the experts the real router chose
        (mean over the {S} layers), that formula, and the meter's weight bytes.
    """)
    counts, union = {}, {}
    for B in BATCHES:
        for name, model in models.items():
            seqs = runs[name, B]
            with Meter() as m, routes() as r:
                batching.step(model, seqs)
            batching.rewind(seqs, CONTEXT)
            counts[name, B] = m.steps[0]
            if name == "mixture":
                union[B] = [len(set(a.ravel())) for a in r]
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("B", "router chose", "uniform", "B·k", "weights read", "per token", "if uniform"):
        t.add_column(col, justify="right", no_wrap=True)
    for B in BATCHES:
        w = counts["mixture", B].bytes["weights"]
        expect = expected_distinct_experts(E, k, B)
        t.add_row(str(B), f"{statistics.mean(union[B]):.1f}", f"{expect:.1f}", str(B * k), fmt_bytes(w),
                  fmt_bytes(w / B), fmt_bytes(mix.step_weight_bytes(B)))
    L.show(t, f"[dim]experts read per layer, of {E}; weights read: the meter's count for the step; if "
              "uniform: the closed form with the formula's number of experts[/]")
    L.claim(all(counts["mixture", B].bytes["weights"] == mix.step_weight_bytes(B, union[B]) for B in BATCHES),
            "at every B the meter's weight bytes equal the closed form for the experts the router chose: "
            "each chosen expert read once a step, however many tokens chose it")
    last = BATCHES[-1]
    chose, expect = statistics.mean(union[last]), expected_distinct_experts(E, k, last)
    how = ("about as many as" if abs(chose - expect) <= 0.1 * expect else
           "more than" if chose > expect else "fewer than")
    w1, wl = counts["mixture", 1].bytes["weights"], counts["mixture", last].bytes["weights"]
    d1, dl = counts["dense", 1].bytes["weights"], counts["dense", last].bytes["weights"]
    L.say(f"""
        At B = {last} this router chose {chose:.1f} experts per layer, {how} uniform routing's {expect:.1f},
        and the mixture's step read {fmt_x(wl / w1)} the weight bytes of B = 1; the dense twin's read
        {fmt_x(dl / d1)} (only its embedding rows grow). Per token, the mixture's bytes fall more slowly
        with B: each of the first tokens of a batch brings experts of its own to read.
    """)
    L.pause()
    return counts


# -- 4. tokens/s against B ----------------------------------------------------------------------------

def compute_bound(rec, hw) -> bool:
    """The roofline's verdict on one counted step: its FLOPs take longer at the peak than its bytes at
    the bandwidth."""
    return rec.total_flops / (hw.peak_gflops * 1e9) > rec.total_bytes / (hw.bandwidth_gbs * 1e9)


def priced_tps(counts: dict, hw) -> dict:
    """Tokens per second on the roofline clock: B ÷ the price of each step's counted bytes and FLOPs,
    max(bytes ÷ bandwidth, FLOPs ÷ peak) at `hw`'s figures. Counts, not a stopwatch: the same in every
    run, busy or not."""
    return {(name, B): B / hw.roofline(rec.total_bytes, rec.total_flops).seconds
            for (name, B), rec in counts.items()}


def speed(L: Lesson, models: dict, runs: dict, counts: dict) -> dict:
    L.section("Tokens per second against B: when does each stop waiting for memory?")
    mix = models["mixture"]
    c = mix.config
    E, k = c.n_expert, c.top_k
    L.say(f"""
        A decode step is memory-bound while its weight bytes take longer to read than its FLOPs take to
        compute. A dense model's FLOPs per weight byte grow with B: every row multiplies every weight.
        In the mixture, an expert read at batch B serves only the rows that chose it, about B·k/E
        of them once all experts are read: the experts reach a dense model's FLOPs per byte at **E/k =
        {E // k} times the batch**. But attention, the embeddings and the head are dense in a mixture
        too, read once for all rows. So the whole step, once every expert is read, needs about
        **total ÷ active** times the dense batch: E/k only if the experts were all of the weights.
        Both models now decode at every B, interleaved, on the same threads. The point is bytes and
        FLOPs, so the comparisons below are priced: each step's counted bytes and FLOPs at this
        machine's roofline, the same every run; the measured tokens/s stand beside them.
    """)
    L.machine()
    clock = roofline_clock(L)                 # the figures of the threads asked for, busy or not
    hw = clock.hw
    with L.progress("decode steps, both models, every B", L.rounds()) as advance:
        secs = batching.time_steps(models, runs, CONTEXT, steps_per_sample(L), L.rounds(), advance)
    tps = {key: [key[1] / s for s in ss] for key, ss in secs.items()}
    med = {key: statistics.median(v) for key, v in tps.items()}
    gain = {key: med[key] / med[key[0], 1] for key in med}
    priced = priced_tps(counts, hw)
    pgain = {key: priced[key] / priced[key[0], 1] for key in priced}
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("B", "dense tok/s", "gain", "priced", "roof", "MoE tok/s", "gain", "priced", "roof"):
        t.add_column(col, justify="right", no_wrap=True)
    bound = {key: compute_bound(rec, hw) for key, rec in counts.items()}
    for B in BATCHES:
        t.add_row(str(B), *(x for name in models for x in (
            f"{med[name, B]:,.0f}", fmt_x(gain[name, B]), fmt_x(pgain[name, B]),
            "compute" if bound[name, B] else "memory")))
    threads = f" at {plural(hw.blas_threads, 'BLAS thread')}" if hw.blas_threads else ""
    L.show(t, f"[dim]gain: measured tokens/s ÷ B = 1's; priced: the same on {clock.words()}{threads}, "
              f"each step at max(counted bytes ÷ bandwidth, counted FLOPs ÷ peak); roof: which of the "
              f"two set the price (ridge {hw.peak_gflops / hw.bandwidth_gbs:.2g} FLOP/byte)[/]")
    L.timing_note(ranked=False)
    L.say("Both were measured in the same rounds on the same BLAS threads"
          + (", on a busy machine: the tokens/s are slower and noisier than it can do, the counts are not."
             if L.busy else "."))
    crit = {name: batching.critical_batch(model, {B: counts[name, B] for B in BATCHES}, hw)
            for name, model in models.items()}
    L.say(roofline_words(crit, E, k, mix.config.n_params() / mix.config.active_params()))
    L.say(twin_words(priced, tps, {name: counts[name, 1].total_bytes for name in models}, k))
    L.say(gain_words(pgain, gain))
    L.pause()
    return crit, bound


def twin_words(priced: dict, tps: dict, step_bytes: dict, k: int) -> str:
    """B = 1: the mixture against its dense twin of the same active bytes. The verdict is on the priced
    tokens/s (`priced_tps`: counts, the same every run; issue 53: a timed verdict here changed between
    a winner and "no winner" from run to run); the measured ratio and its rounds are said beside it,
    unranked, with what the roofline leaves out (issue 53: 174 against 108 tok/s was called noise)."""
    r = priced["mixture", 1] / priced["dense", 1]
    side = closeness.figures_apart(priced["mixture", 1], priced["dense", 1])
    verdict = "more" if side > 0 else "fewer" if side < 0 else f"no winner, within {closeness.CLOSE:.0%}"
    mix, dense = tps["mixture", 1], tps["dense", 1]
    per_round = [x / y for x, y in zip(mix, dense) if y > 0]
    measured = fmt_ratio((statistics.median(mix) / statistics.median(dense), min(per_round), max(per_round)))
    return (f"At B = 1 a step of the mixture read {fmt_bytes(step_bytes['mixture'])} and one of its dense "
            f"twin {fmt_bytes(step_bytes['dense'])} (counted); priced, the mixture made {fmt_x(r)} the twin's "
            f"tokens/s: {verdict} ({closeness.PRICED_RULE}). Measured, it made {measured} the twin's "
            f"tokens/s, timed and not ranked: the roofline prices the bytes the meter counts, not where they come "
            f"from (a smaller matrix can stay in this CPU's caches between steps) or how many products "
            f"read them, and the mixture reads its weights as {k} expert products a layer, each a smaller "
            "matrix than the twin's one wide MLP.")


def roofline_words(crit: dict, E: int, k: int, held: float) -> str:
    """The roofline's critical batches, and their ratio against total ÷ active (`held`), in words
    chosen by the numbers."""
    def where(name):
        if crit[name] is None:
            return "no batch (its FLOPs per byte never reach the ridge)"
        return f"B ≈ {crit[name]:,}" + ("" if crit[name] <= BATCHES[-1] else " (past the sweep)")
    text = (f"By the roofline, from this run's counts, the dense model turns compute-bound at {where('dense')}, "
            f"the mixture at {where('mixture')}")
    if crit["dense"] and crit["mixture"]:
        r = crit["mixture"] / crit["dense"]
        rel = ("about" if abs(r - held) <= 0.25 * held else "more than" if r > held else "less than")
        text += (f": {fmt_x(r)} the batch, {rel} its total ÷ active parameters ({fmt_x(held)}), and "
                 + ("less than" if r < E / k else "not less than") + f" E/k = {E // k}.")
    else:
        text += "."
    return text + " (Between the sweep's batches: its counts joined by straight lines, uniform routing's union.)"


def gain_words(pgain: dict, gain: dict) -> str:
    """What batching bought each model, ranked on the priced gains (tokens/s at B ÷ at B = 1 on the
    roofline clock: counts, the same every run) by the minimum effect alone; the measured gains (the
    table's medians) said beside them, unranked."""
    last = BATCHES[-1]
    head = (f"Priced, B = {last} gave the dense model {fmt_x(pgain['dense', last])} its B = 1 tokens/s and the "
            f"mixture {fmt_x(pgain['mixture', last])}: ")
    side = closeness.figures_apart(pgain["dense", last], pgain["mixture", last])
    if side:
        head += f"batching bought {'the dense model' if side > 0 else 'the mixture'} more"
    else:
        head += f"batching bought them about the same (within {closeness.CLOSE:.0%}): no winner"
    head += f" ({closeness.PRICED_RULE})."
    mid = BATCHES[len(BATCHES) // 2]
    target = pgain["dense", mid]
    status = [closeness.figures_apart(pgain["mixture", B], target) for B in BATCHES]
    first = next((i for i, a in enumerate(status) if a >= 0), None)
    head += f" The dense model's priced gain at B = {mid} was {fmt_x(target)}; the mixture's gain "
    if first is None:
        head += f"stayed below it up to B = {last}."
    elif status[first] > 0:
        head += (f"was below it up to B = {BATCHES[first - 1]}, and above it at B = {BATCHES[first]}."
                 if first else f"was above it already at B = {BATCHES[0]}.")
    else:
        head += (f"was below it up to B = {BATCHES[first - 1]}, and within {closeness.CLOSE:.0%} of it at "
                 f"B = {BATCHES[first]}." if first else f"was within {closeness.CLOSE:.0%} of it from "
                 f"B = {BATCHES[0]}.")
    head += (f" Measured, the gains at B = {last} were {fmt_x(gain['dense', last])} and "
             f"{fmt_x(gain['mixture', last])}, timed and not ranked.")
    return head + (" The mixture's step also pays for a product per chosen expert (up to E a layer) where "
                   "the dense one makes one: time the meter does not count.")


# -- 5. load imbalance --------------------------------------------------------------------------------

def served_requests(L: Lesson, vocab: int) -> list[tuple[list[int], int]]:
    rng = np.random.default_rng(15)
    n = L.pick(24, 6)
    return [(rng.integers(0, vocab, int(rng.integers(*L.pick((8, 49), (4, 13))))).tolist(),
             int(rng.integers(*L.pick((8, 33), (3, 9))))) for _ in range(n)]


def regime_words(bound: dict) -> str:
    """Which regime the sweep's decode steps were in, from the roofline verdicts of its counts."""
    steps = [v for (name, _), v in bound.items() if name == "mixture"]
    if not any(steps):
        return ("Every decode step of the sweep above was memory-bound by its counts: there an expert's time "
                "was its weight read, and what a step waited on was the union of experts, not their rows.")
    if all(steps):
        return "Every decode step of the sweep above was compute-bound by its counts: there rows set the time."
    first = min(B for (name, B), v in bound.items() if name == "mixture" and v)
    return (f"The sweep's decode steps were memory-bound by their counts below B = {first} (the union of experts "
            f"set the time) and compute-bound from it (rows did).")


def imbalance(L: Lesson, mix, bound: dict) -> float:
    L.section("How evenly a served workload spreads over the experts")
    c = mix.config
    E, k, S = c.n_expert, c.top_k, len(c.sparse_layers)
    reqs = served_requests(L, c.vocab_size)
    L.say(f"""
        The union counts the experts a step reads. What an expert's *rows* cost depends on the regime
        (lesson 7's ridge). Below the ridge an expert's time is its weight read, about the same for 1 row
        or 20, so the number of experts each GPU must read sets the wait. Past the ridge (a prefill, or
        decode with wide expert parallelism: DeepSeek-V3 gives each GPU about one expert and hundreds of
        tokens) an expert's time grows with its rows, and an uneven spread of rows sets it.
        {regime_words(bound)}

        Here the engine serves {plural(len(reqs), 'request')} (continuous batching, paged KV cache) and
        `moe.routes()` records every row's k experts in every layer. A fair share is k/E = {k / E:.1%} of
        a layer's rows.
    """)
    engine = Engine(mix, num_blocks=sum(-(-(len(p) + n) // 16) for p, n in reqs) + len(reqs), block_size=16)
    with routes() as r:
        served = [engine.add_request(p, n) for p, n in reqs]
        engine.run()
    ran = sum(len(p) for p, _ in reqs) + sum(len(q.output) - 1 for q in served)
    layers = [np.concatenate([a.ravel() for a in r[i::S]]) for i in range(S)]
    rows = [x.size // k for x in layers]
    L.claim(all(n == ran for n in rows),
            f"every sparse layer's router saw each token the engine ran once: {ran:,} rows a layer "
            "(the prompts, and every answer token but the last)")
    rng = np.random.default_rng(0)
    chance = statistics.mean(max(uniform_busiest(rng, ran, E, k) for _ in range(S)) for _ in range(L.pick(10, 3)))
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("layer", "busiest expert", "its rows", "share", "× fair", "idlest"):
        t.add_column(col, justify="right", no_wrap=True)
    ratio = []
    for i, x in zip(c.sparse_layers, layers):
        load = np.bincount(x, minlength=E)
        top = int(load.argmax())
        ratio.append(load.max() / load.mean())
        t.add_row(str(i), str(top), f"{load.max():,}", f"{load.max() / ran:.1%}", fmt_x(ratio[-1]),
                  f"{load.min():,}")
    L.show(t, f"[dim]share: of the layer's {ran:,} rows; × fair: the busiest expert's rows ÷ the mean "
              f"expert's; uniform routing of as many rows gives about {fmt_x(chance)} in its most uneven of {S} layers[/]")
    worst = max(ratio)
    how = ("about what chance gives" if abs(worst - chance) <= 0.1 * chance else
           "more uneven than chance" if worst > chance else "more even than chance")
    L.say(f"""
        The busiest expert of the most uneven layer served {fmt_x(worst)} the mean expert's rows:
        {how} ({fmt_x(chance)}). These are random weights: trained routers are pushed toward balance in
        training (an auxiliary loss, or DeepSeek-V3's per-expert bias), and how even one is on your
        workload is a thing to measure, as here. Spread over GPUs past the ridge, a step waits for the GPU
        whose experts got the most rows (next).
    """)
    L.pause()
    return worst


# -- 6. expert parallelism ----------------------------------------------------------------------------

GPUS = 8
EP_CHIP = "h200"                # the GPU the EP table sizes against: its memory and its HBM bandwidth


def ep_rows(G: int = GPUS, chip: str = EP_CHIP) -> list[dict]:
    """Expert parallelism on G GPUs for each published mixture, as released: each GPU's routed experts
    and its copy of everything else (attention served data-parallel), the all-to-all bytes a token sends
    (dispatch and combine, bf16, one copy per chosen expert: an upper bound), and the tokens a GPU sends
    in a step before those bytes equal its experts' bytes, and before they take as long on a link as
    the experts' read from HBM (NVLink, InfiniBand)."""
    from minillm.measure.experts import held_bytes
    from minillm.measure.shapes import shape
    hw = CHIPS[chip]
    rows = []
    for name, s in PUBLISHED.items():
        d, sparse = s["d"], s["layers"] - s["dense_layers"]
        bpw = RELEASED[name][1]
        experts = sparse * s["E"] * 3 * d * s["expert_ffn"]
        mine = experts / G * bpw
        rest = held_bytes(shape(name.lower())) - experts * bpw
        moved = 2 * s["k"] * d * 2 * sparse * (G - 1) / G
        bytes_match = mine / moved
        rows.append({"name": name, "experts_per_gpu": s["E"] / G, "experts_bytes": mine, "rest_bytes": rest,
                     "per_gpu": mine + rest, "moved": moved, "bytes_match": bytes_match,
                     **{link: bytes_match * LINKS[link][0] * 1e9 / (hw.bandwidth_gbs * 1e9)
                        for link in ("nvlink4", "ib-ndr")}})
    return rows


def expert_parallelism(L: Lesson, mix, busiest: float, crit: dict, bound: dict) -> None:
    L.section("Expert parallelism, on paper")
    chip = CHIPS[EP_CHIP]
    L.say(f"""
        A model too big for one GPU is spread over several. **Expert parallelism** (EP) puts E/G of each
        layer's experts on each of G GPUs. At every sparse layer each token's hidden vector (d values) is
        sent to the GPUs of its k experts (*dispatch*), and their outputs come back (*combine*): two
        **all-to-all** exchanges a layer. With experts spread evenly, (G − 1)/G of those copies leave
        their GPU. Below, on G = {GPUS} {chip.name.upper()}s, weights as released, hidden vectors in bf16:
    """)
    rows = ep_rows()
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("model", "exp/GPU", "experts", "+ rest", "a2a/tok", "bytes", "NVLink", "IB"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        t.add_row(r["name"], f"{r['experts_per_gpu']:g}", fmt_bytes(r["experts_bytes"]), fmt_bytes(r["rest_bytes"]),
                  fmt_bytes(r["moved"]), f"{r['bytes_match']:,.0f}", f"{r['nvlink4']:,.0f}", f"{r['ib-ndr']:,.0f}")
    L.show(t, f"[dim]experts: one GPU's routed experts; + rest: its copy of every other weight (attention "
              f"served data-parallel); a2a/token: dispatch and combine over every sparse layer; bytes, "
              f"NVLink, IB: the tokens a GPU sends in a step before their all-to-all equals its experts' "
              f"bytes, or takes as long as reading them at {chip.bandwidth_gbs / 1e3:g} TB/s: on "
              f"{LINKS['nvlink4'][1]}; on {LINKS['ib-ndr'][1]}[/]")
    L.fact("all-to-all bytes per token = 2 · k · d · 2 bytes · sparse layers · (G − 1)/G: one copy per chosen "
           "expert, an upper bound (DeepEP-style dispatch sends one per destination GPU, and node-limited "
           "routing caps the nodes); they grow with the batch, while each GPU reads its experts once a step")
    room = chip.memory_gb * 1e9 * 0.9
    fit = [r["name"] for r in rows if r["per_gpu"] <= room]
    over = [r["name"] for r in rows if r["per_gpu"] > room]
    ds = next(r for r in rows if r["name"] == "DeepSeek-V3")
    bf16 = 2 * ds["experts_bytes"] / RELEASED["DeepSeek-V3"][1]
    held_ds = ds["experts_bytes"] * GPUS + ds["rest_bytes"]              # every routed expert once, the rest
    need_even = gpus_needed(held_ds, chip.memory_gb * 1e9)
    need_ep = gpus_needed(held_ds, chip.memory_gb * 1e9, replicated_bytes=ds["rest_bytes"])
    L.say(f"""
        As released, each GPU holds {', '.join(f"{r['name']} {fmt_bytes(r['per_gpu'])}" for r in rows)},
        against the {fmt_bytes(room)} an {chip.name.upper()} gives a server (0.9 × {chip.memory_gb:g} GB):
        {and_list(fit) or 'none'} {'fits' if len(fit) == 1 else 'fit'}{', not ' + and_list(over) if over else ''},
        with {fmt_bytes(room - ds['per_gpu'])} a GPU left for DeepSeek-V3's KV cache. In bf16 its experts
        alone would be {fmt_bytes(bf16)} a GPU, {'more' if bf16 > chip.memory_gb * 1e9 else 'less'} than the
        card's {chip.memory_gb:g} GB: sized in bf16 it needs twice the GPUs; in FP8 on 8 H200s is how
        SGLang's and vLLM's guides serve it. By the one capacity rule (`gpus_needed`: 0.9 of each GPU
        holds the weights), DeepSeek-V3 needs at least {need_even} {chip.name.upper()}s with every weight
        split evenly (what `minillm hardware --shape deepseek-v3` says) and {need_ep} with its attention
        copied to every GPU as here; 8 leaves the KV cache the room above.

        So EP trades weight bytes for link bytes. Each GPU holds and reads only its experts, and the
        batch a step needs for its experts to turn compute-bound is gathered from the tokens of every
        GPU. But links are slower than a GPU's own memory: at equal *time* the all-to-all catches up
        with the experts' read {fmt_x(ds['bytes_match'] / ds['nvlink4'])} sooner over NVLink and
        {fmt_x(ds['bytes_match'] / ds['ib-ndr'])} sooner over InfiniBand than the byte count says. That is
        why DeepSeek-V3's report routes each token to at most 4 nodes, sends the dispatch in FP8, and
        overlaps the exchange with computation (two micro-batches in turn), serving decode with EP over
        320 GPUs. {busiest_words(busiest, bound)} Engines answer with redundant copies of busy experts.
    """)
    c = mix.config
    L.takeaway(f"""
        A mixture's memory holds every expert; a token reads only its k. At batch 1 decode costs the active
        bytes. As B grows a step reads the union of its tokens' experts, E·(1 − (1 − k/E)^B) a layer, and
        each expert read serves only its own rows. {critical_ratio_words(crit, c)} Expert
        parallelism spreads the experts over GPUs and pays with all-to-all bytes per token, slower links
        than memory, and the busiest GPU's wait.
    """)


def and_list(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1] if names else ""


def busiest_words(busiest: float, bound: dict) -> str:
    """What the busiest expert's rows mean for a step spread over GPUs, by regime."""
    idle = 1 - 1 / busiest
    return (f"Past the ridge a step also waits for the busiest GPU: with one expert per GPU, this lesson's "
            f"served run would leave the mean GPU idle {idle:.0%} of the time its busiest worked "
            f"({fmt_x(busiest)} the mean rows). Below it (every decode step here, by its counts)"
            if not any(v for (n, _), v in bound.items() if n == "mixture") else
            f"Past the ridge a step also waits for the busiest GPU: with one expert per GPU, this lesson's "
            f"served run would leave the mean GPU idle {idle:.0%} of the time its busiest worked "
            f"({fmt_x(busiest)} the mean rows). Below it") + \
        " a step waits instead for the GPU with the most experts to read."


def critical_ratio_words(crit: dict, c: MoEConfig) -> str:
    """The takeaway's sentence on the critical batches, from this run's roofline figures."""
    held, E, k = c.n_params() / c.active_params(), c.n_expert, c.top_k
    if crit["dense"] and crit["mixture"]:
        r = crit["mixture"] / crit["dense"]
        more = "a bigger" if r > 1 else "no bigger"
        return (f"Here the mixture needed {more} batch than the dense model of its active size to turn "
                f"compute-bound: {fmt_x(r)} by the roofline (total ÷ active {fmt_x(held)}, E/k = {E // k}).")
    return (f"By the roofline, once every expert is read a mixture needs about total ÷ active times a dense "
            f"model's batch ({fmt_x(held)} here, E/k = {E // k} at most); this run found no crossing for both.")


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
