"""The GPT-2 tokenizer, built offline from the bundled ranks: known ids, round trips, no network."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm.bpe import gpt2_tokenizer, tokenizer

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"


def test_encodes_the_pangram_to_gpt2s_ids():
    # The ids OpenAI's GPT-2 tokenizer gives (tiktoken "gpt2", Hugging Face GPT2TokenizerFast).
    ids = minillm.tokenizer().encode("The quick brown fox jumps over the lazy dog.")
    assert ids == [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13]


def test_endoftext_is_50256_and_the_vocabulary_is_50257():
    enc = tokenizer()
    assert enc.encode("<|endoftext|>", allowed_special={"<|endoftext|>"}) == [50256]
    assert enc.eot_token == 50256
    assert enc.n_vocab == 50257
    assert enc.decode([50256]) == "<|endoftext|>"


def test_special_token_text_is_refused_unless_allowed():
    # tiktoken's safety default: text that spells a special token is an error, not a silent 50256.
    with pytest.raises(ValueError):
        tokenizer().encode("hello <|endoftext|>")


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f"{SHAKESPEARE} is not here (the shared data folder)")
def test_round_trips_all_of_tiny_shakespeare():
    text = SHAKESPEARE.read_text(encoding="utf-8")
    enc = tokenizer()
    ids = enc.encode(text)
    assert len(ids) < len(text) / 2           # BPE merges really happened (about 3.3 chars a token)
    assert enc.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text())                        # any Unicode text (surrogates excluded: not UTF-8 encodable)
def test_round_trips_arbitrary_unicode(text):
    enc = tokenizer()
    ids = enc.encode(text, disallowed_special=())
    assert all(0 <= i < 50257 for i in ids)
    assert enc.decode(ids) == text


def test_building_the_tokenizer_does_not_touch_the_network(monkeypatch):
    def refuse(self, address):
        raise AssertionError(f"the tokenizer tried to connect to {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", lambda address, *a, **k: refuse(None, address))
    gpt2_tokenizer.cache_clear()              # build it afresh, under the patch
    enc = tokenizer()
    assert enc.encode("Hello world") == [15496, 995]
