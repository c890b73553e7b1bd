"""An env that crashes a trial (loaded as module:Class by the Ray workers through PYTHONPATH)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class CrashOnOddSeed(gym.Wrapper):
    """Pendulum-v1 that raises after ``crash_after`` steps when reset with an odd seed (a broken simulator)."""

    crash_after = 300

    def __init__(self) -> None:
        super().__init__(gym.make("Pendulum-v1"))
        self.odd, self.t = False, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self.odd = seed % 2 == 1
        return self.env.reset(seed=seed, options=options)

    def step(self, action: np.ndarray) -> tuple[Any, Any, bool, bool, dict]:
        self.t += 1
        if self.odd and self.t > self.crash_after:
            raise RuntimeError("simulator lost contact (test crash)")
        return self.env.step(action)
