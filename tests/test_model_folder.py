"""Issue 43, item 1: every file a model folder names resolves inside the folder.

A model folder names its files: config.json, generation_config.json, tokenizer.json,
tokenizer_config.json, chat_template.jinja, model.safetensors, or model.safetensors.index.json and
the shards that index names. Each, a symlink to a file outside the folder, is refused in one
WeightsError line (a link to /etc/passwd used to reach the chat prompt); a link that stays inside
the folder, and the Hugging Face cache's snapshot -> blob links, still load. A name with a NUL, a
control character, a separator or a lone surrogate is refused in one line too (a NUL in a shard's
name escaped as `ValueError: embedded null byte`)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm.checkpoints.safetensors import read_safetensors, write_safetensors
from minillm.errors import WeightsError

from test_hostile_files import hf_folder

pytestmark = pytest.mark.skipif(os.name != "posix", reason="symlinks")
GPT2 = Path(__file__).parent / "fixtures" / "gpt2-tiny-a"
INDEX = "model.safetensors.index.json"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def sharded(d: Path) -> Path:
    """Folder d with its weights in two shards and an index."""
    tensors, _ = read_safetensors(d / "model.safetensors")
    names = sorted(tensors)
    halves = dict(zip(SHARDS, (names[:7], names[7:])))
    for file, part in halves.items():
        write_safetensors(d / file, {n: np.array(tensors[n]) for n in part})
    (d / "model.safetensors").unlink()
    (d / INDEX).write_text(json.dumps({"weight_map": {n: f for f, part in halves.items() for n in part}}))
    return d


def moved_out(d: Path, name: str, outside: Path) -> Path:
    """Move file `name` of folder d to `outside` (same bytes) and leave a symlink to it in its place."""
    outside.mkdir(exist_ok=True)
    target = outside / name
    shutil.move(d / name, target)
    (d / name).symlink_to(target)
    return target


def load_with_chat(d: Path):
    """What a chat does first: load the folder, then render a conversation with its template."""
    from minillm.chat import render
    model = minillm.load(d)
    return render([{"role": "user", "content": "hi"}], model.tokenizer)[0]


def hf_chat_folder(tmp_path: Path, jinja: bool = False) -> Path:
    d = hf_folder(tmp_path)
    if jinja:                           # the template in chat_template.jinja, none in tokenizer_config.json
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        (d / "chat_template.jinja").write_text(cfg.pop("chat_template"))
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


HF_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "model.safetensors", INDEX, SHARDS[1]]


def hf_case(tmp_path: Path, name: str) -> Path:
    d = hf_chat_folder(tmp_path, jinja=name == "chat_template.jinja")
    return sharded(d) if name in (INDEX, *SHARDS) else d


@pytest.mark.parametrize("name", HF_FILES)
def test_a_link_out_of_a_hugging_face_folder_is_refused(tmp_path, name):
    d = hf_case(tmp_path, name)
    assert load_with_chat(d)                             # the folder as it is loads and renders
    moved_out(d, name, tmp_path / "elsewhere")           # the same bytes, now outside the folder
    with pytest.raises(WeightsError) as e:
        load_with_chat(d)
    message = str(e.value)
    assert "\n" not in message and name in message and "outside the model's folder" in message, message


@pytest.mark.parametrize("name", HF_FILES)
def test_a_link_that_stays_inside_the_folder_is_followed(tmp_path, name):
    d = hf_case(tmp_path, name)
    want = load_with_chat(d)
    moved_out(d, name, d / "kept")                       # a subfolder of the model's folder
    assert load_with_chat(d) == want


def test_a_chat_template_linked_to_etc_passwd_never_reaches_the_prompt(tmp_path):
    d = hf_chat_folder(tmp_path, jinja=True)
    (d / "chat_template.jinja").unlink()
    (d / "chat_template.jinja").symlink_to("/etc/passwd")
    with pytest.raises(WeightsError, match="chat_template.jinja: a link to '/etc/passwd', outside"):
        load_with_chat(d)
    with pytest.raises(WeightsError, match="outside the model's folder"):
        minillm.tokenizer(d)                             # the tokenizer alone, without the model


def test_the_family_is_never_read_from_a_config_outside_the_folder(tmp_path):
    """The family comes from config.json's model_type: a link to another model's config is refused
    there too, before any reader of the family runs."""
    from minillm.checkpoints.families import family_of
    d = hf_chat_folder(tmp_path)
    moved_out(d, "config.json", tmp_path / "elsewhere")
    with pytest.raises(WeightsError, match="config.json: a link to .*, outside the model's folder"):
        family_of(d)


def test_a_link_to_a_device_outside_says_what_it_is(tmp_path):
    d = hf_chat_folder(tmp_path)
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("/dev/zero")
    with pytest.raises(WeightsError, match=r"config.json: is a character device, not a regular file \(a link to "
                                           r"'/dev/zero', outside the model's folder\)"):
        minillm.load(d)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_link_out_of_a_gpt2_folder_is_refused(tmp_path, name):
    d = tmp_path / "gpt2"
    shutil.copytree(GPT2, d)
    minillm.load(d)
    moved_out(d, name, tmp_path / "elsewhere")
    with pytest.raises(WeightsError, match=f"{name}: a link to .*, outside the model's folder"):
        minillm.load(d)


def test_a_lone_safetensors_files_config_beside_it_is_checked_too(tmp_path):
    d = tmp_path / "gpt2"
    shutil.copytree(GPT2, d)
    moved_out(d, "config.json", tmp_path / "elsewhere")
    with pytest.raises(WeightsError, match="config.json: a link to .*, outside the model's folder"):
        minillm.load(d / "model.safetensors")


def test_the_hugging_face_cache_layout_loads(tmp_path):
    """huggingface_hub's cache: snapshots/<rev>/<name> are relative links to ../../blobs/<sha>."""
    src = sharded(hf_chat_folder(tmp_path, jinja=True))
    want = load_with_chat(src)
    entry = tmp_path / "hub" / "models--org--tiny"
    snap, blobs = entry / "snapshots" / "0123abc", entry / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(src.iterdir())):
        shutil.copy(f, blobs / f"{i:040x}")
        (snap / f.name).symlink_to(Path("..", "..", "blobs", f"{i:040x}"))
    assert load_with_chat(snap) == want
    (blobs.parent.parent / "stray").write_text("{}")               # outside the entry's blobs: refused
    (snap / "generation_config.json").unlink()
    (snap / "generation_config.json").symlink_to(Path("..", "..", "..", "stray"))
    with pytest.raises(WeightsError, match="generation_config.json: a link to .*, outside the model's folder"):
        load_with_chat(snap)


