"""A short, seeded Pendulum-v1 run must learn: a faster SAC that learns worse is a regression."""

import csv
import json

import pytest

from sac_edge.train.cli import main


@pytest.mark.slow
def test_short_pendulum_run_improves_return_substantially(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(
        [
            "--env",
            "Pendulum-v1",
            "--total-steps",
            "6000",
            "--learning-starts",
            "1000",
            "--eval-every",
            "1000",
            "--eval-episodes",
            "5",
            "--seed",
            "0",
            "--out",
            str(run),
            "--no-progress",
            "--json",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with open(run / "metrics.csv") as fh:
        evals = [float(r["eval_return"]) for r in csv.DictReader(fh) if r["eval_return"]]
    first, best = evals[0], max(evals)
    # The untrained policy scores about -1200 to -1500; a learning SAC clears -500 within 5000 updates.
    assert first < -900, evals
    assert best > -500 and summary["final_eval_return"] > -600, evals
