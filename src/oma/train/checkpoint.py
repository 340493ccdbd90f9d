"""Atomic, resumable checkpoints: model and optimizer tensors in safetensors, the rest in JSON.

A checkpoint is a folder ``checkpoints/iter_000010`` written under a temporary name and renamed into
place (a crash leaves either the old state or the new one, never half a checkpoint); the text
file ``checkpoints/latest`` is replaced atomically after it. ``state.json`` holds the SHA-256 of each
tensor file, so a checkpoint damaged in place is detected and :func:`resume_from_checkpoint` falls back to the one
before it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from oma.files import atomic_write_text, follow_umask, sha256_file


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
                    extra: dict[str, Any], ema: Any = None) -> Path:
    """Write ``checkpoints/iter_{iteration:06d}`` atomically and point ``checkpoints/latest`` at it; with
    ``ema`` (``oma.train.loop.WeightAverage``, the averaged weights of ``optim.ema``), also ``ema.safetensors``."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"iter_{iteration:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    try:
        save_model(model, str(tmp / "model.safetensors"))  # handles tied embeddings
        opt_tensors, opt_meta = _flatten_optimizer(optimizer.state_dict())
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        if ema is not None:
            save_file(ema.state_dict(), str(tmp / EMA_FILE))
        state = {"iteration": iteration, "optimizer": opt_meta, **extra,
                 "sha256": {name: sha256_file(tmp / name) for name in _tensor_files(ema is not None)}}
        if hasattr(model, "index_state"):  # the tabular policy's index: JSON beside the tensors
            state["model_index"] = model.index_state()
        (tmp / "state.json").write_text(json.dumps(state))
        follow_umask(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, SafetensorError):  # how safetensors reports a failed write (a full disk), naming no file
            raise OSError(f"checkpoint {final} could not be written: {e}") from None
        raise
    atomic_write_text(root / "latest", final.name)
    return final


TENSOR_FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")
EMA_FILE = "ema.safetensors"


def _tensor_files(with_ema: bool) -> tuple[str, ...]:
    return TENSOR_FILES + ((EMA_FILE,) if with_ema else ())


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file."""


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoints to resume from, best first: the one ``checkpoints/latest`` names, then the
    others from the newest."""
    root = run_dir / "checkpoints"
    found = sorted((p for p in root.glob("iter_*") if p.is_dir()), reverse=True) if root.is_dir() else []
    pointer = root / "latest"
    named = root / pointer.read_text().strip() if pointer.is_file() else None
    return ([named] if named in found else []) + [p for p in found if p != named]


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    ema: Any = None) -> dict[str, Any]:
    """Restore model, optimizer, torch RNG (and ``ema``'s averaged weights) from ``path``; return the JSON state.

    Every file is checked (present, parseable, SHA-256 as saved) before anything is restored, so a
    :class:`CheckpointError` leaves the model and optimizer as they were.
    """
    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint file {path / 'state.json'} is missing or corrupt ({e})") from None
    for name in _tensor_files(ema is not None):
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint file {file} is missing")
        if "sha256" in state and sha256_file(file) != state["sha256"][name]:
            raise CheckpointError(f"checkpoint file {file} is corrupt (its SHA-256 differs from the saved one)")
    try:
        if hasattr(model, "index_state"):
            model.load_index_state(state["model_index"])
        load_model(model, str(path / "model.safetensors"))
        optimizer.load_state_dict(_unflatten_optimizer(load_file(str(path / "optimizer.safetensors")), state["optimizer"]))
        torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch"])
        if ema is not None:
            ema.load_state_dict(load_file(str(path / EMA_FILE)))
    except Exception as e:  # a checkpoint of another model, or one saved before checksums existed and damaged
        raise CheckpointError(f"checkpoint {path} cannot be loaded: {str(e).splitlines()[0]}") from None
    return state


def resume_from_checkpoint(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, warn,
                           ema: Any = None) -> dict[str, Any]:
    """Load the best usable checkpoint of ``run_dir`` (:func:`checkpoints`); each unusable one is reported
    through ``warn(message)`` and the one before it tried. CheckpointError when none is usable."""
    tried = []
    for path in checkpoints(run_dir):
        try:
            return load_checkpoint(path, model, optimizer, ema) | {"path": str(path)}
        except CheckpointError as e:
            warn(f"{e}; trying the checkpoint before it")
            tried.append(path.name)
    raise CheckpointError(f"--resume: {run_dir} has no usable checkpoint" + (f" (tried {', '.join(tried)})" if tried else ""))


_DEBRIS = re.compile(r"^\.tmp-.+|^\.(latest|metrics\.jsonl|samples\.jsonl|config\.json|summary\.json)\..+"
                     r"|^\.iter_\d+\.parquet\.tmp-.+")
"""What a killed save leaves: a checkpoint's temporary folder, :func:`oma.files.atomic_write_text`'s temporary file
(``samples.jsonl``'s too, which a resume rewrites), or :func:`oma.batchfile.write_batch`'s."""


def clean_debris(run_dir: Path) -> None:
    """Remove what killed saves left in ``run_dir``, its ``checkpoints/`` and its ``batches/``."""
    for folder in (run_dir, run_dir / "checkpoints", run_dir / "batches"):
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if _DEBRIS.match(p.name):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
