"""``python -m oma.integrations.verl``: is oma active in this environment's verl? (exit 1 if not)

Imports verl (running its plugin discovery), then verl's ``core_algos`` and, with ``--trainer``,
verl's v1 trainer package, and prints what is registered. Use it on the machine (or in the image)
that runs training: plugin load errors are otherwise swallowed by verl at DEBUG level.
"""

from __future__ import annotations

import argparse
import json
import sys

from oma.integrations.verl import status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oma.integrations.verl", description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", action="store_true", help="also import verl's v1 trainer package and check oma's trainers")
    args = parser.parse_args(argv)
    report = status(import_trainer=args.trainer)
    print(json.dumps(report, indent=2))
    ok = report["plugin_loaded"] and all(report["estimators"].values()) and not report["hook_errors"]
    if args.trainer:
        ok = ok and bool(report["trainers"]) and all(v is True for v in report["trainers"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
