"""The shell scripts that run only on a lent GPU machine at least parse here, so a typo does not cost device time."""

import subprocess
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parents[2] / "scripts").glob("*.sh"))


def test_there_are_scripts():
    assert {p.name for p in SCRIPTS} >= {"gpu_check.sh", "gpu_wheels.sh"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses_and_is_executable(script: Path):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert script.stat().st_mode & 0o111, f"{script.name} is not executable"
