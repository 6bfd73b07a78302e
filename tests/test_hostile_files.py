"""Issue 33, item 1: every limit before the work it bounds. Hostile GGUF files and Hugging Face
folders, built here (a seed per test), each loaded in a forked child under a memory limit (its
address space may grow by LIMIT_BYTES at most) and a time limit: one `MiniLLMError` line naming the
field at fault, or a correct model, never a traceback, a hang or gigabytes.

The GGUF files are written byte by byte (`write_gguf`), so a test can say exactly what a lying
header claims: 2^61 items, two tensors at one offset, Q8_0 declared on F32 bytes."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import struct
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

import minillm
from minillm.checkpoints.safetensors import read_safetensors
from minillm.errors import MiniLLMError
from minillm.model_tokenizer import bytes_to_unicode

resource = pytest.importorskip("resource")     # the memory limit (POSIX)
FIXTURE = Path(__file__).parent / "fixtures" / "llama-tiny"
LIMIT_BYTES = 768 << 20          # what a load may add to the address space (a 10^7 KV cache: 4.8 GB)
LIMIT_SECONDS = 30               # a busy 2-core machine; a correct load takes well under a second

# -- running a load contained ------------------------------------------------------------------------

STATUS = Path("/proc/self/status")     # where the memory limit is measured from (elsewhere: time only)
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="loads run in a forked child")


def contained(fn, seconds: float = LIMIT_SECONDS, extra: int = LIMIT_BYTES):
    """fn() in a forked child whose address space may grow by `extra` bytes, killed after `seconds`.
    -> ("ok", what fn returned) | ("error", class name, message) | ("crash", traceback) | ("timeout",)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                                         # the child
        os.close(r)
        try:
            if STATUS.is_file():                        # Linux: the limit is relative to what the child holds
                vm = next(int(line.split()[1]) * 1024 for line in open(STATUS) if line.startswith("VmSize"))
                resource.setrlimit(resource.RLIMIT_AS, (vm + extra, vm + extra))
            out = ["ok", fn()]
        except MiniLLMError as e:
            out = ["error", type(e).__name__, str(e)]
        except BaseException:                                            # noqa: BLE001 (what the test reports)
            out = ["crash", traceback.format_exc()[-3000:]]
        os.write(w, json.dumps(out, default=str).encode()[:60000])
        os._exit(0)
    os.close(w)
    t0 = time.monotonic()
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() - t0 > seconds:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return ("timeout", seconds)
        time.sleep(0.02)
    with os.fdopen(r, "rb") as f:
        raw = f.read()
    return tuple(json.loads(raw)) if raw else ("crash", "the child died without a word")


def one_error(outcome, *words):
    """A MiniLLMError of one line naming each of `words`."""
    assert outcome[0] == "error", outcome
    _, kind, message = outcome
    assert "\n" not in message and len(message) < 600, message
    for word in words:
        assert word in message, (word, message)


def load_and_run(path):
    """Load, then prefill 3 tokens and decode 2: what a chat does first (the KV cache, RoPE)."""
    def run():
        model = minillm.load(path)
        logits, cache = model.prefill(np.array([1, 2, 3]))
        for _ in range(2):
            logits = model.decode_step(int(np.argmax(logits)), cache)
        assert np.isfinite(logits).all()
        return {"n_ctx": model.config.n_ctx, "cache": cache.k.nbytes + cache.v.nbytes}
    return run


# -- GGUF files, byte by byte -------------------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
        U64: "<Q", I64: "<q", F64: "<d"}
GGML = {"F32": (0, 1, 4), "Q8_0": (8, 32, 34)}       # type id, block, bytes per block


