"""`oma train [CONFIG.yaml] [key=value ...] [--resume]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from oma.train.config import ConfigError, load_config


def _fresh_dir(path: Path) -> Path:
    """``path`` itself if unused, else the first free ``path-2``, ``path-3``… (nothing is overwritten)."""
    if not path.exists() or not any(path.iterdir()):
        return path
    k = 2
    while (candidate := path.with_name(f"{path.name}-{k}")).exists():
        k += 1
    return candidate


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="oma train", description="Stepwise multi-turn agent RL with OMA switches.")
    parser.add_argument("config", nargs="?", help="YAML preset (configs/*.yaml); defaults apply without one")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algo.mass=native iterations=5")
    parser.add_argument("--resume", action="store_true", help="continue the run in out_dir from its latest checkpoint")
    args = parser.parse_args(argv)
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
        config, overrides = None, [config, *overrides]  # `oma train key=value` without a preset
    try:
        cfg = load_config(config, overrides)
        run_dir = Path(cfg.out_dir) if args.resume else _fresh_dir(Path(cfg.out_dir))
        cfg.out_dir = str(run_dir)
        from oma.train.loop import train

        train(cfg, run_dir, resume=args.resume)
    except (ConfigError, FileNotFoundError) as e:
        print(f"oma train: {e}", file=sys.stderr)
        return 2
    return 0
