"""The documentation site (mkdocs.yml) builds with ``mkdocs build --strict`` and no warning, serves its math with
MathJax from the site itself, and the hooks of docs/_hooks/ do what they say: links out of docs/ and page mentions
(links.py), the studies' nav, MathJax's files (mathjax.py) and the docstrings' Sphinx roles and page mentions
(sphinx_roles.py).

mkdocs is the ``docs`` extra, which ``make install`` installs: without it these tests fail, they do not skip.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import griffe
import pytest
import yaml
from benchmark_scripts import load_file
from mkdocs.exceptions import PluginError

from oma.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
REPO_URL = "https://github.com/oma-rl/oma"


def hook(name: str):
    return load_file(ROOT / "docs" / "_hooks" / f"{name}.py", f"docs_hook_{name}")


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
    assert 'id="oma.cli.main"' not in cli and ".main\"" not in cli  # every command's main is the same: left out
    # The math is marked for MathJax, which the site serves itself: every script is local, MathJax's file and
    # license are there, and nothing is fetched from elsewhere at view time (fonts included).
    for page in ("math", "glossary", "reference/core"):
        html = (tmp_path / page / "index.html").read_text()
        assert html.count('class="arithmatex"') >= 3, page
        scripts = re.findall(r'<script[^>]* src="([^"]+)"', html)
        assert any(s.endswith("assets/mathjax/tex-svg-full.js") for s in scripts), scripts
        assert not [s for s in scripts if re.match(r"(https?:)?//", s)], scripts
        assert not re.findall(r'<link[^>]* href="(?:https?:)?//[^"]*(?:fonts|cdn)', html)
    mathjax = tmp_path / "assets" / "mathjax"
    assert (mathjax / "tex-svg-full.js").stat().st_size > 1_000_000 and "Apache License" in (mathjax / "LICENSE").read_text()
    # site_url is set: the sitemap lists the pages under it
    assert "<loc>https://oma-rl.github.io/oma/install/</loc>" in (tmp_path / "sitemap.xml").read_text()
    # a page cited by its path in a docstring is a link in the API reference
    assert 'href="../../math/#mass-alignment">docs/math.md#mass-alignment</a>' in \
        (tmp_path / "reference" / "core" / "index.html").read_text()


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


def test_studies_nav_must_list_each_study_readme(tmp_path):
    root, _ = tree(tmp_path)
    (root / "studies/README.md").write_text("")
    (root / "studies/lm-accounting").mkdir()
    (root / "studies/lm-accounting/README.md").write_text("# A long question?")
    nav = [{"Home": "index.md"}, {"Studies": [{"All studies": "studies/README.md"}, {"LM accounting": "studies/lm-accounting/README.md"}]}]
    assert links.unlisted_studies(root, nav) == ["studies/s/README.md"]
    config = SimpleNamespace(config_file_path=str(root / "mkdocs.yml"), nav=nav)
    with pytest.raises(PluginError, match="studies/s/README.md"):
        links.on_config(config)
    nav[1]["Studies"].append({"S": "studies/s/README.md"})
    assert links.unlisted_studies(root, nav) == [] and links.on_config(config) is config


def test_mkdocs_nav_titles_every_study_results_first():
    class Loader(yaml.SafeLoader):
        pass
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)["nav"]
    assert links.unlisted_studies(ROOT, nav) == []
    studies = next(item["Studies"] for item in nav if isinstance(item, dict) and "Studies" in item)
    assert list(studies[0].values()) == ["studies/results/README.md"]
    guide = next(item["User guide"] for item in nav if isinstance(item, dict) and "User guide" in item)
    assert [list(e.values())[0] for e in guide[:2]] == ["install.md", "how-to-choose.md"]


def test_page_mentions_become_links(tmp_path):
    root, site = tree(tmp_path)
    (root / "docs/training.md").write_text("# Training\n\n## Options\n")
    markdown = "\n".join([
        "See docs/training.md#options, studies/s/journal.md and `docs/training.md` or [x](../docs/training.md).",
        "A moved section: docs/training.md#gone; no such page: docs/none.md.",
        "```", "docs/training.md", "```"])
    out = links.mention_links(markdown, str(root / "studies/s/README.md"), str(root))
    assert out.split("\n") == [
        "See [docs/training.md#options](../../docs/training.md#options), [studies/s/journal.md](journal.md) and "
        "`docs/training.md` or [x](../docs/training.md).",
        "A moved section: docs/training.md#gone; no such page: docs/none.md.",
        "```", "docs/training.md", "```"]
    # then rewrite_links takes each to its page in the site
    assert rewrite(root, site, "studies/s/README.md", out.split("\n")[0]).startswith(
        "See [docs/training.md#options](../../training.md#options), [studies/s/journal.md](journal.md)")


def test_docstring_mentions_become_links():
    text = "See docs/math.md#mass-alignment (studies/results/README.md), ``docs/x.md`` and [a](docs/y.md)."
    assert sphinx_roles.page_links(text) == (
        "See [docs/math.md#mass-alignment](../math.md#mass-alignment) "
        "([studies/results/README.md](../studies/results/README.md)), ``docs/x.md`` and [a](docs/y.md).")


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
