"""Recompute the modern fixtures' expected logits and greedy ids with transformers, from the weights
as stored (run in a throwaway environment with torch and transformers; minillm's tests never import
them). The shipped expected.npz of qwen2-tiny and qwen3-tiny were computed before the weights were
rounded to bfloat16 / float16 for saving: transformers itself, reloading the saved files, differs
from them by 0.08 and 0.01. This script writes expected.npz from the saved weights.

    python benchmarks/reference/modern_fixtures.py tests/fixtures/llama-tiny tests/fixtures/qwen2-tiny ...
"""
import sys

import numpy as np
import torch
import transformers

for folder in sys.argv[1:]:
    old = np.load(f"{folder}/expected.npz")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    prompt = torch.tensor(old["input_ids"])[None]
    with torch.no_grad():
        seq = prompt[0]
        for _ in range(len(old["greedy_ids"])):          # greedy by definition: argmax of a full forward
            seq = torch.cat([seq, model(seq[None]).logits[0, -1].argmax()[None]])
        greedy = seq[prompt.shape[1]:]
        logits = model(torch.cat([prompt[0], greedy])[None]).logits[0]
    before = np.abs(logits.numpy() - old["logits"]).max()
    np.savez(f"{folder}/expected.npz", input_ids=old["input_ids"], greedy_ids=greedy.numpy(),
             logits=logits.numpy().astype(np.float32))
    print(f"{folder}: {len(greedy)} greedy ids, logits moved by at most {before:.2e} from the old file")
