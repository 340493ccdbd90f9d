"""What ``oma verl-smoke`` and ``oma skyrl-smoke`` share: their argument checks, their work folder, and running
a host's trainer in a session of its own, so that the run and every process it starts (Ray's daemons and
workers, whatever process group they move to) are ended together, on success, failure, timeout or Ctrl-C.

If the smoke command itself is killed (SIGTERM, SIGKILL: no ``finally`` of it runs), its :class:`Guardian`, a
small process that outlives it, ends the run's session and removes its temporary work folder.
"""

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


class Guardian:
    """A process that cleans up after this one however it ends: it holds the read end of a pipe whose write end
    only this process has, so it reads end-of-file when this process is gone, ``kill -9`` included; then it ends
    every session and removes every folder it was told of and not told to forget (:func:`_guard`). Started
    on first use, one per process, in a session of its own with SIGINT, SIGTERM and SIGHUP ignored, so a Ctrl-C
    or a signal to this process's group leaves it to do its work."""

    _process: subprocess.Popen | None = None

    @classmethod
    def tell(cls, order: str, value: object) -> None:
        """Send ``order`` (``+session``, ``-session``, ``+folder``, ``-folder``) with ``value`` to the guardian."""
        cls.start()
        cls._process.stdin.write(f"{order} {value}\n")
        cls._process.stdin.flush()

    @classmethod
    def start(cls) -> None:
        """Start the guardian unless it runs."""
        if cls._process is None or cls._process.poll() is not None:
            root = str(Path(__file__).resolve().parents[2])  # the oma this process runs, whatever its sys.path
            code = f"import sys; sys.path.insert(0, {root!r}); from oma.integrations.smoke_run import _guard; _guard()"
            cls._process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, text=True,
                                            start_new_session=True, stdout=subprocess.DEVNULL)

    @classmethod
    def pid(cls) -> int | None:
        return None if cls._process is None else cls._process.pid


def _guard() -> None:
    """The :class:`Guardian`'s process: read orders until this process's parent closes the pipe (it ended), then
    end the sessions and remove the folders still in its care."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    sessions: set[int] = set()
    folders: set[str] = set()
    for line in sys.stdin:
        order, _, value = line.rstrip("\n").partition(" ")
        if order in ("+session", "-session"):
            (sessions.add if order[0] == "+" else sessions.discard)(int(value))
        elif order in ("+folder", "-folder"):
            (folders.add if order[0] == "+" else folders.discard)(value)
    for sid in sessions:
        end_session(sid)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def interrupted(prog: str) -> int:
    """Ctrl-C of a smoke command, once its run and work folder are cleaned up: one line, exit status 130."""
    print(f"{prog}: interrupted; the run and every process it started were ended", file=sys.stderr)
    return 130


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
    if folder.temporary:
        Guardian.tell("+folder", folder.path)  # removed by the guardian if this process is killed
    try:
        yield folder
    finally:
        if not folder.keep:
            shutil.rmtree(folder.path, ignore_errors=True)
        if folder.temporary:
            Guardian.tell("-folder", folder.path)


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
    Guardian.start()  # before the run: between its start and the order below, a kill leaves it at most microseconds
    with log.open("w", encoding="utf-8") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=cwd)
        try:
            Guardian.tell("+session", proc.pid)  # ended by the guardian if this process is killed
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = 124
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            left = end_session(proc.pid)
            Guardian.tell("-session", proc.pid)
    return rc, left
