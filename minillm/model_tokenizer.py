"""A model's own tokenizer: byte-level BPE from `tokenizer.json` or from a GGUF file's metadata.

Built with Hugging Face `tokenizers`, the library transformers itself uses: its BPE, its byte-level
alphabet and its pre-tokenizers are exactly the ones the model was trained with, so minillm does not
hand-roll a second BPE that could drift (tiktoken needs rank order to be merge order, which these
vocabularies do not promise). Special tokens written in the text (`<|im_start|>`) become single ids,
as transformers encodes with `add_special_tokens=False`; no BOS is added.

A GGUF names its pre-tokenizer (`tokenizer.ggml.pre`): the regular expression that cuts text into
pieces before the merges. The ones minillm knows are below, with the same patterns as the models'
own tokenizer.json files; another name is refused with one line rather than guessed.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import MiniLLMError, WeightsError
from .paths import MAX_JSON_BYTES, folder_file, read_json, read_text_capped

MAX_TEMPLATE_BYTES = 1 << 20     # a chat_template.jinja (real ones: a few KB)

# Pre-tokenizers by `tokenizer.ggml.pre`: (digits one by one?, split regex or None for GPT-2's own)
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {
    "gpt2": (False, None),
    "smollm": (True, None),          # SmolLM's tokenizer.json: Digits(individual), then GPT-2's ByteLevel
    "llama-bpe": (False, _LLAMA3),   # Llama 3
    "qwen2": (False, _QWEN2),
}
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|end|>", "</s>")


class ModelTokenizer:
    """encode / decode / eos_ids for one model, plus its chat template (or None).

    Speaks the part of tiktoken's interface that minillm's commands use (`encode`, `decode`,
    `decode_single_token_bytes`, `n_vocab`, `eot_token`), so GPT-2's and a model's own are used alike."""

    def __init__(self, tok, *, name: str, eos_ids=(), bos_id=None, chat_template=None) -> None:
        self.tok = tok
        self.name = name
        self.n_vocab = tok.get_vocab_size(with_added_tokens=True)
        self.eos_ids = tuple(dict.fromkeys(int(i) for i in eos_ids if i is not None and 0 <= i < self.n_vocab))
        self.bos_id = bos_id
        self.chat_template = chat_template
        self.special = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        self._bytes = {c: b for b, c in bytes_to_unicode().items()}
        self._plain = None                  # a copy that reads special tokens as text (encode_ordinary)

    @property
    def eot_token(self) -> int | None:
        return self.eos_ids[0] if self.eos_ids else None

    def encode(self, text: str, allowed_special=None, disallowed_special=None) -> list[int]:
        """Text -> ids; special tokens written in the text are single ids. No BOS is added."""
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Text -> ids with special tokens' characters read as ordinary text (as tiktoken's
        `encode_ordinary`): what a user typed can never become a control token."""
        if self._plain is None:
            from tokenizers import Tokenizer
            self._plain = Tokenizer.from_str(self.tok.to_str())
            self._plain.encode_special_tokens = True
        return self._plain.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """Ids -> text, special tokens included (as transformers' decode with skip_special_tokens=False)."""
        return b"".join(self.decode_single_token_bytes(int(i)) for i in ids).decode("utf-8", errors="replace")

    def decode_single_token_bytes(self, token: int) -> bytes:
        piece = self.tok.id_to_token(int(token))
        if piece is None:
            raise MiniLLMError(f"token id {token} is outside the tokenizer's {self.n_vocab} ids")
        if piece in self.special or not all(c in self._bytes for c in piece):
            return piece.encode("utf-8")
        return bytes(self._bytes[c] for c in piece)

    def __repr__(self) -> str:
        return f"ModelTokenizer({self.name!r}: {self.n_vocab:,} ids, eos {list(self.eos_ids)})"


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as a printable character (the one `tokenizers` uses)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def end_of_turn_ids(vocab: dict[str, int], *named) -> list[int]:
    """The ids generation stops at: the ones the file names, then the end-of-turn tokens it has."""
    return [*named, *(vocab[t] for t in END_OF_TURN if t in vocab)]