class GGUF:
    """A GGUF file's parts, to mutate before `write`: metadata {key: (type, value)} (an array is
    (ARR, (item type, [items]))), tensors [(name, dims fastest first, ggml type name, bytes)], and
    offsets to override ({tensor name: offset}). `fields` after `write`: where each header value lies."""

    def __init__(self, metadata: dict, tensors: list) -> None:
        self.metadata, self.tensors, self.offsets, self.fields = dict(metadata), list(tensors), {}, []
        self.again = []             # (key, (type, value)) written once more after the metadata

    def write(self, path: Path, align: int = 32) -> Path:
        out = bytearray(b"GGUF")

        def put(fmt, value, what):
            self.fields.append((len(out), fmt, what))
            out.extend(struct.pack(fmt, value))

        def put_str(s, what):
            b = s.encode()
            put("<Q", len(b), what + " length")
            out.extend(b)

        def put_value(kind, value, what):
            if kind == STR:
                put_str(value, what)
            elif kind == ARR:
                item, items = value
                put("<I", item, what + " item type")
                put("<Q", len(items), what + " count")
                for v in items:
                    put_value(item, v, what + " item") if item in (STR, ARR) else out.extend(struct.pack(_FMT[item], v))
            else:
                put(_FMT[kind], value, what)

        put("<I", 3, "version")
        put("<Q", len(self.tensors), "tensor count")
        put("<Q", len(self.metadata) + len(self.again), "key count")
        for key, (kind, value) in [*self.metadata.items(), *self.again]:
            put_str(key, key)
            put("<I", kind, key + " type")
            put_value(kind, value, key)
        blob, at = bytearray(), 0
        for name, dims, kind, data in self.tensors:
            put_str(name, name)
            put("<I", len(dims), name + " n_dims")
            for i, n in enumerate(dims):
                put("<Q", n, f"{name} dim {i}")
            put("<I", GGML[kind][0], name + " type")
            put("<Q", self.offsets.get(name, at), name + " offset")
            blob += data + b"\0" * (-len(data) % align)
            at = len(blob)
        out += b"\0" * (-len(out) % align) + blob
        path.write_bytes(bytes(out))
        return path


def tokenizer_metadata(n_vocab: int) -> dict:
    """A byte-level BPE vocabulary of n_vocab ids: the 256 bytes, one merge, control tokens after."""
    chars = list(bytes_to_unicode().values())
    tokens = chars + ["Ġt"] + [f"<|s{i}|>" for i in range(n_vocab - len(chars) - 1)]
    return {"tokenizer.ggml.model": (STR, "gpt2"), "tokenizer.ggml.pre": (STR, "gpt2"),
            "tokenizer.ggml.tokens": (ARR, (STR, tokens)),
            "tokenizer.ggml.token_type": (ARR, (I32, [1] * (len(chars) + 1) + [3] * (n_vocab - len(chars) - 1))),
            "tokenizer.ggml.merges": (ARR, (STR, ["Ġ t"])),
            "tokenizer.ggml.eos_token_id": (U32, 257), "tokenizer.ggml.bos_token_id": (U32, 258)}


LLAMA_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}


def llama_gguf() -> GGUF:
    """The tiny Llama fixture (2 layers, 4 heads / 2 KV heads of 16, vocab 512) as an F32 GGUF."""
    cfg = json.loads((FIXTURE / "config.json").read_text())
    md = {"general.architecture": (STR, "llama"), "llama.block_count": (U32, 2),
          "llama.context_length": (U32, 128), "llama.embedding_length": (U32, 64),
          "llama.feed_forward_length": (U32, 160), "llama.attention.head_count": (U32, 4),
          "llama.attention.head_count_kv": (U32, 2), "llama.attention.key_length": (U32, 16),
          "llama.rope.freq_base": (F32, cfg["rope_theta"]), "llama.attention.layer_norm_rms_epsilon": (F32, 1e-5),
          **tokenizer_metadata(cfg["vocab_size"])}
    tensors = []
    for name, t in read_safetensors(FIXTURE / "model.safetensors")[0].items():
        name = name.removeprefix("model.")
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            base, kind = rest.rsplit(".", 1)
            gname = f"blk.{i}.{LLAMA_NAMES[base]}.{kind}"
        else:
            gname = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]
        a = np.ascontiguousarray(t, dtype="<f4")
        tensors.append((gname, list(a.shape[::-1]), "F32", a.tobytes()))
    return GGUF(md, tensors)


