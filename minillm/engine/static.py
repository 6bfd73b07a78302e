"""Decode with static shapes: B slots, a KV block table of fixed size, every step the same work.

A GPU spends most of a small model's decode step launching kernels (~180 for GPT-2 small, each a
few µs), not moving bytes. A CUDA graph records the step's kernels once and replays them with one
launch; it can only do so if every step has the same shapes and reads its inputs from the same
buffers. So this step is built for that:

    slots      B sequences, fixed; each owns `nb = ceil(context / block_size)` blocks of one paged
               pool from the start, so its block table is a fixed [nb] row of a [B, nb] table
    buffers    ids [B] and positions [B] on the device: the step reads them, and at its end writes
               the next step's into them (greedy: ids = argmax of the logits, positions + 1), so
               a replay needs nothing from the host; the host reads ids back (B integers)
    attention  every slot attends over all nb·block_size positions of its table, the ones not
               written yet masked: the same gather and the same product every step

The step is a plan kind (models/plan.py's StaticDecode, made by `model.static_plan`) that runs
through the model's own `step_plan`, like every other step. The prompts are prefilled eagerly
(`start`), through the model's `step`. The meter counts what the static step does: every slot's
whole table gathered and attended (the masked positions are moved and multiplied too). On the CPU
the step runs eagerly; `capture()` needs a GPU (cuda_graph.Captured).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .. import backend, meter
from ..cache.paged import PagedKVCache, PagedKVPool
from ..cuda_graph import Captured
from ..errors import MiniLLMError, PromptError


class StaticDecode:
    """B slots of greedy decoding with fixed shapes (see the module's docstring).

        sd = StaticDecode(model, batch=4, context=256)
        first = sd.start(prompts)        # prefill each prompt; each slot's first new token
        ids = sd.step()                  # one decode step for all slots -> their next tokens [B]
        sd.capture(); sd.step(graph=True)   # on a GPU: the same step as one CUDA-graph replay
    """

    def __init__(self, model, batch: int, context: int, block_size: int = 16) -> None:
        c = model.config
        if batch < 1 or context < 1:
            raise MiniLLMError(f"batch={batch}, context={context}: both must be at least 1")
        self.model, self.B, self.bs = model, batch, block_size
        self.nb = -(-context // block_size)
        self.T = self.nb * block_size                                   # positions each slot attends over
        if self.T > c.n_ctx:
            raise PromptError(f"context {context} (rounded up to {self.T}, whole blocks of {block_size}) is beyond "
                              f"the model's context of {c.n_ctx}: ask for at most {c.n_ctx // block_size * block_size}")
        self.xp = xp = model.xp                                          # the weights' module (backend.py)
        self.pool = PagedKVPool(c, batch * self.nb, block_size, model.dtype, xp=xp)
        self.caches = [PagedKVCache(self.pool, self.pool.allocator.allocate_many(self.nb)) for _ in range(batch)]
        table = xp.asarray(np.array([cache.table for cache in self.caches], dtype=np.intp))   # [B, nb]
        self.ids = xp.zeros(batch, dtype=np.intp)                        # [B] each slot's token this step
        self.positions = xp.zeros(batch, dtype=np.intp)                 # [B] its position
        self.plan = model.static_plan(self.pool, table, self.ids, self.positions)
        self.logits = None                                               # [B, V] the last step's
        self.host_positions = np.zeros(batch, dtype=np.intp)             # a host copy, to stop before T
        self.graph = None
        self.launches: dict = {}
        self.counted = None                                              # the meter's record of one step
        self.started = False

    # -- the prompts -------------------------------------------------------------------------------

    def start(self, prompts) -> list[int]:
        """Prefill each slot's prompt (eagerly, the model's own step) and pick its first new token
        (greedy). Returns those B tokens."""
        if len(prompts) != self.B:
            raise PromptError(f"{len(prompts)} prompts for {self.B} slots: give one prompt per slot")
        first = []
        for cache, prompt in zip(self.caches, prompts):
            ids = self.model.check_ids(prompt)
            if ids.size >= self.T:
                raise PromptError(f"a prompt of {ids.size} tokens leaves no room in a static context of {self.T} "
                                  "positions: shorten it or ask for a longer context")
            cache.length = 0                                             # (a second start writes over the first)
            (logits,) = self.model.step([(ids, cache)])                  # host logits [V]
            first.append(int(np.argmax(logits)))
        self.host_positions[:] = [len(p) for p in prompts]
        self.ids[...] = self.xp.asarray(np.array(first, dtype=np.intp))
        self.positions[...] = self.xp.asarray(self.host_positions)
        self.started = True
        return first

    # -- the step: what a graph records ------------------------------------------------------------

    def run(self):
        """One decode step of all B slots from the buffers, and the next step's inputs written back
        into them. Reads no host value: this is the function a CUDA graph captures."""
        self.plan.prepare()
        logits = self.model.step_plan(self.plan)                         # [B, V] on the device
        self.ids[...] = self.xp.argmax(logits, axis=-1)                  # greedy, on the device
        self.positions += 1
        self.logits = logits
        return logits

    # -- running it --------------------------------------------------------------------------------

    def step(self, graph: bool = False) -> list[int]:
        """One decode step of every slot (eager, or one replay of the captured graph): their next
        tokens, read back to the host."""
        if not self.started:
            raise MiniLLMError("StaticDecode.step before start(prompts): prefill the slots first")
        if int(self.host_positions.max()) >= self.T:
            raise PromptError(f"a slot has filled its static context of {self.T} positions: start again with a "
                              "longer context")
        if graph and self.graph is None:
            raise MiniLLMError("StaticDecode.step(graph=True) before capture()")
        m = meter.active()
        with meter.step("decode", int(self.host_positions.min()), self.B, attended=self.T,
                        seqs=[(int(p), 1) for p in self.host_positions], clock=partial(backend.clock, self.xp)) as rec:
            if rec is not None:                                          # the same kernels, eager or replayed
                rec.launches = self.launches.get("kernels")
            if graph:
                self.graph.replay()
                if m is not None and self.counted is not None:           # one launch: the step's counts, once
                    m.count("cuda_graph", **self.counted)
            else:
                self.run()
            tokens = [int(t) for t in backend.to_host(self.ids)]         # waits for the device
        self.host_positions += 1
        return tokens

    def capture(self) -> None:
        """Capture `run` as one CUDA graph (cuda_graph.Captured: one eager call first, which also counts the
        step for the meter; the capture itself runs nothing). Needs a GPU."""
        if not self.started:
            raise MiniLLMError("StaticDecode.capture before start(prompts)")
        ids, positions = self.ids.copy(), self.positions.copy()
        with meter.Meter() as m:
            self.graph = Captured(self._counted_run(m), backend.device_of(self.ids))
        self.launches = self.graph.launches
        self.ids[...], self.positions[...] = ids, positions             # the warm-up step is undone
        rec = m.steps[0]
        self.counted = {**rec.bytes, **rec.flops}

    def _counted_run(self, m):
        """`run`, inside one meter step the first time it is called (the eager warm-up)."""
        calls = [0]

        def fn():
            calls[0] += 1
            if calls[0] == 1:
                with m.step("decode", 0, self.B, attended=self.T):
                    return self.run()
            return self.run()
        return fn

    @property
    def step_bytes(self) -> int:
        return sum(v for k, v in (self.counted or {}).items() if k in meter.BYTE_KINDS)

    @property
    def step_flops(self) -> int:
        return sum(v for k, v in (self.counted or {}).items() if k in meter.FLOP_KINDS)

    def close(self) -> None:
        """Every slot's blocks back to the pool, the graph and its memory let go."""
        for cache in self.caches:
            for b in cache.table:
                self.pool.allocator.release(b)
            cache.table.clear()
        self.graph = None
