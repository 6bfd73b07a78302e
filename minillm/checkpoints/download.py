"""Download GPT-2 checkpoints from the Hugging Face Hub, with resume and a SHA-256 check.

Each model is two files from `openai-community/<name>`: `config.json` (the hyper-parameters) and
`model.safetensors` (the weights). A file is streamed into `<file>.part`, and only renamed to its
final name once it is complete and its SHA-256 matches. So:

* a file at the final path is always whole (a crash can leave a `.part`, never a half-written
  `model.safetensors`), and the folder counts as downloaded only once `.verified` is written, after
  the checks: the pinned SHA-256 where one is known, else the server's size, a complete transfer,
  and a file that reads as safetensors beside this model's config.json;
* an interrupted download resumes: the next run asks the server for the rest only
  (`Range: bytes=<size of .part>-`) and hashes the old bytes plus the new ones.

Only the standard library (`urllib`) talks to the network; `rich` draws the progress bar.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from ..checkpoints.checkpoint import read_config
from ..checkpoints.safetensors import read_header
from ..models.gpt2 import GPT2_SIZES
from ..errors import DownloadError, MiniLLMError, ModelNotFoundError, SafetensorsError
from ..paths import atomic_write, cache_dir, expand_user

HF_BASE = "https://huggingface.co"  # overridden by $MINILLM_HF_BASE, then by `base_url=`
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"

CHUNK = 1 << 20  # read and hash 1 MiB at a time: the file never has to fit in memory
TIMEOUT_S = 30.0  # give up on a connect or a read that stalls this long


@dataclass(frozen=True)
class ModelInfo:
    """What minillm knows about a downloadable checkpoint before fetching it."""

    name: str  # what the user types: "gpt2", "gpt2-medium", ...
    repo: str  # the Hugging Face repository, "openai-community/gpt2"
    preset: str  # the key in `config.GPT2_SIZES` with the same shape ("124m", ...)
    params: int  # parameter count (tied LM head counted once)
    size: int | None = None  # bytes of model.safetensors, when known
    sha256: str | None = None  # SHA-256 of model.safetensors, when known

    def url(self, base: str, file: str) -> str:
        """Where `file` of this model lives on a Hugging Face-style server at `base`."""
        return f"{base.rstrip('/')}/{self.repo}/resolve/main/{file}"


def _info(name: str, preset: str, size: int | None = None, sha256: str | None = None) -> ModelInfo:
    return ModelInfo(name, f"openai-community/{name}", preset, GPT2_SIZES[preset].n_params(), size, sha256)


KNOWN_MODELS: dict[str, ModelInfo] = {
    "gpt2": _info(
        "gpt2", "124m", size=548_105_171,
        sha256="248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707",
    ),
    # No published hash could be found for the larger ones (the hub was out of reach): a download of
    # these must have its size stated by the server, arrive whole, and read as a safetensors file whose
    # config.json is this model's; its SHA-256 is printed, so that it can be pinned here.
    "gpt2-medium": _info("gpt2-medium", "355m"),
    "gpt2-large": _info("gpt2-large", "774m"),
    "gpt2-xl": _info("gpt2-xl", "1558m"),
}


def model_info(name: str) -> ModelInfo:
    """The `ModelInfo` for `name`, or `ModelNotFoundError` listing the names minillm knows."""
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise ModelNotFoundError(
            f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}"
        ) from None


VERIFIED = ".verified"  # written last, once every check passed: without it a folder is not "downloaded"


def find_downloaded(name: str) -> Path | None:
    """The cache folder holding model `name`, verified, or None if it is not (fully) downloaded.

    Only a folder whose files passed `download`'s checks counts: a leftover `.part`, or files that
    were never verified, mean the download is unfinished.
    Raises `ModelNotFoundError` for a name that is not in `KNOWN_MODELS`.
    """
    model_info(name)
    folder = cache_dir() / name
    return folder if _is_verified(folder) else None


def _is_verified(folder: Path) -> bool:
    try:
        mark = json.loads((folder / VERIFIED).read_text())
        return (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).stat().st_size == mark["size"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def download(
    name: str,
    directory: str | os.PathLike | None = None,
    *,
    base_url: str | None = None,
    progress: bool = True,
    expected_sha256: str | None = None,
) -> Path:
    """Fetch `config.json` and `model.safetensors` of model `name`; return the folder holding them.

    directory: where to put the files; default `cache_dir() / name` (`$MINILLM_HOME/<name>`).
    base_url: the server; default `$MINILLM_HF_BASE`, else https://huggingface.co.
    progress: draw a progress bar (bytes, speed, ETA) on stderr.
    expected_sha256: the weights' hash, overriding the one in `KNOWN_MODELS` (tests use this). When
        no hash is known at all, the server must say the file's size, the file must arrive whole and
        read as safetensors, and its hash is printed.

    A folder is done once its `.verified` mark is written, after the checks. Raises `DownloadError`
    when the network fails (re-running resumes from the `.part`) or a check fails (the bad file is
    deleted).
    """
    info = model_info(name)
    base = base_url or os.environ.get("MINILLM_HF_BASE") or HF_BASE
    target = expand_user(directory) if directory is not None else cache_dir() / name
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"{target}: cannot make the download folder there ({e.strerror}); "
                            "choose another with --dir or $MINILLM_HOME") from None

    # The known size belongs to the known hash: a caller's own hash means a different file.
    sha256 = expected_sha256 or info.sha256
    size = info.size if expected_sha256 is None else None

    if _is_verified(target):
        _say(f"{name} is already downloaded in {target}; delete its files to download again")
        return target
    fetch_file(info.url(base, CONFIG_FILE), target / CONFIG_FILE, progress=False)
    _check_config(info, target / CONFIG_FILE)
    digest = fetch_file(
        info.url(base, WEIGHTS_FILE), target / WEIGHTS_FILE,
        expected_sha256=sha256, expected_size=size, progress=progress,
    )
    weights = target / WEIGHTS_FILE
    if digest is None:                     # there from an earlier run, never verified: verify it now
        digest = _verify(weights, str(weights), None, size, sha256)
    try:
        read_header(weights)               # an HTML error page or a damaged header stops here
    except SafetensorsError as e:
        weights.unlink()
        raise DownloadError(f"{e}; deleted it, re-run to download it again") from None
    with atomic_write(target / VERIFIED, text=True) as f:
        json.dump({"sha256": digest, "size": weights.stat().st_size, "pinned": sha256 is not None}, f)
    if sha256 is None:
        _say(f"{WEIGHTS_FILE}: no published SHA-256 is pinned for {name}; checked instead: the size the server "
             f"gave, the whole transfer, the safetensors structure and config.json (a changed byte inside the "
             f"weights cannot be caught that way). Its SHA-256: {digest}")
    return target


def _check_config(info: ModelInfo, path: Path) -> None:
    """config.json must be this model's: an error page, or another model's config, is deleted."""
    want = GPT2_SIZES[info.preset]
    try:
        got = read_config(path)
        problem = None if (got.n_layer, got.n_head, got.n_embd, got.vocab_size) == \
            (want.n_layer, want.n_head, want.n_embd, want.vocab_size) else \
            f"is for a {got.n_layer}-layer, width-{got.n_embd} model, not {info.name}"
    except MiniLLMError as e:
        problem = f"is not a GPT-2 config ({e})"
    if problem:
        path.unlink()
        raise DownloadError(f"{path}: {problem}; deleted it, re-run to download it again")


def fetch_file(
    url: str,
    final: Path,
    *,
    expected_sha256: str | None = None,
    expected_size: int | None = None,
    progress: bool = True,
) -> str | None:
    """Download `url` to `final` through `final.part`, resuming a `.part` left by an earlier run.

    The steps: (1) ask for the bytes we do not have yet; (2) append them to `.part`; (3) check the
    length, and the SHA-256 over the whole file; (4) rename `.part` to `final` in one step
    (`os.replace`), so `final` only ever appears whole.

    Returns the file's SHA-256, or None when `final` already existed (then nothing is fetched).
    """
    if final.exists():
        return None
    part = final.with_name(final.name + ".part")
    have = part.stat().st_size if part.exists() else 0

    response, total = _open(url, have)
    if response is None:
        # 416 Range Not Satisfiable: we asked for bytes past the end, so the .part should already
        # hold the whole file (the last run stopped between the final write and the rename).
        total = have if total is None else total
    else:
        with response:
            have, total = _start_offset(response, url, part, have)
            if total is None and expected_sha256 is None and expected_size is None and final.suffix != ".json":
                raise DownloadError(f"{url}: the server did not say how big the file is, and no hash is pinned "
                                    "for it: it could not be verified; try again later")
            try:
                out = open(part, "ab" if have else "wb")
            except OSError as e:
                raise DownloadError(f"{part}: cannot be written ({e.strerror}); choose another --dir") from None
            try:
                with out:
                    _stream(response, out, url, have, total, final.name, progress)
            except OSError as e:                                # disk full: the .part keeps what it has
                raise DownloadError(f"{part}: cannot write ({e.strerror}); free some space, "
                                    "then re-run to resume") from None

    digest = _verify(part, url, total, expected_size, expected_sha256)
    os.replace(part, final)
    return digest


def _open(url: str, have: int) -> tuple[http.client.HTTPResponse | None, int | None]:
    """Send the GET (with `Range` when resuming): `(response, None)`.

    On 416 Range Not Satisfiable, `(None, file size from "Content-Range: bytes */<size>" or None)`.
    """
    headers = {"User-Agent": "minillm"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        request = urllib.request.Request(url, headers=headers)
        return urllib.request.urlopen(request, timeout=TIMEOUT_S), None
    except ValueError as e:                # not a URL at all: "unknown url type"
        raise DownloadError(f"{url}: not a usable URL ({e}); check $MINILLM_HF_BASE") from None
    except urllib.error.HTTPError as e:  # the server answered, but not with the file
        e.close()
        if e.code == 416 and have:
            size = (e.headers.get("Content-Range") or "").removeprefix("bytes */")
            return None, int(size) if _DIGITS.fullmatch(size) else None
        hint = "; is the model name right?" if e.code == 404 else "; try again later"
        raise DownloadError(f"{url}: server answered HTTP {e.code} {e.reason}{hint}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:  # no answer at all
        reason = getattr(e, "reason", None) or e
        raise DownloadError(
            f"could not reach {url}: {reason}; check your connection, re-run to resume"
        ) from None


def _start_offset(response: http.client.HTTPResponse, url: str, part: Path, have: int) -> tuple[int, int | None]:
    """Where the response body starts in the file, and the file's total size (None if not said).

    206 Partial Content: the server honoured our Range, the body continues the `.part`.
    200 OK: the server sent the whole file (it ignored the Range, or we sent none): start over.
    """
    length = _number(response.headers.get("Content-Length"), url, "Content-Length")
    if response.status != 206:
        if have:
            _say(f"{part.name}: the server does not resume downloads; starting over")
        return 0, length
    # Content-Range: bytes <first>-<last>/<total or *>, in ASCII digits (int() would also take "-5", "1_0", "²")
    content_range = response.headers.get("Content-Range", "")
    match = _CONTENT_RANGE.fullmatch(content_range)
    if match is None:
        raise DownloadError(f"{url}: bad Content-Range {content_range!r} in a 206 answer; try again later")
    first = int(match["first"])
    total = None if match["total"] == "*" else int(match["total"])
    if first != have:
        part.unlink()
        raise DownloadError(
            f"{url}: asked to resume at byte {have}, the server sent from byte {first}; "
            "deleted the partial file, re-run to start over"
        )
    if total is not None:
        return have, total
    return have, have + length if length is not None else None


_DIGITS = re.compile(r"[0-9]+")
_CONTENT_RANGE = re.compile(r"bytes (?P<first>[0-9]+)-(?P<last>[0-9]+)/(?P<total>[0-9]+|\*)")


def _number(value: str | None, url: str, header: str) -> int | None:
    """A header's non-negative integer in ASCII digits, None if absent; anything else is the server's fault."""
    if value is None:
        return None
    if not _DIGITS.fullmatch(value.strip()):       # str.isdigit() also takes "²", which int() refuses
        raise DownloadError(f"{url}: bad {header} {value[:40]!r} from the server; try again later")
    return int(value)


def _stream(
    response: http.client.HTTPResponse, out: BinaryIO, url: str, have: int, total: int | None,
    label: str, progress: bool,
) -> None:
    """Copy the response body to `out` in chunks, advancing the progress bar."""
    with _progress_bar(label, have, total, progress) as advance:
        done = have
        while True:
            try:
                chunk = response.read(CHUNK)
            except (OSError, http.client.HTTPException) as e:  # reset, timeout, broken chunking
                out.flush()
                raise DownloadError(_stopped(url, done, total, e)) from None
            if not chunk:
                break
            out.write(chunk)                                    # an OSError here: see fetch_file
            done += len(chunk)
            advance(len(chunk))
    if total is not None and done < total:  # the server closed the connection early
        raise DownloadError(_stopped(url, done, total, "connection closed early"))


def _stopped(url: str, done: int, total: int | None, reason: object) -> str:
    of_total = f" of {total:,}" if total is not None else ""
    return (
        f"could not reach {url}: {reason} after {done:,}{of_total} bytes; "
        "check your connection, re-run to resume"
    )


def _verify(part: Path, url: str, total: int | None, expected_size: int | None, expected_sha256: str | None) -> str:
    """Check the finished `.part`: its length, then its SHA-256 over every byte. Returns the hash.

    A wrong file is deleted: resuming it could never fix it.
    """
    size = part.stat().st_size
    want = expected_size if expected_size is not None else total
    if want is not None and size != want:
        part.unlink()
        raise DownloadError(
            f"{url}: got {size:,} bytes, expected {want:,}; deleted the partial file, re-run to start over"
        )
    digest = _sha256(part)
    if expected_sha256 is not None and digest != expected_sha256.lower():
        part.unlink()
        raise DownloadError(
            f"{url}: SHA-256 mismatch: expected {expected_sha256.lower()}, found {digest}; "
            "deleted the download, re-run to fetch it again"
        )
    return digest


def _sha256(path: Path) -> str:
    """The SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def _progress_bar(label: str, done: int, total: int | None, enabled: bool) -> Iterator:
    """Yield `advance(n)`: a rich bar with bytes, speed and ETA, or a no-op when disabled."""
    if not enabled:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn,
    )

    columns = (
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
        TransferSpeedColumn(), TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task(label, total=total, completed=done)
        yield lambda n: bar.advance(task, n)


def _say(message: str) -> None:
    """Status lines go to stderr, so stdout keeps only the command's result."""
    print(message, file=sys.stderr)
