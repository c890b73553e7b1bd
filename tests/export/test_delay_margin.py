"""``sac-train --action-delay A-B`` to ``sac-export``: the delay recorded in the run dir and the bundle, the
last actions it turns on, and the return at the delay's median, p99 and 2x p99 in ``--json``."""

from __future__ import annotations

import json
from pathlib import Path

from sac_edge.export.cli import main as sac_export
from sac_edge.train.cli import main as sac_train


def test_the_trained_delay_is_recorded_and_its_margin_reported(tmp_path: Path, capsys) -> None:
    run, bundle = tmp_path / "run", tmp_path / "bundle"
    args = ["--env", "Pendulum-v1", "--total-steps", "300", "--learning-starts", "100", "--hidden", "16,16",
            "--batch-size", "16", "--threads", "1", "--compile", "off", "--eval-every", "300",
            "--eval-episodes", "1", "--no-progress", "--action-delay", "1-2", "--out", str(run)]  # fmt: skip
    assert sac_train(args) == 0
    said = capsys.readouterr().out
    assert "--action-delay 1-2 -> action delay in control steps (probability) 1: 0.50, 2: 0.50" in said
    assert "--last-action on: the policy sees the 2 most recent actions" in said
    config = json.loads((run / "config.json").read_text())
    assert config["delay"]["steps"] == [1, 2] and config["observation"]["last_actions"] == 2
    assert sac_export([str(run), "--out", str(bundle), "--engine", "never", "--gate-episodes", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    returns = summary["delay_returns"]
    assert [returns[k]["steps"] for k in ("median", "p99", "2x_p99")] == [1, 2, 4]
    assert all(-2000 < returns[k]["mean_return"] <= 0 for k in returns)  # Pendulum's rewards: 0 to about -16
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["action_delay"]["returns"] == returns and manifest["observation"]["last_actions"] == 2
