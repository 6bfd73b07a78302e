"""The two bundled models: both load offline, the large one is better on text neither trained on,
and its decode steps read more than this CPU's last-level cache holds (so they stream from DRAM)."""

from __future__ import annotations

import numpy as np
import pytest

import minillm
from minillm.data import BundledText
from minillm.measure.probe import detect_llc_bytes
from minillm.training.data import evaluate, load_tokens, split_tokens


@pytest.fixture(scope="module")
def models():
    return minillm.load("small", quiet=True), minillm.load("large", quiet=True)


def test_both_bundled_models_load_by_name(models):
    small, large = models
    assert small.name == "minillm-shakespeare" and minillm.load().name == small.name
    assert large.name == "minillm-shakespeare-large"
    c = large.config
    assert (c.n_layer, c.n_head, c.n_embd, c.n_ctx, c.vocab_size) == (8, 8, 256, 256, 50257)
    assert large.dtype == np.float32 and large.nbytes() > 2.5 * small.nbytes()


def test_the_large_model_beats_the_small_one_on_held_out_text(models):
    """A slice of the held-out tenth (the full figure is in weights/README.md and `minillm eval`)."""
    small, large = models
    _, held = split_tokens(load_tokens(BundledText()), 256)
    part = held[:8 * 256 + 1]
    small_loss = evaluate(small.params, small.config, part)
    large_loss = evaluate(large.params, large.config, part)
    assert large_loss < small_loss - 0.05, (large_loss, small_loss)


def test_a_decode_step_of_the_large_model_reads_more_than_the_last_level_cache(models):
    _, large = models
    with minillm.Meter() as m:
        minillm.generate(large, [464, 2068], 3)
    step = m.of_kind("decode")[-1]
    llc = detect_llc_bytes()
    if not llc or llc >= large.nbytes():
        pytest.skip(f"this CPU's last-level cache ({llc} bytes) is unknown or holds the large model")
    assert step.bytes["weights"] > llc, (step.bytes["weights"], llc)
