"""File utilities every layer shares: atomic text writes, file digests, JSON Lines records.

Low-level on purpose (the standard library only), so that :mod:`oma.train`, :mod:`oma.experiments` and
:mod:`oma.diagnostics` write and read run folders the same way without importing one another.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes, as a checkpoint's ``state.json`` records each of its tensor files'."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of a JSON Lines file, one object per non-blank line, in order.

    Where ``path`` does not exist but its gzip-compressed sibling ``path + ".gz"`` does, that is read
    instead, so a finished run whose ``metrics.jsonl`` was compressed to save space reads the same.
    FileNotFoundError when neither exists; ValueError naming the file and line when a line is not JSON.
    """
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    if not path.exists() and packed.is_file():
        path = packed
        with gzip.open(path, "rt", encoding="utf-8") as f:
            text = f.read()
    else:
        text = path.read_text(encoding="utf-8")
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n} is not JSON ({e.msg})") from None
    return records
