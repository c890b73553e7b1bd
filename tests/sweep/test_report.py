"""IQM and its bootstrap interval, the ranking, the table and the plot, on made-up outcomes (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from docs_tables import documented

from sac_edge.sweep.grid import TrialOutcome, parse_grid, plan
from sac_edge.sweep.report import curves, plot_curves, summarize, table
from sac_edge.sweep.stats import iqm_interval


def test_iqm_is_the_mean_of_the_middle_half() -> None:
    interval = iqm_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 1000.0])
    assert interval.iqm == pytest.approx(4.5)  # the outlier is cut, a plain mean would be 128.5
    assert interval.low is not None and interval.high is not None
    assert 1.0 <= interval.low < 4.5 < interval.high <= 1000.0
    assert iqm_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 1000.0]) == interval  # seeded: reproducible


def test_the_interval_narrows_with_more_seeds() -> None:
    rng = np.random.default_rng(0)
    few, many = iqm_interval(rng.normal(0, 1, 5)), iqm_interval(rng.normal(0, 1, 200))
    assert (many.high - many.low) < (few.high - few.low) / 2  # type: ignore[operator]


def test_one_seed_has_no_interval() -> None:
    assert iqm_interval([-200.0]) == (-200.0, None, None)


def _outcomes(tmp_path: Path) -> list[TrialOutcome]:
    trials = plan(parse_grid(["actor_lr=1e-4,1e-3,1e-2"]), 0, 3, tmp_path)
    finals = {
        ("actor_lr=1e-4", 0): [(500, -900.0), (1000, -400.0)],
        ("actor_lr=1e-4", 1): [(500, -800.0), (1000, -300.0)],
        ("actor_lr=1e-4", 2): [(500, -700.0)],  # stopped early: not in the IQM
        ("actor_lr=1e-3", 0): [(500, -600.0), (1000, -150.0)],
        ("actor_lr=1e-3", 1): [(500, -500.0), (1000, -250.0)],
        ("actor_lr=1e-3", 2): [],  # crashed before its first evaluation
    }
    out = []
    for t in trials:
        curve = finals.get((t.point.label, t.seed), [])
        error = "RuntimeError: boom" if (t.point.label, t.seed) == ("actor_lr=1e-3", 2) else None
        out.append(TrialOutcome(t, curve, error))
    return out


def test_summary_ranks_by_iqm_over_completed_seeds(tmp_path: Path) -> None:
    summary = summarize(_outcomes(tmp_path), 1000, engine="ray")
    ranked = [(c["config"], c["rank"], c["completed"]) for c in summary["configs"]]
    assert ranked == [("actor_lr=1e-3", 1, 2), ("actor_lr=1e-4", 2, 2), ("actor_lr=1e-2", None, 0)]
    top = summary["configs"][0]
    assert top["iqm"] == pytest.approx(-200.0) and top["per_seed"] == {"0": -150.0, "1": -250.0, "2": None}
    assert summary["best"]["run"].endswith("trials/actor_lr=1e-3-seed0") and summary["best"]["values"] == {
        "actor_lr": 1e-3
    }
    statuses = {Path(r["run"]).name: r["status"] for r in summary["trial_results"]}
    assert statuses["actor_lr=1e-4-seed2"] == "stopped" and statuses["actor_lr=1e-3-seed2"] == "error"
    assert statuses["actor_lr=1e-2-seed0"] == "pending"
    assert (summary["trials"], summary["completed"], summary["errors"]) == (9, 4, 1)
    lines = table(summary).splitlines()
    assert lines[0].split()[:3] == ["rank", "config", "IQM"]
    assert lines[2].split()[:3] == ["1", "actor_lr=1e-3", "-200.0"]
    assert lines[4].split()[:3] == ["-", "actor_lr=1e-2", "-"]


def test_curves_use_the_seeds_that_reached_each_step(tmp_path: Path) -> None:
    data = curves(_outcomes(tmp_path))
    first = data["actor_lr=1e-4"]
    assert [p["step"] for p in first] == [500, 1000]
    assert first[0]["iqm"] == pytest.approx(-800.0) and data["actor_lr=1e-2"] == []
    plot_curves(data, tmp_path / "curves.png", "test")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def _write_clock(run: Path, wall_s: float, rows: list[tuple[int, float, float | None]]) -> None:
    """What sac-train leaves for the report's clock: trainer_state.json's wall_s, metrics.csv's wall_s."""
    run.mkdir(parents=True)
    (run / "trainer_state.json").write_text(json.dumps({"step": rows[-1][0] if rows else 0, "wall_s": wall_s}))
    lines = ["step,eval_return,wall_s"] + [f"{s},{'' if r is None else r},{w}" for s, w, r in rows]
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_wall_time_cost_and_time_to_target_per_config(tmp_path: Path) -> None:
    outcomes = _outcomes(tmp_path)
    for o in outcomes:
        if o.curve:
            wall = 100.0 * (1 + o.trial.seed) * (2 if o.trial.point.label == "actor_lr=1e-4" else 1)
            _write_clock(o.trial.run, wall, [(step, wall * step / 1000, ret) for step, ret in o.curve])
    summary = summarize(outcomes, 1000, target_return=-300.0, price_per_hour=3.6, engine="ray")
    by = {c["config"]: c for c in summary["configs"]}
    fast, slow, none = by["actor_lr=1e-3"], by["actor_lr=1e-4"], by["actor_lr=1e-2"]
    assert fast["wall_s"] == pytest.approx(150.0) and fast["cost_usd"] == pytest.approx(0.15)
    # seed 0 reached -150 at step 1000 (100 s), seed 1 -250 at 1000 (200 s): median 150 s
    assert fast["time_to_target_s"] == pytest.approx(150.0) and fast["reached_target"] == 2
    assert slow["wall_s"] == pytest.approx(300.0)  # seeds 0 and 1: the stopped seed 2's 600 s is not a run's
    assert slow["reached_target"] == 1  # only seed 1 reached -300
    assert slow["time_to_target_s"] == pytest.approx(400.0)
    assert none["wall_s"] is None and none["time_to_target_s"] is None and none["reached_target"] == 0
    assert set(fast) == documented("summary.json configs")  # the contract, both ways
    header = table(summary).splitlines()[0].split("  ")
    assert [h.strip() for h in header if h.strip()][6:9] == ["wall s/run", "$/run", "s to -300"]
    plain = table(summarize(outcomes, 1000)).splitlines()[0]
    assert "wall s/run" in plain and "$/run" not in plain and "s to" not in plain
