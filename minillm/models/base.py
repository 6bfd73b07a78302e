"""What every architecture shares: one way in (`step`) and its three special cases.

    step([(ids, cache), ...])  a flattened batch: several sequences, each with its new tokens (a
                               prompt chunk or one decode token) and its own KV cache; the weights
                               are read once for all of them, each attends over its own positions
    forward(ids)               the whole causal pass of one sequence, no cache: logits everywhere
    prefill(ids)               one sequence's prompt in one pass, filling a KV cache on the way
    decode_step(token, cache)  one token at the cache's next position, attending over the cache

An architecture (GPT-2, Llama) is a subclass with two methods, the model itself:

    run(plan)  -> x [N, d]     embeddings, then every block (plan: models/plan.py)
    head(h)    -> [S, V]       the final norm and the LM head, on the rows that are scored

`step` plans the batch, runs the model, advances the caches and splits the logits per sequence;
it never allocates KV memory (the caller reserves: `cache.reserve(n)`, or the engine's block
manager) and never names its steps for the meter (`with meter.label("verify"):` does that).
"""

from __future__ import annotations

import copy
import hashlib

import numpy as np

from .. import backend, meter
from ..cache.contiguous import KVCache, PassKV
from ..cache.paged import PagedKVPool
from ..config import ModelConfig
from ..errors import PromptError
from . import kernel_sets
from .options import check_options
from .plan import NO_STATIC_STATE, NoStaticState, StaticPlan, check_ids, plan_step
from .target import CPU, Target


RANDOM_SEED = 1234      # every family's random builder and preset (`minillm.load("random-124m")`)


