"""Lesson 1: Tokens. A model never sees letters: text becomes a list of integer ids first.

Run:  python lessons/01_tokens.py        (or: minillm learn 1)
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

import minillm
from minillm.lessons._common import Lesson, run_lesson, token_text

TITLE = "Tokens: text becomes numbers"
MINUTES = 4  # 752 words printed (a fast run) at 200 a minute
WHAT_YOU_WILL_SEE = "a sentence as GPT-2 token ids, the 50,257-id vocabulary, <|endoftext|>"
TIMED = False   # nothing here is timed: no busy-machine note

# Edit these and run the lesson again.
SENTENCE = "ROMEO: But soft, what light through yonder window breaks?"
TRICKY = "Tokens: 3.14159, naïve, 東京, antidisestablishmentarianism."


def lesson(L: Lesson) -> None:
    enc = minillm.tokenizer()
    n_tokens = opening(L, enc)
    L.pause()
    where_tokenization_gets_lumpy(L, enc)
    L.pause()
    the_vocabulary(L, enc)
    L.pause()
    endoftext(L, enc, n_tokens)
    L.say(f"""
        The course introduces about {len(GLOSSARY)} words; `minillm learn glossary` lists each with
        its lesson.
    """)


def token_table(enc, ids: list[int], with_ids: bool = True) -> Table:
    """One row a token: its id and text (with_ids), or its text and UTF-8 bytes."""
    t = Table(header_style="bold")
    if with_ids:
        t.add_column("id", justify="right")
    t.add_column("token text", style="cyan")
    if not with_ids:
        t.add_column("bytes", justify="right")
    for token in ids:
        text = token_text(enc, token)
        t.add_row(*((str(token), text) if with_ids else (text, str(len(enc.decode_single_token_bytes(token))))))
    return t


def opening(L: Lesson, enc) -> int:
    L.say("""
        A language model is a function from **integers to integers**. A *tokenizer* cuts text
        into pieces from a fixed list, the **vocabulary**, and replaces each by its place in that
        list: its **token id**. The model predicts the next id.

        GPT-2's *byte-pair encoding* (BPE) starts from single bytes and keeps gluing the pair most
        frequent in the training text: common words become one token, rare words several. minillm
        builds it with `tiktoken` from the table it ships, so nothing is downloaded:

        ```python
        import minillm
        enc = minillm.tokenizer()
        ids = enc.encode("ROMEO: But soft, ...")
        ```
    """)
    L.pause()
    ids = enc.encode(SENTENCE)
    L.show(f"[bold]{escape(repr(SENTENCE))} → {len(ids)} tokens[/]", token_table(enc, ids))
    L.say("""
        `␣` marks a space, which belongs to the *following* word: `␣soft` is one token, `soft`
        another.
    """)
    bare, spaced = enc.encode("soft"), enc.encode(" soft")
    L.show(f"enc.encode('soft') = {bare}    enc.encode(' soft') = {spaced}")
    L.fact(f"'soft' → {bare} and ' soft' → {spaced}: {'different tokens' if bare != spaced else 'the same token'}")
    L.fact("decode(encode(text)) " + ("gave back exactly the text" if enc.decode(ids) == SENTENCE else
                                      "did not give back the text"))
    L.fact(f"{len(SENTENCE)} characters → {len(ids)} tokens ({len(SENTENCE) / len(ids):.1f} characters per token)")
    return len(ids)


def where_tokenization_gets_lumpy(L: Lesson, enc) -> None:
    L.section("Where tokenization gets lumpy")
    tricky = enc.encode(TRICKY)
    L.show(f"[bold]{escape(repr(TRICKY))}[/]\n[bold]{len(TRICKY)} characters → {len(tricky)} tokens[/]",
           token_table(enc, tricky, with_ids=False))
    L.say("""
        Numbers split into arbitrary chunks, a rare word costs several tokens, and non-ASCII
        characters can split *inside* their UTF-8 bytes (`\\x..`). Costs are counted in tokens.
    """)
    L.fact("decoding all the tokens " + ("gave back even the split characters intact" if enc.decode(tricky) == TRICKY
                                         else "did not give back the text"))


def the_vocabulary(L: Lesson, enc) -> None:
    L.section("The vocabulary")
    n_vocab = enc.n_vocab
    first = [token_text(enc, i) for i in (0, 1, 2, 64, 65, 255)]
    L.say(f"""
        GPT-2's vocabulary has **{n_vocab:,}** ids: 256 single bytes (so *any* text can be encoded),
        {n_vocab - 257:,} merged pieces learned from web text, and one special token. Ids 0, 1, 2,
        64, 65, 255 are {", ".join(f"`{t}`" for t in first)}; the last merge, {n_vocab - 2:,}, is
        `{token_text(enc, n_vocab - 2)}`.
    """)
    model = L.load_model()
    L.say(f"""
        The model holds one row per id: `{model.name}`'s embedding table `wte` has shape
        **{tuple(model.wte.shape)}**. Looking a token up reads one row; lesson 2 follows it.
    """)
    L.fact(f"the tokenizer has {n_vocab:,} ids, the model {escape(model.name)} {model.config.vocab_size:,} rows"
           + ("" if n_vocab == model.config.vocab_size else ": they differ"))


def endoftext(L: Lesson, enc, n_tokens: int) -> None:
    L.section("<|endoftext|>")
    eot = enc.eot_token
    special = enc.encode("<|endoftext|>", allowed_special={"<|endoftext|>"})
    as_text = enc.encode("<|endoftext|>", disallowed_special=())
    L.say(f"""
        The special token `<|endoftext|>` (id **{eot}**) separates documents in training;
        generating it means "finished". So typed text cannot fake it, `tiktoken` encodes it only
        when allowed:

        - allowed: `enc.encode("<|endoftext|>", allowed_special={{"<|endoftext|>"}})` → `{special}`
        - as plain text: `enc.encode("<|endoftext|>", disallowed_special=())` → `{as_text}`
          ({len(as_text)} ordinary tokens: {" ".join(f"`{token_text(enc, t)}`" for t in as_text)})
    """)

    L.takeaway(f"""
        Everything is counted in tokens: {n_tokens} for our sentence. The **prompt**'s ids are
        processed at once (prefill, lesson 3); each **generated** token comes one at a time
        (decode, lessons 4 to 6).
    """)
    hello = enc.encode(" hello world")
    L.try_it(f"""
        {L.copy_hint(__file__, "tokens")} Change `SENTENCE` (a line of code, another language):
        English runs around 4 characters per token, other scripts up to a token a byte.
        `python -c "import minillm; print(minillm.tokenizer().encode(' hello world'))"` prints
        `{hello}`.
    """)


# The words the later lessons use, each with the lesson that introduces it (shown at the end of lesson 1,
# and `minillm learn 1` again any time). tests/test_course5.py checks that every term a lesson sets in
# bold is here (or is emphasis, not a term) and that each is in its lesson.
GLOSSARY = (
    ("token id", "a text piece's number in the vocabulary", 1),
    ("vocabulary", "the pieces a tokenizer cuts text into", 1),
    ("prefill", "the prompt's pass: all its tokens at once", 3),
    ("arithmetic intensity", "FLOPs per byte moved: FLOP/byte", 3),
    ("compute-bound", "the FLOPs' term of the roofline is larger", 3),
    ("decode", "one new token a step, reading every weight", 4),
    ("KV cache", "earlier positions' keys and values, kept", 5),
    ("LM head", "the last product: a score for every id", 6),
    ("bandwidth", "bytes a second from memory (GB/s)", 6),
    ("memory-bound", "the bytes' term of the roofline is larger", 6),
    ("ridge", "peak FLOP/s ÷ bandwidth: the turning point", 7),
    ("roofline", "time ≥ max(bytes ÷ bandwidth, FLOPs ÷ peak)", 7),
    ("view of memory", "bytes counted unfused, or ideally fused", 7),
    ("MBU and MFU", "bandwidth, FLOP/s used ÷ the chip's peak", 7),
    ("tensor parallelism", "every matrix split over several GPUs", 7),
    ("all-reduce", "GPUs summing their partial results", 7),
    ("pipeline parallelism", "the layers split into stages over GPUs", 7),
    ("weight-only (W4A16)", "small weights, 16-bit math", 7),
    ("W8A8", "8-bit weights and activations, 8-bit math", 7),
    ("batch, B", "sequences sharing one step: one weight read", 8),
    ("critical batch, B*", "the B at which decode turns compute-bound", 8),
    ("batch-invariant kernel set", "every sum in one order, whatever the batch", 8),
    ("roofline clock", "steps timed by their roofline price", 9),
    ("TTFT", "time to first token: arrival to first token", 9),
    ("TBT", "time between tokens: one gap of one request", 9),
    ("TPOT", "time per output token: a request's mean gap", 9),
    ("p50, p95, p99", "what 50%, 95%, 99% of samples stay within", 9),
    ("SLO", "a latency target, e.g. TTFT ≤ 0.5 s", 9),
    ("goodput", "requests a second meeting every target", 9),
    ("continuous batching", "sequences join and leave at every step", 9),
    ("paged cache", "KV memory in blocks, given out as it grows", 9),
    ("preemption", "a sequence's blocks taken back, rerun later", 9),
    ("multi-LoRA", "many adapters beside one base, one batch", 9),
    ("structured output", "logits masked to what a grammar allows", 9),
    ("prefix caching", "reusing the KV of a prompt start seen before", 10),
    ("prefill-bound, decode-bound", "which phase a workload's time goes to", 10),
    ("KV offloading", "prefixes kept in host memory or on SSD", 10),
    ("cache-aware routing", "a request sent where its prefix is cached", 10),
    ("speculative decoding", "a draft guesses k tokens, one step checks", 11),
    ("acceptance length, τ", "tokens kept per check of the model", 11),
    ("EAGLE, multi-token prediction", "draft heads on the model's own states", 11),
    ("GQA, grouped-query attention", "query heads share KV heads", 12),
    ("MLA, latent attention", "one latent vector cached per layer, token", 12),
    ("sliding windows", "local layers keep only the last w tokens", 12),
    ("attention sinks", "the first tokens kept beside a window", 12),
    ("eviction", "dropping tokens that drew little attention", 12),
    ("KIVI", "2-bit KV: keys per channel, values per token", 12),
    ("cross-layer sharing", "a layer reusing an earlier layer's K and V", 12),
    ("chunked prefill", "a long prompt split over steps (a budget)", 13),
    ("disaggregation", "prefill and decode on separate engines", 13),
    ("capacity", "the highest rate that meets the targets", 13),
    ("input, cached input, output", "the three prices of a token", 13),
    ("quantization", "weights or KV in fewer bits: Q8_0, Q4_0", 14),
    ("K-quants", "GGUF blocks in super-blocks of 256", 14),
    ("FP8, MXFP4, NVFP4", "8- and 4-bit floats with block scales", 14),
    ("fused kernel", "one loop that widens and multiplies", 20),
    ("W4A32, W4A8", "4-bit weights; float32 or int8 activations", 20),
    ("integer dot product (VNNI)", "8-bit multiply-adds in one instruction", 20),
    ("mixture of experts, MoE", "E MLPs a layer, k run per token", 15),
    ("total, active parameters", "what memory holds; what a token uses", 15),
    ("shared expert", "an expert every token runs", 15),
    ("expert parallelism", "each GPU holds some of the experts", 15),
    ("all-to-all", "every GPU sending tokens to every other", 15),
    ("as released", "the format a model's makers publish", 15),
    ("online softmax", "softmax kept as a running max and sum", 16),
    ("FlashAttention", "attention in tiles, no score matrix stored", 16),
    ("Flash-Decoding", "one sequence's keys split over the cores", 16),
    ("kernels, kernel launch", "GPU programs; the host starting one", 17),
    ("CUDA graph", "a step's kernels recorded, replayed at once", 17),
    ("fusion", "fewer, larger kernels", 17),
    ("absorbed, decompressed", "MLA decode in the latent; K, V rebuilt", 18),
    ("data-parallel attention", "each GPU attends for its own sequences", 18),
    ("sparse attention (DSA)", "attention over the top-scored cached tokens", 18),
    ("lightning indexer", "DSA's small FP8 scorer of every cached token", 18),
    ("linear attention", "a layer that folds the past into one state", 19),
    ("state of fixed size", "what such a layer keeps, at any context", 19),
    ("delta rule", "the state moved toward each new key's value", 19),
    ("chunked form", "a prompt's state updates as chunk products", 19),
    ("recurrent form", "one token's read, update and write", 19),
    ("hybrid", "linear layers beside a few full ones", 19),
    ("Gated DeltaNet", "the delta rule with a decay, exp(g), a token", 19),
    ("sliding window, global", "a layer sees the last w positions; or all", 19),
    ("sink", "a learned logit a head in each softmax", 19),
    ("additive linear attention", "S += k·vᵀ: each write piled on the others", 19),
)


def glossary_table() -> Table:
    """The words the lessons introduce, each with the lesson that does: `minillm learn glossary` (kept
    out of lesson 1's run, where the learner has met none of them yet)."""
    t = Table(title="Words you will meet (#: the lesson that introduces it)", title_justify="left",
              header_style="bold", box=None, pad_edge=False, show_header=True)
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("word", style="bold", no_wrap=True)
    t.add_column("what it means", no_wrap=True)
    for word, meaning, n in GLOSSARY:
        t.add_row(str(n), word, meaning)
    return t


def main(argv: list[str] | None = None) -> int:
    return run_lesson(lesson, argv)


if __name__ == "__main__":
    raise SystemExit(main())
