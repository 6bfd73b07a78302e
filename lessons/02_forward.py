"""Lesson 2: One forward pass. From token ids to a probability for every possible next token.

Run:  python lessons/02_forward.py        (or: minillm learn 2)
"""

from __future__ import annotations

import numpy as np
from rich.markup import escape
from rich.table import Table

import minillm
from minillm.models.gpt2 import GPT2_SIZES
from minillm.lessons._common import Lesson, bar_chart, fmt_bytes, fmt_flops, fmt_prob, run_lesson, token_text
from minillm.models import ops

TITLE = "One forward pass: ids in, probabilities out"
MINUTES = 4  # 841 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "real array shapes through every layer, the top-5 next tokens, parameters by part"
TIMED = False   # counts only: no busy-machine note

PROMPT = "ROMEO: But soft, what light through yonder window"


def lesson(L: Lesson) -> None:
    model = L.load_model()
    enc = minillm.tokenizer()
    ids = np.array(enc.encode(PROMPT))
    logits = shapes_through_the_model(L, model, ids)
    L.pause()
    the_next_token_distribution(L, model, enc, logits)
    L.pause()
    where_the_parameters_are(L, model, ids)


# -- the block, written out over minillm.models.ops (the model's own block is the same calls) ---------


def split_heads(qkv: np.ndarray, n_head: int):
    """[T, 3d] -> q, k, v, each [H, T, hd]."""
    T, three_d = qkv.shape
    qkv = qkv.reshape(T, 3, n_head, three_d // (3 * n_head)).transpose(1, 2, 0, 3)   # [3, H, T, hd]
    return qkv[0], qkv[1], qkv[2]


def merge_heads(a: np.ndarray) -> np.ndarray:
    """[H, T, hd] -> [T, d]: the heads side by side again."""
    H, T, hd = a.shape
    return a.transpose(1, 0, 2).reshape(T, H * hd)


def block(x: np.ndarray, p: dict, n_head: int, eps: float, rows: list | None = None) -> np.ndarray:
    """One GPT-2 block: x + attention(ln_1(x)), then + mlp(ln_2(x)). [T, d] -> [T, d].
    With `rows`, each call's name, output shape and meaning is appended to it."""
    def note(call, a, what=""):
        if rows is not None:
            rows.append((call, "[" + ", ".join(str(n) for n in a.shape) + "]", what))
        return a

    def shape(name):
        return "[" + ", ".join(str(n) for n in p[name].shape) + "]"

    h = note("  ops.layer_norm(x, ln_1)", ops.layer_norm(x, p["ln_1.weight"], p["ln_1.bias"], eps),
             "each row: mean 0, variance 1")
    qkv = note(f"  ops.linear(h, c_attn {shape('attn.c_attn.weight')})",
               ops.linear(h, p["attn.c_attn.weight"], p["attn.c_attn.bias"]), "q, k, v side by side")
    q, k, v = split_heads(qkv, n_head)
    note("  split_heads(qkv, H) → q, k, v", q, f"{n_head} heads of {q.shape[-1]} numbers each")
    a = note("  ops.attention(q, k, v)", ops.attention(q, k, v), "mixes values of positions ≤ i")
    merged = note("  merge_heads(a)", merge_heads(a))
    att = note(f"  ops.linear(·, attn.c_proj {shape('attn.c_proj.weight')})",
               ops.linear(merged, p["attn.c_proj.weight"], p["attn.c_proj.bias"]))
    x = note("  x = ops.add(x, ·)", ops.add(x, att), "the residual")
    h = note("  ops.layer_norm(x, ln_2)", ops.layer_norm(x, p["ln_2.weight"], p["ln_2.bias"], eps))
    up = note(f"  ops.linear(h, c_fc {shape('mlp.c_fc.weight')})",
              ops.linear(h, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"]), "MLP: 4× wider")
    g = note("  ops.gelu(·)", ops.gelu(up), "element-wise")
    down = note(f"  ops.linear(·, mlp.c_proj {shape('mlp.c_proj.weight')})",
                ops.linear(g, p["mlp.c_proj.weight"], p["mlp.c_proj.bias"]), "back to width d")
    return note("  x = ops.add(x, ·)", ops.add(x, down))


def block_params(model, layer: int) -> dict:
    prefix = f"h.{layer}."
    return {k[len(prefix):]: v for k, v in model.params.items() if k.startswith(prefix)}


def part_of(name: str) -> str:
    if name.startswith("wte."):
        return "wte (= LM head)"
    if name.startswith("wpe."):
        return "wpe (positions)"
    if ".attn." in name:
        return "attention"
    if ".mlp." in name:
        return "MLP"
    return "layer norms"


def gpt2_sizes(c) -> dict[str, int]:
    """The number of values in each of a GPT-2 config's tensors, from its shapes (nothing allocated)."""
    d, f = c.n_embd, 4 * c.n_embd
    sizes = {"wte.weight": c.vocab_size * d, "wpe.weight": c.n_ctx * d, "ln_f.weight": d, "ln_f.bias": d}
    for i in range(c.n_layer):
        for name, n in (("ln_1.weight", d), ("ln_1.bias", d), ("attn.c_attn.weight", d * 3 * d),
                        ("attn.c_attn.bias", 3 * d), ("attn.c_proj.weight", d * d), ("attn.c_proj.bias", d),
                        ("ln_2.weight", d), ("ln_2.bias", d), ("mlp.c_fc.weight", d * f), ("mlp.c_fc.bias", f),
                        ("mlp.c_proj.weight", f * d), ("mlp.c_proj.bias", d)):
            sizes[f"h.{i}.{name}"] = n
    return sizes


PARTS = ["wte (= LM head)", "wpe (positions)", "attention", "MLP", "layer norms"]


def by_part(sizes: dict[str, int]) -> dict[str, int]:
    parts = dict.fromkeys(PARTS, 0)
    for name, n in sizes.items():
        parts[part_of(name)] = parts.get(part_of(name), 0) + n
    return parts


def shapes_through_the_model(L: Lesson, model, ids) -> np.ndarray:
    c = model.config
    T, d, H, V = ids.size, c.n_embd, c.n_head, c.vocab_size
    L.say(f"""
        `{escape(repr(model))}`

        GPT-2 turns **T** token ids into **T** rows of **d** numbers (the *residual stream*), passes
        them through **L** *blocks*, normalises, and multiplies by the embedding table again: a
        score (*logit*) per vocabulary entry. Here T = {T} tokens, d = {d},
        L = {c.n_layer}, H = {H} heads, V = {V:,}.

        In attention each position makes a **query** (what it looks for), a **key** (what it offers)
        and a **value** (what it passes on to a matching query).
    """)
    L.pause()
    L.say("""
        Each shape below is an array minillm's `ops` returned, called by hand (`block`, in this file).
    """)
    wte, wpe = model.params["wte.weight"], model.params["wpe.weight"]
    rows: list[tuple[str, str, str]] = []
    x = ops.embedding(wte, wpe, ids, 0)
    rows.append(("ops.embedding(wte, wpe, ids, 0)", f"[{T}, {d}]", "wte[ids] + wpe[0..T-1]"))
    x = block(x, block_params(model, 0), H, c.ln_eps, rows)
    for layer in range(1, c.n_layer):
        x = block(x, block_params(model, layer), H, c.ln_eps)
    if c.n_layer > 1:
        rows.append((f"block(x, ...) × {c.n_layer - 1}", f"[{T}, {d}]", ""))
    x = ops.layer_norm(x, model.params["ln_f.weight"], model.params["ln_f.bias"], c.ln_eps)
    rows.append(("ops.layer_norm(x, ln_f)", f"[{T}, {d}]", ""))
    logits = ops.lm_head(x, wte)
    rows.append(("ops.lm_head(x, wte)  # x @ wte.T", "[" + ", ".join(map(str, logits.shape)) + "]",
                 "a score per id, per position"))
    t = Table(header_style="bold")
    t.add_column("call")
    t.add_column("shape", justify="right", style="cyan", no_wrap=True)
    t.add_column("what", style="dim")
    for call, s_, what in rows:
        t.add_row(escape(call), s_, escape(what))
    L.show(f"[bold]Shapes through {escape(model.name)}, T = {T}[/]", t)
    reference = model.forward(ids)
    L.claim(logits.shape == reference.shape == (T, V) and np.allclose(logits, reference, rtol=1e-5, atol=1e-5),
            f"calling the ops by hand gives model.forward(ids)'s logits, [T, V] = [{T}, {V:,}] "
            f"(largest difference {np.abs(logits - reference).max():.1e})")
    L.say("""
        **Attention is the only place positions talk to each other**; all else works row by row.
        Row i of the logits predicts token i + 1: the **last** row, the next token.
    """)
    return logits


def the_next_token_distribution(L: Lesson, model, enc, logits) -> None:
    L.section("The next-token distribution")
    probs = ops.softmax(logits[-1:].astype(np.float64))[0]
    top = np.argsort(-probs)[:5]
    L.show(bar_chart(f"After {escape(repr(PROMPT))}, the model's top 5 next tokens:",
                     [(f"{token_text(enc, int(i))!s} ({int(i)})", float(probs[i]), fmt_prob(probs[i])) for i in top],
                     style="green"))
    L.claim(abs(probs.sum() - 1.0) < 1e-9, "softmax turns the logits into probabilities that sum to 1")
    greedy = minillm.sample(logits[-1], temperature=0.0)
    L.claim(greedy == int(top[0]), f"greedy decoding picks the most likely token, {token_text(enc, greedy)!r}")
    rng = np.random.default_rng(0)
    draws = [minillm.sample(logits[-1], temperature=0.8, top_k=5, rng=rng) for _ in range(8)]
    L.say(f"""
        A *sampler* picks from this **distribution**: greedy (`temperature=0`) the top token;
        `minillm.sample(logits, temperature=0.8, top_k=5, rng=...)` drew
        {" ".join(f"`{token_text(enc, t)}`" for t in draws)}.
    """)
    V = model.config.vocab_size
    if probs[top[0]] < 10.0 / V:
        L.note(f"this model's top probability is only {probs[top[0]]:.4%} (uniform would be {1 / V:.4%}): "
               "random weights know nothing. A trained model puts most of the mass on a few tokens.")


def where_the_parameters_are(L: Lesson, model, ids) -> None:
    L.section("Where the parameters are")
    c = model.config
    T, d, V = ids.size, c.n_embd, c.vocab_size
    small = GPT2_SIZES["124m"]
    mine = by_part({name: int(a.size) for name, a in model.params.items()})
    theirs = by_part(gpt2_sizes(small))
    total_small = sum(theirs.values())
    t = Table(header_style="bold")
    t.add_column("part")
    t.add_column("this model", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    t.add_column("GPT-2 small", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    for part in theirs:
        t.add_row(part, f"{mine[part]:,}", f"{mine[part] / model.n_params():.1%}",
                  f"{theirs[part]:,}", f"{theirs[part] / total_small:.1%}")
    t.add_row("[bold]total[/]", f"{model.n_params():,}", "", f"{total_small:,}", "")
    L.show(t)
    share = theirs[PARTS[0]] / total_small
    L.claim(sum(mine.values()) == model.n_params() == c.n_params(),
            f"the loaded arrays hold {sum(mine.values()):,} numbers: the model's n_params() and its config's "
            "closed form (V·d + n_ctx·d + L·(12·d² + 13·d) + 2·d) agree")
    L.say(f"""
        The LM head has **no weights of its own**: `ops.lm_head(x, wte)` is `x @ wte.T`, so every
        pass reads **all** of `wte`: for GPT-2 small (its shapes), {share:.1%} of the weight bytes
        each generated token reads (lesson 6).
    """)

    with minillm.Meter() as m:
        model.forward(ids)
    r = m.steps[0]
    weights_used = 12 * c.n_layer * d * d + V * d  # matrix weights multiplied: four per block, plus the LM head
    L.claim(r.flops["matmul"] == 2 * T * weights_used,
            f"the matrix products of this pass did 2 FLOPs per weight per token: 2 × {T} × {weights_used:,} = "
            f"{fmt_flops(r.flops['matmul'])} (counted by minillm.Meter)")
    L.takeaway(f"""
        One pass over {T} tokens: {fmt_flops(r.total_flops)}, {fmt_bytes(r.total_bytes)} moved,
        {r.total_flops / r.total_bytes:.2g} FLOPs per byte. The shapes depend only on T:
        **how many tokens** go through sets a pass's cost.
    """)
    L.try_it(f"""
        `minillm learn 2 --model random-124m --no-pause`: the same walk at GPT-2 small's width
        (d = 768, 12 heads of 64). Or change `PROMPT` and watch the top 5:
        {L.copy_hint(__file__, "forward")}
    """)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
