"""What ``sac-sweep --resume`` takes from the command line: the report's target return and price replace the
saved ones and are written back to ``DIR/sweep_config.json``; without them the saved ones stay. A finished
sweep resumes without starting Ray, so these run on one trial sac-train wrote."""

from __future__ import annotations

import json
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


@pytest.fixture
def finished_sweep(tmp_path: Path) -> Path:
    """A one-trial sweep as sac-sweep leaves it, with no target and no price."""
    out = tmp_path / "sweep"
    sweep, train = parse_args(["--out", str(out), "--seeds", "1", *TINY])
    atomic_write_json(out / SAVED, {"sweep": config_dict(sweep), "train": config_dict(train)})
    assert train_main([*TINY, "--out", str(out / "trials" / "default-seed0"), "--seed", "0"]) == 0
    return out


def _resume(out: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    rc = sweep_main(["--out", str(out), "--resume", "--cpus", "1", "--json", *flags])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out.strip().splitlines()[-1])["configs"][0]


def test_target_and_price_given_on_resume_are_taken_and_saved(
    finished_sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On bca952e both were dropped on --resume: no time to target, no cost."""
    plain = _resume(finished_sweep, capsys)
    assert plain["reached_target"] == 0 and plain["cost_usd"] is None
    config = _resume(finished_sweep, capsys, "--target-return", "-1e9", "--price-per-hour", "3.6")
    assert config["reached_target"] == 1 and config["cost_usd"] == pytest.approx(config["wall_s"] / 1000)
    saved = json.loads((finished_sweep / SAVED).read_text())
    assert (saved["sweep"]["target_return"], saved["train"]["price_per_hour"]) == (-1e9, 3.6)
    assert saved["sweep"]["resume"] is False  # only the report's settings are written back
    summary = json.loads((finished_sweep / "summary.json").read_text())
    assert (summary["target_return"], summary["price_per_hour"]) == (-1e9, 3.6)
    again = _resume(finished_sweep, capsys)  # not given again: the saved ones stay
    assert again["reached_target"] == 1 and again["cost_usd"] == config["cost_usd"]
    assert _resume(finished_sweep, capsys, "--target-return", "1e9")["reached_target"] == 0  # a new target


def test_a_bad_price_on_resume_is_one_line_naming_the_flag(
    finished_sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (finished_sweep / SAVED).read_text()
    assert sweep_main(["--out", str(finished_sweep), "--resume", "--price-per-hour", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["sac-sweep: error: --price-per-hour must be a price of 0 or more, got -1.0"]
    assert (finished_sweep / SAVED).read_text() == before


def test_a_setting_resume_would_not_take_is_refused_the_same_one_passes(
    finished_sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, ``--resume --total-steps 600 --seeds 3`` continued the saved sweep and dropped both in silence."""
    before = (finished_sweep / SAVED).read_text()
    changed = ["--out", str(finished_sweep), "--resume", "--total-steps", "600", "--seeds", "3", "--force"]
    assert sweep_main(changed) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sac-sweep: error: --resume continues the sweep saved in "), err
    for said in ("--seeds 3 (saved: 1)", "--force on (saved: off)", "--total-steps 600 (saved: 300)"):
        assert said in err[0], err
    assert (finished_sweep / SAVED).read_text() == before
    assert _resume(finished_sweep, capsys, "--seeds", "1", *TINY)["reached_target"] == 0  # the command line again
