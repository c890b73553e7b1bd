"""``OnlineChecks`` fed step by step, as the node's shadow mode feeds it: the pairing rule, the divergence,
and the online findings (stale, frozen, out_of_range) with their joints."""

from __future__ import annotations

import json

import numpy as np

from sac_edge.common.io_layout import parse_layout
from sac_edge.edge_runtime.replay.online import OnlineChecks, OnlineLimits
from sac_edge.edge_runtime.replay.reference import Reference

LAYOUT_DICT = {
    "observation": [
        {"source": "joint_states", "field": "position", "joints": ["a", "b"]},
        {"source": "joint_states", "field": "velocity", "joints": ["a", "b"]},
    ],
    "action": {"interface": "effort", "joints": ["b", "a"]},
}
LAYOUT = parse_layout(json.dumps(LAYOUT_DICT), "test")
PERIOD = 10_000_000  # 100 Hz


def checks(**limits: int) -> OnlineChecks:
    reference = Reference(np.full(4, -1.0), np.full(4, 1.0), np.full(4, 0.3), None, None, "test")
    return OnlineChecks(LAYOUT, reference, OnlineLimits(**limits))


def test_the_first_command_after_a_state_is_compared_with_the_policys() -> None:
    c = checks()
    assert c.command(0, [9.0, 9.0]) is None  # no state yet
    rng = np.random.default_rng(0)
    diffs = []
    for step in range(200):
        t = step * PERIOD
        c.state(t, rng.uniform(-0.5, 0.5, 4).astype(np.float32))
        policy = rng.normal(size=2)
        c.action(policy)
        robot = policy + np.array([0.1 * step / 200, -0.2])
        assert c.command(t + 1_000_000, robot) is not None
        assert c.command(t + 2_000_000, robot + 5) is None  # a second command answers no state
        diffs.append(np.abs(robot - policy))
    div = c.divergence()
    expect = np.asarray(diffs)
    assert div["b"]["p50"] == np.percentile(expect[:, 0], 50) and div["a"]["p99"] == np.percentile(expect[:, 1], 99)
    assert c.compared == 200 and c.findings() == []
    report = c.report()
    assert report["commands_compared"] == 200 and report["findings"] == [] and report["divergence"] == div
    assert c.timing()["period_ms"] == 10.0 and c.timing()["command_age_p50_ms"] == 1.0


def test_a_gap_a_frozen_value_and_an_out_of_range_one_are_named() -> None:
    c = checks(frozen_steps=20)
    rng = np.random.default_rng(1)
    t = 0
    for step in range(300):
        t += PERIOD * (12 if step == 150 else 1)  # 120 ms with no state before state 150
        obs = rng.uniform(-0.5, 0.5, 4).astype(np.float32)
        if step >= 100:
            obs[1] = 0.25  # position of b stuck
        if step % 10 == 0:
            obs[2] = 3.0  # velocity of a beyond the training range on 10% of the states
        c.state(t, obs)
    found = {(f.kind, f.joints): f.detail for f in c.findings()}
    assert set(found) == {("stale", ("a", "b")), ("frozen", ("b",)), ("out_of_range", ("a",))}
    assert "12.0 periods" in found["stale", ("a", "b")] and "before state 150" in found["stale", ("a", "b")]
    assert "position of b held at 0.25 for 200 states" in found["frozen", ("b",)]
    assert "velocity of a" in found["out_of_range", ("a",)] and "10% of states" in found["out_of_range", ("a",)]


def test_the_divergence_window_is_bounded() -> None:
    c = checks(window=50)
    for step in range(120):
        c.state(step * PERIOD, np.zeros(4, np.float32) + step * 1e-3)
        c.action([0.0, 0.0])
        c.command(step * PERIOD + 1, [float(step), 0.0])
    assert c.compared == 120 and c.divergence()["b"]["max"] == 119.0
    assert c.divergence()["b"]["p50"] == np.percentile(np.arange(70, 120), 50)  # the latest 50


def test_a_robot_at_rest_is_not_a_frozen_channel() -> None:
    c = checks(frozen_steps=20)
    rest = np.array([0.1, 0.2, 0.0, 0.0], np.float32)
    for step in range(100):
        c.state(step * PERIOD, rest)  # every value held: the robot stands still
    assert c.findings() == []
