"""`oma train [CONFIG.yaml] [key=value ...] [--resume]`."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from oma.errors import os_error_line, os_error_status
from oma.files import user_path
from oma.train import CheckpointError, ConfigError, load_config, train
from oma.train.lock import CLAIM


def claim_run_dir(path: Path) -> Path:
    """Claim ``path`` if unused, else the first free ``path-2``, ``path-3``… (nothing is overwritten).

    A folder is free when it does not exist or is empty; it is claimed by creating its :data:`CLAIM`
    file exclusively, so two trainers started at the same moment never share a folder. :func:`train` then
    locks it (:mod:`oma.train.lock`): a ``--resume`` of it by another process is refused while this one runs.
    """
    if path.name in ("", ".", ".."):  # ".", "/", "..": no name to number a sibling by, and a folder not the run's own
        raise ConfigError(f"out_dir={str(path)!r} names no folder of its own; give a run folder such as runs/my-run")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"out_dir: {path} is a file; give a folder")
    if path.is_symlink() and not path.exists():
        raise ConfigError(f"out_dir: {path} is a symbolic link to {os.readlink(path)}, which does not exist; give a "
                          "folder, or remove the link")
    k = 1
    while True:
        candidate = path if k == 1 else path.with_name(f"{path.name}-{k}")
        k += 1
        if candidate.exists() and (not candidate.is_dir() or any(candidate.iterdir())):
            continue
        candidate.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(candidate / CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)  # as open() would
        except FileExistsError:
            continue  # another trainer claimed it between our look and our claim
        os.close(fd)  # the lock names its holder in it (oma.train.lock)
        return candidate


def _resume_dir(path: Path) -> Path:
    if path.exists() and not path.is_dir():
        raise ConfigError(f"out_dir: {path} is a file; give the run folder to --resume")
    if not (path / "config.json").is_file():
        raise ConfigError(f"--resume: {path} is not a run folder (no config.json); check out_dir")
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="oma train", description="Stepwise multi-turn agent RL with OMA switches.")
    parser.add_argument("config", nargs="?", help="YAML preset (configs/*.yaml); defaults apply without one")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.mass=native iterations=5")
    parser.add_argument("--resume", action="store_true", help="continue the run in out_dir from its latest checkpoint")
    args = parser.parse_args(argv)
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        config, overrides = None, [config, *overrides]  # `oma train key=value` without a preset
    run_dir = None
    try:
        cfg = load_config(config, overrides)
        out_dir = user_path(cfg.out_dir)
        run_dir = _resume_dir(out_dir) if args.resume else claim_run_dir(out_dir)
        cfg.out_dir = str(run_dir)
        train(cfg, run_dir, resume=args.resume)
    except KeyboardInterrupt:
        if _abandon(run_dir, args.resume):
            print(f"oma train: interrupted before its first checkpoint; nothing to resume, so {run_dir} was removed",
                  file=sys.stderr)
        else:
            print(f"oma train: interrupted; rerun with --resume (out_dir={run_dir}) to continue from its latest "
                  "checkpoint", file=sys.stderr)
        return 130
    except (ConfigError, CheckpointError, FileNotFoundError) as e:
        _abandon(run_dir, args.resume)
        print(f"oma train: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except OSError as e:
        _abandon(run_dir, args.resume)
        print(f"oma train: {' '.join(os_error_line(e).split())}", file=sys.stderr)
        return os_error_status(e)
    except FloatingPointError as e:
        _abandon(run_dir, args.resume)
        print(f"oma train: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    return 0


def _abandon(run_dir: Path | None, resume: bool) -> bool:
    """Remove a folder this command claimed if it failed (or was interrupted) before its first checkpoint: with
    nothing to resume from it holds no result, and left behind it would send the next run to ``out_dir-2``.
    Whether it was removed."""
    if run_dir is not None and not resume and not any((run_dir / "checkpoints").glob("iter_*")):
        shutil.rmtree(run_dir, ignore_errors=True)
        return True
    return False