def gpt2_gguf(rng: np.random.Generator, n_layer: int = 2, d: int = 32, n_ctx: int = 64, vocab: int = 300) -> GGUF:
    """A tiny random GPT-2 as an F32 GGUF, with GPT-2's names (`minillm quantize`'s layout)."""
    from minillm.checkpoints.gguf_gpt2 import gguf_name
    from minillm.models.gpt2 import GPT2Config
    from minillm.models.gpt2 import GPT2, iter_expected
    c = GPT2Config(n_layer=n_layer, n_head=2, n_embd=d, n_ctx=n_ctx, vocab_size=vocab)
    md = {"general.architecture": (STR, "gpt2"), "gpt2.block_count": (U32, n_layer),
          "gpt2.context_length": (U32, n_ctx), "gpt2.embedding_length": (U32, d),
          "gpt2.feed_forward_length": (U32, 4 * d), "gpt2.attention.head_count": (U32, 2),
          "gpt2.attention.layer_norm_epsilon": (F32, 1e-5)}
    tensors = []
    for name, shape in iter_expected(c):
        a = (0.02 * rng.standard_normal(shape)).astype("<f4")
        a = a.T.copy() if name.endswith(GPT2.MATRICES) else a            # GGUF keeps [out, in] rows
        tensors.append((gguf_name(name), list(a.shape[::-1]), "F32", a.tobytes()))
    return GGUF(md, tensors)


def with_md(g: GGUF, **changes) -> GGUF:
    """A copy with metadata changed: key__with__dots=(type, value), or None to remove the key."""
    out = GGUF(g.metadata, g.tensors)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            out.metadata.pop(key, None)
        else:
            out.metadata[key] = value
    return out


def retype(g: GGUF, index: int, kind: str) -> GGUF:
    """Tensor `index` declared `kind` over the same bytes (its row rounded to whole blocks)."""
    out = GGUF(g.metadata, g.tensors)
    name, dims, _, data = out.tensors[index]
    out.tensors[index] = (name, dims, kind, data)
    return out


# (name, builder(rng) -> GGUF or a path-writing function, words the one error names); None: loads and runs
def _twice(g: GGUF) -> GGUF:
    g.again.append(("llama.context_length", (U32, 64)))
    return g


def _same_offset(rng):
    g = llama_gguf()
    second = g.tensors[rng.integers(1, len(g.tensors))][0]
    g.offsets[second] = 0                                     # two tensors at one offset
    return g


def _lying_array(rng):
    """A 2^61-item token_type array in a valid file: the count patched, as a hostile file would."""
    g = llama_gguf()
    return g, "tokenizer.ggml.token_type count", 1 << 61


