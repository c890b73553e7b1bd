"""The INT8 accuracy gate: INT8 ships only if it acts like FP32 on held-out states and earns the same return.

Rule: accepted when (a) the mean |a_int8 - a_fp32| over the held-out states is at most 1% of the action
range (per dimension, averaged over dimensions and states) and (b) the mean return over ``gate_episodes``
seeded episodes (the same seeds for both) drops by at most 2% of the FP32 return's distance from the env's
worst return. If the fully quantised model fails, each layer's sensitivity is measured (mean action error with only that
layer quantised) and the most sensitive layers are kept in float, one more at a time, re-checking both
criteria each time. (Ranking by this one-at-a-time sensitivity beat a greedy "which float copy helps most"
search on a trained Pendulum actor: greedy kept the wrong layer first and rejected, ranking accepted.)
When every mixed model with at least one INT8 layer fails, INT8 is rejected, with the fully quantised
model's action errors and returns, and every attempt in the report. Without an environment (an SB3 zip exported without
``--env``: ``spec.env_id`` empty) there are no episodes: criterion (a) alone decides, and the table says so.

Worst return: for envs whose per-step reward has a known minimum it is that minimum times the episode
length (Pendulum-v1: -(pi^2 + 0.1*8^2 + 0.001*2^2) = -16.2736044 per step, 200 steps -> -3254.72). For
other envs (MuJoCo locomotion has no finite worst case) it is the lower of the mean returns of the
zero-action policy and a seeded uniform-random policy on the gate seeds: "as bad as doing nothing or
acting at random", a floor a trained policy is far above. Callers may pass their own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from sac_edge.common.bundle_format import FP32, INT8
from sac_edge.common.envs import make_env
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.rollout import EnvSetup, Policy, env_setup, run_episode
from sac_edge.common.spec import PolicySpec

from .reference_policies import random_policy, zero_policy
from .session import OnnxPolicy
from .states import GATE_SEED_OFFSET

MAX_MEAN_ERROR_FRAC = 0.01  # mean action error <= 1% of the action range
MAX_RETURN_DROP_FRAC = 0.02  # return drop <= 2% of (fp32 return - worst return)
NO_ENV = "no environment (--env not given): no episodes"
PER_STEP_WORST_REWARD = {"Pendulum-v1": -(math.pi**2 + 0.1 * 8.0**2 + 0.001 * 2.0**2)}  # -16.2736044


@dataclass(frozen=True)
class LayerReport:
    """One MatMul/Gemm: its final precision and its sensitivity (mean action error as a fraction of the
    range with only this layer quantised; None when the full INT8 model passed and none was measured)."""

    name: str
    precision: str
    sensitivity: float | None


@dataclass(frozen=True)
class Attempt:
    """One candidate the gate tried: the layers it kept in float, its mean action error and return drop."""

    float_layers: tuple[str, ...]
    mean_action_error_frac: float
    return_drop: float | None  # None: episodes skipped, the action criterion already failed
    passed: bool


@dataclass(frozen=True)
class GateReport:
    """The gate's measurements and verdict (for the terminal table and the manifest's ``gate`` entry)."""

    env_id: str
    verdict: str  # "accepted" | "rejected"
    holdout_states: int
    max_action_error: float  # env units
    mean_action_error: float
    max_action_error_frac: float  # fraction of the action range
    mean_action_error_frac: float
    episode_seeds: tuple[int, ...]
    fp32_returns: tuple[float, ...]
    int8_returns: tuple[float, ...]
    fp32_mean_return: float
    int8_mean_return: float
    worst_return: float
    worst_return_source: str
    return_drop: float
    allowed_return_drop: float
    layers: tuple[LayerReport, ...]
    attempts: tuple[Attempt, ...]
    max_mean_error_frac: float = MAX_MEAN_ERROR_FRAC
    max_return_drop_frac: float = MAX_RETURN_DROP_FRAC

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"

    @property
    def float_layers(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers if layer.precision != INT8)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (non-finite values become None)."""
        return _finite({**dataclasses.asdict(self), "float_layers": list(self.float_layers)})


@dataclass(frozen=True)
class CandidateScore:
    """What one INT8 candidate scores against FP32."""

    max_error: float
    mean_error: float
    max_error_frac: float
    mean_error_frac: float
    int8_returns: tuple[float, ...] | None


