"""The models' math, family by family on one shared core.

    ops          one function per operation (embedding, norms, linear, attention, the LM head, RoPE,
                 SwiGLU, ...), each reporting its bytes and FLOPs to the meter, whichever kernel ran
    target       `Target`: what runs where (device, dtype, weights, kernel set), chosen once at load;
                 what each kernel set needs (KERNEL_SETS) and the one wording of "CPU only"
    kernel_sets  `KernelSet`: the implementations a model computes with, one per row of target's
                 KERNEL_SETS (numpy, fused, batch-invariant, int8), and what each attention kernel takes
    weights      the one weight interface every product multiplies by (`Dense`, `DeviceDense`, the
                 batch-invariant set's `FixedOrder*`)
    fused        the fused set's weights (`FusedDense`, `FusedQuant`: numba products)
    int8         the int8 set's weights (`Int8Quant`: quantized products in integers)
    factory      `make_weight(w, target)`: the one place a model's weights are made
    quant        `QuantMatrix`: GGUF's Q8_0 / Q4_0 / Q4_1 blocks, kept quantized and multiplied there
    base         `CausalLM`: the one way in (`step`, `step_plan`) and its special cases, and what tools ask
    options      `Option`: a family's options (DeepSeek's decode form), checked at load, handed to the model
    plan         a step's plan: the batch's rows, positions and attention over each sequence's cache
                 (per sequence, a batched decode, or a static decode step for a CUDA graph)
    gpt2         GPT-2: its config and presets, blocks, manifest, GGUF names, random builder, the model
    llama        the Llama family (Llama 2/3, SmolLM2, Qwen2, Qwen3): the same, with RoPE, GQA, SwiGLU
    moe          mixtures of experts (Mixtral, Qwen3-MoE): a Llama whose MLP is routed experts
    qwen35       Qwen3.5: a hybrid of Gated DeltaNet layers and gated full attention
    qwen35_config  its config.json and checkpoint: `Qwen35Config`, the tensors' names and shapes
    deepseek     the DeepSeek-V3 family: latent attention and DeepSeek's mixture
    deepseek_config  its config.json and checkpoint: `DeepSeekConfig`, the tensors' names and shapes
    gemma3       Gemma 3: sliding-window and global layers, Gemma's norms, GeGLU
    gptoss       gpt-oss: sliding and full layers with a sink per head, YaRN, a biased mixture (MXFP4 read)

What the families assemble (a family module imports these, never another family's; each counts
what it does):

    blocks       the SwiGLU MLP, the final norm and head, the gates, a checkpoint's parameter names
    decoder      the pre-norm decoder Llama brought (`DecoderConfig`, `Decoder`): its block as small
                 functions, its checkpoint's tensors; llama, moe, gemma3 and gptoss build on it
    mixture      a mixture's routers (softmax top-k, DeepSeek's grouped) and dispatch; `routes()`
                 records the experts each step chose (for lessons); `SparseDecoder`, the decoder
                 whose sparse layers are mixtures (moe's and gptoss's model)
    mla          multi-head latent attention (`MLAShape`): the latent cache row, absorbed or decompressed
    deltanet     Gated DeltaNet (`DeltaNetShape`): the convolution and the delta rule, a state per sequence
"""
