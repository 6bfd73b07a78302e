"""Write a GPT-2 as GGUF (llama.cpp's file format) with the `gguf` package, llama.cpp's own Python
library: the architecture's metadata under the names llama.cpp's GPT-2 loader reads, GPT-2's
byte-level BPE tokenizer (tokens and merges, derived from the bundled merge ranks), and the tensors
under GGUF's names, the matrices as the model holds them (Q8_0 / Q4_0 / Q4_1 blocks, or float32).

GGUF keeps a matrix as rows of its contiguous dimension: a linear layer's weight is its [out, in]
rows (ne0 = in), which is how `QuantMatrix` holds it already; a float [in, out] checkpoint matrix
is transposed on the way out. Norms, biases and the position embedding are F32, as llama.cpp's
converter keeps 1-D tensors (and minillm keeps wpe).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import MiniLLMError
from ..model_tokenizer import bytes_to_unicode
from ..models.quant import QuantMatrix

# GGUF's names for GPT-2's tensors (gguf.constants: MODEL_ARCH.GPT2)
BLOCK_NAMES = {
    "ln_1.weight": "attn_norm.weight", "ln_1.bias": "attn_norm.bias",
    "attn.c_attn.weight": "attn_qkv.weight", "attn.c_attn.bias": "attn_qkv.bias",
    "attn.c_proj.weight": "attn_output.weight", "attn.c_proj.bias": "attn_output.bias",
    "ln_2.weight": "ffn_norm.weight", "ln_2.bias": "ffn_norm.bias",
    "mlp.c_fc.weight": "ffn_up.weight", "mlp.c_fc.bias": "ffn_up.bias",
    "mlp.c_proj.weight": "ffn_down.weight", "mlp.c_proj.bias": "ffn_down.bias",
}
TOP_NAMES = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
             "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"}
FILE_TYPES = {"float32": 0, "q4_0": 2, "q4_1": 3, "q8_0": 7}    # llama.cpp's LlamaFileType


def gguf_name(name: str) -> str:
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    _, i, rest = name.split(".", 2)
    return f"blk.{i}.{BLOCK_NAMES[rest]}"


def gpt2_vocab(enc) -> tuple[list[str], list[str]]:
    """(tokens, merges) of GPT-2's tokenizer in the byte-level form GGUF and Hugging Face store.
    Each merge is found from the ranks alone: a token's bytes, merged by BPE with only the ranks
    below its own, end as exactly two parts, the pair whose merge made it. enc: GPT-2's tiktoken
    encoding (`minillm.tokenizer()`)."""
    ranks = enc._mergeable_ranks
    chars = bytes_to_unicode()
    show = lambda b: "".join(chars[x] for x in b)                         # noqa: E731
    tokens = [""] * enc.n_vocab
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        tokens[rank] = show(tok)
        if len(tok) < 2:
            continue
        parts = [bytes([b]) for b in tok]
        while len(parts) > 2:
            best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], 1 << 30))
            if ranks.get(parts[best] + parts[best + 1], 1 << 30) >= rank:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) != 2:
            raise MiniLLMError(f"token {rank} of the GPT-2 ranks is no merge of two tokens; the ranks file is damaged")
        merges.append(f"{show(parts[0])} {show(parts[1])}")
    tokens[50256] = "<|endoftext|>"
    return tokens, merges


def write_gguf(model, path: Path, fmt: str, enc) -> None:
    """The model (its params as they are in memory: quantized or float32) and GPT-2's tokenizer `enc`
    as a GGUF file at path,
    written to a temporary name and renamed, so no half-written file is ever left."""
    import os
    import gguf

    c = model.config
    if c.vocab_size != 50257:
        raise MiniLLMError(f"{model.name}: vocabulary of {c.vocab_size} ids; a GGUF needs its tokenizer, and "
                           "minillm writes GPT-2's (50,257 ids) only")
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    w = gguf.GGUFWriter(str(tmp), "gpt2")
    w.add_name(model.name)
    w.add_file_type(FILE_TYPES[fmt])
    w.add_context_length(c.n_ctx)
    w.add_embedding_length(c.n_embd)
    w.add_feed_forward_length(4 * c.n_embd)
    w.add_block_count(c.n_layer)
    w.add_head_count(c.n_head)
    w.add_layer_norm_eps(c.ln_eps)
    tokens, merges = gpt2_vocab(enc)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if i == 50256 else gguf.TokenType.NORMAL for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_bos_token_id(50256)
    w.add_eos_token_id(50256)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for name, p in model.params.items():
        if isinstance(p, QuantMatrix):
            w.add_tensor(gguf_name(name), p.to_gguf_blocks(),
                         raw_dtype=gguf.GGMLQuantizationType(p.fmt.ggml_type))
        else:
            a = np.asarray(p, dtype=np.float32)
            if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) and a.ndim == 2:
                a = a.T                                              # [in, out] -> GGUF's [out, in] rows
            w.add_tensor(gguf_name(name), np.ascontiguousarray(a))
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file(progress=False)
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise


def read_gguf(path: Path, weights: str = "native"):
    """A GPT-2 GGUF file (as `minillm quantize` writes it, or llama.cpp's converter) -> (config,
    params). weights "native": Q8_0 / Q4_0 / Q4_1 matrices stay as the file has them
    (QuantMatrix); float ones, and every other choice, load as float32 (requantized by the caller)."""
    import gguf

    from ..config import GPT2Config
    from ..models.quant import FORMATS

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError, KeyError, IndexError) as e:
        raise MiniLLMError(f"{path}: not a readable GGUF file ({e})") from None
    fields = reader.fields

    def field(key, default=None):
        f = fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    if arch != "gpt2":
        raise MiniLLMError(f"{path}: GGUF architecture {arch!r}; this reader takes gpt2 files")
    tensors = {t.name: t for t in reader.tensors}
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise MiniLLMError(f"{path}: no token_embd.weight tensor")
    config = GPT2Config(n_layer=int(field("gpt2.block_count")), n_head=int(field("gpt2.attention.head_count")),
                        n_embd=int(field("gpt2.embedding_length")), n_ctx=int(field("gpt2.context_length")),
                        vocab_size=int(emb.shape[1]),
                        ln_eps=float(field("gpt2.attention.layer_norm_epsilon", 1e-5)))
    by_type = {f.ggml_type: f.name for f in FORMATS.values()}
    wanted = {gguf_name(n): n for n in _names(config)}
    params = {}
    for gname, name in wanted.items():
        t = tensors.get(gname)
        if t is None:
            raise MiniLLMError(f"{path}: tensor {gname} is missing; the file is not a whole GPT-2")
        rows = tuple(int(s) for s in reversed(t.shape))            # GGUF's ne reversed: [rows, row length]
        kind = int(t.tensor_type)
        matrix = name == "wte.weight" or name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        if kind in by_type and weights == "native" and matrix:
            params[name] = QuantMatrix.from_gguf_blocks(np.asarray(t.data), by_type[kind], rows)
            continue
        try:
            a = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(rows)
        except (NotImplementedError, ValueError) as e:
            raise MiniLLMError(f"{path}: tensor {gname} of type {t.tensor_type.name}: cannot read it ({e})") from None
        if matrix and name != "wte.weight":
            a = np.ascontiguousarray(a.T)                            # GGUF's [out, in] rows -> [in, out]
        params[name] = a
    return config, params


def _names(config) -> list[str]:
    from .checkpoint import iter_expected
    return [n for n, _ in iter_expected(config)]