# -- names no file can have ---------------------------------------------------------------------------

BAD_NAMES = {
    "a NUL": ("model-00002\x00-of-00002.safetensors", "control character"),
    "a newline": ("model-00002-of-00002.safetensors\n", "control character"),
    "a lone surrogate": ("model-\ud800.safetensors", "lone surrogate"),
    "a path": ("../../../etc/passwd", "path separator"),
    "an absolute path": ("/etc/passwd", "path separator"),
    "a backslash": ("..\\x.safetensors", "path separator"),
    "empty": ("", "not a file's name"),
    "dot-dot": ("..", "not a file's name"),
    "a number": (7, "not text"),
}


@pytest.mark.parametrize("case", BAD_NAMES, ids=list(BAD_NAMES))
def test_a_shard_name_no_file_can_have_is_one_line(tmp_path, case):
    bad, words = BAD_NAMES[case]
    d = sharded(hf_chat_folder(tmp_path))
    index = json.loads((d / INDEX).read_text())
    index["weight_map"] = {k: bad if v == SHARDS[1] else v for k, v in index["weight_map"].items()}
    (d / INDEX).write_text(json.dumps(index))
    with pytest.raises(WeightsError) as e:
        minillm.load(d)
    message = str(e.value)
    assert "\n" not in message and "\x00" not in message, message
    assert f"{INDEX}: shard name" in message and words in message, message


