"""The array seam, proven on the CPU: whole generations through a namespace that is not NumPy.

`minillm.load(..., device=STRICT)` makes every weight through the one factory (`make_weight`,
device=) and moves the model's other arrays once; then prefill and decode run on strict arrays
(tests/strict_arrays.py), which refuse every `numpy.*` call, every NumPy operand and every implicit
conversion, as CuPy does on a GPU. Greedy tokens and the meter's bytes and FLOPs, step by step,
must equal the NumPy path's: the model took its module from its arrays, and counted the same work.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm.backend import Device
from minillm.cache.paged import PagedKVPool
from minillm.engine.static import StaticDecode
from minillm.models.weights import DeviceDense
from strict_arrays import StrictArray, strict

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = ["gpt2-tiny-a", "gpt2-tiny-b", "llama-tiny", "qwen2-tiny", "qwen3-tiny"]
STRICT = Device("strict", strict, "test namespace (tests/strict_arrays.py)")
PROMPT = [1, 5, 9, 3, 7, 2]


def test_load_on_a_device_moves_every_array_once():
    """Every parameter, the cache and the products live in the device's namespace; none is NumPy."""
    for name in ("gpt2-tiny-a", "qwen3-tiny"):
        model = minillm.load(FIXTURES / name, device=STRICT)
        assert model.device is STRICT and model.xp is strict
        assert all(isinstance(v, StrictArray) for v in model.params.values()), name
        assert all(isinstance(w, DeviceDense) for w in model.matrices()), name
        assert isinstance(model.new_cache().k, StrictArray)
        assert model.nbytes() == minillm.load(FIXTURES / name).nbytes()        # the same bytes, counted alike


@pytest.mark.parametrize("name", NAMES)
def test_whole_generation_through_strict(name):
    """Prefill + 12 decode steps: tokens, and each step's meter bytes and FLOPs, equal to NumPy's."""
    ref, dev = minillm.load(FIXTURES / name, kernels="numpy"), minillm.load(FIXTURES / name, device=STRICT)
    assert_same_generation(ref, dev)
    assert ref.fingerprint() == dev.fingerprint()


def assert_same_generation(ref, dev) -> None:
    """12 greedy tokens after PROMPT: the same tokens, and per step the same kind, bytes and FLOPs."""
    with minillm.Meter() as m1:
        a = minillm.generate(ref, PROMPT, 12)
    with minillm.Meter() as m2:
        b = minillm.generate(dev, PROMPT, 12)
    assert a == b
    assert [s.kind for s in m1.steps] == [s.kind for s in m2.steps]
    assert [s.bytes for s in m1.steps] == [s.bytes for s in m2.steps]
    assert [s.flops for s in m1.steps] == [s.flops for s in m2.steps]


@pytest.mark.parametrize("name", ["gpt2-tiny-a", "llama-tiny", "qwen3-tiny"])
def test_batched_paged_through_strict(name):
    """Three sequences in one paged pool: a batched prefill, then decode steps that take the batched
    path (one scatter, one gather per layer) - tokens equal to NumPy's."""
    outs = []
    for device in ("cpu", STRICT):
        model = minillm.load(FIXTURES / name, device=device)
        pool = PagedKVPool(model.config, 64, 4, xp=model.xp)
        seqs = [pool.sequence() for _ in range(3)]
        prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
        for s, p in zip(seqs, prompts):
            s.reserve(len(p))
        logits = model.step([(np.array(p), s) for p, s in zip(prompts, seqs)])
        toks = [[int(np.argmax(x)) for x in logits]]
        for _ in range(6):
            for s in seqs:
                s.reserve(1)
            logits = model.step([(np.array([t]), s) for t, s in zip(toks[-1], seqs)])
            toks.append([int(np.argmax(x)) for x in logits])
        outs.append(toks)
    assert outs[0] == outs[1]


