"""Deterministic evaluation with the deployment policy (the same module export puts into ONNX)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from sac_edge.common.obs_history import ObsAssembler

from .policies import InferencePolicy


@torch.inference_mode()
def evaluate(
    policy: InferencePolicy, env: gym.Env, episodes: int, seed: int, history: ObsAssembler | None = None
) -> list[float]:
    """Returns of ``episodes`` seeded episodes (seeds ``seed, seed+1, ...``) acting with ``policy``;
    ``history``: the run's observation contract's assembler (one env), None for the frame alone."""
    device = policy.obs_mean.device
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        if history is not None:
            history.reset()
        total, done = 0.0, False
        while not done:
            frame = np.asarray(obs, dtype=np.float32)[None]
            x = torch.as_tensor(frame if history is None else history.assemble(frame), device=device)
            action = policy(x)[0].cpu().numpy()
            if history is not None:
                history.advance(frame, action[None])
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = bool(terminated or truncated)
        returns.append(total)
    return returns
