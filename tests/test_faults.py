"""A step that raises fails only the requests that were in it: their blocks go back, each gets an
error, and the engine (and a server's engine loop) goes on serving the rest."""

from __future__ import annotations

import queue

import numpy as np
import pytest

import minillm
from minillm.models.gpt2 import GPT2Config
from minillm.engine.engine import Engine, StepFailed
from minillm.engine.sequence import SamplingParams
from minillm.serving.api import CompletionRequest
from minillm.serving.loop import EngineLoop

from test_properties import random_model

CONFIG = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=64, vocab_size=60)
POISON = 59          # a prompt that starts with this token makes the model step raise


def poisoned(model, monkeypatch):
    real = type(model).step

    def step(self, batch, *, scores="last"):
        if any(int(ids[0]) == POISON for ids, cache in batch if cache.length == 0):
            raise FloatingPointError("injected fault")
        return real(self, batch, scores=scores)

    monkeypatch.setattr(type(model), "step", step)


def test_a_failing_step_ends_only_the_requests_in_it(monkeypatch):
    model = random_model(CONFIG, 1)
    engine = Engine(model, num_blocks=40, block_size=4, max_seqs=2)
    ok1 = engine.add_request([1, 2, 3], 5)
    bad = engine.add_request([POISON, 2, 3], 5)
    late = engine.add_request([4, 5, 6, 7], 5, arrival=0.0)    # waits: the batch holds two
    poisoned(model, monkeypatch)
    with pytest.raises(StepFailed) as e:
        engine.step()
    assert {r.id for r in e.value.requests} == {ok1.id, bad.id}            # both were in that step
    assert bad.finish_reason == ok1.finish_reason == "error"
    assert not late.done, "a request that never ran in the failed step must not fail"
    engine.run()
    assert late.finish_reason == "length" and late.output == minillm.generate(model, [4, 5, 6, 7], 5)
    assert engine.pool.allocator.n_free == 40


def test_the_server_loop_keeps_serving_after_a_fault(monkeypatch):
    model = random_model(CONFIG, 2)
    poisoned(model, monkeypatch)
    loop = EngineLoop(model, kv_memory=1 << 20, block_size=4, max_seqs=1)
    loop.start()
    try:
        def submit(prompt):
            return loop.submit(CompletionRequest(prompt, 4, SamplingParams(), [], False, False))

        def events(r):
            got = []
            while True:
                what, value = r.events.get(timeout=30)
                got.append(value)
                if what == "done":
                    return got

        bad, good = submit([POISON, 1]), submit([3, 4, 5])      # good waits behind bad (one at a time)
        assert events(bad) == ["error"]
        assert events(good) == minillm.generate(model, [3, 4, 5], 4) + ["length"]
        assert "injected fault" in loop.last_error
        again = submit([7, 8])
        assert events(again)[-1] == "length"
        assert loop.pool.allocator.n_free == loop.pool.num_blocks
        assert loop.engine.requests == {}, "the engine still holds answered requests"
    finally:
        loop.stop(grace=0)