def action_errors(
    fp32: Policy, int8: Policy, states: np.ndarray, low: Sequence[float], high: Sequence[float]
) -> tuple[float, float, float, float]:
    """(max, mean) |a_int8 - a_fp32| in env units, then the same as fractions of the action range."""
    err = np.abs(int8(states).astype(np.float64) - fp32(states).astype(np.float64))
    frac = err / (np.asarray(high, np.float64) - np.asarray(low, np.float64))
    return float(err.max()), float(err.mean()), float(frac.max()), float(frac.mean())


def episode_returns(policy: Policy, env: str | EnvSetup, seeds: Sequence[int]) -> tuple[float, ...]:
    """Undiscounted returns of ``policy`` on one episode of ``env`` per seed."""
    made = env_setup(env).make()
    try:
        return tuple(run_episode(policy, made, s).total_return for s in seeds)
    finally:
        made.close()


def worst_return(env_id: str, seeds: Sequence[int]) -> tuple[float, str]:
    """The env's worst return and how it was obtained (see the module docstring)."""
    env = make_env(env_id)
    try:
        per_step = PER_STEP_WORST_REWARD.get(env_id)
        if per_step is not None and env.spec is not None and env.spec.max_episode_steps:
            steps = int(env.spec.max_episode_steps)
            return per_step * steps, f"analytic: {per_step:.7f} per step x {steps} steps"
        zero = float(np.mean([run_episode(zero_policy(env), env, s).total_return for s in seeds]))
        rand = float(np.mean([run_episode(random_policy(env, s), env, s).total_return for s in seeds]))
    finally:
        env.close()
    return min(zero, rand), f"measured: min(zero-action {zero:.2f}, uniform-random {rand:.2f}) on the gate seeds"


@dataclass(frozen=True)
class GateSettings:
    """How the gate measures (``sac-export --gate-episodes``, ``--seed``)."""

    gate_episodes: int
    """Seeded episodes of the env the FP32 and INT8 returns are compared on."""
    seed: int = 0
    """The first episode's seed is ``seed + GATE_SEED_OFFSET``."""
    worst: tuple[float, str] | None = None
    """The env's worst return and its source; None: worked out by :func:`worst_return`."""
    rollout: EnvSetup | None = None
    """The env as the policy is deployed in it (observation contract, trained delay); None: ``spec.env_id``."""

    def __post_init__(self) -> None:
        if self.gate_episodes < 1:
            raise SacEdgeError(f"--gate-episodes must be >= 1, got {self.gate_episodes}")


@dataclass(frozen=True)
class Candidates:
    """The INT8 models the gate may try."""

    build: Callable[[frozenset[str]], onnx.ModelProto]
    """``build(float_layers)``: the Q/DQ model with those MatMul/Gemm layers left float."""
    layers: Sequence[str] = ()
    """Every MatMul/Gemm layer's name: what the mixed-precision fallback chooses from."""
    keep_float: Collection[str] = ()
    """Layers the caller forces to float from the start."""


def run_gate(
    fp32: onnx.ModelProto | Path, candidates: Candidates, holdout: np.ndarray, spec: PolicySpec, settings: GateSettings
) -> tuple[GateReport, onnx.ModelProto | None]:
    """Gate the fully quantised model, falling back to mixed precision; return the report and the
    accepted model (None when rejected)."""
    reference = _reference(fp32, spec, settings)
    outcome = _search(_Trials(reference, candidates.build, holdout, spec), candidates)
    return _report(spec, len(holdout), reference, outcome, candidates.layers), outcome.model


@dataclass(frozen=True)
class _Reference:
    """The FP32 side of every comparison: its policy, episode seeds and returns, the worst return and the
    return drop allowed (no seeds and NaNs without an environment, where the action-error rule alone decides)."""

    policy: OnnxPolicy
    seeds: tuple[int, ...]
    returns: tuple[float, ...]
    mean_return: float
    worst: tuple[float, str]
    allowed_drop: float
    env: EnvSetup


