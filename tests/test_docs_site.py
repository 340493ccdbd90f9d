"""The documentation site (mkdocs.yml) builds with ``mkdocs build --strict`` and no warning, and the hooks of
docs/_hooks/ do what they say: links out of docs/ (links.py) and the docstrings' Sphinx roles (sphinx_roles.py).

mkdocs is the ``docs`` extra, which ``make install`` installs: without it these tests fail, they do not skip.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import griffe

from oma.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
REPO_URL = "https://github.com/oma-rl/oma"


def hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", ROOT / "docs" / "_hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


links = hook("links")
sphinx_roles = hook("sphinx_roles")


def test_site_builds_strict_without_warnings(tmp_path):
    # Material 9.7+ prints a banner about its successor naming NO_MKDOCS_2_WARNING; it is not a build warning.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert [line for line in output.splitlines() if "WARNING" in line] == []
    cli = (tmp_path / "reference" / "cli" / "index.html").read_text()
    for name in COMMANDS:  # cli_help.py put each command's --help on the page
        assert f"usage: oma {name}" in cli


def tree(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A repository with a guide page, a study (page and figure), code and a config folder; the site maps
    the guide and the study to their src_uris as mkdocs would."""
    for path in ["docs/training.md", "studies/s/README.md", "studies/s/journal.md", "studies/s/fig.png",
                 "src/oma/loop.py", "configs/verl/x.yaml"]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    site = {str(tmp_path / "docs/training.md"): "training.md"}
    site.update({str(tmp_path / p): p for p in ["studies/s/README.md", "studies/s/journal.md", "studies/s/fig.png"]})
    return tmp_path, site


def rewrite(root: Path, site: dict[str, str], page: str, markdown: str) -> str:
    source = str(root / page)
    return links.rewrite_links(markdown, source, site[source], site, str(root), REPO_URL)


def test_links_from_a_guide_page(tmp_path):
    root, site = tree(tmp_path)
    markdown = ("See [the study](../studies/s/README.md), [its journal](../studies/s/journal.md#a-finding), "
                "[the loop](../src/oma/loop.py), [the configs](../configs/verl) and [verl](https://github.com/volcengine/verl); "
                "[above](#commands), [nothing](../studies/none.md).")
    assert rewrite(root, site, "docs/training.md", markdown) == (
        "See [the study](studies/s/README.md), [its journal](studies/s/journal.md#a-finding), "
        f"[the loop]({REPO_URL}/blob/main/src/oma/loop.py), [the configs]({REPO_URL}/tree/main/configs/verl) and "
        "[verl](https://github.com/volcengine/verl); [above](#commands), [nothing](../studies/none.md).")


def test_links_from_a_study_page(tmp_path):
    root, site = tree(tmp_path)
    markdown = '[Policy](../../docs/training.md#policy "the guide") ![curves](fig.png) [README](README.md)'
    assert rewrite(root, site, "studies/s/journal.md", markdown) == \
        '[Policy](../../training.md#policy "the guide") ![curves](fig.png) [README](README.md)'


def test_links_in_code_are_left_alone(tmp_path):
    root, site = tree(tmp_path)
    markdown = "\n".join(["```markdown", "[a](../src/oma/loop.py)", "```",
                          "Write `[a](../src/oma/loop.py)` or ``[`b`](../src/oma/loop.py)``: [c](../src/oma/loop.py)"])
    assert rewrite(root, site, "docs/training.md", markdown).split("\n") == [
        "```markdown", "[a](../src/oma/loop.py)", "```",
        f"Write `[a](../src/oma/loop.py)` or ``[`b`](../src/oma/loop.py)``: [c]({REPO_URL}/blob/main/src/oma/loop.py)"]


def test_studies_nav_lists_each_study_readme(tmp_path):
    root, _ = tree(tmp_path)
    (root / "studies/README.md").write_text("")
    (root / "studies/lm-accounting").mkdir()
    (root / "studies/lm-accounting/README.md").write_text("# A long question?")
    config = SimpleNamespace(config_file_path=str(root / "mkdocs.yml"),
                             nav=[{"Home": "index.md"}, {"Studies": [{"Index": "studies/README.md"}]}])
    links.on_config(config)
    # each study under its folder's name, sorted
    assert config.nav[1] == {"Studies": [{"Index": "studies/README.md"}, {"Lm accounting": "studies/lm-accounting/README.md"},
                                         {"S": "studies/s/README.md"}]}


def test_sphinx_roles_become_optional_cross_references():
    code = '''
def helper():
    """A helper."""

def f():
    """Uses :func:`helper`, :mod:`oma.core` and :func:`~oma.core.token_weights`."""
'''
    extensions = griffe.load_extensions(sphinx_roles.SphinxRoles)
    with griffe.temporary_visited_package("m", {"__init__.py": code}, extensions=extensions) as package:
        assert package["f"].docstring.value == (
            'Uses <autoref identifier="m.helper" optional>`helper`</autoref>, '
            '<autoref identifier="oma.core" optional>`oma.core`</autoref> and '
            '<autoref identifier="oma.core.token_weights" optional>`token_weights`</autoref>.')
