"""The code passes the linter and the strict type checker (configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["actors", "wire", "config", "node"]
BENCH = "scripts/benchmark"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_ruff() -> None:
    out = run("ruff", "check", *PACKAGES, "scripts", "tests")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict() -> None:
    out = run("mypy", *PACKAGES, BENCH)
    assert out.returncode == 0, out.stdout + out.stderr
