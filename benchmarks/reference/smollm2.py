"""transformers' answers for the real SmolLM2-135M-Instruct GGUF, for minillm's tests to compare with.

Run once, in a throwaway environment (torch, transformers, gguf, accelerate; minillm's tests never
import them), with the GGUF that `minillm download smollm2-135m` keeps:

    python benchmarks/reference/smollm2.py PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf weights/tinyshakespeare.txt.gz

It writes tests/fixtures/smollm2/expected.npz (the chat prompt's ids, transformers' greedy answer,
the 256 largest of its float32 logits at every
position of prompt + answer, with their ids) and tests/fixtures/smollm2/tokenizer.json (transformers'
ids for a varied corpus, as its GGUF tokenizer gives them with add_special_tokens=False).
"""
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

gguf = Path(sys.argv[1])
shakespeare = gzip.open(sys.argv[2], "rt", encoding="utf-8").read()[:4000]
out = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "smollm2"
out.mkdir(parents=True, exist_ok=True)

tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                          dtype=torch.float32).eval()

CORPUS = [
    "Hello world", " leading space", "trailing space ", "Numbers: 1, 22, 333, 4444, 3.14159 and 2026-12-03",
    "Accents: café, naïve, Ærøskøbing, São Paulo, Dvořák", "Emoji: 🙂👍🏽🇫🇷 and a family 👨‍👩‍👧",
    "CJK: 你好，世界。日本語のテキスト。한국어", "def f(x):\n    return x ** 2  # square\n\tprint(f'{x!r}')",
    "whitespace   runs\n\n\n  and\ttabs\t\t and  \r\n crlf", "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
    "don't won't I'll we've they're it's", "", " ", "\n", shakespeare,
]
ids = [tok.encode(text, add_special_tokens=False) for text in CORPUS]
(out / "tokenizer.json").write_text(json.dumps({"texts": CORPUS, "ids": ids}, ensure_ascii=False))

messages = [{"role": "user", "content": "What is the capital of France?"}]
text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
prompt = torch.tensor(tok.encode(text, add_special_tokens=False))
seq = prompt
with torch.no_grad():
    for _ in range(24):                         # greedy, by definition: argmax of a full forward
        nxt = model(seq[None]).logits[0, -1].argmax()
        seq = torch.cat([seq, nxt[None]])
        if int(nxt) == tok.convert_tokens_to_ids("<|im_end|>"):
            break
    logits = model(seq[None]).logits[0].numpy().astype(np.float32)
greedy = seq[len(prompt):].numpy()
TOP = 256                                       # per row, the 256 largest logits: what sampling can reach
top_ids = np.argsort(-logits, axis=1)[:, :TOP]
np.savez_compressed(out / "expected.npz", chat_text=np.array(text), input_ids=prompt.numpy(),
                    greedy_ids=greedy, top_ids=top_ids.astype(np.int32),
                    top_logits=np.take_along_axis(logits, top_ids, axis=1))
print(repr(text))
print(repr(tok.decode(greedy)))
