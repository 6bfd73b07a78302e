"""Lesson 2: One forward pass. From token ids to a probability for every possible next token.

Run:  python lessons/02_forward.py        (or: minillm learn 2)
"""

from __future__ import annotations

try:
    from minillm.lessons._common import Lesson, bar_chart, fmt_bytes, fmt_flops, fmt_prob, run_lesson, token_text
except ModuleNotFoundError as e:  # run from a checkout in which minillm is not installed
    raise SystemExit(f"{e}: install minillm first (pip install -e . in the checkout), then run this again")

import numpy as np
from rich.markup import escape
from rich.table import Table

import minillm
from minillm.models import gpt2 as model_module
from minillm.models import ops
from minillm.checkpoints.checkpoint import expected_shapes
from minillm.config import PRESETS

TITLE = "One forward pass: ids in, probabilities out"
MINUTES = 6
WHAT_YOU_WILL_SEE = "real array shapes through every layer, the top-5 next tokens, parameters by part"

PROMPT = "ROMEO: But soft, what light through yonder window"


def part_of(name: str) -> str:
    if name.startswith("wte."):
        return "wte (token embedding = LM head)"
    if name.startswith("wpe."):
        return "wpe (position embedding)"
    if ".attn." in name:
        return "attention (c_attn, c_proj)"
    if ".mlp." in name:
        return "MLP (c_fc, c_proj)"
    return "layer norms (ln_1, ln_2, ln_f)"


PARTS = ["wte (token embedding = LM head)", "wpe (position embedding)", "attention (c_attn, c_proj)",
         "MLP (c_fc, c_proj)", "layer norms (ln_1, ln_2, ln_f)"]


def by_part(sizes: dict[str, int]) -> dict[str, int]:
    parts = dict.fromkeys(PARTS, 0)
    for name, n in sizes.items():
        parts[part_of(name)] = parts.get(part_of(name), 0) + n
    return parts


