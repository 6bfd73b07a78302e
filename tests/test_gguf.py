"""GGUF files: a fixture written as GGUF (llama.cpp's q/k row order, F32 and quantized) loads to the
same model; damaged and lying files give one clear error, never a foreign exception or a huge
allocation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.models.quant import QuantMatrix
from minillm.checkpoints.gguf_file import read_gguf, unpermute
from minillm.checkpoints.safetensors import read_safetensors
from minillm.errors import MiniLLMError
from minillm.model_tokenizer import bytes_to_unicode

gguf = pytest.importorskip("gguf")
FIXTURE = Path(__file__).parent / "fixtures" / "llama-tiny"

TO_GGUF = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
           "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def permute(w, n_head):
    """llama.cpp's converter (convert_hf_to_gguf.py): rotate-half rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, qtype: str = "F32", arch: str = "llama", mixed: dict | None = None) -> Path:
    """The tiny Llama fixture as a GGUF, its matrices in `qtype`; `mixed` gives some tensors another
    type, by the end of their GGUF name (e.g. {"attn_v.weight": "Q8_0"}), as llama.cpp's files do."""
    import json
    cfg = json.loads((FIXTURE / "config.json").read_text())
    tensors, _ = read_safetensors(FIXTURE / "model.safetensors")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    chars = list(bytes_to_unicode().values())
    tokens = chars + ["Ġt"] + [f"<|s{i}|>" for i in range(cfg["vocab_size"] - len(chars) - 1)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(chars) + 1) + [3] * (len(tokens) - len(chars) - 1))
    w.add_token_merges(["Ġ t"])
    w.add_eos_token_id(len(chars) + 1)
    for name, t in tensors.items():
        t = np.array(t, dtype=np.float32)
        name = name.removeprefix("model.")
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            base, kind = rest.rsplit(".", 1)
            if base == "self_attn.q_proj" and arch == "llama":
                t = permute(t, cfg["num_attention_heads"])
            if base == "self_attn.k_proj" and arch == "llama":
                t = permute(t, cfg["num_key_value_heads"])
            gname = f"blk.{i}.{TO_GGUF[base]}.{kind}"
        else:
            gname = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]
        kind_q = next((v for k, v in (mixed or {}).items() if gname.endswith(k)), qtype)
        if t.ndim == 2 and kind_q != "F32":
            q = gguf.GGMLQuantizationType[kind_q]
            w.add_tensor(gname, gguf.quants.quantize(t, q), raw_dtype=q)
        else:
            w.add_tensor(gname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "llama-tiny.gguf")


def test_unpermute_undoes_llama_cpps_permutation():
    w = np.arange(4 * 16 * 3, dtype=np.float32).reshape(64, 3)
    np.testing.assert_array_equal(unpermute(permute(w, 4), 4), w)
    assert not np.array_equal(permute(w, 4), w)


def test_f32_gguf_gives_transformers_logits(tiny_gguf):
    model = minillm.load(tiny_gguf)
    e = np.load(FIXTURE / "expected.npz")
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    np.testing.assert_allclose(model.forward(ids), e["logits"], rtol=0, atol=1e-4)
    assert model.config.n_kv_head == 2 and not model.config.tied


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "F16", "BF16"])
def test_quantized_gguf_dequantizes_to_the_quantized_values(tmp_path, qtype):
    """Each matrix loads as gguf's own dequantization of what was stored, rows back in HF order."""
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", qtype)
    model = minillm.load(path)
    _, raw = read_gguf(path)
    q = raw["blk.0.attn_q.weight"]
    assert q.type == qtype
    want = unpermute(gguf.quants.dequantize(q.data, gguf.GGMLQuantizationType[qtype]).reshape(q.shape), 4)
    got = model.blocks[0]["qkv.weight"].a[:, :64].T            # the q rows of the fused [d, (H+2Hkv)·hd]
    np.testing.assert_array_equal(got, want)
    k = raw["blk.1.attn_k.weight"]
    want = unpermute(gguf.quants.dequantize(k.data, gguf.GGMLQuantizationType[qtype]).reshape(k.shape), 2)
    np.testing.assert_array_equal(model.blocks[1]["qkv.weight"].a[:, 64:96].T, want)