GGUF_CASES = [
    ("token_type claims 2^61 items", _lying_array, ["runs past the end of the file"]),
    ("llama block_count 2^32-1", lambda rng: with_md(llama_gguf(), llama__block_count=(U32, 2**32 - 1)),
     ["llama.block_count = 4,294,967,295", "2 blocks"]),
    ("llama block_count 2^63", lambda rng: with_md(llama_gguf(), llama__block_count=(U64, 2**63)),
     ["llama.block_count", "must be an integer from 1 to"]),
    ("llama block_count 2^63-1", lambda rng: with_md(llama_gguf(), llama__block_count=(I64, 2**63 - 1)),
     ["llama.block_count", "2 blocks"]),
    ("llama block_count as text", lambda rng: with_md(llama_gguf(), llama__block_count=(STR, "2")),
     ["llama.block_count = '2'"]),
    ("context_length 10^7", lambda rng: with_md(llama_gguf(), llama__context_length=(U32, 10**7)), None),
    ("context_length 10^8", lambda rng: with_md(llama_gguf(), llama__context_length=(U32, 10**8)),
     ["llama.context_length = 100000000", "16,777,216"]),
    ("context_length 2^32-1", lambda rng: with_md(llama_gguf(), llama__context_length=(U32, 2**32 - 1)),
     ["llama.context_length", "16,777,216"]),
    ("context_length 2^63", lambda rng: with_md(llama_gguf(), llama__context_length=(U64, 2**63)),
     ["llama.context_length", "16,777,216"]),
    ("eos id as text", lambda rng: with_md(llama_gguf(), tokenizer__ggml__eos_token_id=(STR, "</s>")),
     ["tokenizer.ggml.eos_token_id = '</s>'", "0 to 511"]),
    ("eos id negative", lambda rng: with_md(llama_gguf(), tokenizer__ggml__eos_token_id=(I32, -1)),
     ["tokenizer.ggml.eos_token_id = -1"]),
    ("eos id past the vocabulary", lambda rng: with_md(llama_gguf(), tokenizer__ggml__eos_token_id=(U32, 512)),
     ["tokenizer.ggml.eos_token_id = 512"]),
    ("bos id as text", lambda rng: with_md(llama_gguf(), tokenizer__ggml__bos_token_id=(STR, "<s>")),
     ["tokenizer.ggml.bos_token_id = '<s>'"]),
    ("bos id negative", lambda rng: with_md(llama_gguf(), tokenizer__ggml__bos_token_id=(I64, -5)),
     ["tokenizer.ggml.bos_token_id = -5"]),
    ("bos id 2^64-1", lambda rng: with_md(llama_gguf(), tokenizer__ggml__bos_token_id=(U64, 2**64 - 1)),
     ["tokenizer.ggml.bos_token_id"]),
    ("head_count 0", lambda rng: with_md(llama_gguf(), llama__attention__head_count=(U32, 0),
                                         llama__attention__key_length=None),
     ["llama.attention.head_count = 0"]),
    ("vocab_size 2^40", lambda rng: with_md(llama_gguf(), llama__vocab_size=(U64, 2**40)),
     ["embed_tokens.weight", "1099511627776"]),
    ("two tensors at one offset", _same_offset, ["overlaps"]),
    ("Q8_0 declared on F32 bytes", lambda rng: retype(llama_gguf(), int(rng.integers(1, 10)), "Q8_0"),
     ["Q8_0", "does not match its bytes"]),
    ("the last tensor Q8_0 on F32 bytes", lambda rng: retype(llama_gguf(), -1, "Q8_0"),
     ["follow the last tensor", "does not match its bytes"]),
    ("a key twice", lambda rng: _twice(llama_gguf()), ["llama.context_length appears twice"]),
    ("architecture a number", lambda rng: with_md(llama_gguf(), general__architecture=(U32, 7)),
     ["GGUF architecture 7 is not a name"]),
    ("chat_template a number", lambda rng: with_md(llama_gguf(), tokenizer__chat_template=(U32, 7)),
     ["tokenizer.chat_template"]),
    ("gpt2 block_count 10^9", lambda rng: with_md(gpt2_gguf(rng), gpt2__block_count=(U32, 10**9)),
     ["gpt2.block_count = 1,000,000,000", "2 blocks"]),
    ("gpt2 embedding_length disagrees", lambda rng: with_md(gpt2_gguf(rng), gpt2__embedding_length=(U32, 16)),
     ["the metadata disagrees with the tensors"]),
    ("gpt2 context_length disagrees", lambda rng: with_md(gpt2_gguf(rng), gpt2__context_length=(U32, 10**7)),
     ["position_embd.weight", "the metadata disagrees with the tensors"]),
    ("gpt2 head_count 0", lambda rng: with_md(gpt2_gguf(rng), gpt2__attention__head_count=(U32, 0)),
     ["gpt2.attention.head_count = 0"]),
    ("gpt2 block_count 1 of 2", lambda rng: with_md(gpt2_gguf(rng), gpt2__block_count=(U32, 1)),
     ["gpt2.block_count = 1", "2 blocks"]),
    ("gpt2 as written", lambda rng: gpt2_gguf(rng), None),
    ("llama as written", lambda rng: llama_gguf(), None),
]


@pytest.mark.parametrize("name, build, words", GGUF_CASES, ids=[c[0] for c in GGUF_CASES])
def test_hostile_gguf_is_one_line_or_a_model_within_limits(tmp_path, name, build, words):
    rng = np.random.default_rng([c[0] for c in GGUF_CASES].index(name))
    made = build(rng)
    path = tmp_path / "hostile.gguf"
    if isinstance(made, tuple):                              # (GGUF, header field, value): patch the bytes
        g, field, value = made
        g.write(path)
        data = bytearray(path.read_bytes())
        at, fmt = next((at, fmt) for at, fmt, what in g.fields if what == field)
        data[at:at + struct.calcsize(fmt)] = struct.pack(fmt, value)
        path.write_bytes(bytes(data))
    else:
        made.write(path)
    t0 = time.monotonic()
    outcome = contained(load_and_run(path))
    assert time.monotonic() - t0 < LIMIT_SECONDS
    if words is None:
        assert outcome[0] == "ok", outcome
        assert outcome[1]["cache"] < 64 << 20, outcome     # a 10^7 context: the cache grows as it fills
    else:
        one_error(outcome, "hostile.gguf", *words)


# -- Hugging Face folders -----------------------------------------------------------------------------

