"""Where minillm finds its files (package data, found through the package, never the cwd; the cache), and
the two ways it touches them: only regular files are read, and every file is written atomically."""

from __future__ import annotations

import errno
import glob
import os
import stat
import tempfile
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import IO, Iterator

from .errors import MiniLLMError


def package_weights_dir() -> Path:
    """The bundled `weights/` folder, installed as the `minillm.weights` package."""
    return Path(str(resources.files("minillm.weights")))


def package_lessons_dir() -> Path:
    """The `lessons/` folder, installed as the `minillm.lessons` package."""
    return Path(str(resources.files("minillm.lessons")))


def cache_dir() -> Path:
    """`$MINILLM_HOME`, else `~/.cache/minillm`: downloaded checkpoints and measured hardware figures."""
    home = os.environ.get("MINILLM_HOME")
    return expand_user(home) if home else expand_user("~") / ".cache" / "minillm"


def expand_user(path: str | os.PathLike) -> Path:
    """`Path(path).expanduser()`, with an unknown `~user` (or no home at all) a clear MiniLLMError."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise MiniLLMError(f"{path}: cannot find the home directory that {str(path).split('/')[0]} names; "
                           "give the full path") from None


# ------------------------------------------------------------------------------ reading and writing

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_a_regular_file(path: Path) -> str | None:
    """None if `path` is a regular file (after symlinks), else what it is instead, e.g. "is a FIFO (named
    pipe), not a regular file". Checked before opening: a FIFO would block, /dev/zero never ends."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "not found"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    except ValueError:                    # a NUL byte: no file can be named so
        return "cannot be read (the name holds a NUL byte, which no file name can)"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"is {kind}, not a regular file"


# ------------------------------------------------------------------------------ a model folder's files

MAX_NAME = 255            # bytes in a file name (Linux, macOS, Windows)


def name_problem(name) -> str | None:
    """None if `name` can be a file's name inside a folder, else why not: not text, empty, "." or "..",
    a path separator, a NUL or another control character, text the file system cannot encode, or over
    MAX_NAME bytes."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not text"
    if name in ("", ".", ".."):
        return "is not a file's name"
    if "/" in name or "\\" in name:
        return "holds a path separator: it names a file elsewhere, not one in the folder"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "holds a NUL or another control character, which no file's name in a checkpoint has"
    try:
        size = len(os.fsencode(name))
    except UnicodeError:
        return "holds characters no file name can (a lone surrogate)"
    if size > MAX_NAME:
        return f"is {size:,} bytes, longer than any file name ({MAX_NAME})"
    return None


def _hub_blob(real: str, home: str) -> bool:
    """Whether `real` is a blob of the Hugging Face hub cache whose snapshot folder is `home`
    (`models--org--name/snapshots/<rev>/config.json` links to `../../blobs/<sha>`): the one layout
    whose files live outside their folder, still inside the model's own cache entry."""
    snapshots = os.path.dirname(home)
    if os.path.basename(snapshots) != "snapshots":
        return False
    blobs = os.path.join(os.path.dirname(snapshots), "blobs")
    return os.path.dirname(real) == blobs


def folder_file(folder: Path, name, named_by: str = "", what: str = "file name") -> Path:
    """`folder / name`, for a file a model folder names (config, tokenizer, chat template, safetensors
    index and shards), checked to stay inside the folder: `name` a plain file name (`name_problem`), and
    the path, every symlink followed, inside the folder (itself after its own links), or a blob of the
    Hugging Face cache entry the folder is a snapshot of. One WeightsError line otherwise, so a link to
    /etc/passwd never reaches a prompt. `named_by`: the file that gave the name (an index), `what`
    the name is there ("shard name"). Whether the
    file exists, and is a regular file, is the reader's question (`not_a_regular_file`)."""
    from .errors import WeightsError
    folder = Path(folder)
    bad = name_problem(name)
    if bad is not None:
        raise WeightsError(f"{folder / named_by if named_by else folder}: {what} {printable_name(name)} {bad}; "
                           "re-download the checkpoint")
    path = folder / name
    try:
        home, real = os.path.realpath(folder), os.path.realpath(path)
    except (OSError, ValueError) as e:
        raise WeightsError(f"{path}: cannot be resolved ({e}); check the folder") from None
    if os.path.commonpath([home, real]) == home or _hub_blob(real, home):
        return FolderFile.of(path, home)
    problem = not_a_regular_file(path)
    if problem is not None and problem != "not found":
        raise WeightsError(f"{path}: {problem} (a link to {printable_name(real)}, outside the model's folder)")
    raise WeightsError(f"{path}: a link to {printable_name(real)}, outside the model's folder; minillm reads a "
                       "model's files only from inside its folder: copy the file in")


