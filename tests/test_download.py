"""`minillm.download` against a local HTTP server on 127.0.0.1: success, bad hash, resume, no network."""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from minillm import download as dl
from minillm.errors import DownloadError, ModelNotFoundError

WEIGHTS = bytes(range(256)) * 1200 + b"tail"  # ~300 KB, not a multiple of the 1 MiB chunk
WEIGHTS_SHA = hashlib.sha256(WEIGHTS).hexdigest()
CONFIG = json.dumps({"n_layer": 2, "n_head": 2, "n_embd": 8, "n_positions": 16, "vocab_size": 50257}).encode()


class FakeHub(ThreadingHTTPServer):
    """A tiny Hugging Face stand-in serving `/openai-community/<name>/resolve/main/<file>`.

    cut_after: send the right headers but only this many body bytes, then hang up (an interruption).
    ignore_range: answer every request with 200 and the whole file, like a server without resume.
    ranges: the Range header of every request (None when there was none), in order.
    """

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.files: dict[str, bytes] = {}
        for name in dl.KNOWN_MODELS:
            self.files[f"/openai-community/{name}/resolve/main/config.json"] = CONFIG
            self.files[f"/openai-community/{name}/resolve/main/model.safetensors"] = WEIGHTS
        self.cut_after: int | None = None
        self.ignore_range = False
        self.ranges: list[str | None] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: FakeHub

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:
        body = self.server.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        rng = self.headers.get("Range")
        self.server.ranges.append(rng)
        start = 0
        if rng and not self.server.ignore_range:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        rest = body[start:]
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        if self.server.cut_after is not None and self.path.endswith(".safetensors"):
            rest = rest[: self.server.cut_after]  # promise everything, deliver a part, hang up
        self.wfile.write(rest)


@pytest.fixture
def hub():
    server = FakeHub()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_HOME", str(tmp_path))
    monkeypatch.delenv("MINILLM_HF_BASE", raising=False)
    return tmp_path


def test_download_success(hub, home):
    folder = dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    assert folder == home / "gpt2"
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
    assert (folder / "config.json").read_bytes() == CONFIG
    assert not list(folder.glob("*.part"))
    assert dl.find_downloaded("gpt2") == folder


def test_progress_bar_and_env_base(hub, home, monkeypatch):
    monkeypatch.setenv("MINILLM_HF_BASE", hub.base)
    folder = dl.download("gpt2", home / "elsewhere", progress=True, expected_sha256=WEIGHTS_SHA)
    assert folder == home / "elsewhere"
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS


def test_already_downloaded_is_skipped(hub, capsys):
    dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    requests = len(hub.ranges)
    dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    assert len(hub.ranges) == requests  # nothing was fetched again
    assert "already downloaded" in capsys.readouterr().err


def test_unknown_hash_checks_length_and_prints_hash(hub, capsys):
    folder = dl.download("gpt2-medium", base_url=hub.base, progress=False)
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
    assert WEIGHTS_SHA in capsys.readouterr().err


def test_wrong_hash_leaves_nothing(hub, home):
    with pytest.raises(DownloadError, match="SHA-256 mismatch") as err:
        dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256="0" * 64)
    assert "0" * 64 in str(err.value) and WEIGHTS_SHA in str(err.value)
    folder = home / "gpt2"
    assert not (folder / "model.safetensors").exists()
    assert not (folder / "model.safetensors.part").exists()
    assert dl.find_downloaded("gpt2") is None


def test_interrupted_download_resumes(hub, home):
    hub.cut_after = 100_000
    with pytest.raises(DownloadError, match="re-run to resume"):
        dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    part = home / "gpt2" / "model.safetensors.part"
    assert part.stat().st_size == 100_000
    assert not (home / "gpt2" / "model.safetensors").exists()

    hub.cut_after = None
    folder = dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    assert hub.ranges[-1] == "bytes=100000-"
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
    assert not part.exists()


def test_server_ignoring_range_starts_over(hub, home):
    folder = home / "gpt2"
    folder.mkdir()
    (folder / "model.safetensors.part").write_bytes(b"x" * 5000)  # wrong bytes: must be thrown away
    hub.ignore_range = True
    dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    assert hub.ranges[-1] == "bytes=5000-"  # we asked to resume, the server sent 200 instead
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
    assert not (folder / "model.safetensors.part").exists()


def test_complete_part_is_verified_and_renamed(hub, home):
    """A run that died between the last write and the rename: the server answers 416."""
    folder = home / "gpt2"
    folder.mkdir()
    (folder / "model.safetensors.part").write_bytes(WEIGHTS)
    dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    assert hub.ranges[-1] == f"bytes={len(WEIGHTS)}-"
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS


def test_unknown_name():
    with pytest.raises(ModelNotFoundError, match="gpt2-medium"):
        dl.download("gpt3", progress=False)
    with pytest.raises(ModelNotFoundError):
        dl.find_downloaded("gpt3")


def test_http_error_is_download_error(hub):
    hub.files.clear()
    with pytest.raises(DownloadError, match="HTTP 404"):
        dl.download("gpt2", base_url=hub.base, progress=False)


def test_unreachable_server(home):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DownloadError, match="could not reach .*check your connection"):
        dl.download("gpt2", base_url=f"http://127.0.0.1:{port}", progress=False)
    assert not (home / "gpt2" / "model.safetensors").exists()


def test_known_models_table():
    assert set(dl.KNOWN_MODELS) == {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}
    gpt2 = dl.KNOWN_MODELS["gpt2"]
    assert gpt2.repo == "openai-community/gpt2"
    assert gpt2.params == 124_439_808
    assert gpt2.sha256 == "248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707"
    assert gpt2.url(dl.HF_BASE, "config.json") == (
        "https://huggingface.co/openai-community/gpt2/resolve/main/config.json"
    )


def test_cli_run(hub, home, monkeypatch, capsys):
    monkeypatch.setenv("MINILLM_HF_BASE", hub.base)
    parser = argparse.ArgumentParser()
    dl.add_arguments(parser)
    args = parser.parse_args(["gpt2-medium"])  # no pinned hash, so the test file is accepted
    assert dl.run(args) == 0
    out = capsys.readouterr().out
    assert str(home / "gpt2-medium") in out
    assert 'minillm generate "Hello" --model gpt2-medium' in out
    with pytest.raises(SystemExit):
        parser.parse_args(["gpt3"])