class CausalLM:
    """What a family gives, and what every tool asks of a model instead of guessing its family:

        MATRICES          the names of a block's products (in `blocks[i]`)
        embed_w, head_w   the token embedding and the LM head as weights (models/weights.py; one
                          object when tied)
        matrices()        every product a decode step multiplies, once
        step_weight_bytes(B)  the closed form of the weight bytes a decode step of B tokens reads
        experts           (E, k) of a mixture of experts' sparse layers (models/moe.py); None: dense
        OPTIONS, options  its family's options (models/options.py) and their values in this model;
                          with_options(name=value): another model with other values, the same weights
        ATTENTION_ASKS    the options its attention asks of the kernel set (ops.AttentionSpec: scale,
                          window, ...); where the set's kernel declines one, NumPy's form attends
        POOL, new_cache() its paged pool's class and its contiguous cache (a hybrid's keep states)
        fingerprint()     equal for two loads of one checkpoint, different for two checkpoints
        tokenizer         its own tokenizer as loaded, or None; OWN_TOKENIZER: False if the family
                          uses GPT-2's built-in one (`minillm.tokenizer(model)` then gives it)
        weights           the label of its weights' format; float_matrices: products kept in floats
        target            what runs where (models/target.py): device, dtype, weights, kernels
        kernel_set        the implementations it computes with (models/kernel_sets.py), chosen once
                          from the target; `kernels` its name
        plain_block       are its blocks what a kernel set's compiled block computes? (False here;
                          models/decoder.py's Decoder says for its own)
        device, xp        where its arrays live (backend.Device) and their module: numpy, or cupy
                          on a GPU (`load(..., device="cuda")`); the ops take theirs from the arrays
    """
    config: ModelConfig
    params: dict                 # name -> array or QuantMatrix: the weights as the model holds them
    name: str
    dtype: np.dtype
    eos_ids: tuple = ()          # token ids that end a sequence (a server stops there)
    plain_block = False          # no kernel set's compiled block (KernelSet.compiled_block) runs its blocks
    MATRICES: tuple = ()
    blocks: list
    embed_w: object
    head_w: object
    tokenizer = None
    OWN_TOKENIZER: bool = True
    weights: str = "float32"
    float_matrices: int = 0
    experts: tuple | None = None
    target: Target = CPU
    ATTENTION_ASKS: frozenset = frozenset()   # the attention options it attends with (ops.AttentionSpec)
    OPTIONS: tuple = ()          # its family's options (models/options.py), each a constructor keyword
    POOL = PagedKVPool           # its paged pool (cache/paged.py; a hybrid's also pays for its states)
    PACKED: tuple = ()           # suffixes of the integer tensors its checkpoints pack weights in (gpt-oss's
                                 # MXFP4 "_blocks", "_scales"), read as they are, then `unpack`ed to floats

    @staticmethod
    def unpack(tensors: dict) -> dict:
        """A checkpoint's tensors with its packed ones (`PACKED`) as the floats its manifest names."""
        return tensors

    def use_target(self, target: Target) -> None:
        """Take the target's device and kernel set (a constructor's first step)."""
        self.target = target
        self.kernel_set = kernel_sets.get(target.kernels)

    @property
    def options(self) -> dict:
        """Its family's options as this model was built with them: name -> value."""
        return {o.name: vars(self)[o.name] for o in self.OPTIONS}

    def with_options(self, **changes) -> "CausalLM":
        """This model with other values of its family's options (one line for an option it lacks or a
        value outside the choices): a new model sharing these weights; this one is unchanged."""
        check_options(self.OPTIONS, changes, self.name)
        other = copy.copy(self)
        vars(other).update(changes)
        return other

    @property
    def kernels(self) -> str:
        """The name of its kernel set: "numpy", "fused", "batch-invariant", ..."""
        return self.kernel_set.name

    @property
    def device(self) -> backend.Device:
        return self.target.device

    @property
    def xp(self):
        return self.target.device.xp

    # -- the model: each architecture's own ------------------------------------------------------

    def run(self, plan) -> np.ndarray:
        raise NotImplementedError

    def head(self, h: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # -- the one way in ---------------------------------------------------------------------------

    def check_ids(self, ids, pos: int = 0) -> np.ndarray:
        """Token ids as a 1-D integer array, inside the vocabulary and the context; clear errors otherwise."""
        return check_ids(ids, self.config, pos)

    def step(self, batch, *, scores="last") -> list:
        """Run a flattened batch through the model once.

        batch: [(ids, cache), ...], one entry per sequence: its new token ids [n_i] (a prompt, a
        prompt chunk, or one decode token) and its KV cache, which holds its earlier positions, has
        room reserved for these, and receives them. The n_i tokens of all sequences are the rows
        of one matrix: every weight is read once for the whole step. Each cache advances by n_i.

        scores: "last" (default) gives each sequence the logits of its last new position, [V];
        "all" gives [n_i, V], every new position (speculative decoding verifies k drafts with them);
        None gives None (a prompt chunk whose end is not reached yet). A list sets it per sequence.
        Returns one entry per sequence, in order.
        """
        return self.step_plan(plan_step(batch, scores, self.config, self.xp, self.kernel_set))

    def step_plan(self, plan):
        """Run a laid-out step (models/plan.py: a StepPlan, or a static step's plan): the model on its
        rows, the caches advanced, the head on the scored rows (`plan.rows`; None: every row), and
        the logits as the plan hands them back (per sequence on the host; a static step's on the device)."""
        with plan.meter_step():
            x = self.run(plan)                                            # [N, d]
            plan.advance()
            if plan.rows is not None and not plan.rows:
                return [None] * len(plan.spans)
            h = x if plan.rows is None or len(plan.rows) == x.shape[0] else x[plan.rows]   # [S, d]
            return plan.finish(self.head(h))                              # [S, V]

    def static_plan(self, pool, table, ids, positions):
        """The plan of a static decode step over a fixed block table (engine/static.py), with this
        model's kernel set: device buffers in, device logits out. A pool that keeps states (a hybrid's)
        cannot take one: one line."""
        if pool.states is not None:
            raise NoStaticState(NO_STATIC_STATE)
        return StaticPlan(pool, table, ids, positions, self.kernel_set)

    # -- the three special cases --------------------------------------------------------------------

    def forward(self, ids, *, last_only: bool = False) -> np.ndarray:
        """The full causal pass, no cache. ids [T] -> logits [T, V] (or [1, V] with last_only, the way
        nanoGPT scores at inference: the LM head on the last position only)."""
        with meter.label("forward", unless_labelled=True):
            (logits,) = self.step([(ids, PassKV())], scores="last" if last_only else "all")
        return logits[None] if last_only else logits

    def new_cache(self) -> KVCache:
        return KVCache(self.config, self.dtype, xp=self.xp)

    def prefill(self, ids, cache=None) -> tuple[np.ndarray, KVCache]:
        """The whole prompt in one pass, filling a KV cache. ids [T] -> (logits [V] of the last
        position, the cache holding all T positions). With a cache that already holds positions,
        the prompt continues after them (a chunk of a longer prompt)."""
        cache = cache if cache is not None else self.new_cache()
        ids = self.check_ids(ids, cache.length)
        cache.reserve(ids.size)
        with meter.label("prefill", unless_labelled=True):    # a one-token chunk is still prefill
            (logits,) = self.step([(ids, cache)])
        return logits, cache

    def decode_step(self, token: int, cache) -> np.ndarray:
        """One token at the cache's next position; writes its K and V into the cache in place.
        -> logits [V]."""
        if not isinstance(token, (int, np.integer)):
            raise PromptError(f"token {token!r}: a token id must be an integer")
        self.check_ids([token], cache.length)          # before any block is taken for it
        cache.reserve(1)
        (logits,) = self.step([(np.array([token], dtype=np.intp), cache)])
        return logits

    # -- what the tools ask --------------------------------------------------------------------------

    def matrices(self, head: bool = True, chosen=None) -> list:
        """Every product a decode step multiplies, once: each block's MATRICES, then the LM head
        (head=False: the blocks' only). An untied embedding is not one: a step reads one row of it.
        chosen: the experts a mixture's step chose (models/moe.py); a dense model multiplies all."""
        mats = [p[k] for p in self.blocks for k in self.MATRICES]
        return mats + [self.head_w] if head else mats

    def gathered(self) -> tuple[str, ...]:
        """The parameters a decode step only gathers rows from (GPT-2's positions, an untied
        embedding): one row of each per token is read, not the rest."""
        return ()

    def step_weight_bytes(self, n_tokens: int = 1) -> int:
        """What a decode step of n_tokens tokens (one each of n_tokens sequences) reads of the weights,
        by its closed form: every parameter once (a tied embedding as the LM head, plus the tokens'
        rows of it), and n_tokens rows, not the whole, of each table only gathered from. The meter's
        count equals it (lesson 14, tests)."""
        p, skip = self.params, self.gathered()
        tied_rows = self.embed_w.rows_counts(n_tokens)["weights"] if self.embed_w is self.head_w else 0
        return (sum(v.nbytes for k, v in p.items() if k not in skip)
                + n_tokens * sum(p[k].nbytes // p[k].shape[0] for k in skip) + tied_rows)

    def fingerprint(self) -> str:
        """Equal for two loads of one checkpoint, different for two checkpoints (a draft model must not
        be its target): the config, the weights' format and the first 64 tokens' embeddings."""
        h = hashlib.sha256(repr((type(self).__name__, self.config, self.weights)).encode())
        ids = self.xp.asarray(np.arange(min(64, self.config.vocab_size)))
        h.update(np.ascontiguousarray(backend.to_host(self.embed_w.rows(ids))).tobytes())
        return h.hexdigest()

    def n_params(self) -> int:
        return sum(int(v.size) for v in self.params.values())

    def nbytes(self) -> int:
        return sum(int(v.nbytes) for v in self.params.values())

