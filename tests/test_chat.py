"""Chat templates (jinja2 sandbox, as transformers renders them) and the /v1/chat/completions
request parsing and reply bodies, checked against the official openai client's own types."""

from __future__ import annotations

import pytest

import minillm
from minillm.chat import Conversation, PLAIN_NOTE, render
from minillm.errors import MiniLLMError, PromptError
from minillm.serving.api import ApiError, usage
from minillm.serving.chat_api import chat_chunk, chat_completion, parse_chat

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


class Tok:
    """A stand-in tokenizer: one id per character, a ChatML template."""
    chat_template = CHATML
    bos_id, eos_ids = None, (2,)

    def encode(self, text, **_):
        return [ord(c) % 100 for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_render_chatml():
    text, note = render([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}], Tok())
    assert note is None
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_no_template_falls_back_with_a_note():
    tok = minillm.tokenizer()
    text, note = render([{"role": "user", "content": "Hi"}], tok)
    assert note == PLAIN_NOTE and text == "user: Hi\nassistant:"


def test_template_is_sandboxed_and_errors_are_one_line():
    class Evil(Tok):
        chat_template = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(MiniLLMError, match="chat template"):
        render([{"role": "user", "content": "x"}], Evil())

    class Refuses(Tok):
        chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(MiniLLMError, match="roles must alternate"):
        render([{"role": "user", "content": "x"}], Refuses())


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "robot", "content": "x"}], [{"role": "user"}]])
def test_bad_messages_are_named(messages):
    with pytest.raises(PromptError, match="messages"):
        render(messages, Tok())


def test_conversation_keeps_history():
    c = Conversation(Tok(), system="S")
    first = c.prompt_ids("a")
    c.answered("b")
    second = c.prompt_ids("c")
    assert second[:len(first)] == first


def test_parse_chat_renders_and_checks_like_completions():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "max_completion_tokens": 5, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = parse_chat(body, Tok(), 100, 512)
    assert req.prompt_ids == Tok().encode(render([{"role": "user", "content": "Hi"}], Tok())[0])
    assert req.max_tokens == 5 and req.stream and req.include_usage and req.sampling.temperature == 0
    for bad, param in [({"messages": []}, "messages"), ({"prompt": "x"}, "prompt"),
                       ({"messages": [{"role": "user", "content": "x"}], "tools": [{}]}, "tools"),
                       ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}, "max_tokens"),
                       ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature")]:
        with pytest.raises(ApiError) as e:
            parse_chat(bad, Tok(), 100, 512)
        assert e.value.status == 400 and e.value.param == param


def test_no_template_is_a_400():
    class Plain(Tok):
        chat_template = None
    with pytest.raises(ApiError, match="no chat template"):
        parse_chat({"messages": [{"role": "user", "content": "x"}]}, Plain(), 100, 512)


def test_bodies_are_what_the_openai_client_parses():
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    done = ChatCompletion.model_validate(chat_completion("chatcmpl-1", "m", "Paris.", "stop", usage(3, 2), 7))
    assert done.choices[0].message.content == "Paris." and done.usage.total_tokens == 5
    chunks = [chat_chunk("c", "m", 7, role=True), chat_chunk("c", "m", 7, content="Par"),
              chat_chunk("c", "m", 7, content="is."), chat_chunk("c", "m", 7, finish="stop"),
              chat_chunk("c", "m", 7, usage=usage(3, 2))]
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert "".join(p.choices[0].delta.content or "" for p in parsed[:-1]) == "Paris."
    assert parsed[0].choices[0].delta.role == "assistant" and parsed[3].choices[0].finish_reason == "stop"
    assert parsed[-1].usage.completion_tokens == 2 and parsed[-1].choices == []
