"""The observation envelope ``sac-export`` writes into the bundle (``envelope.json``, format in
``common/envelope.py``), and the action shaping defaults that come with it.

States: the source's training states (a run's ``calib_states.npy``: a uniform sample of the replay buffer;
an SB3 zip's space samples when no env is given) plus, when the policy's env can be made, the states of a
few seeded rollouts of the exported policy (seeds disjoint from calibration, parity and the gate: the
states the deployed policy itself visits, which a short run's replay may cover thinly). A seeded
``HOLDOUT_FRACTION`` of the rows is held out: the per-dimension bounds and the normalisation are fitted on
the rest, and the Mahalanobis threshold is the ``1 - fpr`` quantile of the held-out scores, so the
false-positive rate is measured on states the fit did not see (both rates go into the facts).

Why Mahalanobis and not a nearest-neighbour distance: at HalfCheetah's size it costs one small
matrix-vector product per step, against a pass over thousands of stored states, and it detects the drill's
faults as well (``bench/shield.py`` measures both).

Slew default: the largest step-to-step change of each action dimension in those rollouts (the
deterministic policy's own changes; the replay buffer's actions carry exploration noise and change by
nearly the whole range), times ``SLEW_WIDEN``, and never below ``MIN_SLEW_FRACTION`` of the range. Without
an env there are no rollouts and no default (the runtime then limits nothing unless ``--slew`` says so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sac_edge.common.envelope import Envelope
from sac_edge.common.spec import PolicySpec

PER_DIM_QUANTILE = 0.999
"""Each dimension's bounds start from its ``1 - q`` and ``q`` quantiles of the fitted states."""
HOLDOUT_FRACTION = 0.2
RIDGE = 1e-6
"""Added to the normalised covariance's diagonal: a dimension the states never vary in stays invertible."""
MIN_SCALE = 1e-6
ENVELOPE_SEED_OFFSET = 300_000
"""Rollout seeds ``seed + 300_000 + k`` (calibration uses ``seed + k``, held-out 100_000, the gate 200_000)."""
SLEW_WIDEN = 1.5
MIN_SLEW_FRACTION = 0.05


def fit_envelope(
    states: np.ndarray,
    spec: PolicySpec,
    *,
    margin: float,
    fpr: float,
    seed: int,
    action_changes: np.ndarray | None = None,
    sources: dict[str, int] | None = None,
) -> Envelope:
    """The envelope of ``states`` ``[n, obs_dim]`` (finite rows; module docstring for the method);
    ``action_changes`` ``[m, act_dim]``: absolute step-to-step action changes, for the slew default."""
    states = np.asarray(states, dtype=np.float64)
    rng = np.random.default_rng(seed + ENVELOPE_SEED_OFFSET)
    order = rng.permutation(len(states))
    cut = max(1, round(len(states) * HOLDOUT_FRACTION))
    holdout, fit = states[order[:cut]], states[order[cut:]]
    if len(fit) < 2:  # too few to fit on: fit on everything (the facts say so)
        fit = states
    q_low, q_high = np.quantile(fit, 1 - PER_DIM_QUANTILE, axis=0), np.quantile(fit, PER_DIM_QUANTILE, axis=0)
    width = q_high - q_low
    low, high = q_low - margin * width, q_high + margin * width
    mean = fit.mean(axis=0)
    scale = np.maximum(fit.std(axis=0), MIN_SCALE)
    z = (fit - mean) / scale
    cov = np.cov(z, rowvar=False).reshape(spec.obs_dim, spec.obs_dim) + RIDGE * np.eye(spec.obs_dim)
    whiten = np.linalg.inv(np.linalg.cholesky(cov))
    whiten = np.tril(whiten)
    act_low, act_high = np.asarray(spec.action_low, np.float64), np.asarray(spec.action_high, np.float64)
    slew = None
    if action_changes is not None and len(action_changes):
        span = act_high - act_low
        slew = np.clip(np.max(action_changes, axis=0) * SLEW_WIDEN, MIN_SLEW_FRACTION * span, span)
    envelope = Envelope(
        low, high, mean, scale, whiten, 1.0, slew, np.clip(np.zeros_like(act_low), act_low, act_high), {}
    )
    held_scores = envelope.scores(holdout)
    threshold = float(np.quantile(held_scores, 1 - fpr, method="higher")) if len(holdout) else 1.0
    threshold = max(threshold, float(np.finfo(np.float64).tiny))
    facts: dict[str, Any] = {
        "score": "mahalanobis",
        "per_dim_quantile": PER_DIM_QUANTILE,
        "margin": margin,
        "false_positive_rate": fpr,
        "fit_states": len(fit),
        "holdout_states": len(holdout),
        "sources": dict(sources or {}),
        "slew_source": None if slew is None else f"rollouts of the exported policy: max change x {SLEW_WIDEN:g}",
    }
    envelope = Envelope(low, high, mean, scale, whiten, threshold, slew, envelope.safe_action, facts)
    facts["holdout_false_positive_rate"] = float(1.0 - envelope.inside(holdout).mean()) if len(holdout) else None
    return envelope


def rollout_data(onnx_path: Path, env_id: str, episodes: int, seed: int) -> tuple[np.ndarray, np.ndarray] | None:
    """States visited and absolute step-to-step action changes of the exported policy in ``episodes`` seeded
    episodes on ``env_id``, or None when there is no env to roll out in."""
    if not env_id or episodes < 1:
        return None
    from sac_edge.calibration.session import OnnxPolicy
    from sac_edge.common.envs import make_env
    from sac_edge.common.rollout import run_episode

    policy = OnnxPolicy(onnx_path)
    env = make_env(env_id)
    try:
        runs = [run_episode(policy, env, seed + ENVELOPE_SEED_OFFSET + k).observations for k in range(episodes)]
    finally:
        env.close()
    changes = [np.abs(np.diff(policy(obs), axis=0)) for obs in runs if len(obs) > 1]
    states = np.concatenate(runs)
    return states, (np.concatenate(changes) if changes else np.empty((0, 0)))


def envelope_for(
    training: np.ndarray | None,
    training_name: str,
    onnx_path: Path,
    spec: PolicySpec,
    *,
    margin: float,
    fpr: float,
    episodes: int,
    seed: int,
) -> Envelope | None:
    """The bundle's envelope from the training states and the policy's rollouts; None with neither."""
    parts, sources = [], {}
    if training is not None and len(training):
        parts.append(np.asarray(training, dtype=np.float64))
        sources[training_name] = len(training)
    rolled = rollout_data(onnx_path, spec.env_id, episodes, seed)
    changes = None
    if rolled is not None:
        parts.append(rolled[0].astype(np.float64))
        sources[f"rollouts of the exported policy on {spec.env_id} ({episodes} episodes)"] = len(rolled[0])
        changes = rolled[1] if rolled[1].size else None
    if not parts:
        return None
    states = np.concatenate(parts)
    states = states[np.isfinite(states).all(axis=1)]
    return fit_envelope(states, spec, margin=margin, fpr=fpr, seed=seed, action_changes=changes, sources=sources)
