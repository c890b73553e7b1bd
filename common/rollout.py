"""Seeded episodes of a policy on a real environment, in the env it is deployed to: the trainer's evaluation,
INT8 calibration states, the accuracy gate's returns, the export's delay margin and envelope, benchmarks.
A policy with last actions or a history in its input (an observation contract) acts in the env wrapped so
that its observations are the inputs ``Runtime`` assembles; one trained under an action delay acts late.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from .delay import ActionDelay, DelayDistribution
from .envs import make_env
from .obs_history import ObsAssembler, ObsContract

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


class AssembledObservation(gym.Wrapper):
    """An env whose observations are the policy's inputs under ``contract`` (one ``ObsAssembler``, reset
    with each episode and advanced with each action sent, as ``Runtime`` does): rollouts of a policy with
    last actions or a history (INT8 calibration states, the accuracy gate's episodes)."""

    def __init__(self, env: gym.Env, contract: ObsContract) -> None:
        super().__init__(env)
        space = env.action_space
        assert isinstance(space, gym.spaces.Box)
        self.history = ObsAssembler(contract, space.low, space.high)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (contract.obs_dim,), np.float32)
        self._frame = np.zeros((1, contract.frame_dim), np.float32)

    def _input(self, frame: Any) -> np.ndarray:
        self._frame = np.asarray(frame, np.float32).reshape(1, -1)
        return self.history.assemble(self._frame)[0].copy()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        frame, info = self.env.reset(seed=seed, options=options)
        self.history.reset()
        return self._input(frame), info

    def step(self, action: Any) -> Any:
        self.history.advance(self._frame, np.asarray(action).reshape(1, -1))
        frame, reward, terminated, truncated, info = self.env.step(action)
        return self._input(frame), reward, terminated, truncated, info


@dataclass(frozen=True)
class EnvSetup:
    """The env a policy is rolled out in as it will be deployed."""

    env_id: str
    observation: ObsContract | None = None
    """The policy's input contract (None: the frame alone)."""
    action_delay: int = 0
    """Control steps each action arrives late (a bundle's: the median of the delay it was trained under)."""

    def make(self) -> gym.Env:
        env = make_env(self.env_id)
        if self.action_delay:
            env = ActionDelay(env, DelayDistribution((self.action_delay,), (1.0,), "trained median"))
        return policy_inputs(env, self.observation)


def policy_inputs(env: gym.Env, contract: ObsContract | None) -> gym.Env:
    """``env`` with the policy's inputs under ``contract`` as its observations (``env`` itself for the frame
    alone)."""
    return env if contract is None or contract.plain else AssembledObservation(env, contract)


def env_setup(env: str | EnvSetup) -> EnvSetup:
    """An env id as the setup of a policy that sees the frame alone."""
    return env if isinstance(env, EnvSetup) else EnvSetup(env)
