"""One step's plan, built once before the blocks run.

A step is a flattened batch: several sequences, each with its new tokens and its own KV cache. The
blocks need four things from it, and nothing else:

    ids        [N]   every new token, all sequences' rows one after the other
    positions  [N]   each row's position in its own sequence (RoPE reads it); `rows_of_positions`
                     indexes a position table the same way (a slice for one sequence: no gather)
    attend(layer, q, k, v, spec)  q [H, N, hd], k and v [Hkv, N, hd] -> [H, N, hd]: store each
                     sequence's new keys and values in its cache, and let each sequence's queries
                     attend over its own positions only; spec: its options (ops.AttentionSpec: a
                     scale, narrower values, a window, sinks, an expansion), default none
    scored rows      which rows the LM head runs on (the last of a sequence, all of them, or none)

and, for a layer that keeps a fixed state per sequence instead (a hybrid's linear layer), one more:

    states(layer)    (rows, that sequence's state for the layer) per sequence (cache/state.py); a plan
                     that cannot carry one (the static step) refuses in one line

and, for a kernel set's compiled step (KernelSet.compiled_block), where a decode step's keys go:

    decode_pages(config)  every layer's keys and values as pages, each new key's page and row, the
                     table and lengths the attention kernel takes; None where the step runs its
                     operations (the static step, always)

`plan_step` builds it once (in the spirit of nano-vllm's prepare_prefill/prepare_decode), choosing
how attention runs: a decode batch in one paged pool as one batch per layer (`BatchedDecode`: one
gather of short sequences, or the kernel set's paged kernel over any lengths), anything else
sequence by sequence over its own cache (`PerSequence`). Both implement `attend`, so the blocks never
ask which one they got; both attend with the model's kernel set (models/kernel_sets.py), which the
plan carries as `kernels`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from .. import backend, meter
from ..config import ModelConfig
from ..errors import MiniLLMError, PromptError
from . import ops
from .kernel_sets import KernelSet, get as get_kernel_set

NO_STATIC_STATE = ("a static decode step has no per-sequence state: a model with linear-attention layers "
                   "(a hybrid) decodes with eager steps; leave out the static step")
_FIRST_PAGE = np.zeros(1, np.intp)      # a contiguous cache's rows: one page, the first
BATCHED_DECODE_KEYS = 128   # up to this many keys per sequence, a decode batch is attended as one gather
SCORES = ("last", "all", None)


@dataclass(frozen=True)
class Span:
    """One sequence's rows in a step: rows r0 .. r0+n-1 are its new tokens at positions pos .. pos+n-1."""
    r0: int
    n: int
    pos: int
    cache: object      # anything with the cache protocol (cache/contiguous.py)


