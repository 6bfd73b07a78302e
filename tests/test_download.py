"""`minillm.checkpoints.download` against a local HTTP server on 127.0.0.1: success, bad hash, resume, no network."""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from minillm.checkpoints import download as dl
from minillm.cli import download as download_cli
from minillm.models.gpt2 import GPT2_SIZES
from minillm.checkpoints.safetensors import write_safetensors
from minillm.errors import DownloadError, ModelNotFoundError

def _safetensors_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        write_safetensors(Path(d) / "w.safetensors", {"w": np.arange(75_001, dtype=np.float32)})
        return (Path(d) / "w.safetensors").read_bytes()


WEIGHTS = _safetensors_bytes()  # ~300 KB, not a multiple of the 1 MiB chunk; a real safetensors file
WEIGHTS_SHA = hashlib.sha256(WEIGHTS).hexdigest()


def config_of(name: str) -> bytes:
    return json.dumps(GPT2_SIZES[dl.KNOWN_MODELS[name].preset].to_hf()).encode()


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
            self.files[f"/openai-community/{name}/resolve/main/config.json"] = config_of(name)
            self.files[f"/openai-community/{name}/resolve/main/model.safetensors"] = WEIGHTS
        self.cut_after: int | None = None
        self.ignore_range = False
        self.ranges: list[str | None] = []
        self.length_header: str | None = None  # the weights' Content-Length as sent ("" for none)
        self.range_header: str | None = None   # the Content-Range of a 206 or 416 answer as sent, if not the true one

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
                self.send_header("Content-Range", f"bytes */{len(body)}"
                                 if self.server.range_header is None else self.server.range_header)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}"
                             if self.server.range_header is None else self.server.range_header)
        else:
            self.send_response(200)
        rest = body[start:]
        length = self.server.length_header if self.path.endswith(".safetensors") else None
        if length != "":                                 # "" sends no Content-Length at all
            self.send_header("Content-Length", length or str(len(rest)))
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
    assert (folder / "config.json").read_bytes() == config_of("gpt2")
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
    download_cli.add_arguments(parser)
    args = parser.parse_args(["gpt2-medium"])  # no pinned hash, so the test file is accepted
    assert download_cli.run(args) == 0
    out = capsys.readouterr().out
    assert str(home / "gpt2-medium") in out
    assert 'minillm generate "Hello" --model gpt2-medium' in out
    with pytest.raises(SystemExit):
        parser.parse_args(["gpt3"])


# ------------------------------------------------------------- files that are not what they claim


def weights_url(name: str) -> str:
    return f"/openai-community/{name}/resolve/main/model.safetensors"


@pytest.mark.parametrize("bad", ["html", "truncated header", "flipped header byte"])
def test_unpinned_bad_weights_are_never_downloaded(hub, home, capsys, bad):
    hub.files[weights_url("gpt2-medium")] = {
        "html": b"<!DOCTYPE html><html><body>Sign in</body></html>",
        "truncated header": WEIGHTS[:40],
        "flipped header byte": WEIGHTS[:20] + b"}" + WEIGHTS[21:],
    }[bad]
    for _ in range(2):                                   # and a rerun does not call it downloaded either
        with pytest.raises(DownloadError, match="deleted it"):
            dl.download("gpt2-medium", base_url=hub.base, progress=False)
        assert dl.find_downloaded("gpt2-medium") is None
        assert "already downloaded" not in capsys.readouterr().err
        assert not (home / "gpt2-medium" / "model.safetensors").exists()


def test_unpinned_download_says_no_hash_is_pinned_and_marks_it_verified(hub, home, capsys):
    folder = dl.download("gpt2-medium", base_url=hub.base, progress=False)
    assert "no published SHA-256 is pinned" in capsys.readouterr().err
    assert dl.find_downloaded("gpt2-medium") == folder
    (folder / dl.VERIFIED).unlink()                      # files without the mark are not downloaded
    assert dl.find_downloaded("gpt2-medium") is None


