"""Environments that misbehave, for the control-loop threat tests (used as ``--env hostile_envs:Class``).

Each wraps Pendulum-v1 (the test bundle's env) and turns bad after a few steps.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np

BAD_AFTER = 20


class _Pendulum(gym.Wrapper):
    def __init__(self) -> None:
        super().__init__(gym.make("Pendulum-v1"))
        self.t = 0

    def step(self, action: Any) -> Any:
        self.t += 1
        if self.t > BAD_AFTER:
            self.misbehave()
        return self.env.step(action)

    def misbehave(self) -> None:
        raise NotImplementedError


class StepRaises(_Pendulum):
    def misbehave(self) -> None:
        raise RuntimeError("motor driver lost")


class StepExits(_Pendulum):
    def misbehave(self) -> None:
        raise SystemExit(0)


class StepInterrupts(_Pendulum):
    def misbehave(self) -> None:
        raise KeyboardInterrupt


class ResetRaises(_Pendulum):
    def reset(self, **kwargs: Any) -> Any:
        raise OSError("camera not found")


class BadShapes(_Pendulum):
    """Every 3rd observation has the wrong shape, every 5th is a scalar, every 7th is strings."""

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        if self.t % 3 == 0:
            obs = np.zeros(2, np.float32)
        elif self.t % 5 == 0:
            obs = np.float32(0.5)
        elif self.t % 7 == 0:
            obs = np.array(["a", "b", "c"])
        return obs, reward, terminated, truncated, info


class Noisy(_Pendulum):
    """A library that warns on every step after the first few."""

    def misbehave(self) -> None:
        warnings.warn("deprecated call in the driver library", DeprecationWarning, stacklevel=2)