class PerSequence:
    """Each sequence in turn: write its new K, V into its cache, then attend over every position so far
    with the kernel set's attention (the cache's rows in place: `read_rows`); a paged sequence's one
    decode token, where the set has a paged kernel, over its blocks in the pool, no gather."""

    def __init__(self, spans: list[Span], K: KernelSet) -> None:
        self.spans = spans
        self.K = K
        self.tables = {}
        if K.paged_decode is not None:                                     # [1, blocks] a group, once a step
            self.tables = {id(s): [np.asarray(t, dtype=np.intp)[None] for t in s.cache.tables]
                           for s in spans if s.n == 1 and paged_float32(s.cache) is not None}

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               spec: ops.AttentionSpec = ops.PLAIN) -> np.ndarray:
        """spec: the attention's options (ops.AttentionSpec), see `one`."""
        if len(self.spans) == 1:
            return self.one(self.spans[0], layer, q, k, v, spec)
        out = None
        for s in self.spans:
            rows = slice(s.r0, s.r0 + s.n)
            o = self.one(s, layer, q[:, rows], k[:, rows], v[:, rows], spec)
            if out is None:
                out = backend.namespace(q).empty(q.shape[:2] + o.shape[2:], dtype=q.dtype)   # [H, N, hd_v]
            out[:, rows] = o
        return out

    def one(self, s: Span, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray,
            spec: ops.AttentionSpec = ops.PLAIN) -> np.ndarray:
        """One sequence: store its new K, V [Hkv, n, hd], then its queries attend over every position so
        far, with the spec's options (its scale, narrower values, a window, sinks: the kernel set's
        kernel where it takes them, else NumPy's form); spec.expand(k, v) -> (k, v): what attention
        takes, made from the positions the cache read (a latent cache's rows decompressed)."""
        s.cache.write(layer, s.pos, k, v)
        tables = self.tables.get(id(s))
        if tables is not None and not spec.asks():                         # plain: the paged kernel, in place
            pool, row = s.cache.pool, s.cache.pool.slot_of[layer]          # its rows, its group's table
            return self.K.paged_decode(q, pool.k[row], pool.v[row], tables[pool.group_of[layer]], [s.pos + 1])
        lo = 0 if spec.window is None else max(0, s.pos - spec.window + 1)   # a window: its first query's first key
        k_all, v_all = s.cache.read_rows(layer, s.pos + s.n, lo)           # [Hkv, >= pos+n-lo, hd]: lo .. pos+n-1
        if spec.expand is not None:
            k_all, v_all = spec.expand(k_all[:, :s.pos + s.n - lo], v_all[:, :s.pos + s.n - lo])
        return self.K.attention(q, k_all, v_all, s.pos + s.n - lo, spec)   # [H, n, hd_v]


def paged_float32(cache):
    """The cache's paged pool when its keys are float32 (a paged kernel's input), else None."""
    pool = cache.pool
    return pool if pool is not None and pool.k.dtype == np.float32 else None


