"""The gate's reference policies: what "doing nothing" and acting at random score on the same episodes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from sac_edge.common.rollout import Policy


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
