"""``python -m oma.integrations.roll check-install [PATH]``: oma's ROLL hook against a ROLL checkout's own code
(:mod:`oma.integrations.roll.check_install`)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "check-install":
        print("usage: python -m oma.integrations.roll check-install [PATH]", file=sys.stderr)
        return 2
    from oma.integrations.roll.check_install import main as check_install

    return check_install(args[1:])


if __name__ == "__main__":
    sys.exit(main())