CHATML = ("{% for m in messages %}{{'<|s1|>' + m['role'] + '\\n' + m['content'] + '<|s0|>\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|s1|>assistant\\n' }}{% endif %}")


def hf_folder(tmp_path: Path) -> Path:
    """The tiny Llama fixture with a tokenizer.json (the GGUF tests' 512-token vocabulary) and a
    tokenizer_config.json: a whole chat model's folder, to mutate."""
    from minillm.model_tokenizer import from_gguf_metadata
    d = tmp_path / "llama"
    d.mkdir()
    for name in ("config.json", "generation_config.json"):
        shutil.copy(FIXTURE / name, d / name)
    os.symlink(FIXTURE / "model.safetensors", d / "model.safetensors")
    md = {k: v[1][1] if v[0] == ARR else v[1] for k, v in tokenizer_metadata(512).items()}
    (d / "tokenizer.json").write_text(from_gguf_metadata(md, "t.gguf").tok.to_str())
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|s0|>", "chat_template": CHATML}))
    return d


def edit(d: Path, name: str, change) -> None:
    """Rewrite JSON file `name` of folder d: change(value) -> the new value (None for a key removes it)."""
    value = json.loads((d / name).read_text())
    (d / name).write_text(json.dumps(change(value)))


def merge(**fields):
    return lambda cfg: {k: v for k, v in {**cfg, **fields}.items() if v is not None}


def _shard_index(d: Path, rng) -> None:
    name = "".join(rng.choice(list("abcdef")) for _ in range(5000)) + ".safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"embed_tokens.weight": name}}))


def _big(d: Path, name: str, size: int) -> None:
    """A file of `size` bytes that starts as JSON would (sparse: the cap must refuse it unread)."""
    with open(d / name, "wb") as f:
        f.write(b'{"model": {"type": "BPE", "vocab": {"' + b"a" * 64)
        f.truncate(size)


HF_CASES = [
    ("num_attention_heads 0 without head_dim",
     lambda d, rng: edit(d, "config.json", merge(num_attention_heads=0, head_dim=None)),
     ["config.json", "num_attention_heads = 0"]),
    ("num_attention_heads as text", lambda d, rng: edit(d, "config.json", merge(num_attention_heads="4")),
     ["num_attention_heads = '4'"]),
    ("num_hidden_layers 10^9", lambda d, rng: edit(d, "config.json", merge(num_hidden_layers=10**9)),
     ["num_hidden_layers = 1,000,000,000", "2 blocks"]),
    ("num_hidden_layers 2^64", lambda d, rng: edit(d, "config.json", merge(num_hidden_layers=2**64)),
     ["num_hidden_layers", "must be an integer from 1 to"]),
    ("max_position_embeddings 10^9", lambda d, rng: edit(d, "config.json", merge(max_position_embeddings=10**9)),
     ["max_position_embeddings = 1000000000", "16,777,216"]),
    ("max_position_embeddings 2^63", lambda d, rng: edit(d, "config.json", merge(max_position_embeddings=2**63)),
     ["max_position_embeddings", "16,777,216"]),
    ("max_position_embeddings 10^7", lambda d, rng: edit(d, "config.json", merge(max_position_embeddings=10**7)),
     None),
    ("config.json a list", lambda d, rng: (d / "config.json").write_text("[1, 2]"),
     ["config.json: expected a JSON object, found list"]),
    ("tokenizer_config.json a list", lambda d, rng: (d / "tokenizer_config.json").write_text('["x"]'),
     ["tokenizer_config.json: expected a JSON object, found list"]),
    ("tokenizer_config eos_token a list", lambda d, rng: edit(d, "tokenizer_config.json", merge(eos_token=["x"])),
     ["tokenizer_config.json: eos_token"]),
    ("generation_config eos ['x']", lambda d, rng: edit(d, "generation_config.json", merge(eos_token_id=["x"])),
     ["generation_config.json: eos_token_id = ['x']", "0 to 511"]),
    ("generation_config eos -1", lambda d, rng: edit(d, "generation_config.json", merge(eos_token_id=-1)),
     ["generation_config.json: eos_token_id = -1"]),
    ("generation_config eos past the vocabulary",
     lambda d, rng: edit(d, "generation_config.json", merge(eos_token_id=[2, 10**6])),
     ["generation_config.json: eos_token_id = [2, 1000000]"]),
    ("generation_config eos true", lambda d, rng: edit(d, "generation_config.json", merge(eos_token_id=True)),
     ["generation_config.json: eos_token_id = True"]),
    ("a 5,000-character shard name", _shard_index, ["model.safetensors.index.json", "shard name", "5,012 bytes"]),
    ("a 40 MB tokenizer.json", lambda d, rng: _big(d, "tokenizer.json", 40 << 20),
     ["tokenizer.json: 41,943,040 bytes, over the 16,777,216-byte cap"]),
    ("a 20 MB config.json", lambda d, rng: _big(d, "config.json", 20 << 20),
     ["config.json: 20,971,520 bytes, over the 16,777,216-byte cap"]),
    ("a 2 MB chat_template.jinja", lambda d, rng: (edit(d, "tokenizer_config.json", merge(chat_template=None)),
                                                   _big(d, "chat_template.jinja", 2 << 20)),
     ["chat_template.jinja: 2,097,152 bytes, over the 1,048,576-byte cap"]),
    ("tokenizer.json not UTF-8", lambda d, rng: (d / "tokenizer.json").write_bytes(b'{"model": "\xff\xfe"}'),
     ["tokenizer.json: not UTF-8"]),
    ("as copied", lambda d, rng: None, None),
]


