"""mkdocs hook: the site serves MathJax itself, so its math renders offline, with no CDN (mkdocs.yml).

pymdownx.arithmatex marks the ``$...$`` and ``$$...$$`` formulas of the pages and of the docstrings the API
reference renders; docs/javascripts/mathjax.js configures MathJax 3 to typeset those. MathJax's own file comes
from the ``docs`` extra's django-static-mathjax, a wheel that ships MathJax's release files (MathJax 3.2.2): this
hook adds its ``tex-svg-full.js`` (TeX input, SVG output, every TeX extension built in, so it fetches nothing
and needs no web fonts) and MathJax's license to the site under ``assets/mathjax/``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

PACKAGE = "mathjax"  # django-static-mathjax's import name; its files are under static/mathjax/
ASSETS = {"assets/mathjax/tex-svg-full.js": "es5/tex-svg-full.js", "assets/mathjax/LICENSE": "LICENSE"}


def mathjax_root() -> Path:
    """The folder of MathJax's release files in the installed django-static-mathjax (not imported: it is a Django app)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PluginError('MathJax is not installed: the site needs the docs extra (pip install -e ".[docs]")')
    return Path(next(iter(spec.submodule_search_locations))) / "static" / "mathjax"


def on_files(files, config):
    root = mathjax_root()
    for dest, source in ASSETS.items():
        if not (root / source).is_file():
            raise PluginError(f"MathJax's {source} is missing from {root}")
        files.append(File.generated(config, dest, abs_src_path=str(root / source)))
    return files
