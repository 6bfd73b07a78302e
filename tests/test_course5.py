"""The course, round five (the teaching review of lessons 1-17, and its newcomer's traps): each fix
tested where it is made. Sentences of lessons are checked through the functions that build them,
fed the numbers that once misled, and through fast runs of the lessons themselves."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from minillm.cli import learn


def _lesson(number: int):
    return importlib.import_module(next(i.module for i in learn.LESSONS if i.number == number))


def _run(number: int, capsys, *extra) -> str:
    assert _lesson(number).main(["--fast", "--no-pause", *extra]) == 0
    return capsys.readouterr().out


# -- lesson 15 ------------------------------------------------------------------------------------------

def test_lesson_15s_try_it_suggests_a_ratio_the_presets_do_not_have():
    """E21: '64 experts and top-8 (Qwen3's ratio)' was the presets' own E/k = 8; Qwen3-30B-A3B routes 8 of 128."""
    from minillm.measure.experts import PUBLISHED
    m = _lesson(15)
    E, k = m.TRY_EXPERTS
    q = PUBLISHED["Qwen3-30B-A3B"]
    assert (E, k) == (q["E"], q["k"]) and E // k != m.mix_ratio()


def test_lesson_15_sizes_the_published_mixtures_as_released(capsys):
    """E18/C16/W24: DeepSeek-V3 held in FP8 (673 GB, fits 8 H200s with room for KV), the bf16 upcast
    as the doubling; Qwen3-30B-A3B's active count to two decimals beside its makers' 3.3B."""
    from minillm.measure.experts import held_bytes, read_bytes
    from minillm.measure.shapes import shape
    from minillm.ui.report import fmt_bytes
    out = " ".join(_run(15, capsys).split())
    ds = shape("deepseek-v3")
    assert f"{fmt_bytes(held_bytes(ds))} fp8 {fmt_bytes(read_bytes(ds))}" in out
    assert "3.35B active by these formulas; its makers say 30.5B and 3.3B" in out
    assert "DeepSeek-V3 would not fit on 8 GPUs" not in out
    assert "DeepSeek-V3 fit, with" in out and "more than the card's 141 GB" in out
    assert "plain decode does not run it, but engines can use it as the draft of lesson 11" in out
    rows = {r["name"]: r for r in _lesson(15).ep_rows()}
    assert rows["DeepSeek-V3"]["per_gpu"] < 0.9 * 141e9 < 2 * rows["DeepSeek-V3"]["experts_bytes"]


def test_lesson_15s_equal_time_tokens_are_the_byte_count_scaled_by_link_over_hbm():
    """M31: a link is 7-100× slower than HBM, so the all-to-all catches up with the experts' read that
    many times sooner in time than in bytes."""
    from minillm.measure.chips import CHIPS, LINKS
    for r in _lesson(15).ep_rows():
        hbm = CHIPS["h200"].bandwidth_gbs
        assert r["nvlink4"] == pytest.approx(r["bytes_match"] * LINKS["nvlink4"][0] / hbm)
        assert r["ib-ndr"] == pytest.approx(r["bytes_match"] * LINKS["ib-ndr"][0] / hbm)
        assert r["ib-ndr"] < r["nvlink4"] < r["bytes_match"] / 7


@pytest.mark.parametrize("bound, words", [
    ({("mixture", 1): False, ("mixture", 32): False}, "Every decode step of the sweep above was memory-bound"),
    ({("mixture", 1): False, ("mixture", 32): True}, "below B = 32"),
    ({("mixture", 1): True, ("mixture", 32): True}, "compute-bound by its counts: there rows"),
])
def test_lesson_15_says_which_regime_the_rows_matter_in(bound, words):
    """M32: 'the time an expert takes depends on its rows' holds past the ridge only."""
    assert words in _lesson(15).regime_words(bound)
    said = _lesson(15).busiest_words(2.0, bound)
    assert "Past the ridge" in said and "Below it" in said
    assert ("every decode step here" in said) == (not any(bound.values()))


@pytest.mark.parametrize("mix_priced, words", [
    ({1: 1, 2: 1.5, 4: 2.0, 8: 3.0, 16: 9.0, 32: 20}, "was below it up to B = 8, and above it at B = 16"),
    ({1: 1, 2: 1.5, 4: 2.0, 8: 3.0, 16: 5.1, 32: 20}, "was below it up to B = 8, and within 5% of it at B = 16"),
    ({B: 1.05 for B in (1, 2, 4, 8, 16, 32)}, "stayed below it up to B = 32"),
])
def test_lesson_15_says_where_the_mixture_reached_the_dense_gain_from_priced_counts(mix_priced, words, under_load):
    """Issue 53: where the mixture's gain reached the dense model's, and which one batching bought more,
    were ranked on timed rounds and changed between runs. They are drawn from the priced gains (counts
    on the roofline clock) alone: measured gains that say the opposite do not move a word."""
    m = _lesson(15)
    pgain = {("dense", B): float(B) for B in m.BATCHES}
    pgain[("dense", 8)] = 5.0
    pgain.update({("mixture", B): float(v) for B, v in mix_priced.items()})
    gain = {("dense", B): 1.0 for B in m.BATCHES}                   # measured: the mixture far ahead
    gain.update({("mixture", B): 50.0 for B in m.BATCHES})
    said = m.gain_words(pgain, gain)
    assert words in said
    assert "batching bought the dense model more (priced from counts" in said
    assert "Measured, the gains at B = 32 were 1× and 50×, timed and not ranked" in said
    read = under_load.rankings(said)                             # the under-load check reads both verdicts
    assert read[0] == ("batching bought", "the dense model") and read[1][0] == "the mixture's gain"
    assert read[1][1] in words
    pgain.update({("mixture", 32): 31.0})                           # within 5% of the dense model's 32
    said = m.gain_words(pgain, gain)
    assert "batching bought them about the same (within 5%): no winner" in said
    assert under_load.rankings(said)[0] == ("batching bought", None)


# -- lesson 17 ------------------------------------------------------------------------------------------

def test_lesson_17_reads_the_h200_steps_against_both_roofs():
    """E19: the Llama-3-8B B = 256 step at 164 FLOP/byte is below the H200's ridge of 206 (memory-bound by
    the roofline, yet at 44% of the bandwidth: bound by neither); B = 384 passes it; Llama-2-7B's MHA KV
    caps it near 100 FLOP/byte, below every GPU ridge. M37: the KV bytes of each batch row."""
    from minillm.measure.chips import CHIPS
    m = _lesson(17)
    rows = {(r["shape"], r["batch"]): r for r in m.h200_rows()}
    ridge = CHIPS["h200"].ridge
    r256, r384 = rows["llama-3-8b", 256], rows["llama-3-8b", 384]
    assert r256["intensity"] < ridge <= r384["intensity"] and r256["bound"] == "memory"
    assert r256["of_bandwidth"] < 0.5 and r256["of_peak"] < 0.5                  # neither roof
    mha = rows["llama-2-7b", 256]
    assert mha["kv"] / mha["weights"] > 2.5 and mha["cap"] < min(m.gpu_ridges().values())
    assert "never turns compute-bound" in m.cap_words(mha["cap"])
    assert "crosses it" in m.cap_words(r256["cap"])


def test_lesson_17_says_no_issue_words_and_computes_its_h200_reading(capsys, monkeypatch):
    """W18: 'the issue', 'the issue's H200' were the project's tracker words; M30: the graph step's time
    per kernel beside the eager one's; C15: a plain step against the datasheet and tuned engines."""
    from minillm.backend import DeviceError, get_device
    try:
        get_device("cuda")
        pytest.skip("this machine has a GPU")
    except DeviceError:
        pass
    out = " ".join(_run(17, capsys).split())
    assert "issue" not in out.lower()
    assert "4.1 µs a kernel on the device" in out and "8.7 µs for each of its about 180 kernels" in out
    assert "50% of the 4.8 TB/s datasheet figure" in out and "tuned engines with fused kernels" in out
    assert "At B = 384 (208 FLOP/byte) it passes the ridge" in out


