"""File utilities every layer shares: atomic text writes, file digests, JSON Lines records, permissions.

Low-level on purpose (the standard library only), so that :mod:`oma.train`, :mod:`oma.experiments` and
:mod:`oma.diagnostics` write and read run folders the same way without importing one another.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import zlib
from pathlib import Path


def umask() -> int:
    """The process's umask, read without changing it where the OS allows (Linux's ``/proc``): setting it
    and setting it back, the only portable way, leaves other threads a moment with umask 0."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give ``path`` and everything under it the permissions a plain ``open`` or ``mkdir`` would have
    (0644 and 0755 under umask 022). Temporary-then-rename writers need it: ``tempfile.mkstemp`` and
    ``mkdtemp`` create 0600 and 0700 whatever the umask, and so do safetensors' own temporary files."""
    mask = umask()
    for p in [path, *(path.rglob("*") if path.is_dir() else ())]:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``; the file's
    permissions follow the umask, as a plain ``open`` would give it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, as a checkpoint's ``state.json`` records each of its tensor files' (read
    in chunks: a model's weights can be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        # by hand rather than hashlib.file_digest, which is Python >= 3.11 (this module runs on 3.10 too)
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_json_object(path: str | os.PathLike) -> dict:
    """The JSON object a file holds (``config.json``, ``summary.json``, ``compare.json``, …).

    FileNotFoundError when there is none; ValueError naming the file and what is wrong when it is cut short
    or otherwise not JSON, not UTF-8, or holds a JSON value that is not an object.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        why = f"byte {e.start} is not UTF-8"
    except json.JSONDecodeError as e:
        why = f"{e.msg}: line {e.lineno}, column {e.colno}"
    else:
        if isinstance(value, dict):
            return value
        why = f"a JSON {type(value).__name__}, not an object"
    raise ValueError(f"{path} is damaged ({why})")


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON Lines file, one object per non-blank line, in order.

    Where ``path`` does not exist but its gzip-compressed sibling ``path + ".gz"`` does, that is read
    instead, so a finished run whose ``metrics.jsonl`` was compressed to save space reads the same.
    FileNotFoundError when neither exists; ValueError naming the file (and the line) when it is not
    whole gzip or UTF-8 text, or a line is not a JSON object.
    """
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    if not path.exists() and packed.is_file():
        path = packed
    try:
        data = path.read_bytes()
        text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # not gzip, damaged, or cut short
        raise ValueError(f"{path}: not a whole gzip file ({e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: byte {e.start} is not UTF-8 text") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n} is not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {n} is a JSON {type(record).__name__}, not an object")
            records.append(record)
    return records
