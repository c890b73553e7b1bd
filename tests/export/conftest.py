"""Run dirs for the export tests: freshly initialised networks with non-trivial normaliser statistics and
calibration states taken from real environment steps (the run-dir contract of train/checkpoint.py)."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from sac_edge.train.checkpoint import CALIB_STATES, CHECKPOINT, CONFIG, save_tensors
from sac_edge.train.envs import policy_spec
from sac_edge.train.policies import Actor, CriticEnsemble, ObsNormalizer


def env_states(env_id: str, count: int, seed: int = 0) -> np.ndarray:
    """Observations from seeded episodes with random actions."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    rows = []
    for _ in range(count):
        rows.append(np.asarray(obs, np.float32))
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(rows)


def make_run(root: Path, env_id: str = "Pendulum-v1", hidden: tuple[int, ...] = (64, 64), seed: int = 0) -> Path:
    """A run dir as sac-train writes it, from freshly initialised modules."""
    torch.manual_seed(seed)
    env = gym.make(env_id)
    spec = policy_spec(env_id, env, hidden)
    obs_dim, act_dim = spec.obs_dim, spec.act_dim
    env.close()
    states = env_states(env_id, 600, seed)
    norm = ObsNormalizer(obs_dim)
    norm.update(torch.as_tensor(states))
    critic = CriticEnsemble(obs_dim, act_dim, hidden)
    tensors = {
        **{f"actor.{k}": v for k, v in Actor(obs_dim, act_dim, hidden).state_dict().items()},
        **{f"critic.{k}": v for k, v in critic.state_dict().items()},
        **{f"critic_target.{k}": v.clone() for k, v in critic.state_dict().items()},
        "log_alpha": torch.zeros(1),
        **{f"obs_norm.{k}": v for k, v in norm.state_dict().items()},
    }
    run = root / "run"
    run.mkdir(parents=True)
    (run / CONFIG).write_text(json.dumps({"spec": spec.to_dict(), "env": env_id, "seed": seed}))
    save_tensors(run / CHECKPOINT, tensors)
    np.save(run / CALIB_STATES, states)
    return run


@pytest.fixture(scope="session")
def pendulum_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("pendulum"))
