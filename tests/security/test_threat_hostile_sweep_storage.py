"""Threat: a sweep's storage and sweep dir hold what someone else planted. A FIFO in a checkpoint hung
``--resume`` past Ctrl-C; a sparse checkpoint of a few KiB on disk was copied at its full apparent size; a
symlinked checkpoint dir was followed and taken as the trial's result; a ``logs`` link made failed trials
append their tracebacks outside the sweep dir. Each is now refused in one line before Ray starts (or, for a
log file planted mid-run, left alone), with nothing written outside the sweep dir. No Ray runs here: every
refusal comes before it."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.tune")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sweep"))  # sweep_dirs

from sweep_dirs import new_sweep, stored_checkpoint

from sac_edge.sweep.cli import main as sweep_main
from sac_edge.sweep.storage import write_manifest
from sac_edge.sweep.tune_run import _Progress
from sac_edge.train import checkpoint as ckpt

TRIAL = "default-seed0"
RESUME = ["--resume", "--cpus", "1"]
PRECIOUS = "someone's file, not sac-sweep's\n"
PATIENCE_S = 60.0  # far longer than a refusal takes, even on a busy machine


def _resume_within(out: Path, fifo: Path, refused: Callable[..., str]) -> str:
    """``refused`` for ``--resume`` in a thread; a resume still blocked after PATIENCE_S fails the test (the
    FIFO is then opened for writing so that the blocked read ends)."""
    result: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: result.update(line=refused(sweep_main, ["--out", str(out), *RESUME], prog="sac-sweep")),
        daemon=True,
    )
    worker.start()
    worker.join(PATIENCE_S)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(PATIENCE_S)
        pytest.fail(f"--resume blocked on the FIFO {fifo} for {PATIENCE_S:.0f} s")
    return str(result["line"])


def test_a_fifo_in_the_storage_is_refused_without_blocking(tmp_path: Path, refused: Callable[..., str]) -> None:
    out = new_sweep(tmp_path)
    checkpoint = stored_checkpoint(out / "tune", TRIAL, "s1", 0, 600)
    (checkpoint / ckpt.TRAINER_STATE).unlink()
    os.mkfifo(checkpoint / ckpt.TRAINER_STATE)
    line = _resume_within(out, checkpoint / ckpt.TRAINER_STATE, refused)
    assert "FIFO" in line and ckpt.TRAINER_STATE in line, line


def test_a_sparse_checkpoint_is_refused_before_a_byte_is_copied(tmp_path: Path, refused: Callable[..., str]) -> None:
    out = new_sweep(tmp_path)
    checkpoint = stored_checkpoint(out / "tune", TRIAL, "s1", 0, 600)
    os.truncate(checkpoint / ckpt.CHECKPOINT, 256 << 20)  # a hole: a few KiB on disk
    write_manifest(checkpoint)  # a manifest that agrees with it
    line = refused(sweep_main, ["--out", str(out), *RESUME], prog="sac-sweep")
    assert "is not what its header describes" in line, line
    assert not (out / "trials").exists() or not any((out / "trials").iterdir()), "a copy was made"


def test_a_linked_checkpoint_dir_is_not_taken_as_the_trial_s(tmp_path: Path, refused: Callable[..., str]) -> None:
    out = new_sweep(tmp_path)
    elsewhere = stored_checkpoint(tmp_path / "elsewhere", TRIAL, "x", 0, 600)
    (out / "tune" / f"{TRIAL}@s1").mkdir(parents=True)
    (out / "tune" / f"{TRIAL}@s1" / "checkpoint_000000").symlink_to(elsewhere, target_is_directory=True)
    line = refused(sweep_main, ["--out", str(out), *RESUME], prog="sac-sweep")
    assert "checkpoint_000000 is a symlink in the storage" in line, line
    assert not (out / "trials" / TRIAL).exists(), "a checkpoint reached through a link became the trial's result"


def test_a_linked_logs_folder_is_refused(tmp_path: Path, refused: Callable[..., str]) -> None:
    out = new_sweep(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (out / "logs").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    line = refused(sweep_main, ["--out", str(out), *RESUME], prog="sac-sweep")
    assert "logs is a symlink" in line, line
    assert not any((tmp_path / "elsewhere").iterdir())


def test_a_log_file_linked_mid_run_is_not_appended_to(tmp_path: Path) -> None:
    out = new_sweep(tmp_path)
    (out / "logs").mkdir()
    target = tmp_path / "someones-file"
    target.write_text(PRECIOUS)
    (out / "logs" / f"{TRIAL}.log").symlink_to(target)
    progress = _Progress(1, 600, out, {})
    where = progress._log(TRIAL, "Traceback (most recent call last): ...")
    assert where.startswith("not kept") and "symlink" in where, where
    assert target.read_text() == PRECIOUS


def test_a_whole_checkpoint_is_still_copied_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The checks refuse only what sac-train never writes: a whole checkpoint is resumed from as before."""
    out = new_sweep(tmp_path, "--total-steps", "300")
    stored_checkpoint(out / "tune", TRIAL, "s1", 0, 300)
    (out / "trial_state.json").write_text(json.dumps({"ended": {TRIAL: None}}))
    sweep_main(["--out", str(out), *RESUME])  # nothing to run: no Ray; the report of a stand-in checkpoint
    assert json.loads((out / "trials" / TRIAL / ckpt.TRAINER_STATE).read_text())["step"] == 300
