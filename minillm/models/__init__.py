"""The models' math, family by family on one shared core.

    ops       one function per operation (embedding, norms, linear, attention, the LM head, RoPE,
              SwiGLU, ...), each reporting its bytes and FLOPs to the meter
    weights   the one weight interface every product multiplies by (`Dense`, and `make_weight`,
              the factory a model's constructor makes its weights with)
    quant     `QuantMatrix`: GGUF's Q8_0 / Q4_0 / Q4_1 blocks, kept quantized and multiplied there
    base      `CausalLM`: the one way in (`step`) and its special cases, and what tools ask a model
    plan      a step's plan: the batch's rows, positions and attention over each sequence's cache
    gpt2      GPT-2: its blocks, its tensor manifest and GGUF names, the model
    llama     the Llama family (Llama 2/3, SmolLM2, Qwen2, Qwen3): the same, with RoPE, GQA, SwiGLU
"""
