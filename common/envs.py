"""Environment lookup shared by training, the accuracy gate and the device loop (gymnasium, no torch).

``ID`` is a registered gymnasium id; ``module:Class`` is any class with the gymnasium Env API, which is
how a real robot plugs in. Bad ids and unsupported spaces are one-line errors.

Only the command line may name a ``module:Class`` (importing a module runs its code): an environment
named by a file (a bundle's manifest, a run dir's config) goes through ``file_env`` first, which accepts
registered gymnasium ids only.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import gymnasium as gym
import numpy as np

from .errors import SacEdgeError


def is_registered(env: str) -> bool:
    """Whether ``env`` is a gymnasium id already registered (``gym.make`` of it imports nothing new)."""
    return isinstance(env, str) and ":" not in env and env in gym.envs.registration.registry


def file_env(env: object, source: str) -> str:
    """The environment id a file names, accepted only if it is a registered gymnasium id.

    ``source`` names the file. Anything else (``module:Class``, an unknown id, a non-string) is a one-line
    SacEdgeError telling the user to pass the environment on the command line instead.
    """
    if isinstance(env, str) and is_registered(env):
        return env
    if env == "":
        raise SacEdgeError(f"{source} names no environment (an SB3 zip exported without --env): pass --env ID")
    shown = repr(env)[:80]
    raise SacEdgeError(
        f"{source} names environment {shown}, which is not a registered gymnasium id; an environment class is "
        "imported only when given on the command line: pass --env ID or --env module:Class"
    )


def route_mujoco_warnings(env: str) -> None:
    """Send MuJoCo's warnings to stderr as one ``sac-edge:`` line each, for a MuJoCo environment.

    By default MuJoCo prints each warning with a blank line and appends it to ``MUJOCO_LOG.TXT`` in the
    working directory. Deprecation notes about the XML gymnasium ships (HalfCheetah's ``settotalmass``)
    are dropped: the user cannot act on them. The hook is process-wide and set before the model compiles.
    """
    entry = getattr(gym.envs.registration.registry.get(env), "entry_point", "")
    if not (isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco")):
        return
    import mujoco

    def warn(message: str) -> None:
        if "is deprecated" not in message:
            print(f"sac-edge: MuJoCo warning: {message.splitlines()[0]}", file=sys.stderr)

    mujoco.set_mju_user_warning(warn)


def make_env(env: str, **kwargs: Any) -> gym.Env:
    """Instantiate ``env`` (registered id or ``module:Class``) and check it is SAC-compatible."""
    route_mujoco_warnings(env)
    if ":" in env and env.split(":", 1)[0] not in gym.envs.registration.registry:
        module_name, _, class_name = env.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as err:
            raise SacEdgeError(f"cannot load environment class {env!r} ({err}); use module:Class") from None
        if not isinstance(cls, type):  # a function such as os:system would be called with the env's kwargs
            raise SacEdgeError(f"{env!r} names a {type(cls).__name__}, not a class; use module:Class")
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
    obs_space, act_space = getattr(env, "observation_space", None), getattr(env, "action_space", None)
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
