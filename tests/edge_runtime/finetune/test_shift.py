"""The domain-shift wrapper changes the dynamics it names, and nothing else."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime.finetune.shift import ShiftedDynamics, parse_shift


def _pendulum_step(env: gym.Env) -> np.ndarray:
    env.reset(seed=3)
    return np.asarray(env.step(np.array([1.5], np.float32))[0])


def test_heavier_pendulum_responds_less_to_torque() -> None:
    nominal = _pendulum_step(gym.make("Pendulum-v1"))
    heavy_env = ShiftedDynamics(gym.make("Pendulum-v1"), m=2.0)
    heavy = _pendulum_step(heavy_env)
    assert heavy_env.unwrapped.m == 2.0 and heavy_env.shift["m"] == {"old": 1.0, "new": 2.0}  # type: ignore[attr-defined]
    assert heavy[2] < nominal[2]  # angular velocity: the same torque accelerates a heavier pole less
    assert heavy_env.observation_space == gym.make("Pendulum-v1").observation_space


def test_halfcheetah_friction_scale() -> None:
    env = ShiftedDynamics(gym.make("HalfCheetah-v5"), friction=0.5)
    base = gym.make("HalfCheetah-v5").unwrapped.model.geom_friction[:, 0]  # type: ignore[attr-defined]
    np.testing.assert_allclose(env.unwrapped.model.geom_friction[:, 0], base * 0.5)  # type: ignore[attr-defined]


def test_bad_shifts_are_one_line_errors() -> None:
    assert parse_shift(("m=1.6", " g = 9")) == {"m": 1.6, "g": 9.0}
    with pytest.raises(SacEdgeError, match="NAME=NUMBER"):
        parse_shift(("m",))
    with pytest.raises(SacEdgeError, match=r"no such dynamics parameter; use one of .*max_torque"):
        ShiftedDynamics(gym.make("Pendulum-v1"), mass=2.0)
