"""ONNX vs reference parity: the exported graph through onnxruntime must give the reference's actions.

Held-out states are never the calibration rows themselves: replay states (``calib_states.npy``) with small
per-dimension noise, some with wide noise that reaches the observation clamp, or, without replay states,
fresh rollouts of the exported policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from sac_edge.common.errors import InternalError
from sac_edge.common.spec import PolicySpec

from .source import Reference

PARITY_TOL = 1e-5
#: float32's unit roundoff, and the largest error of onnxruntime's CPU Tanh in units of it (5.5 measured on
#: 3M points in [-12, 12]; torch's is 0.54), with room.
UNIT_ROUNDOFF = 2.0**-24
TANH_ULPS = 8.0
GATE_STATES = 1024  # held-out rows the bundle keeps (parity_states.npy) for the edge runtime's engine gate
PARITY_SEED_OFFSET = 300_000  # rollout seeds disjoint from calibration (seed+k) and the gate (seed+200_000+k)
WIDE_FRACTION = 0.1  # share of held-out rows with wide noise (3 std), to exercise the clamp


class Parity(NamedTuple):
    """Max/mean abs action error (env units) of the ONNX graph vs the reference on ``states`` rows."""

    states: int
    max_abs: float
    mean_abs: float
    tol: float
    reference: str
    state_source: str

    @property
    def passed(self) -> bool:
        return self.max_abs <= self.tol

    def to_dict(self) -> dict[str, Any]:
        return {**self._asdict(), "passed": self.passed}


def held_out_states(
    replay: np.ndarray | None, onnx_path: Path, spec: PolicySpec, count: int, seed: int, name: str = "calib_states"
) -> tuple[np.ndarray, str]:
    """``count`` raw observations for the parity check and where they came from (``name``: what ``replay``
    holds)."""
    rng = np.random.default_rng(seed + PARITY_SEED_OFFSET)
    if replay is not None and len(replay):
        base = replay[rng.integers(len(replay), size=count)].astype(np.float64)
        std = replay.std(axis=0) + 1e-3  # the floor perturbs constant dimensions too
        scale = np.where(rng.random(count) < WIDE_FRACTION, 3.0, 0.05)[:, None]
        return (base + rng.standard_normal(base.shape) * std * scale).astype(np.float32), f"perturbed {name}"
    from sac_edge.calibration.session import OnnxPolicy
    from sac_edge.calibration.states import rollout_states

    states = rollout_states(OnnxPolicy(onnx_path), spec.env_id, count, seed + PARITY_SEED_OFFSET)
    return states, f"rollouts of the exported policy on {spec.env_id}"


def onnx_actions(onnx_path: Path, states: np.ndarray, batch: int = 2048) -> np.ndarray:
    """Actions of ``onnx_path`` through onnxruntime's CPU provider."""
    from sac_edge.calibration.session import OnnxPolicy

    policy = OnnxPolicy(onnx_path)
    return np.concatenate([policy(states[i : i + batch]) for i in range(0, len(states), batch)])


def measure_parity(
    onnx_path: Path,
    reference: Reference,
    reference_name: str,
    states: np.ndarray,
    state_source: str,
    tol: float = PARITY_TOL,
) -> Parity:
    """Compare the ONNX actions with ``reference`` on ``states``."""
    got: np.ndarray = onnx_actions(onnx_path, states).astype(np.float64)
    want = np.asarray(reference(states), dtype=np.float64)
    if got.shape != want.shape:
        raise InternalError(f"parity: ONNX actions have shape {got.shape}, the reference {want.shape}")
    err = np.abs(got - want)
    if not np.all(np.isfinite(err)):
        raise InternalError("parity: non-finite actions on finite held-out states")
    return Parity(len(states), float(err.max()), float(err.mean()), tol, reference_name, state_source)


#: Standard deviations of the float32 error a parity tolerance allows (the error of a sum of rounded terms
#: is close to normal: Higham and Mary, "A new approach to probabilistic rounding error analysis", 2019).
SIGMAS = 10.0


def float32_error_std(policy: Any, states: np.ndarray) -> np.ndarray:
    """Per state and action, the standard deviation of the error float32 arithmetic gives an
    ``InferencePolicy``'s action (env units), rounding errors taken as independent, of mean 0 and variance
    ``u^2 / 3`` (u = 2^-24).

    A layer's output j, a sum of n terms ``t_k = w_jk h_k`` and a bias, gets its own rounding error of
    variance ``u^2 n (sum_k t_k^2 + b_j^2) / 3`` (each term passes through at most n + 1 roundings, in any
    summation order) and inherits ``sum_k w_jk^2 var_k`` from its inputs (ReLU never widens an error); the
    normalisation rounds each input twice, tanh (slope at most 1) adds ``TANH_ULPS`` units, the scaling 2
    roundings. So the error grows with the input's width (last actions, a history), the layers' widths,
    the weights and the inputs, which a fixed tolerance ignores."""
    u2 = UNIT_ROUNDOFF**2 / 3.0
    mean = policy.obs_mean.detach().double().numpy()
    inv_std = policy.obs_inv_std.detach().double().numpy()
    bound = min(policy.clip, 1e6)
    h = np.nan_to_num(np.clip((np.asarray(states, np.float64) - mean) * inv_std, -bound, bound))
    var = 2 * u2 * h**2
    layers = [m for m in policy.actor.trunk if hasattr(m, "weight")] + [policy.actor.mu]
    for i, layer in enumerate(layers):
        w = layer.weight.detach().double().numpy()
        b = layer.bias.detach().double().numpy()
        n = w.shape[1] + 1
        z = h @ w.T + b
        var = var @ (w**2).T + u2 * n * ((h**2) @ (w**2).T + b**2)
        h = np.maximum(z, 0.0) if i < len(layers) - 1 else z
    t = np.tanh(h)
    scale = policy.act_scale.detach().double().numpy()
    bias = policy.act_bias.detach().double().numpy()
    var = (var + (TANH_ULPS * UNIT_ROUNDOFF) ** 2) * scale**2 + 2 * u2 * ((t * scale) ** 2 + bias**2)
    return np.asarray(np.sqrt(var))


def derived_tolerance(policy: Any, states: np.ndarray) -> float:
    """``--parity-tol 0`` (the default): ``SIGMAS`` standard deviations of the difference of two float32
    implementations (torch's and onnxruntime's, each ``float32_error_std`` from the exact action,
    independent: sqrt(2) times it) at the parity state and action where it is largest."""
    return float(SIGMAS * np.sqrt(2.0) * float32_error_std(policy, states).max())


def require_parity(parity: Parity) -> None:
    """Exit 1 (an export bug, not bad input) when the ONNX graph disagrees with its reference."""
    if not parity.passed:
        raise InternalError(
            f"parity failed: ONNX vs {parity.reference} max abs {parity.max_abs:.3g} > {parity.tol:g} "
            f"on {parity.states} held-out states (mean abs {parity.mean_abs:.3g}); the bundle was not written"
        )
