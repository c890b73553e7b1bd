"""A gymnasium wrapper recording the actions its env was given, for tests of action delays (the trainer's and
the drill's)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class AppliedActions(gym.Wrapper):
    """Steps ``env`` and keeps the first value of each action it applied, in order."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.applied: list[float] = []

    def step(self, action):
        self.applied.append(float(np.asarray(action)[0]))
        return self.env.step(action)
