"""docs/ARCHITECTURE.md's map of the tree ("## The tree") has a line for every module, and
names none that is gone.

A module is a file of the four packages (node, actors, wire, config: every ``.py`` but
``__init__.py``, and every ``.toml``), and a top-level module or subpackage of the benchmark
(``scripts/benchmark/``). The map gives each a list item that starts with its path in
backquotes, e.g. ``- `actors/wal.py`: ...`` or ``- `scripts/benchmark/peers/`: ...``; a
module added without its line, or a path left in the map for a module that is gone, fails
here. The map also states the direction of imports that tests/test_layering.py enforces.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
MAP_HEADING = "## The tree"
PACKAGES = ("node", "actors", "wire", "config")
BENCH = "scripts/benchmark"
PATH = r"`((?:node|actors|wire|config|scripts/benchmark)/[\w.]+(?:/[\w.]+)*/?)`"
MENTIONED = re.compile(PATH)
LISTED = re.compile(r"^- " + PATH, re.MULTILINE)  # a module's own line in the map


def map_section(doc: str) -> str:
    """The text under the map's heading, up to the next section."""
    start = doc.index(MAP_HEADING + "\n")
    end = doc.find("\n## ", start + len(MAP_HEADING))
    return doc[start:] if end < 0 else doc[start:end]


def modules(root: Path) -> set[str]:
    """The paths, relative to ``root``, of every module the map must name."""
    found: set[str] = set()
    for package in PACKAGES:
        for path in (root / package).rglob("*"):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if (path.suffix == ".py" and path.name != "__init__.py") or path.suffix == ".toml":
                found.add(path.relative_to(root).as_posix())
    bench = root / BENCH
    if bench.is_dir():
        for path in bench.iterdir():
            if path.is_file() and path.suffix == ".py" and path.name != "__init__.py":
                found.add(f"{BENCH}/{path.name}")
            elif path.is_dir() and (path / "__init__.py").is_file():
                found.add(f"{BENCH}/{path.name}/")
    return found


def listed(doc: str) -> set[str]:
    """The module paths that have a line of their own in the map."""
    return set(LISTED.findall(map_section(doc)))


def mentioned(doc: str) -> set[str]:
    """Every module path the map names, on its own line or in passing."""
    return set(MENTIONED.findall(map_section(doc)))


def unmapped(root: Path, doc: str) -> list[str]:
    """Modules under ``root`` without a line in the map of ``doc``."""
    return sorted(modules(root) - listed(doc))


def gone(root: Path, doc: str) -> list[str]:
    """Paths the map of ``doc`` names that are not modules under ``root``."""
    return sorted(mentioned(doc) - modules(root))


def enforced_layers() -> list[str]:
    """``LAYERS`` of tests/test_layering.py, the order its test enforces (top to bottom)."""
    tree = ast.parse((ROOT / "tests" / "test_layering.py").read_text())
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "LAYERS"):
            layers = ast.literal_eval(node.value)
            assert isinstance(layers, list) and all(isinstance(x, str) for x in layers)
            return layers
    raise AssertionError("tests/test_layering.py has no LAYERS")


# ---- the document as it is --------------------------------------------------------------


def test_the_map_names_every_module() -> None:
    missing = unmapped(ROOT, DOC.read_text())
    assert missing == [], f"add a line for each to the map in docs/ARCHITECTURE.md: {missing}"


def test_the_map_names_no_module_that_is_gone() -> None:
    stale = gone(ROOT, DOC.read_text())
    assert stale == [], f"the map in docs/ARCHITECTURE.md names modules that are gone: {stale}"


def test_the_map_states_the_import_direction_the_layering_test_enforces() -> None:
    section = map_section(DOC.read_text())
    layers = enforced_layers()
    assert layers == ["node", "actors", "wire", "config"]
    assert " → ".join(layers) in section
    assert "tests/test_layering.py" in section


# ---- the checker, on a made-up tree -----------------------------------------------------


def make_tree(root: Path, files: list[str]) -> None:
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


TREE = ["node/__init__.py", "node/cli.py", "actors/__init__.py", "actors/base.py",
        "wire/__init__.py", "wire/codec.py", "config/__init__.py", "config/defaults.toml",
        "scripts/benchmark/__init__.py", "scripts/benchmark/report.py",
        "scripts/benchmark/peers/__init__.py", "scripts/benchmark/peers/redis.py"]

MAP = """# How it works

## The tree

- `node/cli.py`: the command.
- `actors/base.py`: the Actor base.
- `wire/codec.py`: the codec.
- `config/defaults.toml`: the defaults.
- `scripts/benchmark/report.py`: tables.
- `scripts/benchmark/peers/`: the peers.

The bench is the package `scripts/benchmark/`, its report `scripts/benchmark/report.py`.

## Processes
"""


def test_a_complete_map_passes(tmp_path: Path) -> None:
    make_tree(tmp_path, TREE)
    assert unmapped(tmp_path, MAP) == []
    assert gone(tmp_path, MAP) == []


@pytest.mark.parametrize("added", [
    "actors/new_actor.py",
    "wire/new_format.py",
    "node/sub/module.py",
    "config/other.toml",
    "scripts/benchmark/new_step.py",
    "scripts/benchmark/new_package/__init__.py",
])
def test_a_module_missing_from_the_map_is_found(tmp_path: Path, added: str) -> None:
    make_tree(tmp_path, [*TREE, added])
    expected = added.removesuffix("__init__.py")
    assert unmapped(tmp_path, MAP) == [expected]


def test_a_module_named_only_in_passing_or_outside_the_map_is_missing(tmp_path: Path) -> None:
    make_tree(tmp_path, [*TREE, "actors/new_actor.py"])
    in_passing = MAP.replace("the Actor base.", "the Actor base, as `actors/new_actor.py` is.")
    outside = MAP + "\nThe new actor is `actors/new_actor.py`.\n"
    for doc in (in_passing, outside):
        assert unmapped(tmp_path, doc) == ["actors/new_actor.py"]


def test_a_module_the_map_names_but_the_tree_lacks_is_found(tmp_path: Path) -> None:
    make_tree(tmp_path, TREE)
    doc = MAP.replace("## Processes", "- `actors/removed.py`: gone.\n\n## Processes")
    assert gone(tmp_path, doc) == ["actors/removed.py"]


def test_init_files_and_caches_are_not_modules(tmp_path: Path) -> None:
    make_tree(tmp_path, [*TREE, "actors/__pycache__/base.cpython-311.pyc",
                         "scripts/benchmark/__pycache__/report.cpython-311.pyc"])
    assert unmapped(tmp_path, MAP) == []