@pytest.mark.parametrize("name, mutate, words", HF_CASES, ids=[c[0] for c in HF_CASES])
def test_hostile_folder_is_one_line_or_a_model_within_limits(tmp_path, name, mutate, words):
    rng = random.Random([c[0] for c in HF_CASES].index(name))
    d = hf_folder(tmp_path)
    mutate(d, rng)
    t0 = time.monotonic()
    outcome = contained(load_and_run(d))
    assert time.monotonic() - t0 < LIMIT_SECONDS
    if words is None:
        assert outcome[0] == "ok", outcome
        assert outcome[1]["cache"] < 64 << 20, outcome
    else:
        one_error(outcome, *words)


def test_a_bad_bos_never_reaches_render_time(tmp_path):
    """A bos id that is no token was refused only when a chat was rendered: `serve` answered 500 to
    every chat. Now the load refuses it, and a good file renders its template with the bos text."""
    from minillm.chat import render
    path = with_md(llama_gguf(), tokenizer__chat_template=(STR, "{{ bos_token }}{{ messages[0]['content'] }}"),
                   tokenizer__ggml__bos_token_id=(I32, -3)).write(tmp_path / "bad.gguf")
    one_error(contained(lambda: minillm.tokenizer(path).bos_id), "bos_token_id = -3")
    good = with_md(llama_gguf(), tokenizer__chat_template=(STR, "{{ bos_token }}{{ messages[0]['content'] }}"),
                   tokenizer__ggml__bos_token_id=(U32, 300)).write(tmp_path / "good.gguf")
    text = render([{"role": "user", "content": "hi"}], minillm.tokenizer(good))[0]
    assert text == "<|s43|>hi"                                   # id 300: the 44th control token


# -- every header field of a valid file, mutated ------------------------------------------------------

INTERESTING = [0, 1, 2, 3, 7, 8, 9, 12, 31, 32, 33, 64, 255, 256, 4096, 10**7, 2**31 - 1, 2**31, 2**32 - 1,
               2**32, 2**61, 2**63 - 1, 2**63, 2**64 - 1]


@pytest.fixture(scope="module")
def valid_llama(tmp_path_factory):
    g = llama_gguf()
    path = g.write(tmp_path_factory.mktemp("valid") / "valid.gguf")
    return path, path.read_bytes(), g.fields


@seed(33)
@settings(max_examples=60, deadline=None, database=None)
@given(data=st.data())
def test_every_header_field_mutated_is_one_line_or_a_model(valid_llama, tmp_path_factory, data):
    """A header field of a valid file (a count, a length, a type tag, a value, a dimension, an offset)
    set to an interesting value: one clear line or a working model, within the limits, always."""
    path, raw, fields = valid_llama
    what = data.draw(st.sampled_from(sorted({w for _, _, w in fields})), label="field")   # each field alike
    at, fmt, what = data.draw(st.sampled_from([f for f in fields if f[2] == what]), label="occurrence")
    size = struct.calcsize(fmt)
    value = data.draw(st.sampled_from(INTERESTING).map(lambda v: v % (1 << (8 * size))), label="value")
    mutated = bytearray(raw)
    mutated[at:at + size] = value.to_bytes(size, "little") if fmt[-1] not in "fd?" else bytes([value % 256]) * size
    bad = tmp_path_factory.mktemp("mutated") / "mutated.gguf"
    bad.write_bytes(bytes(mutated))
    outcome = contained(load_and_run(bad), seconds=LIMIT_SECONDS)
    assert outcome[0] in ("ok", "error"), (what, value, outcome)
    if outcome[0] == "error":
        one_error(outcome, "mutated.gguf")


