"""Threat: ``sac-train`` stopped by a signal. SIGTERM (a job scheduler, ``docker stop``) ended it 143 with no line
and lost every step since the last checkpoint (up to ``--checkpoint-every``, 10,000 by default); SIGINT lost
them too. Both now stop at a step boundary, save, and say in one line where to continue (exit 130 and 143),
and the advice works. A run stopped before its first checkpoint is one both ways back into it name the same
way out of (``--force``), where ``--resume`` and a plain rerun each sent the user to the other."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sac_edge.train import checkpoint as ckpt
from sac_edge.train.cli import main as train_main
from sac_edge.train.config import TrainConfig
from sac_edge.train.trainer import Trainer

TINY = [
    "--learning-starts", "100", "--eval-every", "0", "--hidden", "8,8", "--batch-size", "16", "--threads", "1",
    "--log-every", "200", "--compile", "off",
]  # fmt: skip
PATIENCE_S = 180.0  # far longer than a few hundred steps take, even on a busy machine


def _rows(run: Path) -> int:
    path = run / ckpt.METRICS
    return max(len(path.read_text().splitlines()) - 1, 0) if path.is_file() else 0


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_saves_the_steps_since_the_last_checkpoint(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    run = tmp_path / "run"
    argv = [*TINY, "--total-steps", "10000000", "--checkpoint-every", "10000000", "--out", str(run)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sac_edge.train.cli", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + PATIENCE_S
        while _rows(run) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _rows(run) >= 2, "the run logged no 400 steps"
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=PATIENCE_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, err
    (line,) = err.strip().splitlines()
    found = re.fullmatch(
        rf"sac-train: stopped by {sig.name} at step (\d+) of 10000000; .* --resume --total-steps \d+", line
    )
    assert found, line
    step = int(found.group(1))
    assert step >= 400 and json.loads((run / ckpt.TRAINER_STATE).read_text())["step"] == step
    assert train_main(["--out", str(run), "--resume", "--total-steps", str(step + 100)]) == 0  # the advice works
    assert json.loads((run / ckpt.TRAINER_STATE).read_text())["step"] >= step + 100


def test_a_run_stopped_before_its_first_checkpoint_has_one_way_out(tmp_path: Path, refused: Callable[..., str]) -> None:
    run = tmp_path / "run"
    Trainer(TrainConfig(env="Pendulum-v1", out=str(run), hidden=(8, 8), threads=1))  # set up, then stopped
    assert (run / ckpt.CONFIG).is_file() and not (run / ckpt.CHECKPOINT).exists()
    again = refused(train_main, [*TINY, "--out", str(run)], prog="sac-train")
    resumed = refused(train_main, ["--out", str(run), "--resume"], prog="sac-train")
    for line in (again, resumed):
        assert "stopped before its first checkpoint" in line and "pass --force" in line, line
        assert "--resume" not in line and "without" not in line, line
    assert train_main([*TINY, "--out", str(run), "--force", "--total-steps", "200"]) == 0
