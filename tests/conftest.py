"""Test collection: the modules that test oma against verl itself need the `oma-rl[verl]` extra, and
tests/with_skyrl/ needs `oma-rl[skyrl]` (Python >= 3.12: `make install` builds it in .venv-skyrl).

Without verl they are left out of collection (a `pip install -e ".[dev]"` user gets the rest of the
suite, including oma's verl-free integration tests in test_verl_oma_side.py). `make test`, the
command CI runs, sets OMA_TESTS_NEED_VERL=1, so there a missing verl is an error, never a quiet
omission; it runs tests/with_skyrl in .venv-skyrl with OMA_TESTS_NEED_SKYRL=1, the same way.
"""

import importlib.util
import os

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

collect_ignore = []
if importlib.util.find_spec("verl") is None:
    if os.environ.get("OMA_TESTS_NEED_VERL"):
        raise RuntimeError("OMA_TESTS_NEED_VERL is set but verl is not installed: pip install -e '.[verl]'")
    collect_ignore += VERL_MODULES
if importlib.util.find_spec("skyrl") is None:
    if os.environ.get("OMA_TESTS_NEED_SKYRL"):
        raise RuntimeError("OMA_TESTS_NEED_SKYRL is set but skyrl is not installed: pip install -e '.[skyrl]' "
                           "(Python >= 3.12)")
    collect_ignore.append("with_skyrl")