def first_steps(L: Lesson):
    """Section: the opening."""
    model = L.load_model()
    c = model.config
    enc = minillm.tokenizer()
    ids = np.array(enc.encode(PROMPT))
    T, d, H, V = ids.size, c.n_embd, c.n_head, c.vocab_size
    L.say(f"""
        `{escape(repr(model))}`

        GPT-2 turns **T** token ids into **T** rows of **d** numbers (the *residual stream*), passes
        them through **L** identical *blocks*, normalises them once more, and multiplies by the
        embedding table again to get one score (*logit*) per vocabulary entry. Here T = {T} tokens
        of `{escape(PROMPT)}`, d = {d}, L = {c.n_layer}, H = {H} heads, V = {V:,}.

        Below, every shape was read from the array that minillm's own functions returned: the
        lesson calls `ops.embedding`, `ops.layer_norm`, `ops.linear`, `ops.attention`, `ops.gelu`,
        `ops.lm_head` by hand for block 0, then `model.transformer_block` for the others.
    """)
    rows: list[tuple[str, str, str]] = []

    def shape(a) -> str:
        return "[" + ", ".join(str(n) for n in a.shape) + "]"

    p = model.blocks[0]
    x = ops.embedding(model.wte, model.wpe, ids, 0)
    rows.append(("ops.embedding(wte, wpe, ids, 0)", shape(x), "row ids of wte + rows 0..T-1 of wpe"))
    h = ops.layer_norm(x, p["ln_1.weight"], p["ln_1.bias"], c.ln_eps)
    rows.append(("  ops.layer_norm(x, ln_1)", shape(h), "each row: mean 0, variance 1, then scale, shift"))
    qkv = ops.linear(h, p["attn.c_attn.weight"], p["attn.c_attn.bias"])
    rows.append((f"  ops.linear(h, c_attn {shape(p['attn.c_attn.weight'])})", shape(qkv), "queries, keys, values side by side"))
    q, k, v = model_module.split_heads(qkv, H)
    rows.append(("  split_heads(qkv, H) → q, k, v", shape(q), f"{H} heads of {d // H} numbers each"))
    a = ops.attention(q, k, v)
    rows.append(("  ops.attention(q, k, v)", shape(a), "each position mixes the values of positions ≤ it"))
    merged = model_module.merge_heads(a)
    rows.append(("  merge_heads(a)", shape(merged), "heads side by side again"))
    att = ops.linear(merged, p["attn.c_proj.weight"], p["attn.c_proj.bias"])
    rows.append((f"  ops.linear(·, attn.c_proj {shape(p['attn.c_proj.weight'])})", shape(att), ""))
    x = ops.add(x, att)
    rows.append(("  x = ops.add(x, ·)", shape(x), "residual: add the result to the stream"))
    h = ops.layer_norm(x, p["ln_2.weight"], p["ln_2.bias"], c.ln_eps)
    rows.append(("  ops.layer_norm(x, ln_2)", shape(h), ""))
    up = ops.linear(h, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"])
    rows.append((f"  ops.linear(h, c_fc {shape(p['mlp.c_fc.weight'])})", shape(up), "MLP: 4× wider"))
    g = ops.gelu(up)
    rows.append(("  ops.gelu(·)", shape(g), "tanh-GELU, element by element"))
    down = ops.linear(g, p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])
    rows.append((f"  ops.linear(·, mlp.c_proj {shape(p['mlp.c_proj.weight'])})", shape(down), "back to width d"))
    x = ops.add(x, down)
    rows.append(("  x = ops.add(x, ·)", shape(x), "end of block 0"))
    for layer in range(1, c.n_layer):
        x = model_module.transformer_block(x, model.blocks[layer], c.n_head, c.ln_eps,
                                           lambda q, k, v: ops.attention(q, k, v))   # no cache: attend in place
    if c.n_layer > 1:
        rows.append((f"model.transformer_block × {c.n_layer - 1}", shape(x), f"blocks 1..{c.n_layer - 1}, same shapes"))
    x = ops.layer_norm(x, model.params["ln_f.weight"], model.params["ln_f.bias"], c.ln_eps)
    rows.append(("ops.layer_norm(x, ln_f)", shape(x), "final norm"))
    logits = ops.lm_head(x, model.wte)
    rows.append(("ops.lm_head(x, wte)  # x @ wte.T", shape(logits), "a score for every id, at every position"))

    t = Table(header_style="bold")
    t.add_column("call")
    t.add_column("shape", justify="right", style="cyan", no_wrap=True)
    t.add_column("what", style="dim")
    for call, s, what in rows:
        t.add_row(escape(call), s, what)
    L.show(f"[bold]Shapes through {escape(model.name)}, T = {T}[/]", t)
    L.claim(logits.shape == (T, V), f"the logits are [T, V] = [{T}, {V:,}]: one row of scores per position")
    reference = model.forward(ids)
    L.claim(np.allclose(logits, reference, rtol=1e-5, atol=1e-5),
            "calling the ops by hand gives the same logits as model.forward(ids) "
            f"(largest difference {np.abs(logits - reference).max():.1e})")
    L.say("""
        Two things to notice. **Attention is the only place positions talk to each other**; every
        other operation works on each row alone. And the **last** row of the logits is the one that
        predicts the next token: row i predicts token i + 1 (training uses all of them at once).
    """)
    return T, V, c, d, enc, ids, logits, model


