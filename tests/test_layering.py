"""Imports go one way: node → actors → wire → config (docs/ARCHITECTURE.md).

Every module of the four packages is parsed, and every import in it (at the top or inside
a function) is checked against the layers: a package may import its own modules and those
of the packages below it, never those above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["node", "actors", "wire", "config"]  # top to bottom


def imported_packages(source: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def violations(root: Path) -> list[str]:
    """Every import under ``root`` that goes up the layers, as ``path:line: a imports b``."""
    out = []
    for package in LAYERS:
        rank = LAYERS.index(package)
        for path in sorted((root / package).rglob("*.py")):
            for line, imported in imported_packages(path.read_text()):
                if imported in LAYERS and LAYERS.index(imported) < rank:
                    out.append(f"{path.relative_to(root)}:{line}: {package} imports {imported}")
    return out


def test_the_tree_imports_down_the_layers_only() -> None:
    assert violations(ROOT) == []


@pytest.mark.parametrize(("package", "statement"), [
    ("actors", "from node.client import NodeClient"),
    ("wire", "import actors.base"),
    ("config", "from wire import codec"),
    ("actors", "def f():\n    from node.supervisor import Supervisor\n"),
])
def test_an_import_up_the_layers_is_found(tmp_path: Path, package: str, statement: str) -> None:
    for name in LAYERS:
        (tmp_path / name).mkdir()
    (tmp_path / package / "mod.py").write_text(statement + "\n")
    assert len(violations(tmp_path)) == 1


def test_imports_down_the_layers_pass(tmp_path: Path) -> None:
    for name in LAYERS:
        (tmp_path / name).mkdir()
    (tmp_path / "node" / "a.py").write_text("import actors.base\nfrom wire import codec\n")
    (tmp_path / "actors" / "b.py").write_text("from config import NodeConfig\nimport zmq\n")
    assert violations(tmp_path) == []