def test_gguf_tokenizer_treats_control_tokens_as_single_ids(tiny_gguf):
    tok = minillm.tokenizer(tiny_gguf)
    ids = tok.encode("a<|s3|> t")
    assert ids == [ord("a"), 260, 256]                      # " t" is the one merge
    assert tok.decode(ids) == "a<|s3|> t"
    assert tok.eos_ids[0] == 257


def test_unknown_architecture_and_missing_tensors_are_named(tmp_path):
    bad = write_tiny_gguf(tmp_path / "phi.gguf", arch="phi3")
    with pytest.raises(MiniLLMError, match="GGUF architecture 'phi3' is not supported; minillm runs gpt2, llama"):
        minillm.load(bad)


@settings(max_examples=40)
@given(cut=st.floats(0.0, 0.999), flips=st.lists(st.tuples(st.integers(0, 6000), st.integers(0, 255)),
                                                  max_size=4))
def test_damaged_gguf_is_one_clear_error(tiny_gguf, tmp_path_factory, cut, flips):
    data = bytearray(tiny_gguf.read_bytes())
    data = data[:max(1, int(len(data) * cut))] if cut > 0.001 else data
    for at, value in flips:
        if at < len(data):
            data[at] = value
    path = tmp_path_factory.mktemp("bad") / "bad.gguf"
    path.write_bytes(bytes(data))
    try:
        minillm.load(path)
    except MiniLLMError as e:                  # one line naming the file; anything else fails the test
        assert "\n" not in str(e) and "bad.gguf" in str(e)


def test_lying_counts_are_refused_before_reading(tmp_path):
    path = tmp_path / "lies.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (10**15).to_bytes(8, "little")
                     + (10**15).to_bytes(8, "little") + b"\0" * 64)
    with pytest.raises(MiniLLMError, match="more than its 88 bytes can hold"):
        minillm.load(path)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_native_weights_keep_the_files_blocks_and_compute_what_the_floats_do(tmp_path, qtype):
    """weights="native": the file's blocks kept (bytes well under float32's), the same logits as the
    float32 load of the same file to float32 rounding, and a decode step reads the quantized bytes."""
    path = write_tiny_gguf(tmp_path / f"tiny-{qtype}.gguf", qtype)
    native, floats = minillm.load(path, weights="native"), minillm.load(path)
    assert native.weights == qtype.lower() and native.float_matrices == 0
    assert native.nbytes() < floats.nbytes() / 3
    ids = np.arange(12) % native.config.vocab_size
    np.testing.assert_allclose(native.forward(ids), floats.forward(ids), rtol=0, atol=1e-4)
    _, cache = native.prefill(ids[:6])
    with minillm.Meter() as m:
        native.decode_step(3, cache)
    mats = sum(p[k].nbytes for p in native.blocks for k in native.MATRICES) + native.head_w.nbytes
    assert m.steps[0].bytes["weights"] >= mats


@pytest.mark.parametrize("other", ["Q8_0", "Q5_0"])
def test_a_file_that_mixes_formats_in_one_product_loads_that_product_in_floats(tmp_path, other):
    """llama.cpp keeps attn_v in another type in many files: the fused q|k|v cannot be one quantized
    matrix, so it is widened (and the model says how many products are float), the rest stay Q4_0."""
    path = write_tiny_gguf(tmp_path / f"tiny-mixed-{other}.gguf", "Q4_0", mixed={"attn_v.weight": other})
    native, floats = minillm.load(path, weights="native"), minillm.load(path)
    n = native.config.n_layer
    assert native.weights == "q4_0" and native.float_matrices == n
    assert all(not isinstance(p["qkv.weight"], QuantMatrix) for p in native.blocks)
    assert all(isinstance(p["down_proj.weight"], QuantMatrix) for p in native.blocks)
    assert f"{n} of {4 * n} products in float32" in repr(native)
    ids = np.arange(12) % native.config.vocab_size
    np.testing.assert_allclose(native.forward(ids), floats.forward(ids), rtol=0, atol=1e-4)
