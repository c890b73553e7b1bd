"""What ``sac-export`` exports from: a sac-edge run dir or a Stable-Baselines3 SAC ``.zip``, read and
validated up front so a bad input is a one-line error before anything is written."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from sac_edge.common.bounded import safetensors_shapes
from sac_edge.common.delay import DelayDistribution
from sac_edge.common.envs import file_env, make_env
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.jsonfile import read_json
from sac_edge.common.manifest import sha256_file
from sac_edge.common.obs_history import ObsContract
from sac_edge.common.spec import PolicySpec
from sac_edge.train.checkpoint import (
    CALIB_STATES,
    CHECKPOINT,
    CONFIG,
    RESUME_ONLY_PREFIXES,
    inference_policy,
    learner_tensors,
    load_run,
)
from sac_edge.train.policies import InferencePolicy

from .sb3 import Box, is_sb3_zip, load_sb3_zip, sb3_reference
from .vecnormalize import VecNormStats, load_vecnormalize

SPACE_SAMPLES = 4096  # observations drawn from the recorded space when an SB3 zip comes without --env
Reference = typing.Callable[[np.ndarray], np.ndarray]  # raw obs [batch, obs_dim] -> env-unit actions


class PolicySource(NamedTuple):
    """A policy ready to export, with the reference its ONNX must match."""

    kind: str  # "sac-edge" or "stable-baselines3"
    path: Path
    sha256: str
    spec: PolicySpec
    policy: InferencePolicy
    learner: dict[str, torch.Tensor]  # actor, critics, target critics, log-alpha, obs normaliser
    replay_states: np.ndarray | None  # raw observations: the run's calib_states.npy, or space samples, if any
    reference: Reference
    reference_name: str
    provenance: dict[str, Any]
    states_name: str = "calib_states"  # what ``replay_states`` are, for the reports
    observation: dict[str, Any] | None = None  # the run's observation contract (common/obs_history.py), if any
    action_delay: dict[str, Any] | None = None  # the delay it trained under (common/delay.py), if any


def load_source(run: str, env: str = "", vecnormalize: str = "") -> PolicySource:
    """A run dir or an SB3 zip; ``env`` optional for both (checked against the source's spaces);
    ``vecnormalize``: an SB3 zip's VecNormalize statistics file."""
    path = Path(run)
    if is_sb3_zip(path):
        return _load_sb3(path, env, vecnormalize)
    if vecnormalize:
        raise SacEdgeError(f"{path}: --vecnormalize is for a Stable-Baselines3 zip; a run dir has its own normaliser")
    return _load_run_dir(path, env)


def torch_reference(policy: InferencePolicy) -> Reference:
    """The PyTorch eager action, the parity reference for a sac-edge run."""

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return policy(torch.as_tensor(np.ascontiguousarray(obs, dtype=np.float32))).numpy()

    return act


def _load_run_dir(path: Path, env: str) -> PolicySource:
    for name in (CONFIG, CHECKPOINT, CALIB_STATES):  # a planted link would read a file outside the run dir
        if (path / name).is_symlink():
            raise SacEdgeError(
                f"{path / name}: a symlink, which sac-export never follows inside a run dir; copy the file in"
            )
    _check_tensor_sizes(path)
    run = load_run(path)
    spec = run.spec
    for prefix in ("critic.", "critic_target."):  # learner.safetensors must let the device fine-tune
        if not any(name.startswith(prefix) for name in run.tensors):
            raise SacEdgeError(
                f"{path}: its checkpoint holds no {prefix}* tensors; sac-export writes the learner (actor and "
                "critics) for on-device fine-tuning; export the run's full sac-train checkpoint"
            )
    if env:
        _check_env(env, spec, str(path))
        spec = dataclasses.replace(spec, env_id=env)
    else:  # parity and calibration roll the policy out in the run's env: never import what a file names
        file_env(spec.env_id, str(path / CONFIG))
    replay = None
    if (path / CALIB_STATES).is_file():
        from sac_edge.calibration.states import load_calib_states

        replay = load_calib_states(path, spec.obs_dim)
    try:
        policy = inference_policy(spec, run.tensors)
    except RuntimeError as err:  # torch's state-dict mismatch: the config's hidden sizes are not the checkpoint's
        first = str(err).splitlines()[-1].strip()[:160]
        raise SacEdgeError(
            f"{path}: checkpoint.safetensors does not fit config.json's spec (hidden={list(spec.hidden)}: {first}); "
            "the run dir is inconsistent, retrain or restore it"
        ) from None
    learner = learner_tensors(run.tensors)
    _check_finite(learner, path / CHECKPOINT)
    provenance = {k: run.config[k] for k in ("env", "seed", "total_steps", "versions") if k in run.config}
    return PolicySource(
        "sac-edge",
        run.path,
        run.checkpoint_sha256,
        spec,
        policy,
        learner,
        replay,
        torch_reference(policy),
        "torch",
        provenance,
        observation=_observation(run.config, spec, path),
        action_delay=_action_delay(run.config, path),
    )


def _check_finite(learner: dict[str, torch.Tensor], path: Path) -> None:
    """Refuse learner tensors holding NaN or inf (a diverged run): the bundle would serve, and on-device
    fine-tuning would then reject every update without a word on the robot. ``obs_norm.clip`` is inf by
    design in a run without observation normalisation."""
    for name, tensor in learner.items():
        if name == "obs_norm.clip" or not tensor.is_floating_point():
            continue
        if not bool(torch.isfinite(tensor.float()).all()):
            raise SacEdgeError(
                f"{path}: {name} holds NaN or values infinite in float32 (the run diverged); export an earlier "
                "checkpoint of the run"
            )


def _action_delay(config: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """The action delay the run trained under, checked (None: none)."""
    if "delay" not in config:
        return None
    return DelayDistribution.from_dict(config["delay"], str(path / CONFIG)).to_dict()


def _observation(config: dict[str, Any], spec: PolicySpec, path: Path) -> dict[str, Any] | None:
    """The run's observation contract, checked against its spec (None: the frame alone)."""
    if "observation" not in config:
        return None
    contract = ObsContract.from_dict(config["observation"], str(path / CONFIG))
    if contract.obs_dim != spec.obs_dim or contract.act_dim != spec.act_dim:
        raise SacEdgeError(f"{path / CONFIG}: its observation contract does not fit its spec; retrain or restore it")
    return contract.to_dict()


#: The most Q-networks a checkpoint's critic ensemble may hold (sac-train writes 2; REDQ-style ensembles 10).
MAX_CRITICS = 16


def _check_tensor_sizes(path: Path) -> None:
    """Refuse, before the checkpoint is mapped, a tensor larger than any layer of the spec's networks can be
    (a sparse file declaring a 3 GiB tensor would otherwise fail in the mapping, or fill memory). The resume-
    only tensors (replay, optimiser) are never read by sac-export."""
    fix = "export the run dir sac-train wrote"
    if not ((path / CONFIG).is_file() and (path / CHECKPOINT).is_file()):
        return  # load_run says which is missing
    spec = PolicySpec.from_dict(read_json(path / CONFIG, "run config", fix).get("spec", {}), source=str(path / CONFIG))
    # A layer's weight and bias fit in width^2; the critics are stored as one [n, in, out] ensemble.
    width = max(spec.obs_dim + spec.act_dim, *spec.hidden) + 1
    for name, shape in safetensors_shapes(path / CHECKPOINT, "checkpoint", fix).items():
        if name.startswith(RESUME_ONLY_PREFIXES):
            continue
        count = math.prod(shape)
        if count > MAX_CRITICS * width * width:
            raise SacEdgeError(
                f"{path / CHECKPOINT}: tensor {name[:60]} declares {count} values, more than any layer of a policy "
                f"with obs_dim {spec.obs_dim}, act_dim {spec.act_dim} and hidden {spec.hidden} holds; {fix}"
            )


def _load_sb3(path: Path, env: str, vecnormalize: str) -> PolicySource:
    env_box = _env_boxes(env) if env else None
    obs_norm = load_vecnormalize(Path(vecnormalize)) if vecnormalize else None
    model = load_sb3_zip(path, env, env_box, obs_norm)
    policy = inference_policy(model.spec, model.tensors)
    reference = sb3_reference(model)
    name = "stable-baselines3 predict(deterministic=True)" + (" on VecNormalize-normalised obs" if obs_norm else "")
    if reference is None:  # SB3 is a dev dependency; without it the mapped torch policy is the reference
        reference, name = torch_reference(policy), "torch (stable-baselines3 not installed)"
    provenance: dict[str, Any] = {"stable_baselines3_version": model.sb3_version}
    if obs_norm is not None:
        provenance["vecnormalize"] = {"path": str(obs_norm.path.resolve()), "sha256": sha256_file(obs_norm.path)}
    return PolicySource(
        "stable-baselines3",
        path,
        model.sha256,
        model.spec,
        policy,
        model.tensors,
        None if env else space_samples(model.observation_space, obs_norm, SPACE_SAMPLES),
        reference,
        name,
        provenance,
        "samples of the recorded observation space" + (" around the VecNormalize statistics" if obs_norm else ""),
    )


def _env_boxes(env: str) -> tuple[Box, Box]:
    """The ``--env``'s observation and action spaces (``make_env`` admits only float Box spaces)."""
    instance = make_env(env)
    try:
        obs_space, act_space = instance.observation_space, instance.action_space
    finally:
        instance.close()
    assert isinstance(obs_space, gym.spaces.Box) and isinstance(act_space, gym.spaces.Box)  # make_env checked
    return tuple(  # type: ignore[return-value]
        Box(tuple(s.shape), s.low.astype(np.float64), s.high.astype(np.float64)) for s in (obs_space, act_space)
    )


def space_samples(box: Box, obs_norm: VecNormStats | None, count: int, seed: int = 0) -> np.ndarray:
    """Observations for the parity check when no environment is given: per dimension Gaussian around the
    VecNormalize statistics (3 std wide, so the clip is reached too), else uniform within finite bounds,
    else standard normal; clipped to the bounds."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((count, len(box.low)))
    if obs_norm is not None:
        rows = obs_norm.mean + 3.0 * np.sqrt(obs_norm.var) * noise
    else:
        finite = np.isfinite(box.low) & np.isfinite(box.high)
        uniform = rng.uniform(np.where(finite, box.low, 0.0), np.where(finite, box.high, 1.0), noise.shape)
        rows = np.where(finite, uniform, noise)
    return np.clip(rows, box.low, box.high).astype(np.float32)


def _check_env(env: str, spec: PolicySpec, source: str) -> None:
    """``--env`` must have the run's observation size and action bounds."""
    instance = make_env(env)
    try:
        obs_shape = tuple(instance.observation_space.shape or ())
        act = instance.action_space
    finally:
        instance.close()
    assert isinstance(act, gym.spaces.Box)
    if obs_shape != (spec.obs_dim,) or act.shape != (spec.act_dim,):
        raise SacEdgeError(
            f"{source}: --env {env} has observation shape {obs_shape} and action shape {act.shape}, the run has "
            f"obs_dim={spec.obs_dim}, act_dim={spec.act_dim}"
        )
    if not (np.allclose(act.low, spec.action_low) and np.allclose(act.high, spec.action_high)):
        raise SacEdgeError(f"{source}: --env {env} has action bounds {act.low}..{act.high}, unlike the run's")
