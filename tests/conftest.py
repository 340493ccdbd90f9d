"""Test collection: the modules that test oma against verl itself need the `oma-rl[verl]` extra, and
tests/with_skyrl/ needs `oma-rl[skyrl]` (Python >= 3.12: `make install` builds it in .venv-skyrl).

Without verl they are left out of collection (a `pip install -e ".[dev]"` user gets the rest of the
suite, including oma's verl-free integration tests in test_verl_oma_side.py). `make test`, the
command CI runs, sets OMA_TESTS_NEED_VERL=1, so there a missing verl is an error, never a quiet
omission; it runs tests/with_skyrl in .venv-skyrl with OMA_TESTS_NEED_SKYRL=1, the same way.

On Python 3.10 (verl-agent's WebShop needs it; ROLL and rLLM allow it) `make test` runs PY310_MODULES in
.venv-py310, which holds only what oma's core, hosts, verl-agent, ROLL and rLLM integrations and audit import (no
transformers, no verl). OMA_TESTS_PY310=1
says so: exactly those files are collected, and an interpreter other than 3.10 or a listed file that is gone is
an error, so that line cannot pass by running something else or nothing.
"""

import importlib.util
import os
import sys
from pathlib import Path

from hypothesis import settings

# Property tests draw 60 examples each with no deadline (the CPU is shared). `make test` (and so CI)
# passes --hypothesis-profile=ci: the examples are derived from each test's name, so a run is
# reproducible and a rare example cannot turn CI red by chance. A plain `pytest` draws fresh examples
# each run, the way to search for new failures (README, "Set up, train, test"). derandomize=False is
# explicit because hypothesis derandomizes its default profile when a CI variable (CI, GITHUB_ACTIONS,
# ...) is set, and CI runs exactly what a user runs.
settings.register_profile("oma", max_examples=60, deadline=None, derandomize=False)
settings.register_profile("ci", settings.get_profile("oma"), derandomize=True)
settings.load_profile("oma")

VERL_MODULES = [
    "test_core_vs_verl.py",
    "test_verl_estimators.py",
    "test_verl_loss.py",
    "test_verl_trainer.py",
    "test_verl_plugin.py",
    "test_verl_cpu.py",
    "test_verl_private.py",
]

# The test files of the 3.10 line: the verl-agent integration and its audit, the core, the hosts and the rest of
# the audit, all of which import nothing beyond torch, numpy, pyarrow, omegaconf, rich and matplotlib.
# (test_files.py is not here: it imports oma.train, which needs safetensors and transformers.)
PY310_MODULES = [
    "test_verl_agent_integration.py",
    "test_audit_verl_agent.py",
    "test_verl_agent_check_install.py",
    "test_roll_integration.py",
    "test_audit_roll.py",
    "test_rllm_integration.py",
    "test_core_by_hand.py",
    "test_core_equivalence.py",
    "test_core_errors.py",
    "test_core_invariance.py",
    "test_hosts.py",
    "test_audit_defects.py",
    "test_audit_hostile.py",
    "test_audit_io.py",
    "test_audit_math.py",
    "test_audit_run_dir.py",
    "test_audit_scale.py",
    "test_audit_worked_example.py",
]

collect_ignore = []
if os.environ.get("OMA_TESTS_PY310"):
    if sys.version_info[:2] != (3, 10):
        raise RuntimeError(f"OMA_TESTS_PY310 is set but this is Python {sys.version.split()[0]}: "
                           "run it with .venv-py310/bin/python (make test builds it)")
    here = Path(__file__).parent
    missing = [name for name in PY310_MODULES if not (here / name).is_file()]
    if missing:
        raise RuntimeError(f"OMA_TESTS_PY310: tests/conftest.py's PY310_MODULES names files that are gone: {missing}")
    collect_ignore += sorted(p.name for p in here.iterdir()
                             if p.name not in PY310_MODULES and (p.is_dir() or p.name.startswith("test_")))
if importlib.util.find_spec("verl") is None:
    if os.environ.get("OMA_TESTS_NEED_VERL"):
        raise RuntimeError("OMA_TESTS_NEED_VERL is set but verl is not installed: pip install -e '.[verl]'")
    collect_ignore += VERL_MODULES
if importlib.util.find_spec("skyrl") is None:
    if os.environ.get("OMA_TESTS_NEED_SKYRL"):
        raise RuntimeError("OMA_TESTS_NEED_SKYRL is set but skyrl is not installed: pip install -e '.[skyrl]' "
                           "(Python >= 3.12)")
    collect_ignore.append("with_skyrl")