class FolderFile(type(Path())):
    """A path `folder_file` checked, which remembers its folder (`folder_real`, its real path): the
    reader checks again what it actually opened (`read_regular`), so a file swapped for a link
    between the check and the open is refused, never read."""

    folder_real = ""                  # set by `folder_file`; a path made from it (its parent) has none

    @classmethod
    def of(cls, path: Path, home: str) -> "FolderFile":
        p = cls(path)
        p.folder_real = home
        return p


def _opened_path(fd: int) -> str | None:
    """The real path of what descriptor fd is open on (Linux: /proc/self/fd; macOS: F_GETPATH), or None."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    try:
        import fcntl
        return fcntl.fcntl(fd, getattr(fcntl, "F_GETPATH"), b"\0" * 1024).split(b"\0", 1)[0].decode()
    except (ImportError, AttributeError, OSError, UnicodeDecodeError):
        return None


def _open_checked(path: Path) -> int:
    """A descriptor on path's file, opened once and then checked: not blocking (a FIFO), a regular file
    (fstat of the descriptor), and for a model folder's file (`FolderFile`) inside its folder by the
    descriptor's own real path. O_NOFOLLOW first: a link is followed only when the name is one (a hub
    snapshot's), and then what was opened is what is checked. One WeightsError line otherwise."""
    from .errors import WeightsError
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        try:
            fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.EMLINK):       # not "the name is a link"
                raise
            fd = os.open(path, flags)
    except FileNotFoundError:
        raise WeightsError(f"{path}: not found") from None
    except OSError as e:
        raise WeightsError(f"{path}: cannot be read ({e.strerror or e})") from None
    except ValueError:
        raise WeightsError(f"{path}: cannot be read (the name holds a NUL byte, which no file name can)") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise WeightsError(f"{path}: is {kind}, not a regular file")
        home = getattr(path, "folder_real", "")
        if home:
            real = _opened_path(fd)
            if real is None:                         # no way to ask the descriptor: its identity instead
                st, now = os.fstat(fd), os.stat(os.path.realpath(path))
                real = os.path.realpath(path) if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino) else "?"
            if not (os.path.commonpath([home, real]) == home or _hub_blob(real, home)):
                raise WeightsError(f"{path}: what was opened is {printable_name(real)}, outside the model's "
                                   "folder (the file changed since it was checked); minillm reads a model's "
                                   "files only from inside its folder")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def printable_name(name, limit: int = 60) -> str:
    """A file name for a message: quoted, control characters and NUL escaped, cut at `limit` characters."""
    text = repr(str(name)[:limit])
    return text + ("..." if len(str(name)) > limit else "")


TEMP_NAME_ROOM = 40      # bytes a temporary name adds to a file's own name (`.<name>.<pid>-<random>.tmp`)


