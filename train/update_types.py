"""What the SAC learner and its hand-written update share: the update's metrics and the learner state.

``sac.SAC`` builds a ``manual_update.ManualUpdate`` over itself; both import from here, so neither
imports the other's module back.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from .buffer import ReplayBuffer
from .config import TrainConfig
from .policies import Actor, CriticEnsemble, ObsNormalizer


class UpdateMetrics(NamedTuple):
    """Device scalars from one update; ``finite`` is False if any loss was NaN/inf."""

    critic_loss: Tensor
    actor_loss: Tensor
    alpha_loss: Tensor
    alpha: Tensor
    finite: Tensor


class LearnerState(Protocol):
    """The learner state the hand-written update reads and writes in place (``sac.SAC`` provides it)."""

    cfg: TrainConfig
    device: torch.device
    actor: Actor
    critic: CriticEnsemble
    critic_target: CriticEnsemble
    log_alpha: Tensor
    target_entropy: float
    actor_opt: torch.optim.Adam
    critic_opt: torch.optim.Adam
    buffer: ReplayBuffer
    obs_norm: ObsNormalizer
    critic_params: list[Tensor]
    target_params: list[Tensor]

    def noise(self, n: int) -> Tensor:
        """Standard-normal ``[n, act_dim]`` from the learner's generator (the autograd path's draws)."""
        ...
