"""``python -m oma.integrations.rllm check-install [PATH]``: oma's rLLM hook against an rLLM checkout's own code
(:mod:`oma.integrations.rllm.check_install`, docs/rllm.md#checked-against-rllms-own-code)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oma.integrations.rllm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check-install", help="oma's hook against an rLLM checkout's own code")
    p.add_argument("path", nargs="?", help="an rLLM checkout, the folder that holds rllm/ (default: the installed rllm's parent)")
    p.add_argument("--seed", type=int, default=0, help="the synthetic batch's seed")
    args = parser.parse_args(argv)
    from oma.integrations.rllm.check_install import run  # imports the checkout only now

    return run(args.path, seed=args.seed)


if __name__ == "__main__":
    sys.exit(main())
