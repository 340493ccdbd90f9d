"""The progress display of `oma compare`: one bar for the runs, one per run now training."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any



def _last_iteration(run_dir: Path) -> int | None:
    path = run_dir / "metrics.jsonl"
    try:
        text = path.read_text()
    except OSError:
        return None
    lines = [ln for ln in text.split("\n")[:-1] if ln]  # complete lines only
    if not lines:
        return None
    try:
        return int(json.loads(lines[-1])["iteration"])
    except (ValueError, KeyError):
        return None


class _Display:
    """A rich progress display: an overall bar (runs done / total, the runs now training) and one bar
    per active run (its iterations, read from its metrics.jsonl by a polling thread)."""

    def __init__(self, console, total: int, done: int, horizon: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.horizon = horizon
        self.overall = self.progress.add_task("runs", total=total, completed=done)
        self.active: dict[str, tuple[Any, Path]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> _Display:
        self.progress.__enter__()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=2)
        self.progress.__exit__(*exc)

    def _describe(self) -> None:
        now = ", ".join(self.active) or "-"
        self.progress.update(self.overall, description=f"runs (now: {now})")

    def start(self, key: str, run_dir: Path) -> None:
        with self.lock:
            start = _last_iteration(run_dir) if (run_dir / "metrics.jsonl").is_file() else 0
            task = self.progress.add_task(f"  {key}", total=self.horizon, completed=start or 0)
            self.active[key] = (task, run_dir)
            self._describe()

    def finish(self, key: str) -> None:
        with self.lock:
            task, _ = self.active.pop(key)
            self.progress.remove_task(task)
            self.progress.advance(self.overall)
            self._describe()

    def _poll(self) -> None:
        while not self.stop.wait(0.5):
            with self.lock:
                for task, run_dir in self.active.values():
                    it = _last_iteration(run_dir)
                    if it is not None:
                        self.progress.update(task, completed=it)
