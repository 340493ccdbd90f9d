"""`oma`: the command-line tool. Each subcommand lives in its own module, imported on use."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with `main(argv) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("oma.train.cli", "train an agent with stepwise RL (GRPO/RLOO/GiGPO, PPO/GSPO) and OMA switches"),
    "audit": ("oma.diagnostics.cli", "audit the implicit trajectory weighting of a rollout batch (file or run dir)"),
    "compare": ("oma.experiments.compare", "run the row/trajectory x native/MA accountings over seeds at a matched horizon"),
    "report": ("oma.experiments.report", "write the report of an `oma compare` directory (curves, endpoint, nAUC, 95% CIs)"),
    "coupling-map": ("oma.experiments.coupling_map", "map OMA's effect against expansion-outcome coupling (tabular lane)"),
    "dose-response": ("oma.experiments.dose_response", "sweep the expansion ratio by the step cap and fit OMA's effect on it"),
    "verl-smoke": ("oma.integrations.verl.smoke", "run real verl training steps with oma's trainer on CPU (needs oma[verl])"),
    "skyrl-smoke": ("oma.integrations.skyrl.smoke", "run real SkyRL training steps with oma's trainer on CPU (needs oma[skyrl])"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: oma <command> [args...]\n\ncommands:")
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:<10} {help_text}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"oma: unknown command {name!r}; expected one of {sorted(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
