"""The models' math, family by family on one shared core.

    ops          one function per operation (embedding, norms, linear, attention, the LM head, RoPE,
                 SwiGLU, ...), each reporting its bytes and FLOPs to the meter, whichever kernel ran
    target       `Target`: what runs where (device, dtype, weights, kernel set), chosen once at load;
                 what each kernel set needs (KERNEL_SETS) and the one wording of "CPU only"
    kernel_sets  `KernelSet`: the implementations a model computes with (numpy, fused, batch-invariant)
    weights      the one weight interface every product multiplies by (`Dense`, `DeviceDense`, the
                 batch-invariant set's `FixedOrder*`)
    fused        the fused set's weights (`FusedDense`, `FusedQuant`: numba products)
    factory      `make_weight(w, target)`: the one place a model's weights are made
    quant        `QuantMatrix`: GGUF's Q8_0 / Q4_0 / Q4_1 blocks, kept quantized and multiplied there
    base         `CausalLM`: the one way in (`step`, `step_plan`) and its special cases, and what tools ask
    plan         a step's plan: the batch's rows, positions and attention over each sequence's cache
                 (per sequence, a batched decode, or a static decode step for a CUDA graph)
    gpt2         GPT-2: its config and presets, blocks, manifest, GGUF names, random builder, the model
    llama        the Llama family (Llama 2/3, SmolLM2, Qwen2, Qwen3): the same, with RoPE, GQA, SwiGLU
    moe          mixtures of experts (Mixtral, Qwen3-MoE): a Llama whose MLP is routed experts; its
                 `routes()` context records the experts each step chose (for lessons)
"""
