"""The static decode step (engine/static.py): fixed slots, a fixed block table, masked keys; the step a
CUDA graph captures. On the CPU it runs eagerly: its greedy tokens must equal `generate`'s."""

from __future__ import annotations

import numpy as np
import pytest

import minillm
from minillm.backend import DeviceError
from minillm.engine.static import StaticDecode
from minillm.errors import MiniLLMError, PromptError

from conftest import FIXTURES

NAMES = ["gpt2-tiny-a", "llama-tiny", "qwen3-tiny"]


@pytest.fixture(scope="module", params=NAMES)
def model(request):
    return minillm.load(FIXTURES / request.param)


def prompts_for(model, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, model.config.vocab_size, n)] for n in lengths]


@pytest.mark.parametrize("lengths", [[5], [7, 1, 12]])
def test_static_greedy_equals_generate(model, lengths):
    """Each slot's tokens are the ones `generate` makes for its prompt alone (B = 1, and B = 3 with
    prompts of different lengths in blocks of 4: the unwritten keys of the shorter ones masked)."""
    prompts = prompts_for(model, lengths)
    n = 10
    sd = StaticDecode(model, batch=len(prompts), context=32, block_size=4)
    got = [[t] for t in sd.start(prompts)]
    for _ in range(n - 1):
        for row, t in zip(got, sd.step()):
            row.append(t)
    for prompt, row in zip(prompts, got):
        assert row == minillm.generate(model, prompt, n)
    sd.close()
    assert sd.pool.allocator.n_free == sd.pool.num_blocks


def test_static_step_counts_the_same_work_every_step(model):
    """Fixed shapes, fixed work: every decode step of the static step counts the same bytes and FLOPs,
    its weights the same as a plain decode step's, its attention over the whole table."""
    sd = StaticDecode(model, batch=2, context=16, block_size=4)
    sd.start(prompts_for(model, [3, 6]))
    with minillm.Meter() as m:
        sd.step()
        sd.step()
    a, b = m.steps
    assert a.kind == b.kind == "decode" and a.n_tokens == 2
    assert a.bytes == b.bytes and a.flops == b.flops
    caches = [model.prefill(p)[1] for p in prompts_for(model, [3, 6])]
    for cache in caches:
        cache.reserve(1)
    with minillm.Meter() as plain:                                   # the same two tokens, the plain way
        model.step([(np.array([4]), cache) for cache in caches])
    assert a.bytes["weights"] == plain.steps[0].bytes["weights"]
    assert a.flops["matmul"] == plain.steps[0].flops["matmul"]
    c = model.config
    hd = getattr(c, "head_dim", c.n_embd // c.n_head)
    assert a.flops["attention"] == c.n_layer * 4 * c.n_head * 2 * sd.T * hd   # B = 2 slots, T keys each


def test_static_decode_refuses_clearly(model):
    with pytest.raises(PromptError, match="beyond the model's context"):
        StaticDecode(model, batch=1, context=model.config.n_ctx + 1)
    sd = StaticDecode(model, batch=2, context=8, block_size=4)
    with pytest.raises(MiniLLMError, match="before start"):
        sd.step()
    with pytest.raises(PromptError, match="2 slots"):
        sd.start(prompts_for(model, [3]))
    with pytest.raises(PromptError, match="no room"):
        sd.start(prompts_for(model, [3, 8]))
    sd.start(prompts_for(model, [3, 6]))
    sd.step()                                                        # positions 6 and 7: the last two
    sd.step()
    with pytest.raises(PromptError, match="filled its static context of 8"):
        sd.step()
    with pytest.raises(DeviceError, match="needs --device cuda"):
        sd.capture()


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_gpu_graph_replay_equals_eager_equals_cpu(name):
    """On a GPU (float32): the captured step's greedy tokens equal the eager step's and the CPU's."""
    from minillm.backend import get_device
    try:
        get_device("cuda")
    except DeviceError as e:
        pytest.skip(str(e))
    gpu = minillm.load(FIXTURES / name, device="cuda", dtype=np.float32)     # float32: tokens comparable
    cpu = minillm.load(FIXTURES / name)
    prompts = prompts_for(cpu, [5, 9])
    runs = []
    for graph in (False, True):
        sd = StaticDecode(gpu, batch=2, context=32, block_size=4)
        rows = [[t] for t in sd.start(prompts)]
        if graph:
            sd.capture()
            assert sd.launches["kernels"] > 0
        for _ in range(8):
            for row, t in zip(rows, sd.step(graph=graph)):
                row.append(t)
        runs.append(rows)
    assert runs[0] == runs[1] == [minillm.generate(cpu, p, 9) for p in prompts]
