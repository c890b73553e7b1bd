"""Threat: another local user plants a symlink where a sweep's trials make their working run dirs. Those
were at a predictable ``$TMPDIR/sac-sweep-<uid>/<session>/<trial>`` (the session is in every checkpoint's
path in the shared storage), so a link there made a trial delete, then train in, a folder the planter chose.
Each attempt of a trial now works in a folder ``mkdtemp`` creates (unpredictable, mode 0700), and whatever
is planted in the temp dir is neither followed nor deleted. The trial runs here as in a Ray worker, without
Ray (Tune's session calls do nothing outside one)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("ray.tune")

from sac_edge.sweep import tune_run
from sac_edge.sweep.cli import parse_args
from sac_edge.sweep.grid import parse_grid, plan
from sac_edge.sweep.storage import open_storage

TINY = [
    "--total-steps", "300", "--learning-starts", "100", "--eval-every", "300", "--eval-episodes", "1",
    "--hidden", "8,8", "--batch-size", "16", "--threads", "1", "--seeds", "1",
]  # fmt: skip
PRECIOUS = "someone's file, not sac-sweep's\n"
SESSION = "0123456789ab"  # read from the storage by whoever planted the link


@pytest.mark.filterwarnings("ignore:`.*` is meant to only be called inside")
def test_a_link_planted_in_the_temp_dir_is_not_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "tmp"  # the node's shared temp dir
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    chosen = tmp_path / "chosen"
    (chosen / SESSION / "default-seed0").mkdir(parents=True)
    (chosen / SESSION / "default-seed0" / "notes.txt").write_text(PRECIOUS)
    planted = temp / f"sac-sweep-{os.getuid()}"
    planted.symlink_to(chosen, target_is_directory=True)

    sweep, train = parse_args(["--out", str(tmp_path / "sweep"), *TINY])
    (trial,) = plan(parse_grid(sweep.grid), train.seed, sweep.seeds, Path(sweep.out))
    used: list[tuple[Path, int]] = []
    real_init = tune_run._ReportingTrainer.__init__

    def spy(self: tune_run._ReportingTrainer, cfg: tune_run.TrainConfig) -> None:
        run = Path(cfg.out)
        used.append((run, run.parent.stat().st_mode & 0o777))
        real_init(self, cfg)

    monkeypatch.setattr(tune_run._ReportingTrainer, "__init__", spy)
    storage = open_storage(str(tmp_path / "store"))
    tune_run._run_trial({"trial": "default-seed0"}, train, {"default-seed0": trial}, SESSION, storage, {})

    assert (chosen / SESSION / "default-seed0" / "notes.txt").read_text() == PRECIOUS, "a planted link was followed"
    assert [p.name for p in (chosen / SESSION / "default-seed0").iterdir()] == ["notes.txt"]
    (run, mode), *_ = used
    assert run.parent.parent == temp and run.parent != planted and mode == 0o700, (run, oct(mode))
    left = sorted(p.name for p in temp.iterdir() if p.name.startswith("sac-sweep"))  # torch keeps its own there
    assert left == [planted.name], "the trial's folder was left behind"
