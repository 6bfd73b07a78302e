"""One family of errors. Every message names the file or value at fault and what to do about it.

The CLI catches `MiniLLMError` and prints its message on one line; anything else is a bug.
"""

from __future__ import annotations


def interrupted(exc: BaseException | None) -> bool:
    """Whether `exc` is Ctrl-C, or carries it: a KeyboardInterrupt raised while Python runs a class
    body's `__set_name__` (rich's Console, imported as the command starts) reaches the caller as a
    RuntimeError whose cause is the interrupt."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class MiniLLMError(Exception):
    """Base of every error minillm raises on purpose (bad input, missing file, ...)."""


class WeightsError(MiniLLMError):
    """A checkpoint that cannot be read or does not fit its config."""


class SafetensorsError(WeightsError):
    """A .safetensors file that is damaged or not in the format."""


class ModelNotFoundError(MiniLLMError):
    """An unknown model name, or a known one that has not been downloaded."""


class PromptError(MiniLLMError):
    """An empty prompt, token ids outside the vocabulary, or a sequence longer than the context."""


class ContextFull(PromptError):
    """A prompt and the new tokens asked for that do not fit: past the model's context, or needing more
    KV blocks than the pool holds (fewer new tokens, or a shorter prompt, would)."""


class ConfigError(MiniLLMError):
    """A config.json that is missing fields or has impossible values."""


class DownloadError(MiniLLMError):
    """A download that failed or did not verify."""
