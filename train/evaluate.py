"""Deterministic evaluation with the deployment policy (the same module export puts into ONNX)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from .policies import InferencePolicy


@torch.inference_mode()
def evaluate(policy: InferencePolicy, env: gym.Env, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` seeded episodes (seeds ``seed, seed+1, ...``) acting with ``policy``."""
    device = policy.obs_mean.device
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            x = torch.as_tensor(np.asarray(obs, dtype=np.float32), device=device).unsqueeze(0)
            action = policy(x)[0].cpu().numpy()
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = bool(terminated or truncated)
        returns.append(total)
    return returns
