"""``make demo`` and ``make test`` pass in either order in one clone: what the commands write cannot change
what lint, type checks and tests see.

The class of failure: a folder at the repository root named like an imported module (the demo once wrote
``bundles/``, the name of a test helper) made ruff's isort call that import first-party, and ``make test``
failed after ``make demo``. Two guards: the demo writes only under ``runs/`` (ignored by git and every
check), and lint gives the same verdict with a folder at the root for every module name the code imports.
"""

from __future__ import annotations

import ast
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUTPUT_FLAGS = ("--out", "--telemetry", "--plot")


def _tracked_python() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_demo_writes_only_under_runs() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dry = subprocess.run(["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    outputs = []
    for line in dry.splitlines():
        words = shlex.split(line) if "/sac-" in line else []
        outputs += [words[i + 1] for i, w in enumerate(words[:-1]) if w in OUTPUT_FLAGS]
    assert len(outputs) >= 5, dry  # run dir, bundle, two telemetry files, bench json and plot
    assert all(Path(p).parts[0] == "runs" for p in outputs), outputs


def test_lint_is_unchanged_by_folders_at_the_root(tmp_path: Path) -> None:
    """A copy of the tracked sources with a root folder named after every top-level import lints clean."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    names = set()
    for rel in _tracked_python():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, tmp_path / rel)
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    shutil.copyfile(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for name in names - {"__future__"}:
        (tmp_path / name).mkdir(exist_ok=True)
    (tmp_path / "runs").mkdir(exist_ok=True)
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=tmp_path, capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout[-3000:]
