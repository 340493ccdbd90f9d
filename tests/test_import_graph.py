"""Who may import whom, read from the source with ``ast``:

* the loop and the warm start never name a policy kind (they call oma.agent.kinds' interface);
* the trainers (oma.train, oma.integrations) write batches through oma.batchfile, never importing the audit;
* outside oma.train, code imports the package's public names, never its submodules;
* the layers below oma.train never import it (type checkers' imports aside).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "oma"
TRAIN_SUBMODULES = {p.stem for p in (SRC / "train").glob("*.py") if p.stem != "__init__"}
KIND_WORDS = ("tabular", "Tabular", "action_level", "normalise", "TokenLM", "ActionLM", "TABLE", "KINDS")
"""What names a policy kind: its config value, its model, its row flag, a concrete kind of oma.agent.kinds."""


def _files(*folders: Path) -> list[Path]:
    return sorted(p for folder in folders for p in folder.rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path`` that runs (those under ``if TYPE_CHECKING:`` do not);
    ``from oma.train import loop`` counts as importing ``oma.train.loop``."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
               for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                    if node.module == "oma.train" and a.name in TRAIN_SUBMODULES]
    return out


def _offending(files: list[Path], bad) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line} imports {module}" for p in files for line, module in _imports(p) if bad(module)]


def _code_words(path: Path) -> set[str]:
    """Every identifier, attribute, imported module and string of ``path`` but its prose: the strings that
    stand alone as statements (docstrings, and the attribute docstrings after an assignment)."""
    tree = ast.parse(path.read_text())
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    words = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.alias):
            words.add(node.asname or node.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            words.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            words.add(node.value)
    return words


@pytest.mark.parametrize("module", ["loop", "warmstart"])
def test_the_loop_and_the_warm_start_name_no_policy_kind(module):
    path = SRC / "train" / f"{module}.py"
    found = sorted(w for w in _code_words(path) if any(k in w for k in KIND_WORDS))
    assert not found, f"{path.relative_to(ROOT)} names a policy kind: {found}"


def test_the_code_words_skip_prose_but_not_code(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""A tabular docstring."""\nfrom oma.agent.tabular import imitate\n\ndef f(cfg):\n'
                     '    """action_level here is prose."""\n    return cfg.policy.model == "tabular"\n')
    assert {"tabular", "policy", "model", "cfg", "oma.agent.tabular", "imitate"} <= _code_words(probe)
    assert not any("docstring" in w or "prose" in w for w in _code_words(probe))


def test_trainers_write_batches_without_importing_the_audit():
    files = _files(SRC / "train", SRC / "integrations")
    assert files
    assert not _offending(files, lambda m: m == "oma.diagnostics" or m.startswith("oma.diagnostics."))


def test_outside_oma_train_only_its_public_names_are_imported():
    files = [p for p in _files(SRC, ROOT / "benchmarks", ROOT / "studies" / "tools") if SRC / "train" not in p.parents]
    assert not _offending(files, lambda m: m.startswith("oma.train."))


def test_the_layers_below_oma_train_do_not_import_it():
    below = [SRC / name for name in ("agent", "core", "envs", "diagnostics")]
    files = _files(*below) + [SRC / f"{name}.py" for name in ("files", "batchfile", "errors")]
    assert not _offending(files, lambda m: m.split(".")[:2] in (["oma", "train"], ["oma", "experiments"]))


def test_the_import_reader_by_hand(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nimport oma.train\nfrom oma.train import loop, train\n"
                     "if TYPE_CHECKING:\n    from oma.train.config import TrainConfig\n"
                     "def f():\n    from oma.diagnostics import audit\n")
    assert _imports(probe) == [(1, "typing"), (2, "oma.train"), (3, "oma.train"), (3, "oma.train.loop"),
                               (7, "oma.diagnostics")]
