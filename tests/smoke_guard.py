"""A smoke command (`oma verl-smoke`, `oma skyrl-smoke`) run as the command line runs it, whose host trainer is a
cheap stand-in that starts grandchildren (one in a process group of its own, as Ray's daemons move to), then
stopped by a signal: what its tests check is that nothing of the run outlives it (#69 item 3).

Only the host's trainer is replaced: the command's own main, its work folder, its session and its guardian
(:mod:`oma.integrations.smoke_run`) are the real ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import os, subprocess, sys, time
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
kids = [subprocess.Popen(sleep), subprocess.Popen(sleep), subprocess.Popen(sleep, preexec_fn=os.setpgrp)]
with open(os.environ["SMOKE_GUARD_PIDS"], "a") as f:
    f.write("".join(f"{p}\\n" for p in [os.getpid(), *(k.pid for k in kids)]))
time.sleep(600)
"""

DRIVER = """
import importlib, os, sys, tempfile
from oma.integrations import smoke_run
from oma.cli import main

command, module, inputs = sys.argv[1:4]
tempfile.tempdir = os.environ["SMOKE_GUARD_TMP"]  # where the work folder is made
smoke = importlib.import_module(module)
smoke.check_install = lambda: None
setattr(importlib.import_module(inputs), "build_inputs", lambda work: None)
real = smoke_run.run_in_session

def stand_in(cmd, env, log, timeout, cwd=None):
    with open(os.environ["SMOKE_GUARD_PIDS"], "a") as f:
        f.write(f"{smoke_run.Guardian.pid()}\\n")
    return real([sys.executable, "-c", os.environ["SMOKE_GUARD_CHILD"]], env, log, timeout, cwd)

smoke.run_in_session = stand_in
sys.exit(main([command, "--steps", "1"]))
"""


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie has: it runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def stop_smoke(tmp_path: Path, command: str, module: str, inputs: str, sig: int) -> tuple[int, str, list[int], Path]:
    """Run ``oma COMMAND`` with the stand-in trainer until its run and grandchildren are up, send it ``sig``, and
    return (its exit status, its stderr, the pids of the guardian, the run and the grandchildren, the folder the work
    folder was made in), after waiting (at most 60 s) for those processes to end. Whatever is still alive then
    is killed by its id, so a failing test leaves nothing behind either."""
    tmp, pids_file = tmp_path / "tmp", tmp_path / "pids"
    tmp.mkdir()
    env = {**os.environ, "SMOKE_GUARD_TMP": str(tmp), "SMOKE_GUARD_PIDS": str(pids_file), "SMOKE_GUARD_CHILD": CHILD}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, command, module, inputs], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while len(pids) < 5 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = [int(x) for x in pids_file.read_text().split()] if pids_file.exists() else []
        assert len(pids) == 5, f"the stand-in run did not start: {driver.poll()=}, {pids=}"
        driver.send_signal(sig)
        _, err = driver.communicate(timeout=120)
        deadline = time.monotonic() + 60
        while not all(gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        return driver.returncode, err, [p for p in pids if not gone(p)], tmp
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for p in pids:
            if not gone(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