# -- lesson 16 ------------------------------------------------------------------------------------------

def test_lesson_16_explains_its_own_measurement_and_says_at_least(capsys):
    """E20: the removed score bytes' time at the measured bandwidth beside the measured prefill, and where
    FlashAttention's win is (a GPU's HBM at long prompts); M36: 'at least', and NumPy's 128-query blocks
    computing more than T²/2; W25: its sources."""
    from minillm.kernels import available
    if not available():
        pytest.skip("lesson 16 needs numba")
    m = _lesson(16)
    assert m.scored_pairs(512) / 512 ** 2 == pytest.approx(0.625)          # the review's 62%
    out = " ".join(_run(16, capsys).split())
    assert "at least 4 bytes written and 4 read per score" in out
    assert "75% of T² at 256 tokens" in out
    assert "of NumPy's measured prefill" in out and "at most what removing them can save" in out
    assert "prefill is compute-bound on this machine" in out or "prefill is memory-bound on this machine" in out
    for source in ("Milakov and Gimelshein (2018)", "Dao et al., 2022", "Flash-Decoding (Dao, Haziza, Massa and "
                   "Sizov, 2023)"):
        assert source in out


def test_lesson_16s_gpu_rows_grow_the_scores_share_with_the_prompt():
    rows = _lesson(16).gpu_rows()
    shares = [r["score_s"] / r["flop_s"] for r in rows]
    assert shares == sorted(shares) and shares[0] < 0.1 < 0.5 < shares[-1]
    assert all(0 < r["attention_share"] < 1 for r in rows)


