"""What ``oma verl-smoke`` and ``oma skyrl-smoke`` share: their argument checks, their work folder, and running
a host's trainer in a session of its own, so that the run and every process it starts (Ray's daemons and
workers, whatever process group they move to) are ended together, on success, failure or timeout."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path


class SmokeError(Exception):
    """A bad argument or a missing install; the message says how to fix it."""


def refused(prog: str, steps: int, timeout: int, check_install: Callable[[], None]) -> int | None:
    """2, with one line on stderr, for ``--steps`` or ``--timeout`` below 1 or a missing install (which
    ``check_install`` reports by raising :class:`SmokeError`); None when the run may go ahead."""
    try:
        if steps < 1:
            raise SmokeError(f"--steps must be ≥ 1, got {steps}")
        if timeout < 1:
            raise SmokeError(f"--timeout must be ≥ 1 second, got {timeout}")
        check_install()
    except SmokeError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    return None


class WorkFolder:
    """Where a smoke run writes its model, data and ``train.log``: ``--out`` (kept), or a temporary folder that is
    removed when the run ends (:func:`work_folder`), unless the run failed: then its log, which the JSON line
    names, is what explains the failure, and the folder stays for it."""

    def __init__(self, out: str | None, prefix: str) -> None:
        self.temporary = out is None
        self.path = Path(tempfile.mkdtemp(prefix=prefix)) if out is None else Path(out)
        self.path.mkdir(parents=True, exist_ok=True)
        self.keep = not self.temporary

    def settle(self, ok: bool, result: dict) -> None:
        """Keep the folder of a failed run; a run that succeeded in a temporary folder names no log in its JSON line
        (``result["log"]``), since the log goes with the folder."""
        if not ok:
            self.keep = True
        elif self.temporary:
            result["log"] = None


@contextlib.contextmanager
def work_folder(out: str | None, prefix: str) -> Iterator[WorkFolder]:
    """The run's :class:`WorkFolder`; a temporary one is removed after the block unless :meth:`WorkFolder.settle`
    kept it (an exception, Ctrl-C included, removes it too: an interrupted run explains nothing)."""
    folder = WorkFolder(out, prefix)
    try:
        yield folder
    finally:
        if not folder.keep:
            shutil.rmtree(folder.path, ignore_errors=True)


def session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` (Linux's /proc; empty elsewhere)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # after the command: state, ppid, process group, session
                members.append(int(stat.parent.name))
    return members


def end_session(sid: int, wait_s: float = 10.0) -> int:
    """SIGKILL every process of session ``sid``; returns how many are still alive after ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        members = session_members(sid)
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if not members or time.monotonic() > deadline:
            return len(members)
        time.sleep(0.2)


def run_in_session(cmd: list[str], env: dict[str, str], log: Path, timeout: int,
                   cwd: Path | None = None) -> tuple[int, int]:
    """Run ``cmd`` with stdout and stderr in ``log``, in a new session; then end whatever of the session is
    left. Returns (exit status, 124 on timeout; processes that could not be ended)."""
    with log.open("w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=cwd)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = 124
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            left = end_session(proc.pid)
    return rc, left
