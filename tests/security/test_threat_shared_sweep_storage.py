"""Threat: sweeps that share one ``--storage``, as Ray Tune users share one ``storage_path``. A second sweep was
refused ("give another prefix") and ``--force`` cleared the whole prefix, another sweep's checkpoints
included. Each sweep now has its own folder under the storage (``--name``, by default ``--out``'s name),
``--force`` clears only that one, and a sweep saved before keeps finding its checkpoints in ``tune/``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("ray.tune")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sweep"))  # sweep_dirs

from sweep_dirs import TINY, new_sweep, stored_checkpoint

from sac_edge.sweep.cli import SAVED
from sac_edge.sweep.cli import main as sweep_main
from sac_edge.train import checkpoint as ckpt

TRIAL = "default-seed0"
ONE = [*TINY, "--total-steps", "300", "--seeds", "1", "--cpus", "1"]


def test_force_clears_only_its_own_sweep_s_folder(
    tmp_path: Path, refused: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    others = [  # other sweeps' checkpoints as they left them: one named lr, one saved before sweeps shared
        stored_checkpoint(store / "lr", TRIAL, "s0", 0, 300),
        stored_checkpoint(store / "tune", TRIAL, "s0", 0, 300),
    ]
    assert sweep_main(["--out", str(tmp_path / "wd"), "--storage", str(store), "--force", *ONE]) == 0
    for other in others:
        assert json.loads((other / ckpt.TRAINER_STATE).read_text())["step"] == 300, f"{other} went"
    assert [p.parent.name.partition("@")[0] for p in store.glob("wd/*/checkpoint_*")] == [TRIAL]
    assert json.loads((tmp_path / "wd" / SAVED).read_text())["sweep"]["name"] == "wd"
    capsys.readouterr()

    again = ["--out", str(tmp_path / "again" / "wd"), "--storage", str(store), *ONE]
    line = refused(sweep_main, again, prog="sac-sweep")
    assert "already holds a sweep named wd" in line and "--name" in line, line


def test_an_out_whose_name_cannot_name_a_folder_asks_for_name(tmp_path: Path, refused: Callable[..., str]) -> None:
    argv = ["--out", str(tmp_path / "my sweep"), "--storage", str(tmp_path / "store"), *ONE]
    line = refused(sweep_main, argv, prog="sac-sweep")
    assert "'my sweep' cannot name the sweep's folder" in line and "pass --name" in line, line
    line = refused(sweep_main, [*argv, "--name", "../up"], prog="sac-sweep")
    assert "--name '../up'" in line, line
    assert not (tmp_path / "store").exists()


def test_a_sweep_saved_before_resumes_from_tune(tmp_path: Path) -> None:
    store = tmp_path / "store"
    out = new_sweep(tmp_path, "--total-steps", "300", "--storage", str(store))
    saved = json.loads((out / SAVED).read_text())
    del saved["sweep"]["name"]  # as sac-sweep saved it before sweeps shared a storage
    (out / SAVED).write_text(json.dumps(saved))
    stored_checkpoint(store / "tune", TRIAL, "s1", 0, 300)
    (out / "trial_state.json").write_text(json.dumps({"ended": {TRIAL: None}}))
    sweep_main(["--out", str(out), "--resume", "--cpus", "1"])  # nothing to run: no Ray
    assert json.loads((out / "trials" / TRIAL / ckpt.TRAINER_STATE).read_text())["step"] == 300