# -- cache residency from the measurement (lessons 6, 14; compare, bench) -----------------------------

def _vm():
    from minillm.measure.chips import Hardware
    return Hardware(name="vm", bandwidth_gbs=20.0, peak_gflops=100.0, llc_bytes=480 * 2**20)


def test_lesson_14_calls_the_weights_cached_only_when_float32_passed_its_dram_ceiling():
    """E22/C18: on a VM whose sysfs lists the host's 480 MiB L3, 498 MB of float32 weights at 67% of the
    DRAM ceiling were said to 'fit' the cache; now only a run past the ceiling says so."""
    m = _lesson(14)
    f32 = {"of_ceiling": 0.67, "model_bytes": 498e6}
    said = m.cache_words(f32, _vm(), "random-124m")
    assert "67% of its DRAM ceiling" in said and "reports a last-level cache of 480 MiB" in said
    assert "from a cache" not in said and "fit" not in said
    said = m.cache_words({**f32, "of_ceiling": 1.3}, _vm(), "random-124m")
    assert "from a cache" in said and "--model random-124m" not in said


def test_the_residency_verdict_reads_the_probe_not_the_size():
    from minillm.measure import residency
    hw = _vm()
    assert residency.verdict(498e6, hw) == "unknown"                        # the size alone says nothing
    assert residency.verdict(498e6, hw, step_gbs=25.0) == "cache"
    assert residency.verdict(498e6, hw, probe_gbs=22.0) == "dram"
    assert residency.verdict(498e6, hw, probe_gbs=40.0) == "cache"
    assert residency.probe_at(4 * 2**20) > 0


# -- lessons 14 and 20: the 2026 formats, the ridge, the loss ---------------------------------------------

def test_halving_the_math_precision_doubles_the_ridge_and_weight_only_lowers_the_critical_batch():
    """X21: B* ≈ ridge·b/2 stays put when the weights share the math's format; W4A16 cuts it by its byte ratio."""
    rows = {r["format"]: r for r in _lesson(20).format_rows("b200")}
    bf16, fp8 = rows["bf16 (W16A16)"], rows["FP8 (W8A8)"]
    wo, fp4 = rows["4-bit weight-only (W4A16)"], rows["NVFP4 (W4A4)"]
    assert fp8["ridge"] == pytest.approx(2 * bf16["ridge"]) and fp4["ridge"] == pytest.approx(4 * bf16["ridge"])
    assert fp8["b_star"] == pytest.approx(bf16["b_star"], rel=0.01)
    assert wo["b_star"] == pytest.approx(bf16["b_star"] * wo["bytes"] / bf16["bytes"])
    assert fp4["bytes"] == 9 / 16                                          # 16 E2M1 values and an E4M3 scale
    assert "NVFP4 (W4A4)" not in {r["format"] for r in _lesson(20).format_rows("h100-sxm")}   # no FP4 math


