"""The GPT-2 math: `ops` (one function per operation, each reporting its bytes and FLOPs) and `gpt2`
(the blocks and the model's entry points)."""
