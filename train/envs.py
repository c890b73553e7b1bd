"""Vector environments for training, and environment state capture for exact resume.

Same-step autoreset: when a sub-env ends, ``step`` returns the first observation of the next episode and
the true final observation in ``info["final_obs"]``, which is what the replay buffer needs as next_obs.

Exact resume needs the environments' state too, not only the learner's. ``env_state``/``restore_env_state``
capture what gymnasium keeps per env: the env's RNG, the TimeLimit step count and the physical state
(MuJoCo ``qpos/qvel/act/qacc_warmstart/time``, or a classic-control ``state`` array), all as JSON.
"""

from __future__ import annotations

import os
import sys
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from sac_edge.common.delay import ActionDelay, DelayDistribution
from sac_edge.common.envs import make_env
from sac_edge.common.spec import PolicySpec

_MUJOCO_FIELDS = ("qpos", "qvel", "act", "qacc_warmstart")


def make_vector_env(
    env_id: str, num_envs: int, mode: str = "sync", delay: DelayDistribution | None = None
) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``env_id`` with same-step autoreset (checked before workers start), each
    applying its actions ``delay`` steps late when given (``common/delay.py``)."""
    make_env(env_id).close()  # one-line errors for bad ids/spaces before any worker process starts
    fns = [partial(delayed_env, env_id, delay) for _ in range(num_envs)]
    if mode == "async":
        workers = [partial(_one_thread_env, env_id, delay) for _ in range(num_envs)]
        return gym.vector.AsyncVectorEnv(workers, autoreset_mode=AutoresetMode.SAME_STEP)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)


#: The thread-pool variables of the math libraries an env may load (torch, MKL, OpenBLAS).
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def delayed_env(env_id: str, delay: DelayDistribution | None) -> gym.Env:
    """``make_env(env_id)``, its actions applied late by ``delay`` (None: on time)."""
    env = make_env(env_id)
    return env if delay is None else ActionDelay(env, delay)


def _one_thread_env(env_id: str, delay: DelayDistribution | None = None) -> gym.Env:
    """``make_env`` in an async worker process, with one intra-op thread for whatever math library the env
    uses: K workers beside the learner's threads must not each start a pool the size of the machine."""
    for var in THREAD_VARS:
        os.environ[var] = "1"
    if "torch" in sys.modules:  # a forked worker inherits the learner's pool size
        sys.modules["torch"].set_num_threads(1)
    return delayed_env(env_id, delay)


def policy_spec(env_id: str, env: gym.Env | gym.vector.VectorEnv, hidden: tuple[int, ...]) -> PolicySpec:
    """The PolicySpec of an env (single-env spaces of a vector env)."""
    obs_space = getattr(env, "single_observation_space", env.observation_space)
    act_space = getattr(env, "single_action_space", env.action_space)
    assert isinstance(act_space, gym.spaces.Box)
    return PolicySpec(
        env_id=env_id,
        obs_dim=int(np.prod(obs_space.shape or ())),
        act_dim=int(np.prod(act_space.shape)),
        action_low=tuple(float(x) for x in act_space.low),
        action_high=tuple(float(x) for x in act_space.high),
        hidden=hidden,
    )


def _time_limit(env: gym.Env) -> gym.wrappers.TimeLimit | None:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return env
        env = env.env
    return None


def env_state(vec: gym.vector.VectorEnv) -> list[dict[str, Any]] | None:
    """JSON-able state of each sub-env, or None when it cannot be captured (async workers)."""
    if not isinstance(vec, gym.vector.SyncVectorEnv):
        return None
    states = []
    for env in vec.envs:
        raw: Any = env.unwrapped
        state: dict[str, Any] = {"rng": raw.np_random.bit_generator.state}
        limit = _time_limit(env)
        if limit is not None:
            state["elapsed_steps"] = limit._elapsed_steps
        data = getattr(raw, "data", None)
        if data is not None and hasattr(data, "qpos"):
            state["mujoco"] = {f: np.asarray(getattr(data, f)).tolist() for f in _MUJOCO_FIELDS}
            state["mujoco"]["time"] = float(data.time)
        elif hasattr(raw, "state"):
            state["state"] = np.asarray(raw.state).tolist()
        if isinstance(env, ActionDelay):
            state["action_delay"] = env.state()
        states.append(state)
    return states


def restore_env_state(vec: gym.vector.VectorEnv, states: list[dict[str, Any]]) -> bool:
    """Put captured states back into a freshly reset SyncVectorEnv. False if not possible."""
    if not isinstance(vec, gym.vector.SyncVectorEnv) or len(states) != len(vec.envs):
        return False
    for env, state in zip(vec.envs, states):
        raw: Any = env.unwrapped
        if isinstance(env, ActionDelay) and "action_delay" in state:
            env.load_state(state["action_delay"])
        raw.np_random.bit_generator.state = state["rng"]
        limit = _time_limit(env)
        if limit is not None and "elapsed_steps" in state:
            limit._elapsed_steps = state["elapsed_steps"]
        if "mujoco" in state:
            import mujoco  # only MuJoCo envs have such a state, so the wheel is there

            data = raw.data
            for f in _MUJOCO_FIELDS:
                getattr(data, f)[:] = np.asarray(state["mujoco"][f])
            data.time = state["mujoco"]["time"]
            mujoco.mj_forward(raw.model, data)
            data.qacc_warmstart[:] = np.asarray(state["mujoco"]["qacc_warmstart"])
        elif "state" in state:
            raw.state = np.asarray(state["state"], dtype=np.asarray(raw.state).dtype)
    return True
