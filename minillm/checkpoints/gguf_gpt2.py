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
from ..models.gpt2 import GPT2
from ..models.quant import QuantMatrix

FILE_TYPES = {"float32": 0, "q4_0": 2, "q4_1": 3, "q8_0": 7}    # llama.cpp's LlamaFileType


def gguf_name(name: str) -> str:
    """GGUF's name of a GPT-2 checkpoint tensor, from GPT-2's row of the family table (the reader uses
    the same names the other way)."""
    from .families import family
    return family("gpt2").names.to_gguf(name)


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
            if name.endswith(GPT2.MATRICES):
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
