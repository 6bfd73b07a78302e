"""Weights on disk: the safetensors reader and writer, the Hugging Face GPT-2 layout, `minillm.load`
and the downloader."""