def _reference(fp32: onnx.ModelProto | Path, spec: PolicySpec, settings: GateSettings) -> _Reference:
    policy, env = OnnxPolicy(fp32), settings.rollout or EnvSetup(spec.env_id)
    if not spec.env_id:  # no episodes: the action-error rule alone decides
        return _Reference(policy, (), (), math.nan, (math.nan, NO_ENV), math.nan, env)
    seeds = tuple(settings.seed + GATE_SEED_OFFSET + k for k in range(settings.gate_episodes))
    returns = episode_returns(policy, env, seeds)
    worst = settings.worst if settings.worst is not None else worst_return(spec.env_id, seeds)
    mean = _mean(returns)
    return _Reference(policy, seeds, returns, mean, worst, MAX_RETURN_DROP_FRAC * max(mean - worst[0], 0.0), env)


class _Trials:
    """Scores INT8 candidates against the FP32 reference: action errors on the held-out states, then (where
    there is an env) returns on the reference's seeds."""

    def __init__(
        self,
        reference: _Reference,
        build: Callable[[frozenset[str]], onnx.ModelProto],
        holdout: np.ndarray,
        spec: PolicySpec,
    ) -> None:
        self.reference, self.build, self.holdout, self.spec = reference, build, holdout, spec

    def score(self, float_layers: frozenset[str]) -> tuple[CandidateScore, onnx.ModelProto, OnnxPolicy]:
        """Action errors of the candidate that keeps ``float_layers`` in float (no episodes yet)."""
        model = self.build(float_layers)
        policy = OnnxPolicy(model)
        errors = action_errors(self.reference.policy, policy, self.holdout, self.spec.action_low, self.spec.action_high)
        return CandidateScore(*errors, None), model, policy

    def with_returns(self, scored: CandidateScore, policy: OnnxPolicy) -> tuple[CandidateScore, float | None]:
        """The candidate's episode returns and return drop (None without an environment)."""
        if not self.spec.env_id:
            return scored, None
        returns = episode_returns(policy, self.reference.env, self.reference.seeds)
        return dataclasses.replace(scored, int8_returns=returns), self.reference.mean_return - _mean(returns)

    def passes(self, scored: CandidateScore, drop: float | None) -> bool:
        returns_ok = drop is not None and drop <= self.reference.allowed_drop if self.spec.env_id else True
        return scored.mean_error_frac <= MAX_MEAN_ERROR_FRAC and returns_ok


@dataclass(frozen=True)
class _Outcome:
    """What the search settled on: the accepted model (None: rejected), the score the report shows (the
    accepted candidate's, else the first one's), the layers left float, every attempt and the sensitivities."""

    model: onnx.ModelProto | None
    shown: CandidateScore
    float_layers: frozenset[str]
    attempts: tuple[Attempt, ...]
    sensitivity: Mapping[str, float]


def _search(trials: _Trials, candidates: Candidates) -> _Outcome:
    """The fully quantised model (bar ``keep_float``) first; when it fails, the layers ranked by sensitivity
    and the most sensitive kept in float, one more at a time, until a candidate passes or one layer is left."""
    forced = frozenset(candidates.keep_float)
    first, model, policy = trials.score(forced)
    drop = None
    if math.isfinite(first.max_error):  # reported even when rejected, so always with its returns
        first, drop = trials.with_returns(first, policy)
    ok = trials.passes(first, drop)
    attempts = [Attempt(tuple(sorted(forced)), first.mean_error_frac, drop, ok)]
    remaining = [name for name in candidates.layers if name not in forced]
    if ok or len(remaining) < 2:
        return _Outcome(model if ok else None, first, forced, tuple(attempts), {})
    every = frozenset(candidates.layers)
    sensitivity = {name: trials.score(every - {name})[0].mean_error_frac for name in remaining}
    ranked = sorted(remaining, key=lambda n: sensitivity[n], reverse=True)
    for k in range(1, len(ranked)):  # keep the k most sensitive layers in float
        kept = forced | frozenset(ranked[:k])
        scored, model, policy = trials.score(kept)
        drop = None
        if math.isfinite(scored.max_error) and scored.mean_error_frac <= MAX_MEAN_ERROR_FRAC:
            scored, drop = trials.with_returns(scored, policy)
        ok = trials.passes(scored, drop)
        attempts.append(Attempt(tuple(sorted(kept)), scored.mean_error_frac, drop, ok))
        if ok:
            return _Outcome(model, scored, kept, tuple(attempts), sensitivity)
    return _Outcome(None, first, forced, tuple(attempts), sensitivity)