def output_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """The path an output option names, checked before any work: a new name in an existing folder, or a
    regular file (replaced whole, atomically). A device node, a FIFO, a socket or a directory is
    refused, never replaced (`/dev/null` stays a device), and so is a name too long for the folder
    once the temporary name written first is added; each with one line."""
    path = expand_user(path)
    parent = path.parent
    try:
        name_max = os.pathconf(parent if parent.is_dir() else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    size = len(os.fsencode(path.name))
    if size + TEMP_NAME_ROOM > name_max:
        raise MiniLLMError(f"{flag} {str(path)[:60]}...: the file name is {size:,} bytes; this folder allows "
                           f"{name_max} and minillm writes a temporary name {TEMP_NAME_ROOM} bytes longer first: "
                           f"use a name of at most {name_max - TEMP_NAME_ROOM} bytes")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise MiniLLMError(f"{flag} {path}: cannot be checked ({e.strerror or e}); give another path") from None
    if mode is not None and not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise MiniLLMError(f"{flag} {path}: is {kind}, not a regular file, and minillm will not replace it; "
                           "give a new file name (or a regular file to overwrite)")
    if not parent.is_dir():
        raise MiniLLMError(f"{flag} {path}: folder {parent} does not exist; create it first")
    return path


def read_capped(path: Path, cap: int) -> bytes | None:
    """The bytes of a regular file, or None if it holds more than `cap` bytes (read no further)."""
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return None if len(data) > cap else data


def read_named_file(path: Path, cap: int, error: type, name: str, hint: str) -> bytes | None:
    """A file the user named (--prompt-file, --data): its bytes if it holds at most `cap` (None if more),
    else one `error` line naming it: not a regular file (with `hint`: what to give instead), unreadable."""
    problem = not_a_regular_file(path)
    if problem is not None:
        raise error(f"{name}: {problem}; {hint}")
    try:
        return read_capped(path, cap)
    except OSError as e:
        raise error(f"{name}: cannot be read ({e.strerror})") from None


MAX_JSON_BYTES = 1 << 24   # 16 MiB: the largest config or tokenizer JSON minillm reads (Qwen3's tokenizer.json: 11 MB)


def read_regular(path: Path, how_much, hint: str = "") -> tuple[int, bytes]:
    """(size, its first how_much(size) bytes) of a regular file, opened once; one WeightsError line
    for a path that is not a readable regular file (`hint`: what to pass instead)."""
    from .errors import WeightsError
    problem = not_a_regular_file(path)
    if problem is not None:
        raise WeightsError(f"{path}: {problem}" + (f"; {hint}" if hint else ""))
    fd = _open_checked(path)         # what is read is what was checked: the descriptor, not the name again
    try:
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return size, f.read(how_much(size))
    except OSError as e:
        raise WeightsError(f"{path}: cannot be read ({e.strerror or e})") from None


def read_text_capped(path: Path, cap: int, what: str) -> str:
    """A regular file's UTF-8 text, read only if it holds at most `cap` bytes: one line naming the
    file, its size and the cap otherwise (checked before reading: a 40 MB tokenizer.json costs nothing)."""
    from .errors import ConfigError
    size, raw = read_regular(path, lambda size: size + 1 if size <= cap else 0)   # no cap-sized buffer
    if size > cap or len(raw) > cap:
        raise ConfigError(f"{path}: {max(size, len(raw)):,} bytes, over the {cap:,}-byte cap for {what}; "
                          "is it the right file?")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start:,}); re-download it") from None


def read_json(path: Path, cap: int = MAX_JSON_BYTES, what: str = "a JSON file") -> dict:
    """A JSON object from a regular file of at most `cap` bytes; one line naming the file otherwise."""
    import json
    from .errors import ConfigError
    text = read_text_capped(path, cap, what)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"{path}: not valid JSON ({str(e)[:80]}); re-download the checkpoint") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def _stale_temps(path: Path) -> None:
    """Remove temporary files of `path` left by a writer that was killed (its process is gone)."""
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid = tmp.name[len(path.name) + 2:].partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True          # it exists but belongs to someone else
    return True


@contextmanager
def atomic_write(path: str | os.PathLike, text: bool = False) -> Iterator[IO]:
    """Write `path` all at once or not at all: yield a file open on `.<name>.<pid>-<random>.tmp` beside it;
    when the block ends it is flushed to disk and renamed over `path` in one step. On any failure,
    Ctrl-C included, the temporary file is deleted and `path` is left as it was; one left by a killed
    writer is removed by the next write to the same path."""
    path = Path(path)
    _stale_temps(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w" if text else "wb", **({"encoding": "utf-8"} if text else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)        # mkstemp makes it owner-only; these files are ordinary data
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
