"""The type check sees across stages: every ``sac_edge.*`` import resolves to its file, so a wrong call from
one stage into another fails ``make typecheck`` instead of passing as ``Any``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_layout import ROOT, STAGES

pytestmark = pytest.mark.slow


def test_each_stage_is_linked_under_the_package() -> None:
    for stage in STAGES:
        link = ROOT / "sac_edge" / stage
        assert link.is_symlink() and os.readlink(link) == f"../{stage}", f"sac_edge/{stage} -> ../{stage}"


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), str(probe)],
        cwd=ROOT, env={**os.environ, "MYPYPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_wrong_call_between_stages_fails_the_type_check(tmp_path: Path) -> None:
    wrong = (
        "from sac_edge.edge_runtime.backends.base import Backend\n"
        "from sac_edge.common.spec import PolicySpec\n"
        "def use(backend: Backend, spec: PolicySpec) -> None:\n"
        "    backend.act_on(spec.obs_dim)\n"
        "    reveal_type(backend.act)\n"
    )
    result = _mypy(tmp_path, wrong)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'error: "Backend" has no attribute "act_on"' in result.stdout
    assert "def (obs: numpy.ndarray" in result.stdout  # the real signature, not Any
