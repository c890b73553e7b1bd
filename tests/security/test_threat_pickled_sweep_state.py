"""Threat: code run from a sweep directory copied from elsewhere. Ray Tune's experiment state is pickled
(``DIR/tune/tuner.pkl``); ``sac-sweep --resume`` must rebuild the sweep from its JSON and the trials' run
dirs without unpickling anything there, and resume the directory named by ``--out``, never one that
``DIR/sweep_config.json`` names."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

pytest.importorskip("ray.tune")

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.config import config_dict
from sac_edge.sweep.cli import SAVED, parse_args
from sac_edge.sweep.cli import main as sweep_main
from sac_edge.train.cli import main as train_main

TINY = [
    "--total-steps", "300", "--learning-starts", "100", "--eval-every", "300", "--eval-episodes", "1",
    "--hidden", "8,8", "--batch-size", "16", "--threads", "1",
]  # fmt: skip


class _Touch:
    """A pickle that, when loaded, creates ``path`` (as any hostile pickle could run any code)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (open, (str(self.path), "w"))


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-trial sweep as sac-sweep leaves it: sweep_config.json and a complete run dir per trial."""
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    sweep, train = parse_args(["--out", str(out), "--seeds", "1", *TINY])
    atomic_write_json(out / SAVED, {"sweep": config_dict(sweep), "train": config_dict(train)})
    run = out / "trials" / "default-seed0"
    assert train_main([*TINY, "--out", str(run), "--seed", "0", "--checkpoint-every", "300"]) == 0
    return out


def _copy(finished: Path, dest: Path, saved_out: Path) -> Path:
    copy = Path(shutil.copytree(finished, dest))
    saved = json.loads((copy / SAVED).read_text())
    saved["sweep"]["out"] = str(saved_out)
    (copy / SAVED).write_text(json.dumps(saved))
    return copy


def test_resume_never_unpickles_the_tune_state(
    finished_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = _copy(finished_sweep, tmp_path / "copied", tmp_path / "copied")
    marker = tmp_path / "code-ran"
    (copy / "tune").mkdir()
    (copy / "tune" / "tuner.pkl").write_bytes(pickle.dumps(_Touch(marker)))
    rc = sweep_main(["--out", str(copy), "--resume", "--cpus", "1", "--json"])
    assert not marker.exists(), "a pickle from the sweep directory was loaded"
    assert rc == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["trials"], result["completed"]) == (1, 1)  # rebuilt from the run dir


def test_resume_works_on_the_directory_named_by_out(
    finished_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "someone-elses-sweep"
    copy = _copy(finished_sweep, tmp_path / "copied", elsewhere)
    rc = sweep_main(["--out", str(copy), "--resume", "--cpus", "1", "--json"])
    assert not elsewhere.exists(), "resume read or wrote the directory sweep_config.json names"
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((copy / "summary.json").read_text())
    assert [Path(r["run"]).parent.parent for r in summary["trial_results"]] == [copy.resolve()]
