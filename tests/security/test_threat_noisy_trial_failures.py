"""Threat: a failing trial buries sac-sweep's answer under Ray's output (a worker traceback of ~45 lines, the
token-authentication notice of every ``ray.init``), so the one line that names the problem scrolls away.
A sweep's stderr holds sac-sweep's lines only; the trial's traceback is in the log file its line names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("ray.tune")

from sac_edge.sweep.cli import main as sweep_main

HERE = Path(__file__).resolve().parents[1] / "sweep"  # sweep_toy_envs, imported by the Ray workers
TINY = [
    "--total-steps", "500", "--learning-starts", "400", "--eval-every", "500", "--eval-episodes", "1",
    "--hidden", "8,8", "--batch-size", "16", "--cpus", "1", "--threads", "1",
]  # fmt: skip


def test_a_crashing_trial_leaves_one_line_and_its_traceback_in_a_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    out = tmp_path / "sweep"
    argv = ["--out", str(out), "--env", "sweep_toy_envs:CrashOnOddSeed", "--seed", "1", "--seeds", "1", *TINY]
    assert sweep_main(argv) == 1  # its only trial failed
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Token authentication" not in err, err
    foreign = [line for line in err.splitlines() if line.strip() and not line.startswith("sac-sweep")]
    assert not foreign, "\n".join(foreign)
    failed = [line for line in err.splitlines() if "trial default-seed1 failed" in line]
    assert failed and "RuntimeError: simulator lost contact (test crash)" in failed[0], err
    named = re.search(r"traceback: (\S+\.log)\)", failed[0])
    assert named, failed[0]
    log = Path(named.group(1))
    assert log.parent == out / "logs" and "Traceback" in log.read_text() and "simulator lost contact" in log.read_text()