def test_lesson_14_names_nvfp4_and_the_slice_its_loss_is_of(capsys):
    """X21, C10 (the lesson's loss is of its first tokens, the README's of all of them)."""
    out = " ".join(_run(14, capsys).split())
    assert "NVFP4 16 9 4.5" in out
    assert "tokens here)" in out and "--weights W scores all" in out and "another slice" in out


def test_lesson_20_names_w4a32_and_other_processes_when_busy(monkeypatch, capsys):
    """W21 ('W4A16 in float32' is W4A32; the fused half moved from lesson 14 to 20). M42: the typed
    sentence on what is left between the fused speed and the byte ratio names the other processes
    when the machine is busy (it named the wrong cause under contention)."""
    from minillm.lessons import _common
    from minillm.kernels import available
    if not available():
        pytest.skip("the fused half needs numba")
    monkeypatch.setattr(_common, "busy_line", lambda: "busy machine (stand-in)")
    out = " ".join(_run(20, capsys).split())
    assert "float32 activations and products, W4A32" in out and "W4A16 in float32" not in out
    assert "on this busy machine, other processes" in out


# -- lessons 9 and 13: every ranking through the closeness rule; the rate sweep and the prices ---------

def test_lesson_13_ranks_by_the_rule_sweeps_the_rate_and_prices_the_tokens(capsys):
    """M41 (winners only beyond the rounds' spread, 'peaked' only when the larger batches fell beyond it),
    X16 (a lesson runs the rate sweep), X26 (input, cached-input and output prices), W22 (rates in words),
    W23 (launch-bound small models: lesson 17)."""
    out = " ".join(_run(13, capsys).split())
    assert "Goodput against the request rate, and what a token costs" in out
    assert "met: the share of requests that met every target" in out
    assert "Per million tokens at that load: input" in out and "cached input" in out and "output" in out
    # M41, since issue 53: every ranking of a served workload priced from counts on the roofline clock
    from minillm import closeness
    assert closeness.PRICED_RULE in out and "on the roofline clock (" in out and "the closeness rule" not in out
    assert "4.1e+02 per second" not in out and "lesson 17 measures it" in out
    assert "kernel launches, not by this roofline: lesson 6" not in out


@pytest.mark.parametrize("rounds, words", [
    ({"batch 1": [1, 1.1], "batch 4": [5, 5.2], "batch 8": [9, 9.1]}, "grew up to the largest batch, batch 8"),
    ({"batch 1": [1, 1.1], "batch 4": [9, 9.2], "batch 8": [5, 5.1]}, "peaked at batch 4, below the largest"),
    ({"batch 1": [1, 1.1], "batch 4": [5, 9.2], "batch 8": [9, 9.1]}, "showed no batch apart"),
])
def test_lesson_13_says_peaked_only_when_the_larger_batches_fell_beyond_the_spread(rounds, words):
    from minillm import closeness
    m = _lesson(13)
    rounds = {k: v * 3 for k, v in rounds.items()}                   # 6 paired rounds: the rule can rank
    assert words in m.peak_words(closeness.rank(rounds), list(rounds))


def test_a_rate_reads_as_a_rate():
    fmt_rate = _lesson(13).fmt_rate
    assert fmt_rate(410.3) == "410 per second" and fmt_rate(2.5) == "2.5 per second"


