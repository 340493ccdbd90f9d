"""ScienceWorld's Java engines (one JVM each) and the process-wide pool that reuses them."""

from __future__ import annotations

import atexit
import contextlib
import gc
import subprocess
from typing import Any

from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from py4j.protocol import Py4JError
from scienceworld.constants import BASEPATH, JAR_PATH

JAVA_OPTIONS = ("-Xms32m", "-Xmx512m", "-XX:+UseSerialGC")
"""A lean JVM: one simulation needs far less than Java's default heap (a quarter of the RAM), and
the serial collector spares the cores (the trainer may hold dozens of engines)."""




class _Engine:
    """A JVM running ScienceWorld's ``PythonInterface`` over py4j: one simulation at a time."""

    running = 0  # engines started and not closed, in this process

    def __init__(self) -> None:
        # The gateway listens on 127.0.0.1 (py4j's default) and, with enable_auth, serves only a client that
        # sends the token the JVM printed to this process: another local user cannot drive it on its port.
        port, token, proc = launch_gateway(classpath=JAR_PATH, die_on_exit=True, cwd=BASEPATH,
                                           javaopts=list(JAVA_OPTIONS), enable_auth=True, return_proc=True)
        self.process = proc
        self.gateway = JavaGateway(gateway_parameters=GatewayParameters(auto_field=True, port=port, auth_token=token),
                                   java_process=proc)
        self.server: Any = self.gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        self.closed = False
        _Engine.running += 1

    def load(self, task: str, variation: int, simplifications: str, gold: bool = False) -> None:
        error = self.server.load(task, variation, simplifications, gold)
        if error:
            raise ValueError(f"scienceworld: loading {task!r} variation {variation} failed: {error}")

    def alive(self) -> bool:
        return not self.closed and self.process.poll() is None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _Engine.running -= 1
        with contextlib.suppress(Py4JError, OSError):  # already gone
            self.gateway.shutdown()
        try:  # die_on_exit: the JVM exits when its stdin gets a line or closes (py4j issue 320)
            if self.process.poll() is None:
                self.process.stdin.write(b"\n")
                self.process.stdin.flush()
            self.process.wait(timeout=10)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


_COLLECT_AT = 8
"""With this many engines running, collect garbage before starting another."""

_IDLE: list[_Engine] = []
"""Started engines no environment holds (reused before a new JVM is started)."""

_VARIATIONS: dict[tuple[str, str], tuple[int, ...]] = {}
"""(task, split) -> its variations, sorted."""

_GOLD: dict[tuple[str, int, str], tuple[str, ...]] = {}
"""(task, variation, simplifications) -> the gold action sequence generated first in this process."""


def _take_engine() -> _Engine:
    """An idle engine, else a new one (after a garbage collection, if many are running: an
    environment dropped in a reference cycle gives its engine back only when collected)."""
    for attempt in range(2):
        while _IDLE:
            engine = _IDLE.pop()
            if engine.alive():
                return engine
        if attempt == 0 and _Engine.running >= _COLLECT_AT:
            gc.collect()
    return _Engine()


def _give_back(engine: _Engine) -> None:
    if engine.alive():
        _IDLE.append(engine)


def shutdown() -> None:
    """Shut down the idle engines now (the live ones stay with their environments)."""
    while _IDLE:
        _IDLE.pop().close()


atexit.register(shutdown)
