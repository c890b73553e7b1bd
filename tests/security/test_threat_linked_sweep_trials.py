"""Threat: a sweep dir whose trial dirs, or whose ``trials/`` itself, are symlinks to folders elsewhere (planted
in a shared sweep folder, or left by a careless copy). ``sac-sweep --resume`` opens them without following
the link: it refuses in one line before any Ray starts, trains in nothing outside the sweep dir and deletes
nothing there."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("ray.tune")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sweep"))  # sweep_dirs

from sweep_dirs import TINY, new_sweep

from sac_edge.sweep.cli import main as sweep_main
from sac_edge.train.cli import main as train_main

PRECIOUS = "someone's file, not sac-sweep's\n"


def test_a_linked_trial_dir_is_neither_trained_in_nor_read(tmp_path: Path, refused: Callable[..., str]) -> None:
    outside = tmp_path / "someone-elses-run"
    assert train_main([*TINY, "--total-steps", "300", "--out", str(outside), "--checkpoint-every", "300"]) == 0
    before = (outside / "checkpoint.safetensors").read_bytes()
    out = new_sweep(tmp_path)
    (out / "trials").mkdir()
    (out / "trials" / "default-seed0").symlink_to(outside)
    line = refused(sweep_main, ["--out", str(out), "--resume", "--cpus", "1"], prog="sac-sweep")
    assert "default-seed0 is a symlink" in line, line
    assert (outside / "checkpoint.safetensors").read_bytes() == before, "resume trained in a run outside the sweep"


def test_a_linked_trials_folder_loses_nothing(tmp_path: Path, refused: Callable[..., str]) -> None:
    outside = tmp_path / "elsewhere"
    (outside / "default-seed0").mkdir(parents=True)
    (outside / "default-seed0" / "notes.txt").write_text(PRECIOUS)
    out = new_sweep(tmp_path)
    (out / "trials").symlink_to(outside, target_is_directory=True)
    line = refused(sweep_main, ["--out", str(out), "--resume", "--cpus", "1"], prog="sac-sweep")
    assert "trials is a symlink" in line, line
    assert (outside / "default-seed0" / "notes.txt").read_text() == PRECIOUS, "a folder outside the sweep was deleted"
    assert sorted(p.name for p in outside.iterdir()) == ["default-seed0"]
