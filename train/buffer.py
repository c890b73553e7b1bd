"""Replay buffer preallocated as tensors on the training device.

No Python lists and no per-sample copies: a vector-env step writes K rows with one indexed copy per field,
and sampling draws indices on the device from a dedicated generator (``rand * size``, so the fill level is
a device tensor and the whole sample-and-update step can be captured in a CUDA graph).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor


class ReplayBatch(NamedTuple):
    """One minibatch. Observations are raw (normalised in the update); actions are in [-1, 1]."""

    obs: Tensor
    actions: Tensor
    rewards: Tensor
    next_obs: Tensor
    dones: Tensor


class ReplayBuffer:
    """Fixed-capacity ring buffer of transitions, all fields on ``device``."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "dones")

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, device: torch.device | str) -> None:
        self.capacity = capacity
        self.device = torch.device(device)
        self.obs = torch.zeros((capacity, obs_dim), device=self.device)
        self.actions = torch.zeros((capacity, act_dim), device=self.device)
        self.rewards = torch.zeros(capacity, device=self.device)
        self.next_obs = torch.zeros((capacity, obs_dim), device=self.device)
        self.dones = torch.zeros(capacity, device=self.device)
        self.pos = 0
        self.size = 0
        self._size_t = torch.zeros((), device=self.device)  # fill level as a device scalar for sampling

    def add(
        self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray, dones: np.ndarray
    ) -> None:
        """Append a batch of K transitions (one per vector env), wrapping around at capacity."""
        k = obs.shape[0]
        skip = max(0, k - self.capacity)  # more rows than fit: only the newest survive, as one by one
        pos = (self.pos + skip) % self.capacity
        head = min(k - skip, self.capacity - pos)  # rows before the wrap; the rest go to the start
        for name, value in zip(self.FIELDS, (obs, actions, rewards, next_obs, dones)):
            src, dst = torch.as_tensor(np.asarray(value, dtype=np.float32)[skip:]), getattr(self, name)
            dst[pos : pos + head].copy_(src[:head], non_blocking=True)
            if head < len(src):
                dst[: len(src) - head].copy_(src[head:], non_blocking=True)
        self.pos = (self.pos + k) % self.capacity
        self.size = min(self.size + k, self.capacity)
        self._size_t.fill_(self.size)

    def sample_rows(self, batch_size: int, generator: torch.Generator) -> Tensor:
        """Uniform row indices with replacement; no host synchronisation."""
        return (torch.rand(batch_size, device=self.device, generator=generator) * self._size_t).long()

    def gather(self, rows: Tensor) -> ReplayBatch:
        """The transitions at ``rows`` (a compiled update gathers inside its graph, fused with what reads them)."""
        return ReplayBatch(*(getattr(self, name)[rows] for name in self.FIELDS))

    def sample(self, batch_size: int, generator: torch.Generator) -> ReplayBatch:
        """Uniform minibatch with replacement; no host synchronisation."""
        return self.gather(self.sample_rows(batch_size, generator))

    def state_tensors(self) -> dict[str, Tensor]:
        """The filled rows as laid out in the ring, plus (pos, size), for the checkpoint."""
        out = {f"replay.{name}": getattr(self, name)[: self.size] for name in self.FIELDS}
        out["replay.meta"] = torch.tensor([self.pos, self.size], dtype=torch.int64)
        return out

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        """Restore what ``state_tensors`` wrote (capacity must be at least the saved size)."""
        pos, size = (int(x) for x in tensors["replay.meta"])
        if size > self.capacity:
            raise ValueError(f"saved replay holds {size} transitions, more than capacity {self.capacity}")
        for name in self.FIELDS:
            getattr(self, name)[:size].copy_(tensors[f"replay.{name}"])
        self.pos, self.size = pos, size
        self._size_t.fill_(size)

    def sample_observations(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """A uniform sample of stored raw observations (for calib_states.npy)."""
        take = rng.choice(self.size, size=min(n, self.size), replace=False)
        return self.obs[torch.as_tensor(np.sort(take), device=self.device)].cpu().numpy().astype(np.float32)
