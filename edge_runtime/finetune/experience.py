"""The control thread's side of fine-tuning: a staging ring of transitions, episode returns, exploration noise.

Nothing here touches torch: the control thread copies each transition into one preallocated float32 row
(one numpy store of a list of Python floats: the step's numpy calls are what a 1 kHz loop pays for, cold,
between steps) and the learner process drains them into the replay buffer in chunks; the rows live in
shared memory (``shared.py``). The ring is single-producer / single-consumer: the producer fills row
``written % capacity`` and only then advances ``written``; the consumer reads up to the ``written`` it saw
and then advances ``read``, so neither ever sees a half-written row and the control path never waits.
When the learner falls a whole ring behind, new transitions are dropped and counted rather than
overwriting unread rows.

Each finished episode (terminated or truncated) is recorded with the weight *generation* that was serving
when it started and whether that generation served it to the end, so the promotion logic compares returns
of episodes served entirely by one weight set (an episode a swap cut in two belongs to neither).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple

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


def ring_layout(capacity: int, obs_dim: int, act_dim: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """The arrays of a ``StagingRing`` (for ``shared.SharedArrays``): the rows and the three counters.

    A row is ``obs | next_obs | action (normalised) | reward | done``, so a transition is one store."""
    return [
        ("rows", np.dtype(np.float32).str, (capacity, 2 * obs_dim + act_dim + 2)),
        ("counters", np.dtype(np.int64).str, (3,)),  # written, read, dropped
    ]


class StagingRing:
    """Preallocated SPSC ring between the control thread (``push``) and the learner (``drain``).

    ``arrays`` holds the rows and counters (``ring_layout``): plain numpy arrays, or views of a shared
    memory block so that the producer and the consumer can be different processes. The producer's
    ``written`` is published under ``publish`` when one is given (a ``multiprocessing.Lock``, whose
    acquire/release are the memory barriers that make the rows visible before the count on weakly ordered
    CPUs); the producer only ever *tries* the lock, so a stalled consumer can never block the control
    thread: a transition that finds it taken is dropped and counted.
    """

    def __init__(
        self, arrays: Mapping[str, np.ndarray], low: np.ndarray, high: np.ndarray, publish: Any = None
    ) -> None:
        low, high = np.asarray(low, np.float32).reshape(-1), np.asarray(high, np.float32).reshape(-1)
        rows, act_dim = arrays["rows"], len(low)
        obs_dim = (rows.shape[1] - act_dim - 2) // 2
        self._rows, self._counters = rows, arrays["counters"]
        self.obs, self.next_obs = rows[:, :obs_dim], rows[:, obs_dim : 2 * obs_dim]  # column views
        self.actions = rows[:, 2 * obs_dim : 2 * obs_dim + act_dim]
        self.rewards, self.dones = rows[:, -2], rows[:, -1]
        self.capacity = len(rows)
        self._normalise = list(zip(((high + low) / 2).tolist(), (2 / (high - low)).tolist()))
        self._publish = publish

    @property
    def written(self) -> int:
        return int(self._counters[0])

    @property
    def read(self) -> int:
        return int(self._counters[1])

    @property
    def dropped(self) -> int:
        return int(self._counters[2])

    def push(self, obs: np.ndarray, action: np.ndarray, reward: float, next_obs: np.ndarray, done: bool) -> None:
        """Copy one transition in (control thread); ``action`` in env units."""
        counters = self._counters
        written = int(counters[0])
        if written - int(counters[1]) >= self.capacity:
            counters[2] += 1
            return
        self._rows[written % self.capacity] = self._row(obs, action, reward, next_obs, done)
        if self._publish is None:
            counters[0] = written + 1  # publish only after the row is complete
        elif self._publish.acquire(False):
            counters[0] = written + 1
            self._publish.release()
        else:
            counters[2] += 1

    def _row(self, obs: np.ndarray, action: np.ndarray, reward: float, next_obs: np.ndarray, done: bool) -> list[float]:
        row: list[float] = obs.reshape(-1).tolist() + next_obs.reshape(-1).tolist()
        for a, (bias, scale) in zip(action.reshape(-1).tolist(), self._normalise):
            a = (a - bias) * scale
            row.append(-1.0 if a < -1.0 else 1.0 if a > 1.0 else a)
        row += (reward, 1.0 if done else 0.0)
        return row

    def drain(self, limit: int | None = None) -> Transitions | None:
        """Copies of the unread rows (learner), oldest first; None when there are none."""
        if self._publish is not None:
            with self._publish:
                end = int(self._counters[0])
        else:
            end = int(self._counters[0])
        start = int(self._counters[1])
        if limit is not None:
            end = min(end, start + limit)
        if end <= start:
            return None
        idx = np.arange(start, end) % self.capacity
        out = Transitions(self.obs[idx], self.actions[idx], self.rewards[idx], self.next_obs[idx], self.dones[idx])
        self._counters[1] = end
        return out


class EpisodeLog:
    """Per-episode returns tagged with the serving generation (appended by the control thread)."""

    def __init__(self) -> None:
        self.generation = 0  # set by the coordinator thread after a swap has completed
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
    """Gaussian action noise while fine-tuning: ``std`` is a fraction of the half action range (0: none).

    The noise is drawn ``NOISE_BLOCK`` steps at a time, one numpy call every 256 steps, and added over
    Python floats: the step itself makes no numpy call for it (BENCHMARKS.md "Edge: the step as stages")."""

    NOISE_BLOCK = 256

    def __init__(self, std: float, low: np.ndarray, high: np.ndarray, seed: int) -> None:
        low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        self.sigma = (std * (high - low) / 2).astype(np.float32)
        self.enabled = std > 0
        self._rng = np.random.default_rng(seed)
        self._block: list[list[float]] = []
        self._next = 0
        self._out = np.zeros_like(low)

    def __call__(self, action: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return action
        if self._next == len(self._block):
            noise = self._rng.standard_normal((self.NOISE_BLOCK, self.sigma.size)) * self.sigma.reshape(-1)
            self._block, self._next = noise.tolist(), 0
        self._next += 1
        return self._add(action, self._block[self._next - 1], self._out)

    @staticmethod
    def _add(action: np.ndarray, noise: list[float], out: np.ndarray) -> np.ndarray:
        out[:] = [a + n for a, n in zip(action.reshape(-1).tolist(), noise)]
        return out
