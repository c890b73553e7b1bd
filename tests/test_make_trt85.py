"""``make test-trt85``'s last check, run here on a made-up ``run.err``: it passes on exactly one line of error
(warnings about ``cryptography`` aside), fails otherwise, and shows that line without wiping what make wrote
before it into a log that stdout and stderr are both redirected to (``make test-trt85 > log 2>&1``).

The whole recipe needs Python 3.8 and the 525 MB wheel, so it is not run by ``make test``; this step is the one
that touches the caller's output.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _one_line_check(bundle: Path) -> str:
    """The recipe's command that reads ``run.err`` after the run, as ``make -n`` prints it."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    cmd = ["make", "-n", "-s", f"TRT85_BUNDLE={bundle}", "test-trt85"]
    dry = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    commands = dry.replace("\\\n", " ").splitlines()
    checks = [c for c in commands if "run.err" in c and "sac-edge" not in c]
    assert len(checks) == 1, dry
    return checks[0]


@pytest.mark.parametrize(
    ("err", "passes"),
    [
        ("sac-edge: error: backend 'tensorrt' is unavailable: no CUDA device usable\n", True),
        ("CryptographyDeprecationWarning: Python 3.8\nsac-edge: error: no CUDA device usable\n", True),
        ("Traceback (most recent call last):\n  File x\nTypeError: nullptr\n", False),
        ("", False),
    ],
    ids=["one-line", "one-line-and-a-warning", "traceback", "nothing"],
)
def test_the_run_check_counts_one_line_and_keeps_the_log(tmp_path: Path, err: str, passes: bool) -> None:
    (tmp_path / "run.err").write_text(err)
    log = tmp_path / "make.log"
    with log.open("w") as out:  # as `make test-trt85 > make.log 2>&1` opens it
        out.write("doctor's report, written before\n")
        out.flush()
        result = subprocess.run(["sh", "-c", _one_line_check(tmp_path)], stdout=out, stderr=out, check=False)
    assert (result.returncode == 0) is passes, log.read_text()
    text = log.read_text()
    assert text.startswith("doctor's report, written before\n"), text
    if passes:
        assert text.rstrip().endswith("no CUDA device usable"), text
