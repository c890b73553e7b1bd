"""``sac-train --action-delay A-B`` to ``sac-export``: the delay recorded in the run dir and the bundle, the
last actions it turns on, and the return at the delay's median, p99 and 2x p99 in ``--json``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sac_edge.edge_runtime.cli import main as sac_edge
from sac_edge.export.cli import main as sac_export
from sac_edge.train.cli import main as sac_train

TINY = ["--env", "Pendulum-v1", "--total-steps", "300", "--learning-starts", "100", "--hidden", "16,16",
        "--batch-size", "16", "--threads", "1", "--compile", "off", "--eval-every", "300",
        "--eval-episodes", "1", "--no-progress"]  # fmt: skip
PENDULUM_DT = 0.05  # Pendulum-v1's control period (s)


def test_the_trained_delay_is_recorded_and_its_margin_reported(tmp_path: Path, capsys) -> None:
    run, bundle = tmp_path / "run", tmp_path / "bundle"
    assert sac_train([*TINY, "--action-delay", "1-2", "--out", str(run)]) == 0
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


def _last_json(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_delay_measured_by_sac_edge_run_and_bench_is_trained_in_and_recorded(tmp_path: Path, capsys) -> None:
    """The real ``--json`` of ``sac-edge run`` and ``sac-edge bench`` on a bundle, fed to ``sac-train
    --delay-profile``: its latency (plus the step start's lateness in run's) at Pendulum's 50 ms period becomes
    the recorded delay, in config.json and, exported, in manifest.json."""
    plain, bundle = tmp_path / "plain", tmp_path / "bundle"
    assert sac_train([*TINY, "--out", str(plain)]) == 0
    assert sac_export([str(plain), "--out", str(bundle), "--engine", "never", "--gate-episodes", "1"]) == 0
    capsys.readouterr()
    run_json, bench_json = tmp_path / "run.json", tmp_path / "bench.json"
    assert sac_edge(["run", str(bundle), "--backend", "onnxruntime", "--precision", "fp32", "--rate-hz", "200",
                     "--duration", "0.5", "--json"]) == 0  # fmt: skip
    run_json.write_text(json.dumps(_last_json(capsys)))
    assert sac_edge(["bench", str(bundle), "--backends", "onnxruntime", "--batch", "1", "--calls", "30",
                     "--warmup", "5", "--out", str(bench_json)]) == 0  # fmt: skip
    measured = json.loads(run_json.read_text())
    run_us = [measured["latency_us"][k] + measured["jitter_us"][k] for k in ("p50", "p99", "max")]
    (row,) = json.loads(bench_json.read_text())["rows"]
    bench_us = [
        row["latency_us"]["p50"],
        row["latency_us"]["p99"],
        row["latency_us"].get("max", row["latency_us"]["p99"]),
    ]
    for profile, us in ((run_json, run_us), (bench_json, bench_us)):
        out = tmp_path / f"aware-{profile.stem}"
        assert sac_train([*TINY, "--delay-profile", str(profile), "--out", str(out)]) == 0
        said = capsys.readouterr().out
        steps = [math.floor(u * 1e-6 / PENDULUM_DT + 0.5) for u in us]
        delay = json.loads((out / "config.json").read_text())["delay"]
        assert delay["steps"] == sorted(set(steps)) and math.isclose(sum(delay["probs"]), 1.0, abs_tol=1e-5)
        figures = "/".join(f"{u:.0f}" for u in us)
        assert delay["source"] == f"--delay-profile {profile.name}: p50/p99/max {figures} us at dt 0.05 s", delay
        assert f"--delay-profile {profile.name}: p50/p99/max {figures} us" in said
        assert json.loads((out / "config.json").read_text())["observation"]["last_actions"] == max(1, max(steps))
    exported = tmp_path / "aware-bundle"
    assert sac_export([str(tmp_path / "aware-run"), "--out", str(exported), "--engine", "never",
                       "--gate-episodes", "1"]) == 0  # fmt: skip
    recorded = json.loads((exported / "manifest.json").read_text())["action_delay"]
    config = json.loads((tmp_path / "aware-run" / "config.json").read_text())["delay"]
    assert {k: recorded[k] for k in config} == config and set(recorded["returns"]) == {"median", "p99", "2x_p99"}
