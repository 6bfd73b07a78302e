"""A mixture of experts' layer, as operations any family assembles (models/moe.py's Mixtral and
Qwen3-MoE, models/deepseek.py's): a router chooses k experts a row, then each chosen expert runs
once on all of its rows. Every operation here reports its bytes and FLOPs to the meter.

    route(x, router, k, norm_topk)    softmax over the E experts, the top k (Mixtral, Qwen3-MoE)
    grouped_route(x, router, bias, c) sigmoid affinities, a bias that chooses, groups (DeepSeek-V3)
    dispatch(x, experts, weights, p)  each chosen expert once on its rows, weighed, added back
    experts_mlp(x, p, c)              route, then dispatch
    routes()                          records every router's choice while active (lessons, tools)
    expected_distinct_experts(E, k, B) the experts B uniformly routed tokens read: the closed form
    step_weight_bytes(c, distinct)    the weight bytes a step reads: the closed form
    SparseDecoder                     a decoder whose sparse layers are mixtures (Mixtral's, gpt-oss's)
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from .. import meter
from . import ops
from .blocks import mlp
from .decoder import Decoder
from .quant import FORMATS
from .target import Target, cpu_only
from .weights import check_blocks

Block = dict   # one block's parameters, stacked names


_ROUTES: ContextVar = ContextVar("minillm_moe_routes", default=None)


@contextmanager
def routes():
    """The experts every sparse layer chose while active, on this thread: a list of [N, k] arrays, one
    per sparse layer and step, in the order they ran (a step's layers one after another).

    >>> with routes() as r:
    ...     model.decode_step(token, cache)
    >>> [set(a.ravel()) for a in r]          # the experts each sparse layer read
    """
    found: list[np.ndarray] = []
    token = _ROUTES.set(found)
    try:
        yield found
    finally:
        _ROUTES.reset(token)


def route(x: np.ndarray, router, k: int, norm_topk: bool, bias=None) -> tuple[np.ndarray, np.ndarray]:
    """Which k experts each row uses, and how much. x [N, d], router [d, E] (bias [E]: gpt-oss's) ->
    (experts [N, k] ints, weights [N, k]), the largest probability first.
    Counted: the router's product (ops.linear), then per row a softmax over E (5 FLOPs an entry)
    and, renormalised, k divisions."""
    logits = ops.linear(x, router, bias)                                    # [N, E]
    probs = ops.softmax(logits)                                             # [N, E], in place
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]                 # [N, k]: ties to the lower id
    w = np.take_along_axis(probs, top, axis=-1)                             # [N, k]
    if norm_topk:
        w /= w.sum(axis=-1, keepdims=True)
    m = meter.active()
    if m is not None:
        m.count("router", activations=2 * probs.nbytes + top.nbytes + w.nbytes,
                other=5 * probs.size + (w.size if norm_topk else 0))
    record_route(top)
    return top, w


def record_route(top: np.ndarray) -> None:
    """A router's choice [N, k], for `routes()` when one is recording (every family's routers)."""
    found = _ROUTES.get()
    if found is not None:
        found.append(top)


def expert(p: Block, e: int, biases: bool = False) -> Block:
    """Expert e of a sparse block: its {"gate_up.weight", "down_proj.weight"}, as `llama.mlp` takes them
    (biases: with their biases too, where it has them: gpt-oss's)."""
    names = ("gate_up.weight", "down_proj.weight") + (("gate_up.bias", "down_proj.bias") if biases else ())
    return {n: p[f"experts.{e}.{n}"] for n in names if f"experts.{e}.{n}" in p}


def experts_mlp(x: np.ndarray, p: Block, c, act=ops.swiglu) -> np.ndarray:
    """The mixture: route each row to k experts, then run each chosen expert once on all of its
    rows. x [N, d] -> [N, d].

    The N·k (row, expert) pairs are sorted by expert, so expert e's rows are one run of them: its
    gate|up and down weights are multiplied once for that run (`llama.mlp`, through `ops.linear`),
    and an expert no row chose is not read at all. The outputs, scaled by their weights, are added
    into their rows (a row's k experts are distinct, so each run adds into distinct rows).
    Counted besides, per (row, expert) pair of d values: the gather (read, write), scaling the
    output and adding it into y (read it, read y, write y; 2 FLOPs a value); and y's zeros.
    c: the counts (top_k, norm_topk); act: the experts' SwiGLU (the kernel set's)."""
    experts, weights = route(x, p["router.weight"], c.top_k, c.norm_topk, p.get("router.bias"))  # [N, k] each
    return dispatch(x, experts, weights, p, act)


def dispatch(x: np.ndarray, experts: np.ndarray, weights: np.ndarray, p: Block, act=ops.swiglu) -> np.ndarray:
    """Each chosen expert run once on all its rows (as `experts_mlp` says), its outputs weighed and
    added into them. x [N, d], experts and weights [N, k] (a router's choice) -> [N, d]."""
    k = experts.shape[1]
    order = np.argsort(experts, axis=None, kind="stable")                   # [N·k] pairs, grouped by expert
    rows, by = order // k, experts.ravel()[order]
    starts = np.flatnonzero(np.r_[True, by[1:] != by[:-1]])                 # where each expert's run begins
    ends = np.r_[starts[1:], by.size]
    w = weights.ravel()[order]                                              # [N·k], in the same order
    y = np.zeros_like(x)                                                    # [N, d]
    for s, t in zip(starts, ends):
        r = rows[s:t]                                                       # the rows expert `by[s]` serves
        h = mlp(x[r], expert(p, by[s], True), act)                              # [n_e, d]
        h *= w[s:t, None]
        y[r] += h
    m = meter.active()
    if m is not None:
        pairs = rows.size * x.shape[1]                                      # values gathered and added
        m.count("moe_combine", activations=x.itemsize * (2 * pairs + 3 * pairs + y.size), other=2 * pairs)
    return y


def grouped_route(x: np.ndarray, router, bias: np.ndarray, c) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek-V3's router: which k experts each row uses, and how much. x [N, d], router [d, E] (a
    weight), bias [E]; c: the counts (n_expert, n_group, topk_group, top_k, norm_topk, routed_scale)
    -> (experts [N, k], weights [N, k]).

    The affinities s = sigmoid(x·router) weigh; s + bias chooses (bias: the load-balancing correction,
    learned without a loss term). Groups: the E experts split into n_group groups of E/G, each scored
    by its two best choices; a row picks its k among the topk_group best groups only."""
    logits = ops.linear(x, router)                                          # [N, E]
    s = 1.0 / (1.0 + np.exp(-logits))                                       # [N, E] affinities
    choice = s + bias                                                       # [N, E]
    N, E, G = s.shape[0], c.n_expert, c.n_group
    if c.topk_group < G:
        per = choice.reshape(N, G, E // G)                                  # [N, G, E/G]
        best2 = -np.sort(-per, axis=-1)[:, :, :min(2, E // G)].sum(-1)      # [N, G]: a group's two best
        groups = np.argsort(-best2, axis=-1, kind="stable")[:, :c.topk_group]   # [N, topk_group]
        allowed = np.zeros((N, G), dtype=bool)
        np.put_along_axis(allowed, groups, True, axis=-1)
        choice = np.where(np.repeat(allowed, E // G, axis=-1), choice, -np.inf)   # [N, E]
    top = np.argsort(-choice, axis=-1, kind="stable")[:, :c.top_k]          # [N, k]: ties to the lower id
    w = np.take_along_axis(s, top, axis=-1)                                 # [N, k]: weighed by s, not s + bias
    if c.norm_topk:
        w = w / (w.sum(-1, keepdims=True) + 1e-20)
    w = w * c.routed_scale
    m = meter.active()
    if m is not None:
        m.count("router", weights=bias.nbytes, activations=3 * s.nbytes + top.nbytes + w.nbytes,
                other=5 * s.size + 2 * w.size)
    record_route(top)
    return top, w


def expected_distinct_experts(E: int, k: int, B: int) -> float:
    """Experts a layer reads for B tokens that each choose k of E uniformly at random: E·(1 − (1 − k/E)^B).
    (Expert e escapes one token with probability 1 − k/E, all B with (1 − k/E)^B.) B = 1 gives k."""
    return E * (1.0 - (1.0 - k / E) ** B)


# -- the model a mixture's families share ---------------------------------------------------------------

class SparseDecoder(Decoder):
    """A pre-norm decoder (models/decoder.py) whose sparse layers' MLP is a router and E experts: what
    models/moe.py's `MoE` and models/gptoss.py's `GptOss` share (the CPU-only rule, a float router,
    the experts' counts and the products a step multiplies). A family brings its config (`n_expert`,
    `top_k`, `expert_ffn`, `sparse_layers`, ...), its block's parameters and its `ffn`."""

    def __init__(self, config, tensors: dict, target: Target | None = None, *, name: str = "",
                 eos_ids: tuple[int, ...] = ()) -> None:
        """target: as Decoder's. The routing and the grouping of rows by expert are NumPy's (argsort on
        the host), so a mixture runs on the CPU only; its products take the target's kernel set
        (the experts' too), the router kept float."""
        c = config
        target = target or Target.numpy()
        name = name or f"{c.model_type}-{c.n_layer}x{c.n_embd}-{c.n_expert}e"
        if not target.on_cpu:
            raise cpu_only(f"{name}: a mixture of experts (its routing is NumPy's)", target.device,
                           "use --device cpu")
        check_blocks({"expert FFN": c.expert_ffn}, target.weights, name)
        self.router_target = target.with_(weights="float32")                            # the router stays float
        super().__init__(config, tensors, target, name=name, eos_ids=eos_ids)

    @property
    def experts(self) -> tuple[int, int]:
        """(E, k): experts per sparse layer, and how many each token uses."""
        return self.config.n_expert, self.config.top_k

    def step_weight_bytes(self, n_tokens: int = 1, distinct=None) -> float:
        """The weight bytes a decode step of n_tokens rows reads when its sparse layers' rows chose
        `distinct` experts each (a list per sparse layer; default: uniform routing's expectation,
        `expected_distinct_experts`, exactly k at one token, so a float past it). `step_weight_bytes` below."""
        c = self.config
        if distinct is None:
            n = expected_distinct_experts(c.n_expert, c.top_k, n_tokens)
            distinct = [c.top_k if n_tokens == 1 else n] * len(c.sparse_layers)
        return step_weight_bytes(c, distinct, n_tokens, self.dtype.itemsize, self.weights)

    def matrices(self, head: bool = True, chosen=None) -> list:
        """The products a step multiplies, each once: attention, dense MLPs, the chosen experts of each
        sparse layer, then the LM head (head=False: not it). Not the router, kept float.
        chosen: per sparse layer, the experts the step's rows chose (the sets a `routes()` record
        holds); default the first k of each, a one-token step (every expert has the same shapes and
        bytes, so which k does not change a count); "all": every expert, what memory holds."""
        c = self.config
        if chosen is None:
            chosen = [range(c.top_k)] * len(c.sparse_layers)
        elif isinstance(chosen, str):                                       # "all"
            chosen = [range(c.n_expert)] * len(c.sparse_layers)
        sets = dict(zip(c.sparse_layers, chosen, strict=True))
        out = []
        for i, p in enumerate(self.blocks):
            out += [p["qkv.weight"], p["o_proj.weight"]]
            if i in sets:
                out += [w for e in sorted(set(sets[i])) for w in expert(p, e).values()]
            else:
                out += [p["gate_up.weight"], p["down_proj.weight"]]
        return out + [self.head_w] if head else out


# -- closed forms: what a step reads -----------------------------------------------------------------

def step_weight_bytes(c, distinct, n_tokens: int = 1, itemsize: int = 4, weights: str = "float32"):
    """The weight bytes a step of n_tokens rows reads, from the config alone: every parameter once,
    except the embedding table (its n_tokens rows; a tied table is read whole as the head) and the
    experts no row chose. distinct: per sparse layer (in order), how many distinct experts the step's
    rows chose (k at one token; `expected_distinct_experts` under uniform routing). weights: the
    matrices' format ("float32": itemsize bytes a value; "q8_0" ...: their blocks, router kept float).
    c: a mixture's config (models/moe.py's `MoEConfig`). The meter's count of a step equals it
    (tests/test_moe.py)."""
    b = itemsize
    per = (lambda values: values * b) if weights not in FORMATS else \
        (lambda values: values * FORMATS[weights].block_bytes // 32)      # a matrix of `values` values
    L, d, V, H, Hkv, hd = c.n_layer, c.n_embd, c.vocab_size, c.n_head, c.n_kv_head, c.head_dim
    attention = (per(d * (H + 2 * Hkv) * hd) + per(H * hd * d) + b * (2 * d + 2 * hd * c.qk_norm
                 + (H + 2 * Hkv) * hd * c.qkv_bias + d * c.o_bias))      # q|k|v, o, two norms, q/k norms, biases
    dense = per(3 * d * c.ffn) + b * (2 * c.ffn + d) * c.mlp_bias
    router, one_expert = b * d * c.n_expert, per(c.expert_params())
    distinct = list(distinct)
    if len(distinct) != len(c.sparse_layers):
        raise ValueError(f"distinct: one count per sparse layer ({len(c.sparse_layers)}), got {len(distinct)}")
    blocks = L * attention + (L - len(distinct)) * dense + sum(router + n * one_expert for n in distinct)
    return per(n_tokens * d) + blocks + b * d + per(V * d)                # embedding rows, blocks, norm, head
