"""One process at a time in a run folder: an OS lock (``flock``) on its ``.oma-run`` file.

:func:`oma.train.train` (so ``oma train``, fresh or ``--resume``, and every run of ``oma compare``) holds
the lock while it trains into the folder. The OS releases it when the process dies, ``kill -9``
included, so no stale lock is left to clear by hand. A second process is refused in one line naming the
holder, as the holder wrote itself into the file: two processes appending to one run would interleave
their metrics and checkpoints (docs/guarantees.md).
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from oma.errors import ConfigError

CLAIM = ".oma-run"
"""The run folder's claim and lock: created with O_EXCL by the trainer that claims a fresh folder
(``oma.train.cli.claim_run_dir``), locked by whichever process trains into it, and naming that process
(docs/training.md#run-directory)."""


class RunFolderInUse(ConfigError):
    """Another process holds the run folder; the message names it (pid, host, since when)."""


@contextmanager
def held(run_dir: Path, option: str = "out_dir") -> Iterator[None]:
    """``run_dir`` locked by this process for the block; :class:`RunFolderInUse` when another process (or
    another block of this one: a flock belongs to one open file) holds it, naming ``option``, the setting or
    flag that gave the folder (``oma compare`` locks its ``--out`` the same way)."""
    fd = os.open(run_dir / CLAIM, os.O_RDWR | os.O_CREAT, 0o666)  # 0666 & ~umask, as open() would
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderInUse(f"{option}: {run_dir} is in use by {holder(run_dir)}; wait for it to end (or end "
                                 f"it), or give another {option}") from None
        os.ftruncate(fd, 0)
        since = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {since}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def holder(run_dir: Path) -> str:
    """Who holds ``run_dir``, as its holder wrote it in ``.oma-run``."""
    try:
        text = (run_dir / CLAIM).read_text(errors="replace").strip()
    except OSError:
        text = ""
    return text or "another process (it has not written its name yet)"