def from_gguf_metadata(md: dict, where) -> ModelTokenizer:
    """Build the tokenizer a GGUF file describes (tokens, merges, token types, pre-tokenizer)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    kind = md.get("tokenizer.ggml.model")
    if kind in ("llama", "t5", "bert") or kind is None and md.get("tokenizer.ggml.scores") is not None:
        raise WeightsError(f"{where}: its tokenizer is SentencePiece ({kind}); minillm reads byte-level BPE "
                           "tokenizers only (tokenizer.ggml.model = gpt2)")
    if kind != "gpt2":
        raise WeightsError(f"{where}: tokenizer model {kind!r} is not supported; minillm reads byte-level BPE "
                           "(gpt2)")
    pre = md.get("tokenizer.ggml.pre", "gpt2")
    if pre not in PRE_TOKENIZERS:
        raise WeightsError(f"{where}: pre-tokenizer {pre!r} is not supported; minillm knows "
                           f"{', '.join(PRE_TOKENIZERS)}")
    tokens = md.get("tokenizer.ggml.tokens")
    merges = md.get("tokenizer.ggml.merges", [])
    types = md.get("tokenizer.ggml.token_type")            # the reader's read-only view, or a list
    types = [1] * len(tokens) if types is None and isinstance(tokens, list) else types
    if not (isinstance(tokens, list) and tokens and all(isinstance(t, str) for t in tokens)
            and isinstance(merges, list) and all(isinstance(m, str) and " " in m for m in merges)
            and isinstance(types, (list, np.ndarray)) and len(types) == len(tokens)):
        raise WeightsError(f"{where}: the tokenizer's tokens, merges or token types are missing or damaged; "
                           "re-download the file")
    eos, eot, bos = (gguf_token_id(md, f"tokenizer.ggml.{k}_token_id", len(tokens), where)
                     for k in ("eos", "eot", "bos"))
    vocab = {t: i for i, t in enumerate(tokens)}
    try:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        tok = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    except Exception as e:
        raise WeightsError(f"{where}: the tokenizer's vocabulary or merges are damaged ({str(e)[:80]})") from None
    digits, regex = PRE_TOKENIZERS[pre]
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if regex is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps) if len(steps) > 1 else steps[0]
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty in (3, 4)]
    tok.add_special_tokens(special)
    template = md.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise WeightsError(f"{where}: metadata tokenizer.chat_template is a {type(template).__name__}, not text; "
                           "re-download the file")
    return ModelTokenizer(tok, name=str(Path(where).name), eos_ids=end_of_turn_ids(vocab, eot, eos),
                          bos_id=bos, chat_template=template)


def gguf_token_id(md: dict, key: str, n_vocab: int, where) -> int | None:
    """A GGUF's `tokenizer.ggml.*_token_id`: an integer from 0 to n_vocab - 1, or absent (None). Checked
    at load, so a bad one is one line now, never a TypeError when a chat is rendered."""
    value = md.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_vocab):
        raise WeightsError(f"{where}: metadata {key} = {repr(value)[:40]} is not a token id of its "
                           f"{n_vocab:,}-token vocabulary (0 to {n_vocab - 1:,}); re-download the file")
    return value


def named_template(value, where) -> str | None:
    """`chat_template` as transformers reads it: a string, or a list of {"name", "template"} from which
    the one named "default" is taken (the others, e.g. "tool_use", are for tools minillm does not serve)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                       and isinstance(t.get("template"), str) for t in value):
        by_name = {t["name"]: t["template"] for t in value}
        if "default" in by_name:
            return by_name["default"]
        raise WeightsError(f"{where}: chat_template lists templates named {', '.join(sorted(by_name))[:100]} but "
                           "none named \"default\", the one minillm would use; add one")
    raise WeightsError(f"{where}: chat_template must be a string or a list of {{\"name\", \"template\"}} "
                       f"objects, not {type(value).__name__}")


def from_folder(folder: Path, generation_eos=()) -> ModelTokenizer:
    """A Hugging Face folder's `tokenizer.json` (+ `tokenizer_config.json` for the chat template and EOS)."""
    from tokenizers import Tokenizer
    if (folder / "tokenizer.model").is_file() and not (folder / "tokenizer.json").is_file():
        raise WeightsError(f"{folder}: its tokenizer is SentencePiece (tokenizer.model); minillm reads "
                           "byte-level BPE tokenizers (tokenizer.json) only")
    path = folder_file(folder, "tokenizer.json")
    if not path.is_file():
        raise WeightsError(f"{folder}: no tokenizer.json; minillm needs the model's own tokenizer beside it")
    text = read_text_capped(path, MAX_JSON_BYTES, "a tokenizer.json")      # checked before it is parsed
    try:
        model = json.loads(text).get("model", {})
    except (ValueError, RecursionError, AttributeError) as e:
        raise WeightsError(f"{path}: not a tokenizer.json ({str(e)[:80]}); re-download it") from None
    if not isinstance(model, dict) or model.get("type") != "BPE" or model.get("byte_fallback"):
        model = model if isinstance(model, dict) else {}
        raise WeightsError(f"{path}: a {model.get('type')} tokenizer{' with byte fallback (SentencePiece-style)' if model.get('byte_fallback') else ''}; "
                           "minillm reads byte-level BPE tokenizers only")
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:
        raise WeightsError(f"{path}: cannot be read as a tokenizer ({str(e)[:100]})") from None
    cfg, cfg_path = {}, folder_file(folder, "tokenizer_config.json")
    if cfg_path.is_file():
        cfg = read_json(cfg_path, what="a tokenizer_config.json")
    template = named_template(cfg.get("chat_template"), cfg_path)
    if template is None and (jinja := folder_file(folder, "chat_template.jinja")).is_file():
        template = read_text_capped(jinja, MAX_TEMPLATE_BYTES, "a chat template")
    vocab = tok.get_vocab()

    def token_id(key):
        """tokenizer_config's `eos_token` / `bos_token`: the token's text (or {"content": text}); text
        the vocabulary lacks is no token (None), as transformers reads it."""
        v = cfg.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if v is not None and not isinstance(v, str):
            raise WeightsError(f"{cfg_path}: {key} = {str(v)[:40]} is not a token's "
                               "text; fix or delete the field")
        return vocab.get(v) if isinstance(v, str) else None

    named = [token_id("eos_token"), *generation_eos]
    return ModelTokenizer(tok, name=folder.name, eos_ids=end_of_turn_ids(vocab, *named),
                          bos_id=token_id("bos_token"),
                          chat_template=template if isinstance(template, str) else None)
