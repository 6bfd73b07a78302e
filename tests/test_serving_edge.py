"""Issue 38, item 6, the serving edge: errors classified by their type (not their text), what a
server attaches to a request kept in the loop's own table, http.py split under 400 lines a file,
`minillm.cli.main` only the function, and serving/'s docstring naming every module."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

import minillm
from minillm.models.gpt2 import GPT2Config
from minillm.engine.engine import Request
from minillm.engine.sequence import SamplingParams
from minillm.errors import ContextFull, MiniLLMError, PromptError
from minillm.serving.api import ApiError, CompletionRequest
from minillm.serving.loop import EngineLoop, Served

from test_properties import random_model

PACKAGE = Path(minillm.__file__).parent
CONFIG = GPT2Config(n_layer=1, n_head=2, n_embd=16, n_ctx=32, vocab_size=64)


@pytest.fixture(scope="module")
def loop():
    return EngineLoop(random_model(CONFIG, 1), kv_memory=1 << 16, block_size=4)     # not started: submit only


def submit_error(loop, prompt, max_tokens) -> ApiError:
    with pytest.raises(ApiError) as e:
        loop.submit(CompletionRequest(prompt, max_tokens, SamplingParams()))
    return e.value


def test_what_does_not_fit_is_max_tokens_and_a_bad_prompt_is_prompt(loop):
    assert submit_error(loop, [1, 2, 3], 40).param == "max_tokens"             # past the context of 32
    small = EngineLoop(random_model(CONFIG, 1), kv_memory=4 * 4 * 2 * 16 * 4 * 2, block_size=4)
    e = submit_error(small, [1, 2, 3], 20)                                      # fits 32, not the pool
    assert e.param == "max_tokens" and "KV blocks" in e.message
    assert submit_error(loop, [1, 99], 2).param == "prompt"                      # 99: past the vocabulary


def test_the_class_decides_not_the_words(loop, monkeypatch):
    for raised, param in ((ContextFull("nothing about tokens here"), "max_tokens"),
                          (PromptError("KV blocks, new tokens: words that used to decide"), "prompt"),
                          (MiniLLMError("new tokens"), "prompt")):
        def new_request(*a, raised=raised, **k):
            raise raised
        monkeypatch.setattr(loop.engine, "new_request", new_request)
        e = submit_error(loop, [1, 2], 2)
        assert e.status == 400 and e.param == param, (raised, e.param)


def test_context_full_is_a_prompt_error_for_those_who_catch_that():
    from minillm.engine.sampling import check_fits
    with pytest.raises(ContextFull):
        check_fits(30, 5, 32)
    assert issubclass(ContextFull, PromptError)


def test_the_loop_keeps_its_own_table_of_what_it_serves(loop):
    assert not {"events", "api"} & set(Request.__dataclass_fields__)
    served = loop.submit(CompletionRequest([1, 2, 3], 2, SamplingParams()))
    assert isinstance(served, Served) and isinstance(served.request, Request) and served.id == served.request.id
    assert served.events.empty()


def test_serving_files_are_under_400_lines_and_its_docstring_names_each():
    serving = PACKAGE / "serving"
    doc = ast.get_docstring(ast.parse((serving / "__init__.py").read_text()))
    for path in sorted(serving.glob("*.py")):
        if path.name != "__init__.py":
            assert len(path.read_text().splitlines()) < 400, path.name
            assert f"\n    {path.stem} " in "\n" + doc, f"serving/__init__.py does not name {path.stem}"


def test_cli_main_is_the_function_only():
    import minillm.cli as cli
    import minillm.cli.commands as commands
    assert isinstance(cli.main, types.FunctionType) and cli.main is commands.main
    assert not (PACKAGE / "cli" / "main.py").exists()
