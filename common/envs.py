"""Environment lookup shared by training, the accuracy gate and the device loop (gymnasium, no torch).

``ID`` is a registered gymnasium id; ``module:Class`` is any class with the gymnasium Env API, which is
how a real robot plugs in. Bad ids and unsupported spaces are one-line errors.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym
import numpy as np

from .errors import SacEdgeError


def make_env(env: str, **kwargs: Any) -> gym.Env:
    """Instantiate ``env`` (registered id or ``module:Class``) and check it is SAC-compatible."""
    if ":" in env and env.split(":", 1)[0] not in gym.envs.registration.registry:
        module_name, _, class_name = env.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as err:
            raise SacEdgeError(f"cannot load environment class {env!r} ({err}); use module:Class") from None
        instance = cls(**kwargs)
    else:
        try:
            instance = gym.make(env, **kwargs)
        except gym.error.Error as err:
            raise SacEdgeError(
                f"unknown environment {env!r} ({str(err).splitlines()[0]}); pass a registered gymnasium id "
                "such as Pendulum-v1 or module:Class"
            ) from None
    check_spaces(instance, env)
    return instance


def check_spaces(env: gym.Env, name: str) -> None:
    """SAC needs a flat Box observation and a bounded, finite Box action space."""
    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(act_space, gym.spaces.Box):
        raise SacEdgeError(
            f"{name}: action space is {type(act_space).__name__}, SAC needs a continuous Box action space"
        )
    if not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        raise SacEdgeError(f"{name}: action bounds are unbounded; wrap the env to give finite low/high")
    if len(act_space.shape) != 1:
        raise SacEdgeError(f"{name}: action space shape {act_space.shape} is not flat; flatten it first")
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise SacEdgeError(
            f"{name}: observation space must be a flat Box, got {obs_space}; wrap it with FlattenObservation"
        )
