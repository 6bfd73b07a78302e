"""Gemma 3 and gpt-oss bfloat16 fixtures with transformers (run in a throwaway environment with torch
and transformers 5.25; minillm's tests never import them).

    python benchmarks/reference/make_w6_bf16.py tests/fixtures/w6

writes FOLDER/gemma3-bf16 and FOLDER/gptoss-bf16: two checkpoints that differ from w6's float32
gemma3-tiny and gptoss-tiny in what the tests never saw, saved by `save_pretrained` in bfloat16.

- gemma3-bf16: 5 layers sliding, sliding, full, sliding, full (not 5 sliding then 1 full), a window
  of 5, head_dim 16 with 4 heads on a width of 48 (wider than d / H) and 2 KV heads,
  query_pre_attn_scalar 24 (not the head width: the queries' scale is not 1/sqrt(hd)), a linear
  rotary factor of 8 on the full layers (as Gemma 3 4B-27B), its own head (untied).
- gptoss-bf16: 3 layers full, sliding, sliding (full first), a window of 6, 6 experts top-3 (not 8
  top-2), 6 heads / 2 KV heads, YaRN factor 8 over an original 64 positions with `truncate` on (the
  ramp's ends rounded to whole dimensions), swiglu_limit 5 and swiglu_alpha 1.5.

Same recipe as the float32 ones: random norm gains, biases, sinks and router biases, so a missing term
changes the logits. expected.npz (input_ids, greedy_ids, logits) is computed by transformers from the
files as stored (the bfloat16 rounding included), read back in float32 with eager attention: the
greedy ids are checked equal with transformers' cache and without it (argmax of a full forward each
step), and logits is one full forward over prompt + greedy ids. It prints the smallest top-two logit
gap along the greedy path (and, for gpt-oss, the smallest gap between the k-th and (k+1)-th router
logit over every token and layer), which must stay well above the 1e-4 the tests allow.
"""
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

PROMPT, NEW = 11, 36


def gemma3(folder, seed=3):
    torch.manual_seed(seed)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=512, hidden_size=48, intermediate_size=96, num_hidden_layers=5,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=5,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.06,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        pad_token_id=0, bos_token_id=2, eos_token_id=1)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.3 * torch.randn_like(p))                 # gains 1 + w, w random
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    return save_and_expect(model, folder, cfg.vocab_size, seed)


def gptoss(folder, seed=13):
    torch.manual_seed(seed)
    cfg = transformers.GptOssConfig(
        vocab_size=480, hidden_size=48, intermediate_size=32, num_hidden_layers=3,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        num_attention_heads=6, num_key_value_heads=2, head_dim=16, sliding_window=6,
        num_local_experts=6, num_experts_per_tok=3, max_position_embeddings=512, initializer_range=0.2,
        rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 8.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 64, "truncate": True},
        swiglu_limit=5.0, swiglu_alpha=1.5)
    model = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("sinks"):
                p.copy_(torch.randn_like(p))
    margins = []

    def router_margin(module, args, out):                   # k-th minus (k+1)-th router logit, every token
        top = torch.topk(out[0], cfg.num_experts_per_tok + 1, dim=-1).values
        margins.append((top[:, -2] - top[:, -1]).min().item())

    expect = save_and_expect(model, folder, cfg.vocab_size, seed,
                             hook=lambda m: [layer.mlp.router.register_forward_hook(router_margin)
                                             for layer in m.model.layers], margins=margins)
    print(f"  smallest router margin (k-th minus (k+1)-th logit) on the greedy path: {min(margins):.4f}")
    return expect


def save_and_expect(model, folder, vocab, seed, hook=None, margins=None):
    model.to(torch.bfloat16).save_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    ids = torch.tensor(np.random.default_rng(seed).integers(0, vocab, PROMPT))
    with torch.no_grad():
        seq = ids                                          # without the cache: a full forward each step
        for _ in range(NEW):
            seq = torch.cat([seq, model(seq[None], use_cache=False).logits[0, -1].argmax()[None]])
        out = model(ids[None], use_cache=True)             # with it: prefill, then one token a step
        cached = [out.logits[0, -1].argmax()]
        for _ in range(NEW - 1):
            out = model(cached[-1].view(1, 1), past_key_values=out.past_key_values, use_cache=True)
            cached.append(out.logits[0, -1].argmax())
        assert torch.equal(torch.stack(cached), seq[PROMPT:]), "greedy ids differ with and without the cache"
        handles = hook(model) if hook else []
        logits = model(seq[None], use_cache=False).logits[0].numpy()
        for h in handles:
            h.remove()
    assert (logits[PROMPT - 1:-1].argmax(1) == seq[PROMPT:].numpy()).all()
    top2 = np.sort(logits[PROMPT - 1:-1], axis=1)[:, -2:]
    np.savez(f"{folder}/expected.npz", input_ids=ids.numpy(), greedy_ids=seq[PROMPT:].numpy(), logits=logits)
    size = (Path(folder) / "model.safetensors").stat().st_size
    print(f"{folder}: transformers {transformers.__version__}, torch {torch.__version__}, {size:,} bytes, "
          f"{len(set(seq[PROMPT:].tolist()))} distinct of {NEW} greedy ids, smallest top-two gap on the "
          f"greedy path {(top2[:, 1] - top2[:, 0]).min():.4f}")


if __name__ == "__main__":
    root = Path(sys.argv[1])
    gemma3(root / "gemma3-bf16")
    gptoss(root / "gptoss-bf16")
