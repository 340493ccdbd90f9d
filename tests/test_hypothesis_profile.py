"""The property tests' profiles (tests/conftest.py): `make test` draws the same examples every run."""

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

MAKEFILE = Path(__file__).parents[1] / "Makefile"
CONFTEST = Path(__file__).parent / "conftest.py"


def _draws(profile: str) -> list[int]:
    seen = []

    @settings(settings.get_profile(profile), database=None)
    @given(st.integers())
    def record(x):
        seen.append(x)

    record()
    return seen


def test_the_ci_profile_repeats_its_examples_and_the_default_one_does_not():
    assert _draws("ci") == _draws("ci") and len(_draws("ci")) == 60
    assert _draws("oma") != _draws("oma")  # fresh examples each run: 60 equal integer draws by chance is ~0


def test_the_profiles_keep_the_suites_sizes():
    for name in ("oma", "ci"):
        profile = settings.get_profile(name)
        assert profile.max_examples == 60 and profile.deadline is None
    assert settings.get_profile("ci").derandomize and not settings.get_profile("oma").derandomize


def test_make_test_runs_every_pytest_with_the_ci_profile():
    recipe = MAKEFILE.read_text().split("\ntest: install\n")[1].split("\n\n")[0]
    pytest_lines = [line for line in recipe.splitlines() if "-m pytest" in line]
    assert len(pytest_lines) == 3 and all("--hypothesis-profile=ci" in line for line in pytest_lines)


def test_the_profiles_do_not_depend_on_a_ci_variable():
    # hypothesis derandomizes its own default profile when CI is set; ours must not inherit that
    read = (f"import runpy; from hypothesis import settings; runpy.run_path({str(CONFTEST)!r}); "
            "print(settings.get_profile('oma').derandomize, settings.get_profile('ci').derandomize)")
    for ci in ("", "true"):
        env = {k: v for k, v in os.environ.items() if k not in ("CI", "GITHUB_ACTIONS")}
        if ci:
            env["CI"] = ci
        out = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split() == ["False", "True"], (ci, out.stdout, out.stderr)