def the_next_token_distribution(L: Lesson, V, enc, logits):
    """Section: The next-token distribution."""
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
        The model does not output a token, it outputs a **distribution**. A *sampler* picks one:
        `minillm.sample(logits, temperature=0)` takes the most likely (greedy);
        `minillm.sample(logits, temperature=0.8, top_k=5, rng=...)` draws among the top 5. Eight
        draws: {" ".join(f"`{token_text(enc, t)}`" for t in draws)}.
    """)
    if probs[top[0]] < 10.0 / V:
        L.note(f"this model's top probability is only {probs[top[0]]:.4%} (uniform would be {1 / V:.4%}): "
               "random weights know nothing. A trained model puts most of the mass on a few tokens.")


def where_the_parameters_are(L: Lesson, T, V, c, d, ids, model):
    """Section: Where the parameters are."""
    L.section("Where the parameters are")
    small = PRESETS["124m"]
    preset_sizes = {name: int(np.prod(s)) for name, s in expected_shapes(small).items()}
    mine = by_part({name: int(a.size) for name, a in model.params.items()})
    theirs = by_part(preset_sizes)
    total_small = sum(theirs.values())
    t = Table(header_style="bold")
    t.add_column("part")
    t.add_column("this model", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    t.add_column("GPT-2 small", justify="right", no_wrap=True)
    t.add_column("float32", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    for part in theirs:
        t.add_row(part, f"{mine[part]:,}", f"{mine[part] / model.n_params():.1%}",
                  f"{theirs[part]:,}", fmt_bytes(4 * theirs[part]), f"{theirs[part] / total_small:.1%}")
    t.add_row("[bold]total[/]", f"{model.n_params():,}", "", f"{total_small:,}", fmt_bytes(4 * total_small), "")
    L.show(t)
    L.show(bar_chart("GPT-2 small, bytes by part (float32):",
                     [(part, 4 * n, fmt_bytes(4 * n)) for part, n in theirs.items()], style="blue"))
    share = theirs["wte (token embedding = LM head)"] / total_small
    L.claim(sum(mine.values()) == model.n_params() and total_small == small.n_params(),
            f"the loaded model's arrays hold exactly its n_params() = {model.n_params():,} numbers, and GPT-2 "
            f"small's checkpoint shapes add up to its config's count, {total_small:,} (nothing allocated)")
    L.claim(0.28 < share < 0.36, f"the tied token embedding wte is about a third of GPT-2 small: {share:.1%}")
    L.say("""
        The LM head has **no weights of its own**: GPT-2 multiplies by `wte` transposed
        (`ops.lm_head(x, wte)` is `x @ wte.T`). So `wte` is read twice per pass: a few rows for the
        embedding, and **all** of it for the logits. Remember this in lesson 6: for GPT-2 small the
        LM head alone is about a third of the bytes every generated token has to read.
    """)

    with minillm.Meter() as m:
        model.forward(ids)
    r = m.steps[0]
    weights_used = 12 * c.n_layer * d * d + V * d  # matrix weights multiplied: four per block, plus the LM head
    L.claim(r.flops["matmul"] == 2 * T * weights_used,
            f"the matrix products of this pass did 2 FLOPs per weight per token: 2 × {T} × {weights_used:,} = "
            f"{fmt_flops(r.flops['matmul'])} (counted by minillm.Meter)")
    L.takeaway(f"""
        One forward pass over {T} tokens: {fmt_flops(r.total_flops)} and {fmt_bytes(r.total_bytes)} of memory
        traffic, {r.total_flops / r.total_bytes:.2g} FLOPs per byte. The shapes never depend on the text,
        only on T: the cost of a pass is set by **how many tokens** go through it. The next lessons are
        about what that means when you generate text one token at a time.
    """)
    L.try_it(f"""
        `minillm learn 2 --model random-124m --no-pause` runs the same walk at GPT-2
        small's real width: d = 768, 12 heads of 64, MLP of 3,072, logits [T, 50257]. Or change
        `PROMPT` and watch the top-5 change (with a trained model): {L.copy_hint(__file__, "forward")}
    """)


def lesson(L: Lesson) -> None:
    T, V, c, d, enc, ids, logits, model = first_steps(L)
    L.pause()
    the_next_token_distribution(L, V, enc, logits)
    L.pause()
    where_the_parameters_are(L, T, V, c, d, ids, model)


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv, number=2, title=TITLE, minutes=MINUTES, what=WHAT_YOU_WILL_SEE,
                      prog="python lessons/02_forward.py")


if __name__ == "__main__":
    raise SystemExit(main())
