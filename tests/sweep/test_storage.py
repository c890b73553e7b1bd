"""sweep/storage.py without Ray: the newest checkpoint of each trial found by its JSON, one cut short never
chosen, copied back whole into DIR/trials, older ones pruned, a symlinked trials/ refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyarrow.fs")
from sweep_dirs import stored_checkpoint

from sac_edge.common.errors import SacEdgeError
from sac_edge.sweep.grid import GridPoint, Trial
from sac_edge.sweep.storage import collect, newest, open_storage
from sac_edge.train import checkpoint as ckpt


def test_the_newest_complete_checkpoint_is_chosen_and_copied_back(tmp_path: Path) -> None:
    store = open_storage(str(tmp_path / "store"))
    stored_checkpoint(tmp_path / "store" / "tune", "a-seed0", "s1", 0, 500)
    whole = stored_checkpoint(tmp_path / "store" / "tune", "a-seed0", "s2", 1, 1000)
    cut = stored_checkpoint(tmp_path / "store" / "tune", "a-seed0", "s3", 2, 1500)
    (cut / ckpt.CHECKPOINT).write_bytes(b"w" * 10)  # the upload was cut short
    assert newest(store, {"a-seed0"}) == {"a-seed0": (1000, str(whole))}

    sweep = tmp_path / "sweep"
    trial = Trial(GridPoint("a", {}), 0, sweep / "trials" / "a-seed0")
    collect(store, [trial], sweep)
    assert json.loads((trial.run / ckpt.TRAINER_STATE).read_text())["step"] == 1000
    assert sorted(p.name for p in (tmp_path / "store" / "tune").iterdir()) == ["a-seed0@s2"]  # pruned


def test_a_symlinked_trials_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "trials").symlink_to(tmp_path / "elsewhere")
    store = open_storage(str(tmp_path / "store"))
    with pytest.raises(SacEdgeError, match="trials is a symlink"):
        collect(store, [], tmp_path / "sweep")
