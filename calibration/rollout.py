"""Seeded episodes of a policy on a real environment: the source of fresh calibration states and of the
returns the accuracy gate compares."""

from __future__ import annotations

import typing
from typing import NamedTuple

import gymnasium as gym
import numpy as np

Policy = typing.Callable[[np.ndarray], np.ndarray]  # [batch, obs_dim] float32 -> [batch, act_dim]
DEFAULT_MAX_STEPS = 1000  # for envs registered without a time limit (module:Class)


class Episode(NamedTuple):
    """One finished episode: the observations the policy acted on and the undiscounted return."""

    observations: np.ndarray  # [steps, obs_dim] float32
    total_return: float


def run_episode(policy: Policy, env: gym.Env, seed: int) -> Episode:
    """Run ``policy`` (deterministic) from ``env.reset(seed=seed)`` until termination or the time limit."""
    spec = env.spec
    limit = (spec.max_episode_steps if spec is not None else None) or DEFAULT_MAX_STEPS
    obs, _ = env.reset(seed=seed)
    seen: list[np.ndarray] = []
    total = 0.0
    for _ in range(limit):
        obs = np.asarray(obs, dtype=np.float32)
        seen.append(obs)
        action = policy(obs[None])[0]
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        if terminated or truncated:
            break
    return Episode(np.stack(seen), total)


def random_policy(env: gym.Env, seed: int) -> Policy:
    """Uniform random actions from a seeded generator (a reference policy for the gate, never for states)."""
    rng = np.random.default_rng(seed)
    space = env.action_space
    assert isinstance(space, gym.spaces.Box)
    low, high = space.low.astype(np.float32), space.high.astype(np.float32)

    def act(obs: np.ndarray) -> np.ndarray:
        return rng.uniform(low, high, size=(len(obs), *low.shape)).astype(np.float32)

    return act


def zero_policy(env: gym.Env) -> Policy:
    """The action nearest zero inside the bounds (a "do nothing" reference policy for the gate)."""
    space = env.action_space
    assert isinstance(space, gym.spaces.Box)
    action = np.clip(np.zeros(space.shape, dtype=np.float32), space.low, space.high).astype(np.float32)
    return lambda obs: np.broadcast_to(action, (len(obs), *action.shape))
