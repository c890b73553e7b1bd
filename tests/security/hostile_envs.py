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


class MaskedObservations(_Pendulum):
    """Observations as numpy masked arrays, every 4th with its first entry masked (a missing reading)."""

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        return np.ma.masked_array(obs, mask=[self.t % 4 == 0, False, False]), reward, terminated, truncated, info


class ArrayFlags(_Pendulum):
    """``terminated``/``truncated`` as one-element numpy arrays (accepted), then an array of two."""

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        flag = np.array([terminated]) if self.t <= BAD_AFTER else np.array([terminated, truncated])
        return obs, reward, flag, np.array([truncated]), info


class _NoTruth:
    def __bool__(self) -> bool:
        raise RuntimeError("truth of a driver status word")


class RaisingFlag(_Pendulum):
    """``terminated`` is an object whose ``__bool__`` raises (after a few steps)."""

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        return obs, reward, _NoTruth() if self.t > BAD_AFTER else terminated, truncated, info


class CloseRaises(_Pendulum):
    """Runs fine; ``close()`` raises."""

    def misbehave(self) -> None:
        pass

    def close(self) -> None:
        raise OSError("actuator did not park")


class NoReward(_Pendulum):
    """Reward ``None`` on every other step, NaN on every 7th (a plant without a reward signal)."""

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        bad = None if self.t % 2 else (float("nan") if self.t % 7 == 0 else reward)
        return obs, bad, terminated, truncated, info
