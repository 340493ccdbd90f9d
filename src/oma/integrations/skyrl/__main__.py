"""``python -m oma.integrations.skyrl key.path=value ...``: SkyRL's trainer with oma (docs/skyrl.md)."""

from oma.integrations.skyrl.trainer import main

main()
