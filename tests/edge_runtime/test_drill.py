"""``sac-edge drill`` end to end on a small bundle with an envelope: every fault with and without the shield,
no bad action, the fallbacks within their windows, the results written beside the bundle; bad flags are
one line before any work."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from docs_tables import documented

from sac_edge.edge_runtime.cli import main
from sac_edge.edge_runtime.drill import FAULTS
from sac_edge.edge_runtime.runtime import BackendSection, Runtime, RuntimeOptions


def test_drill_runs_every_fault_both_ways(enveloped_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["drill", str(enveloped_bundle), "--episodes", "1", "--max-steps", "60", "--fault-start", "20"]
    assert main([*argv, "--save", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert out[0].startswith("fault")  # the table came first
    rows = {(r["fault"], r["shield"]): r for r in result["rows"]}
    assert set(rows) == {(f, m) for f in FAULTS for m in ("on", "guards")}
    assert result["checks"]["bad_actions"] == 0 and result["checks"]["late_fallbacks"] == []
    assert rows["nan", "on"]["steps_to_fallback"] == 2  # the default window of 3: the third NaN step
    assert rows["stuck", "on"]["steps_to_fallback"] == 3  # five identical observations: the one before the onset + 4
    assert rows["nan", "guards"]["fallbacks"] is None
    assert rows["swap", "on"]["swap_jump"] is not None
    assert documented("sac-edge drill --json") == set(result)
    saved = enveloped_bundle.parent / f"{enveloped_bundle.name}.drill.json"
    assert json.loads(saved.read_text())["rows"] == result["rows"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--faults", "nan,bogus"], "--faults: unknown bogus"),
        (["--stuck-steps", "1"], "--stuck-steps"),
        (["--drop-rate", "2"], "--drop-rate"),
        (["--slew", "0.1,0.2"], "--slew takes one value or 1"),
    ],
)
def test_bad_drill_flags_are_one_line(
    enveloped_bundle: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    assert main(["drill", str(enveloped_bundle), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_the_runtime_ramps_in_with_the_shield_and_not_in_guards_mode(enveloped_bundle: Path) -> None:
    obs = np.array([1.0, 0.0, 0.5], np.float32)
    guards = RuntimeOptions(str(enveloped_bundle), backend=BackendSection(kind="onnxruntime"), shield=None)
    with Runtime(guards) as plain:
        policy = plain.act(obs).copy()
        assert plain.shield is None and plain.summary().shield == {"mode": "guards"}
    options = RuntimeOptions.of(str(enveloped_bundle), backend="onnxruntime", ramp_steps=4, slew=(0,))
    with Runtime(options) as runtime:
        first = runtime.act(obs).copy()
        np.testing.assert_allclose(first, policy / 4, rtol=1e-5, atol=1e-6)  # a quarter of the way from 0
        nan = runtime.act(np.array([np.nan, 0.0, 0.0], np.float32))
        assert np.isfinite(nan).all()
    summary = runtime.summary().shield
    assert summary["mode"] == "on" and summary["envelope"] and summary["out_of_envelope"] >= 1


def test_the_delay_fault_applies_actions_late_from_the_onset() -> None:
    """``--action-delay-steps K``: from ``--fault-start`` the env gets the action sent K steps before (issue 51),
    on top of the observation delay."""
    import gymnasium as gym
    from applied_actions import AppliedActions

    from sac_edge.edge_runtime.config import DrillConfig
    from sac_edge.edge_runtime.drill import FaultInjector

    inner = AppliedActions(gym.make("Pendulum-v1"))
    cfg = DrillConfig("unused", fault_start=3, action_delay_steps=2)
    env = FaultInjector(inner, "delay", cfg, np.ones(3), np.random.default_rng(0))
    env.reset(seed=0)
    for t in range(7):
        env.step(np.array([t / 10], np.float32))
    assert inner.applied == pytest.approx([0.0, 0.1, 0.2, 0.1, 0.2, 0.3, 0.4])
