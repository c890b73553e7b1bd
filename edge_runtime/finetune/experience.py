"""The control thread's side of fine-tuning: a staging ring of transitions, episode returns, exploration noise.

Nothing here touches torch: the control thread copies each transition into preallocated numpy rows
(a few microseconds) and the learner thread drains them into the replay buffer in chunks. The ring is
single-producer / single-consumer: the producer fills row ``written % capacity`` and only then advances
``written``; the consumer reads up to the ``written`` it saw and then advances ``read``, so neither ever
sees a half-written row and no lock sits on the control path. When the learner falls a whole ring behind,
new transitions are dropped and counted rather than overwriting unread rows.

Each finished episode (terminated or truncated) is recorded with the weight *generation* that was serving
when it started and whether that generation served it to the end, so the promotion logic compares returns
of episodes served entirely by one weight set (an episode a swap cut in two belongs to neither).
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np


class Transitions(NamedTuple):
    """A drained chunk (copies): actions are normalised to [-1, 1] like the trainer's replay."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    dones: np.ndarray


class EpisodeRecord(NamedTuple):
    generation: int
    total_return: float
    steps: int
    whole: bool = True
    """False when a weight swap happened during the episode."""


class StagingRing:
    """Preallocated SPSC ring between the control thread (``push``) and the learner (``drain``)."""

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray) -> None:
        self.capacity = capacity
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), np.float32)
        self.actions = np.zeros((capacity, act_dim), np.float32)
        self.rewards = np.zeros(capacity, np.float32)
        self.dones = np.zeros(capacity, np.float32)
        low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self._bias = (high + low) / 2
        self._inv_scale = 2 / (high - low)
        self.written = 0
        self.read = 0
        self.dropped = 0

    def push(self, obs: np.ndarray, action: np.ndarray, reward: float, next_obs: np.ndarray, done: bool) -> None:
        """Copy one transition in (control thread); ``action`` in env units."""
        if self.written - self.read >= self.capacity:
            self.dropped += 1
            return
        i = self.written % self.capacity
        self.obs[i] = obs
        self.next_obs[i] = next_obs
        row = self.actions[i]
        np.subtract(action, self._bias, out=row)
        np.multiply(row, self._inv_scale, out=row)
        np.clip(row, -1.0, 1.0, out=row)
        self.rewards[i] = reward
        self.dones[i] = 1.0 if done else 0.0
        self.written += 1  # publish only after the row is complete

    def drain(self, limit: int | None = None) -> Transitions | None:
        """Copies of the unread rows (learner thread), oldest first; None when there are none."""
        start, end = self.read, self.written
        if limit is not None:
            end = min(end, start + limit)
        if end <= start:
            return None
        idx = np.arange(start, end) % self.capacity
        out = Transitions(self.obs[idx], self.actions[idx], self.rewards[idx], self.next_obs[idx], self.dones[idx])
        self.read = end
        return out


class EpisodeLog:
    """Per-episode returns tagged with the serving generation (appended by the control thread)."""

    def __init__(self) -> None:
        self.generation = 0  # set by the learner thread after a swap has completed
        self.finished: deque[EpisodeRecord] = deque()  # append / popleft are thread-safe
        self._gen = 0
        self._return = 0.0
        self._steps = 0

    def step(self, reward: float, done: bool) -> None:
        if self._steps == 0:
            self._gen = self.generation
        self._return += reward
        self._steps += 1
        if done:
            whole = self.generation == self._gen
            self.finished.append(EpisodeRecord(self._gen, self._return, self._steps, whole))
            self._return, self._steps = 0.0, 0


class Exploration:
    """Gaussian action noise while fine-tuning: ``std`` is a fraction of the half action range (0: none)."""

    def __init__(self, std: float, low: np.ndarray, high: np.ndarray, seed: int) -> None:
        low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.sigma = (std * (high - low) / 2).astype(np.float32)
        self.enabled = std > 0
        self._rng = np.random.default_rng(seed)
        self._noise = np.zeros_like(low)
        self._out = np.zeros_like(low)

    def __call__(self, action: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return action
        self._rng.standard_normal(out=self._noise, dtype=np.float32)
        np.multiply(self._noise, self.sigma, out=self._noise)
        np.add(action, self._noise, out=self._out)
        return self._out
