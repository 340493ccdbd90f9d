"""Atomic, resumable checkpoints: model and optimizer tensors in safetensors, the rest in JSON.

A checkpoint is a folder ``checkpoints/iter_000010`` written under a temporary name and renamed into
place (a crash leaves either the old state or the new one, never half a checkpoint); the text
file ``checkpoints/latest`` is replaced atomically after it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model


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


def _flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for pid, slots in state["state"].items():
        for name, value in slots.items():
            key = f"state.{pid}.{name}"
            if isinstance(value, torch.Tensor):
                tensors[key] = value.contiguous()
            else:
                scalars[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for key, value in list(tensors.items()) + list(meta["scalars"].items()):
        _, pid, name = key.split(".", 2)
        state.setdefault(int(pid), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(run_dir: Path, iteration: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    extra: dict[str, Any]) -> Path:
    """Write ``checkpoints/iter_{iteration:06d}`` atomically and point ``checkpoints/latest`` at it."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter_{iteration:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    try:
        save_model(model, str(tmp / "model.safetensors"))  # handles tied embeddings
        opt_tensors, opt_meta = _flatten_optimizer(optimizer.state_dict())
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        state = {"iteration": iteration, "optimizer": opt_meta, **extra}
        if hasattr(model, "index_state"):  # the tabular policy's index: JSON beside the tensors
            state["model_index"] = model.index_state()
        (tmp / "state.json").write_text(json.dumps(state))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(root / "latest", final.name)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"checkpoint {path} named by {pointer} is missing or incomplete")
    return path


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model, optimizer and torch RNG from ``path``; return the JSON state."""
    state = json.loads((path / "state.json").read_text())
    if hasattr(model, "index_state"):
        model.load_index_state(state["model_index"])
    load_model(model, str(path / "model.safetensors"))
    optimizer.load_state_dict(_unflatten_optimizer(load_file(str(path / "optimizer.safetensors")), state["optimizer"]))
    torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch"])
    return state