@pytest.mark.parametrize("name", ["", *HF_FILES[:5]])
def test_a_nul_in_the_path_of_a_folder_or_a_file_it_names_is_one_line(tmp_path, name):
    """A path given to `load` or `tokenizer` with a NUL in the folder's name or in a file's name."""
    d = hf_chat_folder(tmp_path)
    for path in (f"{d}\x00", f"{d}\x00/{name}", f"{d}/{name}\x00", f"{d}/\x00{name}"):
        for load in (minillm.load, minillm.tokenizer):
            with pytest.raises(WeightsError, match="NUL byte") as e:
                load(path)
            assert "\n" not in str(e.value) and "\x00" not in str(e.value)


def test_a_template_swapped_for_a_link_while_loading_is_never_read(tmp_path):
    """The check and the read were two opens: a chat_template.jinja swapped for a link to a file
    outside the folder between them was read (19 of 777 loads). Now the file is opened once and what
    was opened is checked (its descriptor's real path): a thread swaps the file and the link in a
    loop while the tokenizer loads; every load gets the folder's template or one line, never the
    outside file."""
    import threading
    from minillm import model_tokenizer as mt
    d = hf_chat_folder(tmp_path, jinja=True)
    inside = (d / "chat_template.jinja").read_text()
    secret = tmp_path / "secret.jinja"
    secret.write_text("SECRET OUTSIDE THE FOLDER {{ messages }}")
    stop = threading.Event()

    def swap():
        i = 0
        while not stop.is_set():
            i += 1
            tmp = d / f".swap{i % 2}"
            if i % 2:
                tmp.symlink_to(secret)
            else:
                tmp.write_text(inside)
            os.replace(tmp, d / "chat_template.jinja")

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    seen = {"inside": 0, "refused": 0}
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                tok = mt.from_folder(d)
            except WeightsError as e:
                assert "\n" not in str(e)
                seen["refused"] += 1
                continue
            assert tok.chat_template in (inside, None) and "SECRET" not in (tok.chat_template or "")
            seen["inside"] += tok.chat_template == inside
    finally:
        stop.set()
        t.join()
    assert seen["inside"] + seen["refused"] > 20, seen


def test_weights_swapped_for_a_link_while_loading_are_never_read(tmp_path):
    """The same race for model.safetensors, whose header and data were two opens: the file is opened
    once (header and mapped data from one descriptor), checked by what was opened. A thread swaps it
    for a link to another checkpoint outside the folder; every read gets the folder's tensors or one
    line."""
    import threading
    from minillm.checkpoints.llama_load import read_tensors
    src = Path(__file__).parent / "fixtures" / "llama-tiny"
    d = tmp_path / "model"
    shutil.copytree(src, d)
    tensors, _ = read_safetensors(d / "model.safetensors")
    inside = {k: np.array(v) for k, v in tensors.items()}
    outside = tmp_path / "outside.safetensors"
    write_safetensors(outside, {k: -v for k, v in inside.items()})
    stop = threading.Event()

    def swap():
        i = 0
        while not stop.is_set():
            i += 1
            tmp = d / f".swap{i % 2}"
            if i % 2:
                tmp.symlink_to(outside)
            else:
                shutil.copyfile(src / "model.safetensors", tmp)
            os.replace(tmp, d / "model.safetensors")

    t = threading.Thread(target=swap, daemon=True)
    t.start()
    seen = {"inside": 0, "refused": 0}
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                got = read_tensors(d, None)
            except WeightsError as e:
                assert "\n" not in str(e)
                seen["refused"] += 1
                continue
            for k, v in inside.items():
                assert np.array_equal(got[k.removeprefix("model.")], v), k
            seen["inside"] += 1
    finally:
        stop.set()
        t.join()
    assert seen["inside"] + seen["refused"] > 20, seen