def test_token_prices_split_the_engines_seconds_by_phase_and_charge_the_idle_time():
    from minillm.serving.rates import price_lines, token_prices
    run = {"duration_s": 10.0, "busy_seconds": 5.0, "prefill_seconds": 1.0, "prefill_tokens": 1000,
           "output_tokens": 400}
    p = token_prices(run, kv_bytes_per_token=1e6, bandwidth_gbs=10.0)
    assert p["idle_scale"] == 2.0
    assert p["input_s_per_mtok"] == pytest.approx(1.0 * 2 / 1000 * 1e6)
    assert p["output_s_per_mtok"] == pytest.approx(4.0 * 2 / 400 * 1e6)
    assert p["cached_input_s_per_mtok"] == pytest.approx(1e6 / 10e9 * 2 * 1e6)
    said = " ".join(price_lines(p, 3600.0))
    assert "input 0.556 engine-hours ($2,000.00)" in said and "An output token costs 10×" in said


def test_lesson_9_serves_the_three_policies_on_the_roofline_clock_and_ranks_priced_figures(capsys):
    """The static-against-continuous verdict changed between separate runs (2 threads) and --compare (1),
    then, with interleaved rounds and the sign test, between a winner and no winner at the rule's edge
    (issue 53): the lesson now serves each policy once on the roofline clock and ranks priced figures."""
    out = " ".join(_run(9, capsys).split())
    assert "on the roofline clock (" in out and "their price" in out
    assert "Goodput on this run:" in out and "on the roofline clock, priced from counts" in out
    assert "rounds" not in out


# -- lesson 1: the glossary covers every term the lessons introduce; tokenizer facts as facts ----------

# Words the lessons set in bold for emphasis, not as terms to learn (checked against the lessons below).
NOT_TERMS = {
    "accepted", "achieved", "all", "arrive", "at least", "batching, against both roofs.", "best possible time",
    "continuous", "disfavours", "distribution", "every weight", "favours", "full", "generated", "how many tokens",
    "in the same step", "integers to integers", "intensity", "keep them", "key", "last", "long answers",
    "long prompts", "many short requests", "once", "one", "only the new token", "per channel", "prompt",
    "query", "queue", "rows of", "sequential", "single", "static", "system prompt", "that", "the critical batch.",
    "time", "token ids into", "total ÷ active", "value", "which phase", "quantized",
    "highest request rate", "ngram", "c.asdict(),", "going back",
}


def _bold_terms() -> dict:
    import re
    from pathlib import Path
    found = {}
    for f in sorted((Path(__file__).parents[1] / "lessons").glob("[0-9][0-9]_*.py")):
        for m in re.finditer(r"\*\*([^*\n{}]{2,40})\*\*", f.read_text(encoding="utf-8")):
            t = m.group(1).strip().lower()
            if not re.search(r"\d", t) and len(t.split()) <= 4:
                found.setdefault(t, set()).add(int(f.name[:2]))
    return found


def test_the_glossary_covers_every_term_a_lesson_sets_in_bold():
    """M38: the glossary stopped at lesson 14. A term a lesson introduces in bold is in the glossary (a
    glossary word contains it, whole words), or is listed above as emphasis."""
    import re
    words = [w.lower() for w, _, _ in _lesson(1).GLOSSARY]
    missing = sorted(t for t in _bold_terms() if t not in NOT_TERMS
                     and not any(re.search(rf"(^|[\s,(]){re.escape(t)}($|[\s,)])", w) for w in words))
    assert not missing, missing
    assert not NOT_TERMS - set(_bold_terms()), NOT_TERMS - set(_bold_terms())      # no stale emphasis entry


def test_every_glossary_word_is_in_the_lesson_it_names():
    import re
    from pathlib import Path
    sources = {int(f.name[:2]): " ".join(f.read_text(encoding="utf-8").lower().replace("**", "").split())
               for f in (Path(__file__).parents[1] / "lessons").glob("[0-9][0-9]_*.py")}
    for word, meaning, n in _lesson(1).GLOSSARY:
        parts = [p.strip(" *") for p in re.split(r",|\(", word.lower()) if p.strip(" *)")]
        assert any(p.rstrip(")") in sources[n] for p in parts), (word, n)
        assert len(word) <= 30 and len(meaning) <= 44, word
    for term in ("moe", "online softmax", "cuda graph", "mla", "all-to-all", "expert parallelism", "w8a8"):
        assert any(term in w.lower() for w, _, _ in _lesson(1).GLOSSARY), term


