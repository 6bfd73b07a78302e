"""Qwen3.5 fixtures with transformers (run in a throwaway environment with torch and transformers 5.25;
minillm's tests never import them).

    python benchmarks/reference/qwen35_fixtures.py exact tests/fixtures/w5/qwen35-tiny
    python benchmarks/reference/qwen35_fixtures.py make tests/fixtures/w5/qwen35-bf16

`exact FOLDER`: writes FOLDER/expected_float64.npz, the logits of `input_ids + greedy_ids` (from
FOLDER/expected.npz) computed by transformers' own Qwen3.5 code with every float32 cast in it
promoted to float64 (its linear layers, norms and rotary angles compute in float32 even in a
float64 model). This model amplifies float32 rounding: transformers' float32 logits, rerun here,
sit 4e-4 from these and 5.6e-4 from the shipped expected.npz, so float64 against float64 is the
test that can be tight.

`make FOLDER`: a new checkpoint, different from qwen35-tiny in layer pattern, convolution width,
head counts and rotary fraction, with random norms, A_log and dt_bias (so a missing term changes
the logits), saved by `save_pretrained` in bfloat16; then expected.npz (input_ids, greedy_ids, and
the float32 logits of transformers from the files as stored, greedy by argmax of a full forward)
and expected_float64.npz as above.
"""
import importlib.util
import inspect
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers.models.qwen3_5 import modeling_qwen3_5


def float64_module():
    """transformers' modeling_qwen3_5 with its float32 casts promoted to float64."""
    src = inspect.getsource(modeling_qwen3_5)
    src = src.replace("torch.float32", "torch.float64").replace(".float()", ".double()")
    src = src.replace("dtype=torch.float)", "dtype=torch.float64)")
    path = Path(tempfile.mkdtemp()) / "modeling_qwen3_5_float64.py"
    path.write_text(src)
    name = modeling_qwen3_5.__package__ + ".modeling_qwen3_5_float64"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def exact(folder):
    from safetensors.torch import load_file
    e = np.load(f"{folder}/expected.npz")
    cfg = transformers.Qwen3_5TextConfig(**json.load(open(f"{folder}/config.json")))
    cfg._attn_implementation = "eager"
    model = float64_module().Qwen3_5ForCausalLM(cfg).double().eval()
    state = {k: v.double() for k, v in load_file(f"{folder}/model.safetensors").items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    if missing:
        model.tie_weights()
    ids = np.concatenate([e["input_ids"], e["greedy_ids"]])
    with torch.no_grad():
        logits = model(torch.tensor(ids)[None]).logits[0].numpy()
    np.savez(f"{folder}/expected_float64.npz", logits=logits)
    print(f"{folder}: float64 logits [{len(ids)}, {logits.shape[1]}], {np.abs(logits - e['logits']).max():.2e} "
          "from the float32 ones")


def make(folder, seed=7, prompt=11, new=24):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=500, hidden_size=48, intermediate_size=96, num_hidden_layers=5,
        layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention",
                     "linear_attention"],
        num_attention_heads=3, num_key_value_heads=1, head_dim=16, linear_conv_kernel_dim=3,
        linear_key_head_dim=8, linear_value_head_dim=12, linear_num_key_heads=1, linear_num_value_heads=3,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.25,
        rope_parameters={"rope_type": "default", "rope_theta": 1e5, "partial_rotary_factor": 0.5})
    model = transformers.Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(1.0, 16.0)))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn_like(p))
            elif "norm" in name:
                p.copy_((1.0 if "linear_attn.norm" in name else 0.0) + 0.2 * torch.randn_like(p))
    model.to(torch.bfloat16).save_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    ids = torch.tensor(np.random.default_rng(seed).integers(0, cfg.vocab_size, prompt))
    with torch.no_grad():
        seq = ids
        for _ in range(new):
            seq = torch.cat([seq, model(seq[None]).logits[0, -1].argmax()[None]])
        logits = model(seq[None]).logits[0].numpy()
    top2 = np.sort(logits[prompt - 1:-1], axis=1)[:, -2:]
    np.savez(f"{folder}/expected.npz", input_ids=ids.numpy(), greedy_ids=seq[prompt:].numpy(), logits=logits)
    print(f"{folder}: {transformers.__version__}, smallest top-two gap on the greedy path "
          f"{(top2[:, 1] - top2[:, 0]).min():.4f}")
    exact(folder)


if __name__ == "__main__":
    {"exact": exact, "make": make}[sys.argv[1]](*sys.argv[2:])