def test_a_config_that_is_not_the_models_is_refused(hub, home):
    hub.files["/openai-community/gpt2-large/resolve/main/config.json"] = b"<html>502 Bad Gateway</html>"
    with pytest.raises(DownloadError, match="not a GPT-2 config"):
        dl.download("gpt2-large", base_url=hub.base, progress=False)
    hub.files["/openai-community/gpt2-large/resolve/main/config.json"] = config_of("gpt2")
    with pytest.raises(DownloadError, match="12-layer, width-768 model, not gpt2-large"):
        dl.download("gpt2-large", base_url=hub.base, progress=False)
    assert dl.find_downloaded("gpt2-large") is None


def test_files_left_unverified_are_verified_before_they_count(hub, home):
    folder = home / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_bytes(config_of("gpt2"))
    (folder / "model.safetensors").write_bytes(WEIGHTS[:-1] + b"X")    # whole-looking, but wrong
    with pytest.raises(DownloadError, match="SHA-256 mismatch"):
        dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    assert dl.find_downloaded("gpt2") is None


@pytest.mark.parametrize("length, words", [("", "did not say how big"), ("12abc", "bad Content-Length '12abc'"),
                                           ("\xb2", "bad Content-Length '\xb2'")])
def test_unpinned_weights_need_a_size_from_the_server(hub, length, words):
    hub.length_header = length
    with pytest.raises(DownloadError, match=words):
        dl.download("gpt2-xl", base_url=hub.base, progress=False)


def test_a_bad_base_url_or_folder_is_a_download_error(hub, home, tmp_path):
    with pytest.raises(DownloadError, match="not a usable URL"):
        dl.download("gpt2", base_url="nowhere", progress=False)
    (tmp_path / "file").write_text("x")
    for folder in (tmp_path / "file", tmp_path / "file" / "sub", "/proc/minillm"):
        with pytest.raises(DownloadError, match="cannot make the download folder"):
            dl.download("gpt2", folder, base_url=hub.base, progress=False)


def test_disk_full_keeps_the_part_and_says_so(hub, home, monkeypatch):
    monkeypatch.setattr(dl, "open", lambda *a, **k: open("/dev/full", "wb"), raising=False)
    with pytest.raises(DownloadError, match="cannot write .No space left on device."):
        dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)


LAST = len(WEIGHTS) - 1


@pytest.mark.parametrize("content_range", [
    "bytes abc-def/xyz", f"bytes 100000-{LAST}/lots", "kilobytes", f"bytes 100000-{LAST}/{LAST + 1}/1", "",
    f"bytes 100000-{LAST}/-5",
    f"bytes \xb2-{LAST}/{LAST + 1}", f"bytes 100000-{LAST}/\xb2",
])
def test_a_resume_answer_with_a_bad_content_range_is_refused_and_the_part_kept(hub, home, content_range):
    """A 206 whose Content-Range is not `bytes <digits>-<digits>/<digits or *>`: one DownloadError naming
    the header, and the partial file kept as it was, so a later run can still resume it."""
    hub.cut_after = 100_000
    with pytest.raises(DownloadError, match="re-run to resume"):
        dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    part = home / "gpt2" / "model.safetensors.part"
    assert part.read_bytes() == WEIGHTS[:100_000]
    hub.cut_after, hub.range_header = None, content_range
    with pytest.raises(DownloadError) as e:
        dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    assert f"bad Content-Range {content_range!r} in a 206 answer" in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert hub.ranges[-1] == "bytes=100000-"
    assert part.read_bytes() == WEIGHTS[:100_000]
    assert not (home / "gpt2" / "model.safetensors").exists() and dl.find_downloaded("gpt2") is None
    hub.range_header = None                                 # a good answer now resumes it
    dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    assert (home / "gpt2" / "model.safetensors").read_bytes() == WEIGHTS


@pytest.mark.parametrize("content_range", ["bytes */lots", "bytes */\xb2", "bytes */-5", ""])
def test_a_finished_part_answered_416_with_a_bad_content_range_is_still_verified(hub, home, content_range):
    """The 416 that says a .part is already whole: a size that is not digits is ignored (never a traceback),
    and the file is verified by its hash as usual."""
    folder = home / "gpt2"
    folder.mkdir()
    (folder / "model.safetensors.part").write_bytes(WEIGHTS)
    hub.range_header = content_range
    dl.download("gpt2", base_url=hub.base, progress=False, expected_sha256=WEIGHTS_SHA)
    assert hub.ranges[-1] == f"bytes={len(WEIGHTS)}-"
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
