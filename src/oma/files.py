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
from collections.abc import Iterable
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


def user_path(value: str | os.PathLike) -> Path:
    """A path a user gave (a setting such as ``out_dir``, ``warm_start.cache_dir`` or ``policy.model``, or a flag
    such as ``--out``), read the one way every command reads it: a leading ``~`` is the home folder, as a shell
    would make it, so a preset's ``out_dir: ~/runs/x`` and the command line's ``out_dir=~/runs/x`` name one folder."""
    return Path(value).expanduser()


class OutputRefused(ValueError):
    """An output path that would land on an input or on a file the writer did not write; the message names the
    option, the file and what to do."""


def written_by(path: Path, marks: tuple[str, ...]) -> bool:
    """Whether the file ``path`` begins with one of ``marks``, the first characters each of oma's writers puts in
    the files it writes (``# oma audit: ``, ``# oma compare: ``, …): how a writer knows a file it may replace."""
    head = max(len(m) for m in marks)
    try:
        with open(path, "rb") as f:
            start = f.read(head).decode("utf-8", errors="replace")
    except OSError:
        return False
    return start.startswith(marks)


def _is_or_holds(outer: Path, path: Path) -> bool:
    """Whether ``path`` is ``outer`` (the same file, by any name) or lies inside the folder ``outer``."""
    try:
        if os.path.lexists(path) and os.path.exists(outer) and os.path.samefile(outer, path):
            return True
    except OSError:
        pass
    a, b = outer.resolve(), path.resolve()
    return a == b or a in b.parents


def check_outputs(option: str, main: Path, marks: tuple[str, ...], *, beside: Iterable[str] = (),
                  inputs: Iterable[Path] = (), owners: Iterable[str] = ()) -> None:
    """The one rule every writer of oma follows before it writes: the file ``main`` and the files named ``beside``
    in its folder (the PNGs of a report, …) are never one of the command's ``inputs`` (a file, or anything inside
    an input folder) and never an existing file the writer did not write. ``main`` is the writer's when it begins
    with one of ``marks`` (:func:`written_by`); a file beside it is the writer's when ``main``, or another of the
    writer's files named in ``owners`` in that folder, is (they were written together). Raises
    :class:`OutputRefused` naming ``option`` and the file; writes nothing."""
    targets = [main, *(main.parent / name for name in beside)]
    for target in targets:
        for source in inputs:
            if _is_or_holds(Path(source), target):
                raise OutputRefused(f"{option}: {target} is one of this command's inputs; give another path")
    if main.is_dir():
        raise OutputRefused(f"{option}: {main} is a folder; give a file name")
    ours = any(written_by(main.parent / name, marks) for name in (main.name, *owners))
    for target in targets:
        if os.path.lexists(target) and not (written_by(main, marks) if target == main else ours):
            raise OutputRefused(f"{option}: {target} exists and was not written by this command; give a new path, "
                                "or move the file away")
