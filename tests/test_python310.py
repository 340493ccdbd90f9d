"""oma-rl installs on Python 3.10 (verl-agent's WebShop needs it). `make test` runs the 3.10 parts' tests there
(tests/conftest.py's PY310_MODULES); the rest of the package runs only on >= 3.11 in CI, so this reads all of
src/oma with ``ast`` for the standard library's names that Python 3.11 and 3.12 added, the ones that broke 3.10
before (``datetime.UTC``, ``typing.Self``, ``hashlib.file_digest``) and their likes. A list, so not complete:
the 3.10 line is the check that counts for the 3.10 parts."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "oma"

NEWER = {
    "tomllib": None, "wsgiref.types": None,  # whole modules
    "datetime": {"UTC"},
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type", "Required",
               "NotRequired", "TypeVarTuple", "Unpack", "dataclass_transform", "override", "TypeAliasType",
               "get_overloads", "clear_overloads"},
    "hashlib": {"file_digest"},
    "enum": {"StrEnum", "ReprEnum", "verify", "member", "nonmember", "global_enum", "EnumCheck", "FlagBoundary"},
    "asyncio": {"TaskGroup", "timeout", "timeout_at", "Runner", "Barrier"},
    "itertools": {"batched"},
    "contextlib": {"chdir"},
    "operator": {"call"},
    "math": {"exp2", "cbrt", "sumprod"},
    "logging": {"getLevelNamesMapping"},
    "sys": {"exception"},
}
"""Module -> names it gained in Python 3.11 or 3.12 (None: the module itself is new)."""
BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}
METHODS = {"add_note", "walk"}
"""Methods 3.11/3.12 added to exceptions and to pathlib.Path; ``os.walk`` and ``ast.walk`` are older."""


def newer_names(path: Path) -> list[str]:
    """``line: what`` for each use in ``path`` of a name that Python 3.10 lacks (of NEWER, BUILTINS, METHODS)."""
    tree = ast.parse(path.read_text())
    alias = {}  # local name -> module, from `import x` / `import x as y`
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                alias[a.asname or top] = a.name if a.asname else top
                if a.name in NEWER and NEWER[a.name] is None:
                    found.append(f"{node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module in NEWER and NEWER[node.module] is None:
                found.append(f"{node.lineno}: from {node.module} import")
            found += [f"{node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name in (NEWER.get(node.module) or ())]
        elif isinstance(node, getattr(ast, "TryStar", ())):
            found.append(f"{node.lineno}: except*")
        elif isinstance(node, ast.Name) and node.id in BUILTINS:
            found.append(f"{node.lineno}: {node.id}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = alias.get(node.value.id) if isinstance(node.value, ast.Name) else None
        if node.attr in (NEWER.get(base) or ()):
            found.append(f"{node.lineno}: {base}.{node.attr}")
        elif node.attr in METHODS and base not in ("os", "ast"):
            found.append(f"{node.lineno}: .{node.attr}()")
    return sorted(found, key=lambda s: int(s.split(":")[0]))


def test_the_package_uses_no_name_that_python_3_10_lacks():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 50
    found = {str(p.relative_to(ROOT)): hits for p in files if (hits := newer_names(p))}
    assert not found, f"Python >= 3.11 names in a package that installs on 3.10: {found}"


def test_the_reader_by_hand(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import datetime as _dt\nimport os, ast, hashlib\nfrom typing import Any, Self\nimport tomllib\n"
                     "def f(p, e):\n    os.walk(p); ast.walk(p); p.walk(); e.add_note('x')\n"
                     "    hashlib.file_digest(p, 'sha256'); hashlib.sha256()\n"
                     "    raise ExceptionGroup('x', [e])\n"
                     "now = _dt.datetime.now(_dt.UTC), _dt.timezone.utc\n"
                     "try:\n    pass\nexcept* ValueError:\n    pass\n")
    assert newer_names(probe) == ["3: from typing import Self", "4: import tomllib", "6: .walk()", "6: .add_note()",
                                  "7: hashlib.file_digest", "8: ExceptionGroup", "9: datetime.UTC", "10: except*"]
