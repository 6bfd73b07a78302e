"""minillm against Hugging Face transformers, on the two fixture checkpoints (tests/fixtures/README).

transformers computed the fixtures' logits in float32; minillm agrees to about 6e-6. The tolerance,
1e-4 max-abs on logits of size ~7, leaves room for a different summation order and nothing more:
a wrong GELU (erf instead of tanh), a missing 1/sqrt(hd), an off-by-one position or a leaky mask
all move the logits by 1e-3 or (much) more.
"""

from __future__ import annotations

import numpy as np

import minillm

ATOL = 1e-4


def test_forward_matches_transformers(reference):
    ids = np.concatenate([reference.prompt, reference.greedy])
    logits = reference.model.forward(ids)
    assert logits.shape == reference.logits.shape
    np.testing.assert_allclose(logits, reference.logits, rtol=0, atol=ATOL)


def test_greedy_generation_with_kv_cache_matches_transformers(reference):
    new = minillm.generate(reference.model, reference.prompt, len(reference.greedy), kv_cache=True)
    assert new == reference.greedy.tolist()


def test_greedy_generation_without_kv_cache_matches_transformers(reference):
    new = minillm.generate(reference.model, reference.prompt, len(reference.greedy), kv_cache=False)
    assert new == reference.greedy.tolist()


def test_prefill_and_every_decode_step_match_transformers_rows(reference):
    """prefill(prompt) gives row P-1; decode_step(greedy[i]) gives row P+i, for every i."""
    model, P = reference.model, len(reference.prompt)
    logits, cache = model.prefill(reference.prompt)
    np.testing.assert_allclose(logits, reference.logits[P - 1], rtol=0, atol=ATOL, err_msg="prefill")
    for i, token in enumerate(reference.greedy):
        logits = model.decode_step(int(token), cache)
        np.testing.assert_allclose(logits, reference.logits[P + i], rtol=0, atol=ATOL,
                                   err_msg=f"decode step {i} (position {P + i})")
    assert cache.length == P + len(reference.greedy)