def test_lesson_1_shows_the_tokenizers_facts_as_facts(capsys):
    """C7: facts of the tokenizer were shown as '✓ checked' claims about this run's numbers."""
    out = _run(1, capsys)
    assert "✓ checked" not in out and "= by definition: 'soft' →" in out


def test_an_80_gb_card():
    """W19: 'A "80 GB" card'."""
    article = _lesson(5).article
    assert [article(n) for n in (80, 40, 141, 8, 11, 18, 24)] == ["an", "a", "a", "an", "an", "an", "a"]


# -- lessons 8, 10, 11, 12: the concepts still missing, each with a computed row -------------------------

def test_lesson_8s_attention_table_is_g_for_gqa_and_leaves_mla_to_lesson_18():
    """X23/M35: decode attention's FLOPs per KV byte in bf16: MHA ≈ 1, GQA ≈ g. The fourth teaching
    review's course cuts: MLA's ≈ 1.9·H rows left lesson 8 (taught four times); lesson 18 computes them."""
    rows = {r["layout"]: r["intensity"] for r in _lesson(8).attention_rows()}
    assert rows == {"MHA, 32/32 heads": 1, "GQA, 32/8 heads": 4, "GQA, 28/4 heads": 7}
    import inspect
    src = inspect.getsource(_lesson(18).against_the_ridge)
    assert "2 * H * (2 * r + dr) / ((r + dr) * 2)" in src and "2 * mla_fb" in src


def test_lesson_8_names_the_threads_its_critical_batch_holds_for(capsys):
    out = " ".join(_run(8, capsys).split())
    assert "move with the thread count and the load, not with the work" in out
    assert "By the closeness rule, tokens/s" in out and "Decode attention's FLOPs per byte" in out


def test_lesson_10_reloads_a_prefix_only_when_its_bytes_beat_its_flops():
    """X22: reload when KV bytes ÷ link bandwidth < prefill FLOPs ÷ peak."""
    from minillm.measure.chips import Hardware
    import minillm
    model = minillm.load("random-tiny", quiet=True)
    rows = _lesson(10).reload_rows(model, Hardware(name="x", bandwidth_gbs=10.0, peak_gflops=100.0))
    for r in rows:
        assert r["reload_s"] == r["kv"] / (r["link"] * 1e9) and r["compute_s"] == r["flops"] / (r["peak"] * 1e9)
    by = {(r["what"], r["link_name"]): r for r in rows}
    assert by["llama-3-8b", "PCIe 5"]["reload_s"] < by["llama-3-8b", "PCIe 5"]["compute_s"]      # GQA: reload
    assert by["llama-2-7b", "NVMe"]["reload_s"] > by["llama-2-7b", "NVMe"]["compute_s"]          # MHA, SSD


def test_lesson_11_keeps_its_formula_whole_and_rows_a_one_layer_head(capsys):
    """X24 (EAGLE and MTP heads, acceptance length), and the formula that broke across lines."""
    import minillm
    small = minillm.load("small", quiet=True)
    c = small.config
    assert _lesson(11).head_cost(small) == pytest.approx(
        (12 * c.n_embd ** 2 + 13 * c.n_embd + c.vocab_size * c.n_embd) / small.n_params())
    out = _run(11, capsys)
    assert any("E = (1 − α^(k+1)) ÷ (1 − α)" in line for line in out.splitlines())
    flat = " ".join(out.split())
    assert "acceptance length τ = 1 + α of 1.85-1.90" in flat and "EAGLE" in flat
    assert "Ranked by the closeness rule" in flat


def test_lesson_12_marks_rows_past_their_context_and_names_each_8_bit_scale(capsys):
    """M39 (rows past the model's context marked 'the formula only'), M34 (vLLM's FP8 scale per tensor,
    llama.cpp's q8_0 per 32 values, minillm's per head vector), M35 (MLA absorbed in decode), X25 (sinks,
    eviction, KIVI, a computed row each), W20 (KiB)."""
    out = " ".join(_run(12, capsys).split())
    assert "* past the model's own context (llama-2-7b 4,096, llama-3-8b 8,192, gemma-2-9b 8,192)" in out
    assert "17.2 GB *" in out and "537 MB *" not in out
    assert "one scale per tensor per layer" in out and "one fp16 scale per 32 values" in out
    assert "attend in the latent itself" in out
    assert "sinks 4 + window 4,096" in out and "KIVI 2-bit" in out and "512 KiB" in out
    rows = dict(_lesson(12).cache_rows())
    full = rows["every token, bf16"]
    assert rows["sinks 4 + window 4,096"] == pytest.approx(full * 4100 / 32768)
    assert rows["evict to 2,048 tokens"] == pytest.approx(full / 16)