@pytest.mark.parametrize("name", ["gpt2-tiny-a", "llama-tiny", "qwen3-tiny"])
def test_static_step_through_strict_never_reads_the_host(name):
    """The static decode step (what a CUDA graph captures) reads no device value on the host, and
    its tokens equal `generate`'s."""
    prompts = [[1, 5, 9, 3, 7], [2, 4]]
    sd = StaticDecode(minillm.load(FIXTURES / name, device=STRICT), batch=2, context=16, block_size=4)
    rows = [[t] for t in sd.start(prompts)]
    for _ in range(6):
        with strict.capturing():
            sd.run()                                   # inside: any host read raises
        for r, t in zip(rows, sd.ids.get()):
            r.append(int(t))
        sd.host_positions += 1
    cpu = minillm.load(FIXTURES / name)
    assert rows == [minillm.generate(cpu, p, 7) for p in prompts]


def test_a_numpy_call_left_on_the_compute_path_fails_here(monkeypatch):
    """The proof can fail: one `np.tanh` put back into the GELU raises on strict arrays."""
    from minillm.models import ops
    monkeypatch.setattr(ops.backend, "namespace", lambda *a: np)
    with pytest.raises(TypeError):
        minillm.generate(minillm.load(FIXTURES / "gpt2-tiny-a", device=STRICT), PROMPT, 2)


@pytest.mark.parametrize("name", ["gpt2-tiny-a", "qwen3-tiny"])
def test_float16_on_a_device_counts_half_the_weight_bytes(name):
    """float16 (a GPU's default) through the seam: norms in float32 then stored back, float32 logits
    on the host, and the meter's weight bytes of a decode step half of float32's, from the itemsize."""
    f32 = minillm.load(FIXTURES / name, device=STRICT)
    f16 = minillm.load(FIXTURES / name, device=STRICT, dtype=np.float16)
    assert f16.dtype == np.float16 and f16.nbytes() * 2 == f32.nbytes()
    logits, cache = f16.prefill(PROMPT)
    assert logits.dtype == np.float32 and np.isfinite(logits).all()
    with minillm.Meter() as m:
        f16.decode_step(int(np.argmax(logits)), cache)
    assert m.steps[0].bytes["weights"] == f16.step_weight_bytes() == f32.step_weight_bytes() // 2


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_gpu_generation_equals_the_cpu(name):
    """On a GPU in float32: greedy tokens equal to the CPU's, and each step's meter bytes and FLOPs."""
    from minillm.backend import DeviceError, get_device
    try:
        get_device("cuda")
    except DeviceError as e:
        pytest.skip(str(e))
    assert_same_generation(minillm.load(FIXTURES / name), minillm.load(FIXTURES / name, device="cuda",
                                                                       dtype=np.float32))


@pytest.mark.parametrize("name", ["gpt2-tiny-a", "qwen2-tiny"])
@pytest.mark.parametrize("cache", ["paged", "contiguous"])
def test_the_engine_through_strict(name, cache):
    """The serving engine on a device model: continuous batching of five requests with chunked prefill,
    a prefix cache (paged), sampled and greedy, gives the same tokens as on NumPy."""
    from minillm.engine.engine import Engine
    from minillm.engine.sequence import SamplingParams
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 3, 4, 9], [7, 8], [1, 2, 3, 4, 5, 6, 20], [30] * 9]
    outs = []
    for device in ("cpu", STRICT):
        engine = Engine(minillm.load(FIXTURES / name, device=device), num_blocks=40 if cache == "paged" else None,
                        block_size=4, cache=cache, prefix_cache=cache == "paged", max_seqs=3, max_batched_tokens=8)
        rs = [engine.add_request(p, 6, SamplingParams(temperature=0.8 * (i % 2), seed=i)) for i, p in enumerate(prompts)]
        engine.run()
        outs.append([r.output for r in rs])
    assert outs[0] == outs[1] and all(len(o) == 6 for o in outs[0])
