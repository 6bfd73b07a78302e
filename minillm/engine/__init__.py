"""Generation: one sequence at a time (the teaching loops), and the engine that runs many in
shared batched steps. It never imports a model: the model is passed in and asked for `step` (or
`step_plan`, for a plan it made: `static_plan`).

    sampling       logits -> one token (greedy, temperature, top-k, top-p) and the checks on those settings
    sequence       `SamplingParams`, and `Sequence`: one request's tokens, settings and random stream
    generate       `generate`: one sequence, the naive and the KV-cached decode loops side by side
    runner         `run_step`: one batched model step over a set of sequences, each one's next token
    block_manager  KV blocks for the scheduler: admit, grow, free, prefix caching (the only allocator)
    scheduler      which sequences run next and how many of their tokens (token budget, batch limit,
                   chunked prefill, preemption by recompute)
    engine         `Engine`: requests in, one scheduled step at a time, its `StepInfo` and tokens out;
                   `adopt` for a sequence prefilled elsewhere
    batch          `generate_batch`: many prompts through the engine
    speculative    `speculative_generate`: a draft guesses k tokens, the target checks them in one step
    static         `StaticDecode`: B slots decoding with fixed shapes, the step a CUDA graph replays
"""
