"""A pendulum-shaped env (obs 3, action 1) with a declared observation range that it breaks on purpose:
NaN every 5th step, +inf every 7th, out of range every 11th. Loaded as ``faulty_env:FaultyPendulum``."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class FaultyPendulum(gym.Env):
    observation_space = gym.spaces.Box(low=-8.0, high=8.0, shape=(3,), dtype=np.float32)
    action_space = gym.spaces.Box(low=-1.0, high=1.0, shape=(1,), dtype=np.float32)  # tighter than Pendulum's 2

    def __init__(self) -> None:
        self.t = 0
        self.actions: list[np.ndarray] = []

    def _obs(self) -> np.ndarray:
        obs = np.array([np.cos(self.t / 10), np.sin(self.t / 10), 0.5], dtype=np.float32)
        if self.t % 5 == 0:
            obs[0] = np.nan
        elif self.t % 7 == 0:
            obs[1] = np.inf
        elif self.t % 11 == 0:
            obs[2] = 100.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 1
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert np.all(np.isfinite(action)) and np.all(np.abs(action) <= 1.0), action
        self.actions.append(np.array(action, copy=True))
        self.t += 1
        return self._obs(), 0.0, False, self.t % 50 == 0, {}