class BatchedDecode:
    """B sequences of one paged pool taking one new token each, attended as one batch: the block tables
    are laid out once per step as a [B, blocks] matrix, and each layer writes the B new keys with
    one scatter and reads everything with one gather, [Hkv, B, T, hd] (T = the longest sequence,
    rounded up to whole blocks; shorter rows are padded with their own first block and masked).

    The gather is a copy, counted as one: kv_read for the blocks the sequences really hold,
    activations for writing the copy and for attention reading it (padding included: it is moved).
    It pays while the sequences are short: one gather instead of B small reads. `plan_step` uses it
    up to BATCHED_DECODE_KEYS keys; `minillm bench --batch` shows both ways. With a kernel set's
    paged kernel (`paged_decode`) nothing is gathered, padded or masked, at any length.
    """

    def __init__(self, pool, caches: list, paged_decode=None) -> None:
        bs = pool.block_size
        xp = backend.namespace(pool.k)                                     # the pool's device
        self.pool = pool
        self.paged_decode = paged_decode   # the kernel set's paged kernel: no gather, no padding, no mask
        B = len(caches)
        pos = np.array([c.length for c in caches], dtype=np.intp)          # each new token's position
        self.lengths = pos + 1
        nb = -(-int(self.lengths.max()) // bs)
        table = np.empty((B, nb), dtype=np.intp)
        for i, c in enumerate(caches):
            row = c.table[:nb]
            table[i, :len(row)] = row
            table[i, len(row):] = row[0]
        table.flags.writeable = self.lengths.flags.writeable = False        # the step's: checked once (kernels/checks.py)
        self.table = xp.asarray(table)                                     # [B, nb]  (laid out on the host,
        self.blocks = xp.asarray(table[np.arange(B), pos // bs])          # where each new key goes   moved once
        self.offsets = xp.asarray(pos % bs)                                #                           a step)
        self.T = nb * bs
        self.mask = None                   # the paged kernel reads each sequence's own keys: no mask
        if paged_decode is None:
            keys = np.arange(self.T)
            mask = np.where(keys[None, :] < self.lengths[:, None], 0.0, -np.inf).astype(pool.k.dtype)[:, None, :]
            self.mask = xp.asarray(mask)                                   # [B, 1, T]; lengths stay on the host
        self.held = int(sum(-(-int(n) // bs) for n in self.lengths)) * bs  # positions in blocks really held

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               spec: ops.AttentionSpec = ops.PLAIN) -> np.ndarray:
        """q [H, B, hd], the B new keys and values [Hkv, B, hd] -> [H, B, hd]. Plain attention only (a
        StepPlan sends any other spec to its per-sequence form)."""
        if spec.asks():
            raise ValueError(f"a batched decode step attends plainly; asked {sorted(spec.asks())}")
        self.write(layer, k, v)
        if self.paged_decode is not None:                                  # reads the pool in place
            return self.paged_decode(q, self.pool.k[layer], self.pool.v[layer], self.table, self.lengths)
        k_all, v_all = self.read(layer)                                    # [Hkv, B, T, hd]
        return ops.decode_attention(q, k_all, v_all, self.mask, self.lengths)

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """The B new keys and values, [Hkv, B, hd], into their blocks: one scatter each."""
        self.pool.k[layer][:, self.blocks, self.offsets] = k
        self.pool.v[layer][:, self.blocks, self.offsets] = v
        m = meter.active()
        if m is not None:
            m.count("kv_write", kv_write=k.nbytes + v.nbytes)

    def read(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Every sequence's keys and values, [Hkv, B, T, hd] each: one gather through the tables."""
        kp, vp = self.pool.k[layer], self.pool.v[layer]                    # [Hkv, blocks, bs, hd]
        (H, _, _, hd), B, xp = kp.shape, self.table.shape[0], backend.namespace(kp)
        k = xp.take(kp, self.table, axis=1).reshape(H, B, self.T, hd)     # [Hkv, B, nb, bs, hd] -> [Hkv, B, T, hd]
        v = xp.take(vp, self.table, axis=1).reshape(H, B, self.T, hd)
        m = meter.active()
        if m is not None:
            m.count("kv_gather", kv_read=2 * H * self.held * hd * k.itemsize, activations=2 * (k.nbytes + v.nbytes))
        return k, v


class NoStaticState(MiniLLMError):
    """A static decode step asked for a hybrid: its slots carry block tables, no state."""


class StaticPlan(BatchedDecode):
    """The plan of a decode step with static shapes, for a CUDA graph (engine/static.py): B slots,
    each owning a fixed row of a [B, nb] block table from the start, their token ids and positions
    in buffers on the device, read by the step and refilled between steps, so the step reads no host
    value. Every slot attends over its whole table, T = nb·block_size positions, the ones not written
    yet masked: the same gather and the same product every step. A `BatchedDecode` whose lengths are
    the whole table: the same write, gather and counts (every key moved and multiplied, masked too).

    `prepare()` (inside the step a graph records) derives where the new keys go and the mask from
    the positions buffer; the model's `step_plan` then runs it like any plan."""

    def __init__(self, pool, table, ids, positions, kernel_set: KernelSet) -> None:
        B, nb = table.shape
        self.pool, self.table, self.ids, self.positions = pool, table, ids, positions     # device buffers
        self.paged_decode = None
        self.kernels = kernel_set
        self.T = nb * pool.block_size
        self.keys = backend.namespace(table).arange(self.T)                # [T]
        self.lengths = np.full(B, self.T)                                  # the work done: every key
        self.held = B * self.T
        self.rows = None                                                   # every row is scored
        self.attend = self.attend                                          # (a bound method, as StepPlan's)

    @property
    def rows_of_positions(self):
        return self.positions

    def prepare(self) -> None:
        """From the positions buffer, on the device: each new key's block and offset, and the mask."""
        xp, bs = backend.namespace(self.table), self.pool.block_size
        self.blocks = xp.take_along_axis(self.table, (self.positions // bs)[:, None], axis=1)[:, 0]   # [B]
        self.offsets = self.positions % bs                                                          # [B]
        mask = xp.where(self.keys[None, :] <= self.positions[:, None], 0.0, -np.inf)                # [B, T]
        self.mask = mask.astype(self.pool.k.dtype)[:, None, :]                                      # [B, 1, T]

    def meter_step(self):
        return meter.NO_STEP                    # the slots' owner records the step (outside a capture)

    def decode_pages(self, config: ModelConfig):
        return None                             # its keys' places are device buffers: the operations run

    def states(self, layer: int):
        raise NoStaticState(NO_STATIC_STATE)

    def advance(self) -> None:
        pass                                    # the owner moves the positions buffer on

    def finish(self, logits):
        return logits                           # [B, V], left on the device (a greedy argmax follows there)


def _pool_fits(pool, shape: tuple) -> bool:
    """Does a pool hold float32 keys and values of this [L, Hkv, (blocks, bs,) hd] on the CPU?"""
    k = pool.k
    return (isinstance(k, np.ndarray) and k.dtype == np.float32 and k.ndim == 5 and pool.v.shape == k.shape
            and k.shape[:2] + k.shape[4:] == shape)


def batched_decode(spans: list[Span], K: KernelSet) -> BatchedDecode | None:
    """B > 1 decode tokens in one paged pool, attended as one batch: with the kernel set's paged kernel
    at any lengths (it gathers nothing), else as one gather per layer while no sequence has more than
    BATCHED_DECODE_KEYS keys (one gather beats B separate reads). None where the set attends each
    sequence on its own (the batch-invariant set: exactly as it would alone)."""
    if not K.gather_decode or len(spans) < 2 or any(s.n != 1 for s in spans):
        return None
    pool = spans[0].cache.pool
    if pool is None or len(pool.groups) > 1 or any(s.cache.pool is not pool for s in spans):
        return None                   # (several KV cache groups, several tables: each sequence on its own)
    if K.paged_decode is not None and paged_float32(spans[0].cache) is not None:
        return BatchedDecode(pool, [s.cache for s in spans], K.paged_decode)
    if max(s.pos for s in spans) >= BATCHED_DECODE_KEYS:
        return None
    return BatchedDecode(pool, [s.cache for s in spans])


def check_ids(ids, config: ModelConfig, pos: int = 0) -> np.ndarray:
    """Token ids as a 1-D integer array, inside the vocabulary and the context; clear errors otherwise."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size == 0:
        raise PromptError(f"expected a non-empty list of token ids, got shape {ids.shape}: the prompt is empty")
    if not np.issubdtype(ids.dtype, np.integer):
        raise PromptError(f"token ids must be integers, got dtype {ids.dtype}")
    V, n_ctx = config.vocab_size, config.n_ctx
    bad = ids[(ids < 0) | (ids >= V)]
    if bad.size:
        raise PromptError(
            f"token id {int(bad[0])} is outside this model's vocabulary of {V} ids (0..{V - 1}); "
            "was the prompt tokenized for another model?"
        )
    if pos + ids.size > n_ctx:
        where = f"after the {pos} already cached, " if pos else ""
        raise PromptError(
            f"{ids.size} tokens do not fit the context of {n_ctx}: {where}at most {n_ctx - pos} fit; "
            "shorten the prompt"
        )
    return ids.astype(np.intp, copy=False)


class StepPlan:
    """What the blocks and the head need from one step (see the module's docstring)."""

    def __init__(self, spans: list[Span], ids: np.ndarray, positions: np.ndarray, wants: list, xp=np,
                 kernel_set: KernelSet | None = None) -> None:
        self.spans = spans
        self.xp = xp                        # the weights' module: ids and positions go to their device
        self.ids = xp.asarray(ids)          # [N]
        self.positions = xp.asarray(positions)   # [N]
        one = spans[0]
        self.rows_of_positions = slice(one.pos, one.pos + one.n) if len(spans) == 1 else self.positions
        self.wants = wants                  # per sequence: "last", "all" or None
        self.kernels = K = kernel_set or get_kernel_set("numpy")           # the model's kernel set
        self.each = PerSequence(spans, K)                                  # any attention, sequence by sequence
        self.attention = batched_decode(spans, K) or self.each             # plain attention: batched where it pays
        rows = []
        for s, w in zip(spans, wants):
            if w == "last":
                rows.append(s.r0 + s.n - 1)
            elif w == "all":
                rows.extend(range(s.r0, s.r0 + s.n))
        self.rows = rows                    # the rows the LM head scores

    def attend(self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               spec: ops.AttentionSpec = ops.PLAIN) -> np.ndarray:
        """The blocks' one attention (see the module): plain attention as the plan chose (batched or per
        sequence), any other spec (ops.AttentionSpec) sequence by sequence over each own cache."""
        if spec.asks():
            return self.each.attend(layer, q, k, v, spec)
        return self.attention.attend(layer, q, k, v)

    def decode_pages(self, config: ModelConfig):
        """Where a decode step's keys go and are read, as pages, for a kernel set's compiled step
        (KernelSet.compiled_block): (k, v [L, Hkv, blocks, bs, hd], layer l's pages at [l]; each new
        key's page [N] and its row there [N]; the pages' table [N, nb] and the lengths [N] as the
        attention kernel takes them, read-only). Only for one token a sequence: one sequence over a
        contiguous float32 cache on the CPU (its rows one page), one sequence of a paged pool the
        set's paged kernel reads in place (`PerSequence`'s table), or a batch attended in one call
        over its paged pool (`BatchedDecode` with that kernel); the arrays of the model's shape, one
        row a layer (a cache of another shape is the operations' to refuse), float32 on the CPU;
        else None."""
        from ..cache.contiguous import KVCache
        from ..kernels import products
        if any(s.n != 1 for s in self.spans):
            return None
        shape = (config.n_layer, config.n_kv_head)
        if len(self.spans) == 1 and self.spans[0].cache.pool is not None:       # one sequence of a pool
            s = self.spans[0]
            pool, tables = s.cache.pool, self.each.tables.get(id(s))          # its table, as the kernel takes it
            if (tables is None or len(tables) != 1 or not _pool_fits(pool, shape + (config.head_dim,))
                    or list(pool.slot_of) != list(range(config.n_layer))):
                return None
            bs = pool.block_size
            return (pool.k, pool.v, np.array([s.cache.tables[0][s.pos // bs]], np.intp),
                    np.array([s.pos % bs], np.intp), tables[0], products._length(s.pos + 1))
        if len(self.spans) == 1:
            s = self.spans[0]
            c = s.cache
            if (type(c) is not KVCache or c.kv_dtype is not None or c.shared or not isinstance(c.k, np.ndarray)
                    or c.k.dtype != np.float32 or c.k.shape[:2] + c.k.shape[3:] != shape + (config.head_dim,)
                    or not (c.k.flags.c_contiguous and c.v.flags.c_contiguous)):   # (reshaped: views, not copies)
                return None
            S = c.k.shape[2]
            return (c.k.reshape(shape + (1, S, config.head_dim)), c.v.reshape(shape + (1, S, config.head_dim)),
                    _FIRST_PAGE, np.array([s.pos], np.intp), products._ONE_BLOCK, products._length(s.pos + 1))
        b = self.attention
        if (not isinstance(b, BatchedDecode) or b.paged_decode is None
                or not _pool_fits(b.pool, shape + (config.head_dim,))):
            return None
        return (b.pool.k, b.pool.v, np.asarray(b.blocks, np.intp), np.asarray(b.offsets, np.intp), b.table, b.lengths)

    @property
    def n_tokens(self) -> int:
        return int(self.ids.size)

    @property
    def kind(self) -> str:
        """What the step is, from its shape: "decode" (one new token per sequence, each after a
        cached prompt), "prefill" (prompts or prompt chunks only) or "mixed"."""
        if all(s.n == 1 and s.pos > 0 for s in self.spans):
            return "decode"
        return "prefill" if all(s.n > 1 or s.pos == 0 for s in self.spans) else "mixed"

    def meter_step(self):
        """The meter's record around this step (a no-op with no meter active)."""
        if meter.active() is None:
            return meter.NO_STEP
        return meter.step(self.kind, self.spans[0].pos, self.n_tokens,
                          attended=max(s.pos + s.n for s in self.spans),
                          seqs=[(s.pos, s.n) for s in self.spans],
                          clock=None if self.xp is np else partial(backend.clock, self.xp))

    def states(self, layer: int) -> list:
        """What a layer that keeps a fixed state per sequence (a hybrid's linear layer, cache/state.py)
        takes from the step: (its rows, its state for state layer `layer`) per sequence, the state
        None for a pass that keeps nothing (it starts at zeros and is dropped)."""
        out = []
        for s in self.spans:
            if s.cache.state is None and not s.cache.transient:
                raise MiniLLMError("this model's linear layers keep a state per sequence and this cache has no "
                                   "slot for one; make caches with model.new_cache() or the model's pool (model.POOL)")
            out.append((slice(s.r0, s.r0 + s.n), None if s.cache.state is None else s.cache.state.at(layer)))
        return out

    def advance(self) -> None:
        """The step ran: every cache now holds its new positions."""
        for s in self.spans:
            s.cache.advance(s.n)

    def finish(self, logits):
        """The head's [S, V] logits on the host, one entry per sequence (`split`)."""
        return self.split(backend.host_logits(logits))

    def split(self, logits: np.ndarray | None) -> list:
        """The head's [S, V] logits, one entry per sequence: [V] (last), [n, V] (all) or None."""
        out, i = [], 0
        for s, w in zip(self.spans, self.wants):
            if w is None:
                out.append(None)
            elif w == "last":
                out.append(logits[i])
                i += 1
            else:
                out.append(logits[i:i + s.n])
                i += s.n
        return out


def plan_step(batch, scores, config: ModelConfig, xp=np, kernel_set: KernelSet | None = None) -> StepPlan:
    """Check a step's batch [(ids, cache), ...] and lay it out. Every cache must already have room for
    its new positions (`cache.reserve(n)`: the caller's job, the engine's block manager in a server).
    kernel_set: the model's (None: the NumPy reference)."""
    if not batch:
        raise PromptError("a step needs at least one sequence")
    wants = [scores] * len(batch) if scores is None or isinstance(scores, str) else list(scores)
    if len(wants) != len(batch) or any(w not in SCORES for w in wants):
        raise ValueError(f"scores={scores!r}: 'last', 'all', None, or one of those per sequence")
    caches = [cache for _, cache in batch]
    if len({id(c) for c in caches}) != len(caches):
        raise PromptError("the same KV cache appears twice in one step: each sequence needs its own")
    chunks = [check_ids(ids, config, cache.length) for ids, cache in batch]
    spans, r0 = [], 0
    for ids, cache in zip(chunks, caches):
        if cache.length + ids.size > cache.capacity:
            raise PromptError(f"the KV cache has room for {cache.capacity - cache.length} more positions and the "
                              f"step brings {ids.size}: reserve them first (cache.reserve(n))")
        spans.append(Span(r0, ids.size, cache.length, cache))
        r0 += ids.size
    if len(spans) == 1:
        ids, positions = chunks[0], np.arange(spans[0].pos, spans[0].pos + r0)
    else:
        ids = np.concatenate(chunks)
        positions = np.concatenate([np.arange(s.pos, s.pos + s.n) for s in spans])
    return StepPlan(spans, ids, positions, wants, xp, kernel_set)