# -- what the long context costs: nothing until it is used ------------------------------------------

def mapped_bytes(a: np.ndarray) -> tuple[int, int]:
    """(resident bytes, of which in huge pages of any kind) of the mapping that holds array `a`, from
    /proc/self/smaps."""
    addr = a.__array_interface__["data"][0]
    rss, huge = None, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and ":" not in head[0]:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = lo <= addr < hi
        elif inside and head[0] == "Rss:":
            rss = int(head[1]) * 1024
        elif inside and head[0] in ("AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:"):
            huge += int(head[1]) * 1024
    return rss, huge


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's per-mapping page counts")
@pytest.mark.parametrize("paged", [False, True])
def test_a_new_cache_takes_memory_only_where_positions_are_written(paged):
    """A cache allocated for the whole context is resident only where positions are written, a 4 KiB
    page at a time: one position in each of GPT-2-124M's 12 layers × 12 heads adds a page each, not
    the 2 MiB huge pages NumPy's zeros of that size ask Linux for (then the first writes fault in and
    zero every 2 MiB page of k and v, 72 MiB for this one position, where the system gives huge
    pages; cache/contiguous.py's untouched_zeros)."""
    from minillm.cache.contiguous import KVCache
    from minillm.cache.paged import PagedKVPool
    from minillm.models.gpt2 import GPT2_SIZES
    c = GPT2_SIZES["124m"]
    if paged:
        pool = PagedKVPool(c, num_blocks=c.n_ctx // 16, block_size=16)
        k, v = pool.k, pool.v                                   # [L, Hkv, blocks, 16, hd]
        k[:, :, 0, 0] = 1.0
        v[:, :, 0, 0] = 1.0
    else:
        cache = KVCache(c)
        cache.reserve(1)
        one = np.ones((c.n_kv_head, 1, c.head_dim), np.float32)
        for layer in range(c.n_layer):
            cache.write(layer, 0, one, one)
        k, v = cache.k, cache.v
    assert k.nbytes >= 32 << 20                                  # big enough for NumPy to ask for huge pages
    for a in (k, v):
        rss, huge = mapped_bytes(a)
        assert huge == 0 and rss <= 2 * c.n_layer * c.n_kv_head * 4096, (rss, huge)
    ones = c.n_layer * c.n_kv_head * c.head_dim           # the ones written, zeros elsewhere (reading all
    assert k.sum() == v.sum() == ones                      # of it maps all of it: so this comes last)


@pytest.mark.parametrize("seed_, kv_dtype", [(0, None), (1, "int8")])
def test_a_cache_that_grows_computes_what_a_preallocated_one_does(monkeypatch, seed_, kv_dtype):
    """Past PREALLOCATE positions the contiguous cache doubles as it fills: the same logits, bit for
    bit, as a cache allocated whole (here PREALLOCATE is 4, so a 40-token run grows it four times)."""
    from minillm.cache import contiguous
    model = minillm.load(FIXTURE)
    rng = np.random.default_rng(seed_)
    prompt, steps = rng.integers(0, 512, int(rng.integers(2, 9))), int(rng.integers(20, 32))

    def run():
        logits, cache = model.prefill(prompt, contiguous.KVCache(model.config, model.dtype, kv_dtype))
        out = [logits]
        for _ in range(steps):
            out.append(model.decode_step(int(np.argmax(out[-1])), cache))
        return np.stack(out), cache

    whole, big = run()
    monkeypatch.setattr(contiguous, "PREALLOCATE", 4)
    grown, small = run()
    np.testing.assert_array_equal(grown, whole)
    assert big.capacity == model.config.n_ctx and small.capacity < model.config.n_ctx
    assert small.fork().k[:, :, :small.length].tobytes() == small.k[:, :, :small.length].tobytes()