# -- the commands: compile time not a step, diagnose's batched rule, serve-sim's advice --------------

def test_traffic_warms_up_before_its_first_metered_step(monkeypatch, capsys):
    """C4: a first traffic step of 4.24 s was numba compiling; the warm-up runs first, outside the meter."""
    from minillm import cli
    from minillm.cli import compare
    from minillm.meter import active
    seen = []
    real = compare.warm_up
    monkeypatch.setattr(compare, "warm_up", lambda *a, **k: seen.append(active()) or real(*a, **k))
    assert cli.main(["traffic", "--model", "random-tiny", "--prompt-tokens", "8", "--steps", "2", "--json"]) == 0
    assert seen == [None]                                       # called, and not under a meter
    assert len(capsys.readouterr().out.strip().splitlines()) == 3      # the prefill and two decode steps


def test_a_long_warm_up_is_named_not_counted(monkeypatch, capsys):
    import minillm
    from minillm.cli import common
    monkeypatch.setattr(common, "WARM_NOTE_S", 0.0)
    common.warm_up(minillm.load("random-tiny", quiet=True), [1, 2, 3])
    assert "not counted as a step" in capsys.readouterr().err


def test_diagnose_judges_the_dominant_phase_batched_as_lesson_7_does(capsys):
    """C7: diagnose judged 'which phase dominates' on the chip at B = 1 only; a server runs batches."""
    from minillm import cli
    assert cli.main(["diagnose", "--model", "random-tiny", "--prompt-tokens", "100", "--answer-tokens", "50",
                     "--chip", "h100"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "on h100-sxm alone (B = 1)" in out and "served in batches on h100-sxm" in out
    assert "A server runs batches: the advice below is for B = 32" in out and "in batches:" in out


def test_serve_sim_does_not_advise_continuous_batching_to_the_continuous_policy():
    """C11."""
    from minillm.ui.report import diagnosis
    run = {"policy": "budget 32", "scheduler": "continuous", "mean_batch": 3.0,
           "phases": {"decode": {"seconds": 9.0, "bound": "memory"}}}
    assert "continuous batching" not in diagnosis(run) and "bigger batches" in diagnosis(run)
    run["scheduler"] = "static"
    assert "continuous batching" in diagnosis(run)


def test_serve_sim_json_notes_a_busy_machine(monkeypatch, capsys):
    """C6: serve-sim --json printed no busy note at load 4.8; now on stderr and in every run's conditions."""
    import json
    from minillm import cli
    from minillm.cli import serve_sim
    monkeypatch.setattr(serve_sim, "busy_note", lambda threads=None: "busy machine (stand-in)")
    assert cli.main(["serve-sim", "--model", "random-tiny", "--requests", "3", "--rate", "50", "--json"]) == 0
    out = capsys.readouterr()
    assert "busy machine (stand-in)" in out.err
    assert all(r["conditions"]["busy"] == "busy machine (stand-in)" for r in json.loads(out.out))


def test_lesson_9_sizes_a_lora_adapter_against_its_base():
    """X27: multi-LoRA and structured output, a paragraph and a computed row."""
    adapter, base = _lesson(9).lora_bytes("llama-3-8b", 16)
    d, kv = 4096, 8 * 128
    assert adapter == 2 * 32 * 16 * ((d + d) + 2 * (d + kv) + (d + d)) and 0.001 < adapter / base < 0.003


# -- benchmarks/lessons_under_load.py: what the lead's two runs check ------------------------------------

UNDER_LOAD = Path(__file__).parents[1] / "benchmarks" / "lessons_under_load.py"


def test_the_under_load_check_finds_a_flipped_ranking_and_forgives_no_winner(under_load):
    m = under_load
    quiet = ("Measured, the whole prefill: the fused one took 0.5× (0.4×–0.6× over the rounds) the time of "
             "NumPy's: faster, every round beyond the other's spread (this machine, 1 BLAS thread, now). "
             "Throughput favours no chunking (12 tok/s (11-13 tok/s); budget 16: 5 tok/s (4-6 tok/s)), beyond.")
    busy_same = quiet.replace("0.5×", "0.7×")
    busy_flip = quiet.replace("favours no chunking", "favours budget 16")
    busy_close = quiet.replace("faster, every round beyond the other's spread", "no winner (their rounds overlap)")
    a = m.rankings(quiet)
    assert ("the fused one / NumPy's", "faster") in a and ("Throughput", "no chunking") in a
    assert m.flipped(a, m.rankings(busy_same)) == []
    assert m.flipped(a, m.rankings(busy_close)) == []                  # the rule said no winner: not a flip
    assert m.flipped(a, m.rankings(busy_flip)) == ["Throughput: no chunking / budget 16"]
    assert m.too_wide("x" * 81 + "\nok") and not m.too_wide("x" * 80)


@pytest.mark.parametrize("args, words", [(["--only", "5,x"], "give lesson numbers separated by commas"),
                                         (["--modes", "loud"], "name quiet, busy or both"),
                                         (["--only", "5,99"], "no lesson 99 (they are numbered 1-")])
def test_the_under_load_run_refuses_bad_arguments_in_one_line(args, words, tmp_path):
    proc = subprocess.run([sys.executable, str(UNDER_LOAD), *args, "--out", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and words in proc.stderr.splitlines()[-1] and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()                     # nothing run, nothing written


# -- what was left untested: the probe again in each section, the ridge's thread count --------------------

def test_a_lesson_probes_the_machine_again_in_each_section(monkeypatch):
    """M42: a lull at a lesson's start hid a busy machine later. Each section's first timing probes
    again (once per section), and the first busy probe prints the note, once."""
    import io

    from rich.console import Console

    from minillm.lessons import _common
    answers = iter([None, "busy machine (stand-in)", "busy machine (stand-in)"])
    probes = []
    monkeypatch.setattr(_common, "busy_line", lambda: probes.append(1) or next(answers))
    out = io.StringIO()
    L = _common.Lesson(0, "a stand-in", console=Console(file=out, width=80, color_system=None))
    L.section("quiet at first")
    assert L.recheck() is False and L.recheck() is False and len(probes) == 1   # once per section
    L.section("busy later")
    assert L.recheck() is True and len(probes) == 2
    L.section("still busy")
    assert L.recheck() is True and len(probes) == 3
    assert out.getvalue().count("busy machine (stand-in)") == 1


def test_a_steps_verdict_names_the_thread_count_its_ridge_was_measured_at():
    """The naive step read 'compute-bound' in the README and 'memory-bound' on a busy run: the ridge
    moved with the BLAS threads, not the work. The verdict says which ridge it used."""
    import dataclasses

    import minillm
    from minillm.measure.chips import Hardware
    from minillm.ui import report
    model = minillm.load("random-tiny", quiet=True)
    with minillm.Meter() as naive:
        minillm.generate(model, list(range(20)), 3, kv_cache=False)
    step = naive.steps[-1]
    hw = Hardware(name="this machine", bandwidth_gbs=30.0, peak_gflops=170.0, llc_bytes=32 * 2**20,
                  measured_at="2026-12-02T00:00:00+00:00", cpu="x", threads=2, methods={"vecmat": 30.0},
                  method="vecmat")
    one = report.verdict(step, dataclasses.replace(hw, blas_threads=1), "naive")
    two = report.verdict(step, dataclasses.replace(hw, blas_threads=2), "naive")
    assert f"this machine's ridge at 1 BLAS thread is {hw.ridge:.3g} FLOP/byte" in one
    assert "ridge at 2 BLAS threads is" in two
