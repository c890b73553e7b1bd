"""Action delay (common/delay.py): ``--action-delay K | A-B``, a device profile turned into control steps, and
the wrapper that applies actions late, drawn per episode from the reset's seed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from applied_actions import AppliedActions

from sac_edge.common.delay import (
    PROFILE_FIX,
    ActionDelay,
    DelayDistribution,
    delay_from_profile,
    parse_action_delay,
)
from sac_edge.common.errors import SacEdgeError


def test_a_fixed_delay_and_a_range():
    fixed = parse_action_delay("3")
    assert fixed.steps == (3,) and fixed.probs == (1.0,) and fixed.largest == 3
    spread = parse_action_delay("1-3")
    assert spread.steps == (1, 2, 3) and spread.quantile(0.5) == 2 and spread.quantile(0.99) == 3
    assert DelayDistribution.from_dict(spread.to_dict(), "x") == spread
    for bad in ("", "3-1", "a", "1-65", "-2"):
        with pytest.raises(SacEdgeError, match="--action-delay"):
            parse_action_delay(bad)


def test_a_device_profile_becomes_steps_at_the_env_period(tmp_path: Path):
    run = tmp_path / "run.json"  # sac-edge run --json: latency and the step start's lateness
    run.write_text(json.dumps({"latency_us": {"p50": 20_000, "p99": 40_000, "max": 90_000, "mean": 21_000},
                               "jitter_us": {"p50": 4_000, "p99": 20_000, "max": 30_000}}))  # fmt: skip
    delay = delay_from_profile(str(run), dt=0.05)  # 24, 60, 120 ms at 50 ms a step: 0, 1, 2 steps
    assert delay.steps == (0, 1, 2) and delay.probs == pytest.approx((0.5, 0.49, 0.01))
    assert "p50/p99/max 24000/60000/120000 us" in delay.source
    bench = tmp_path / "bench.json"  # sac-edge bench --json: the fastest batch-1 row
    bench.write_text(json.dumps({"rows": [{"batch": 1, "latency_us": {"p50": 80_000, "p99": 90_000}},
                                          {"batch": 1, "latency_us": {"p50": 60_000, "p99": 70_000}},
                                          {"batch": 64, "latency_us": {"p50": 1, "p99": 2}}]}))  # fmt: skip
    assert delay_from_profile(str(bench), dt=0.05).steps == (1,)
    node = tmp_path / "summary.json"  # the ROS 2 node's: its step time, the slowest inference for the max
    node.write_text(json.dumps({"node": {"step_p50_us": 30_000, "step_p99_us": 70_000},
                                "runtime": {"latency_us": {"p50": 1_000, "p99": 2_000, "max": 130_000}}}))  # fmt: skip
    assert delay_from_profile(str(node), dt=0.05).steps == (1, 3)
    empty, unstepped = tmp_path / "empty.json", tmp_path / "unstepped.json"
    empty.write_text("{}")
    unstepped.write_text(json.dumps({"node": {"step_p50_us": None, "step_p99_us": None}, "runtime": None}))
    for path in (empty, unstepped):
        with pytest.raises(SacEdgeError, match="no step latency"):
            delay_from_profile(str(path), dt=0.05)
    link, fifo = tmp_path / "link.json", tmp_path / "fifo.json"
    link.symlink_to(run)
    os.mkfifo(fifo)
    said = {"missing.json": "not found", "link.json": "symlink", "fifo.json": "FIFO", "empty.json": "no step latency"}
    for name, why in said.items():  # one line each, naming the file's problem and what to pass
        with pytest.raises(SacEdgeError, match=f"{why}.*; {PROFILE_FIX}"):
            delay_from_profile(str(tmp_path / name), dt=0.05)


def test_actions_arrive_late_by_a_delay_drawn_per_seeded_episode():
    inner = AppliedActions(gym.make("Pendulum-v1"))
    env = ActionDelay(inner, parse_action_delay("2"))
    env.reset(seed=0)
    for t in range(4):
        env.step(np.array([0.5 * (t + 1)], np.float32))
    assert inner.applied == [0.0, 0.0, 0.5, 1.0]  # the middle of the bounds until the first action arrives
    spread = ActionDelay(gym.make("Pendulum-v1"), parse_action_delay("0-5"))
    drawn = []
    for seed in range(6):
        spread.reset(seed=seed)
        drawn.append(spread.steps)
    again = []
    for seed in range(6):
        spread.reset(seed=seed)
        again.append(spread.steps)
    assert drawn == again and len(set(drawn)) > 1
    state = spread.state()
    spread.reset()
    spread.load_state(state)
    assert spread.state() == state
