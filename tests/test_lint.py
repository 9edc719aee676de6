"""The code passes the linter and the strict type checker (configured in pyproject.toml):
the packages, the tests and the scripts alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["actors", "wire", "config", "node"]
# scripts/crashtest.py, scripts/demo.py and the scripts.benchmark package (scripts has no
# __init__: pyproject's explicit_package_bases names its modules from the root).
CHECKED = [*PACKAGES, "tests", "scripts"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_ruff() -> None:
    out = run("ruff", "check", *CHECKED)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict() -> None:
    out = run("mypy", *CHECKED)
    assert out.returncode == 0, out.stdout + out.stderr
