"""Small gymnasium envs that exercise the trainer's input checks (loaded as module:Class)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class UnboundedActionEnv(gym.Env):
    """A Box action space with infinite bounds, which SAC cannot scale into."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(2, np.float32), 0.0, False, False, {}


class NanRewardEnv(gym.Env):
    """Well-formed until step ``nan_after``, then rewards become NaN (a broken sensor or reward)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    nan_after = 700

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        reward = float("nan") if self.t > self.nan_after else -float(np.square(action).sum())
        obs = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return obs, reward, False, self.t % 50 == 0, {}