def _report(
    spec: PolicySpec, holdout_states: int, reference: _Reference, outcome: _Outcome, layers: Sequence[str]
) -> GateReport:
    shown = outcome.shown
    int8_returns = shown.int8_returns or tuple(math.nan for _ in reference.seeds)
    return GateReport(
        env_id=spec.env_id,
        verdict="accepted" if outcome.model is not None else "rejected",
        holdout_states=holdout_states,
        max_action_error=shown.max_error,
        mean_action_error=shown.mean_error,
        max_action_error_frac=shown.max_error_frac,
        mean_action_error_frac=shown.mean_error_frac,
        episode_seeds=reference.seeds,
        fp32_returns=reference.returns,
        int8_returns=int8_returns,
        fp32_mean_return=reference.mean_return,
        int8_mean_return=_mean(int8_returns),
        worst_return=reference.worst[0],
        worst_return_source=reference.worst[1],
        return_drop=reference.mean_return - _mean(int8_returns),
        allowed_return_drop=reference.allowed_drop,
        layers=tuple(
            LayerReport(n, FP32 if n in outcome.float_layers else INT8, outcome.sensitivity.get(n)) for n in layers
        ),
        attempts=outcome.attempts,
    )


def render_table(report: GateReport) -> str:
    """The gate report as a terminal table."""
    pct = 100.0
    lines = [
        f"INT8 accuracy gate: {report.env_id}  ->  {report.verdict.upper()}",
        f"  {'criterion':<34}{'FP32':>12}{'INT8':>12}{'value':>12}{'limit':>12}  ok",
        f"  {'mean action error (% of range)':<34}{'':>12}{'':>12}"
        f"{report.mean_action_error_frac * pct:>11.3f}%{report.max_mean_error_frac * pct:>11.2f}%"
        f"  {_mark(report.mean_action_error_frac <= report.max_mean_error_frac)}",
        f"  {'max action error (% of range)':<34}{'':>12}{'':>12}{report.max_action_error_frac * pct:>11.3f}%",
        f"  {'mean action error (env units)':<34}{'':>12}{'':>12}{report.mean_action_error:>12.4g}",
        f"  {'max action error (env units)':<34}{'':>12}{'':>12}{report.max_action_error:>12.4g}",
        f"  {f'mean return ({len(report.episode_seeds)} seeded episodes)':<34}"
        + (
            f"{report.fp32_mean_return:>12.2f}{report.int8_mean_return:>12.2f}"
            f"{report.return_drop:>12.2f}{report.allowed_return_drop:>12.2f}"
            f"  {_mark(report.return_drop <= report.allowed_return_drop)}"
            if report.episode_seeds
            else f"{'skipped: no --env, the action-error rule alone decides':>48}"
        ),
        f"  worst return {report.worst_return:.2f} ({report.worst_return_source}); "
        f"held-out states {report.holdout_states}",
        f"  {'layer':<40}{'precision':>10}{'sensitivity':>14}",
    ]
    for layer in report.layers:
        sens = "-" if layer.sensitivity is None else f"{layer.sensitivity * pct:.3f}%"
        lines.append(f"  {layer.name:<40}{layer.precision:>10}{sens:>14}")
    if len(report.attempts) > 1:
        for i, att in enumerate(report.attempts):
            drop = "skipped" if att.return_drop is None else f"{att.return_drop:.2f}"
            kept = ", ".join(att.float_layers) or "none"
            lines.append(
                f"  attempt {i}: float [{kept}]  mean error {att.mean_action_error_frac * pct:.3f}%  "
                f"return drop {drop}  {'pass' if att.passed else 'fail'}"
            )
    return "\n".join(lines)


def _mean(values: Sequence[float]) -> float:
    """The mean, NaN for no values (no episodes without an environment)."""
    return float(np.mean(values)) if len(values) else math.nan


def _mark(ok: bool) -> str:
    return "yes" if ok else "NO"


def _finite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def gate_model(
    fp32: onnx.ModelProto | Path,
    int8: onnx.ModelProto | Path,
    holdout: np.ndarray,
    spec: PolicySpec,
    settings: GateSettings,
) -> GateReport:
    """Gate one given INT8 model as it is (no mixed-precision fallback, no layer table)."""
    model = int8 if isinstance(int8, onnx.ModelProto) else onnx.load(str(int8))
    return run_gate(fp32, Candidates(lambda _: model), holdout, spec, settings)[0]
