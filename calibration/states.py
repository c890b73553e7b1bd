"""Representative state sets for INT8: calibration states and a disjoint held-out set for the gate.

Two real sources, never random noise: ``calib_states.npy`` (a uniform sample of the replay buffer, i.e. the
states training visited) and fresh rollouts of the trained policy itself (deterministic actions, through
onnxruntime on ``policy.onnx``), i.e. the states the deployed policy will see. Rollouts for calibration,
for the held-out set and for the gate use disjoint seed ranges.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.rollout import EnvSetup, Policy, env_setup, run_episode
from sac_edge.common.spec import PolicySpec

from .session import OnnxPolicy

CALIB_STATES = "calib_states.npy"  # the run-dir file name (train/checkpoint.py CALIB_STATES)
HOLDOUT_SEED_OFFSET = 100_000  # rollout seeds: calibration seed+k, held-out seed+100_000+k
GATE_SEED_OFFSET = 200_000  # gate episodes: seed+200_000+k


class StateSets(NamedTuple):
    """Calibration and held-out states (raw observations, float32 ``[N, obs_dim]``), disjoint row-wise."""

    calibration: np.ndarray
    holdout: np.ndarray
    counts: dict[str, int]  # rows per source and split, for the manifest


def validate_states(states: np.ndarray, obs_dim: int, source: str) -> np.ndarray:
    """Check shape ``[N, obs_dim]`` and finiteness; return the states as float32."""
    arr = np.asarray(states)
    if arr.ndim != 2 or arr.shape[1] != obs_dim or arr.shape[0] == 0:
        raise SacEdgeError(f"{source}: states have shape {arr.shape}, expected [N, {obs_dim}] with N >= 1")
    if not np.issubdtype(arr.dtype, np.floating):
        raise SacEdgeError(f"{source}: states have dtype {arr.dtype}, expected float32")
    bad = int((~np.isfinite(arr)).any(axis=1).sum())
    if bad:
        raise SacEdgeError(
            f"{source}: calibration set has {bad} of {len(arr)} rows with non-finite values (NaN/inf); "
            "re-collect the states (retrain or drop those rows)"
        )
    return arr.astype(np.float32, copy=False)


def load_calib_states(path: Path, obs_dim: int) -> np.ndarray:
    """Read ``calib_states.npy`` (a run dir or the file itself); never unpickles."""
    file = path / CALIB_STATES if path.is_dir() else path
    if not file.is_file():
        raise SacEdgeError(f"{file}: calibration states not found (sac-train writes them into the run dir)")
    try:  # mapped first: a header declaring more data than the file holds is refused before any allocation
        arr = np.array(np.load(file, mmap_mode="r", allow_pickle=False))
    except (OSError, ValueError, EOFError, MemoryError) as err:
        raise SacEdgeError(f"{file}: not a readable .npy array ({str(err).splitlines()[0]})") from None
    return validate_states(arr, obs_dim, str(file))


def rollout_states(policy: Policy, env: str | EnvSetup, count: int, seed: int) -> np.ndarray:
    """``count`` states (policy inputs) visited by ``policy`` in seeded episodes of ``env`` (seeds ``seed,
    seed+1, ...``), sampled uniformly over whole episodes so every phase of an episode is represented."""
    made = env_setup(env).make()
    try:
        episodes: list[np.ndarray] = []
        total = 0
        while total < count:
            obs = run_episode(policy, made, seed + len(episodes)).observations
            episodes.append(obs)
            total += len(obs)
    finally:
        made.close()
    pool = np.concatenate(episodes)
    pick = np.random.default_rng(seed).choice(len(pool), size=count, replace=False)
    return pool[np.sort(pick)]


def build_state_sets(
    fp32_onnx: Path,
    spec: PolicySpec,
    *,
    calib_samples: int,
    holdout_samples: int,
    replay: np.ndarray | None = None,
    seed: int = 0,
    rollout: EnvSetup | None = None,
) -> StateSets:
    """Calibration set of ``calib_samples`` rows and a disjoint held-out set of ``holdout_samples`` rows.

    With ``replay`` (the run's ``calib_states.npy``) up to half of each set comes from it (its rows split
    between the two sets, never shared); the rest are fresh rollouts of ``fp32_onnx`` on ``spec.env_id``.
    Without an environment (``spec.env_id`` empty) both sets come from ``replay`` alone. ``rollout``: the env
    as the policy is deployed in it (its observation contract, its trained delay), default ``spec.env_id``.
    """
    if calib_samples < 1 or holdout_samples < 1:
        raise SacEdgeError(
            f"--calib-samples and held-out samples must be >= 1 (got {calib_samples}, {holdout_samples})"
        )
    rows = np.empty((0, spec.obs_dim), np.float32)
    if replay is not None:
        rows = validate_states(replay, spec.obs_dim, CALIB_STATES)
        rows = rows[np.random.default_rng(seed).permutation(len(rows))]
    share = 1 if spec.env_id else 2  # without an environment to roll out, the given states are all there is
    if not spec.env_id and len(rows) < 2:
        raise SacEdgeError("no environment to roll out and fewer than 2 given states to calibrate on; pass --env ID")
    n_cal_replay = min(calib_samples * share // 2, len(rows) // 2)
    n_hold_replay = min(holdout_samples * share // 2, len(rows) - n_cal_replay)
    policy, setup = OnnxPolicy(fp32_onnx), rollout or EnvSetup(spec.env_id)
    cal_parts = [rows[:n_cal_replay]]
    hold_parts = [rows[n_cal_replay : n_cal_replay + n_hold_replay]]
    if spec.env_id and calib_samples > n_cal_replay:
        cal_parts.append(rollout_states(policy, setup, calib_samples - n_cal_replay, seed))
    if spec.env_id and holdout_samples > n_hold_replay:
        hold_parts.append(rollout_states(policy, setup, holdout_samples - n_hold_replay, seed + HOLDOUT_SEED_OFFSET))
    calibration = np.concatenate(cal_parts)
    holdout = _without_rows(np.concatenate(hold_parts), calibration)
    counts = {
        "calibration": len(calibration),
        "calibration_replay": n_cal_replay,
        "calibration_rollout": len(calibration) - n_cal_replay,
        "holdout": len(holdout),
        "holdout_replay": n_hold_replay,
        "holdout_rollout": len(holdout) - n_hold_replay,
    }
    return StateSets(calibration, holdout, counts)


def _without_rows(rows: np.ndarray, exclude: np.ndarray) -> np.ndarray:
    """``rows`` minus any row bit-identical to a row of ``exclude`` (keeps the sets truly disjoint)."""
    seen = {r.tobytes() for r in np.ascontiguousarray(exclude)}
    keep = [i for i, r in enumerate(np.ascontiguousarray(rows)) if r.tobytes() not in seen]
    return rows[keep]
