"""Deterministic evaluation with the deployment policy (the same module export puts into ONNX)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from sac_edge.common.rollout import run_episode

from .policies import InferencePolicy


@torch.inference_mode()
def evaluate(policy: InferencePolicy, env: gym.Env, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` seeded episodes (seeds ``seed, seed+1, ...``) acting with ``policy`` in ``env``,
    whose observations are the policy's inputs (``common.rollout.policy_inputs``, as every rollout of it)."""
    device = policy.obs_mean.device

    def act(obs: np.ndarray) -> np.ndarray:
        return policy(torch.as_tensor(obs, device=device)).cpu().numpy()

    return [run_episode(act, env, seed + i).total_return for i in range(episodes)]
