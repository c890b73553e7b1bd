"""The findings that need the whole log, and the per-joint action statistics.

- ``scale`` / ``sign`` from the kinematics: a joint's reported velocity against the change of its reported
  position (a velocity in deg/s moves 57x faster than its position does); which of the two is off is the one
  whose spread is off the training spread, and the factor is named when it is a known unit.
- ``swapped`` / ``sign`` from how each command channel moved the robot: the change of every joint's velocity
  (effort and velocity commands) or position (position commands) in the step after a command, regressed on
  the command's channels; a channel must move its own joint, forwards. A channel that moves another joint is
  ``swapped`` (the pair is told apart as exchanged state values when each joint's recorded values resemble the
  other's training values, else as exchanged command channels); one that moves its joint backwards is
  ``sign``.
- ``swapped`` / ``sign`` / ``scale`` from the recorded commands against the policy's on the same states: a
  command channel that follows another channel's action, the opposite of its own, or a multiple of it.
- Without commands (or none that vary apart from the state): a ``swapped`` pair when two joints' recorded
  values each resemble the other's training values far better than their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sac_edge.common.io_layout import IoLayout

from .findings import Finding, Slot
from .reference import Reference

#: Known unit errors: factor -> what it is, for a factor found within UNIT_MATCH of it (log ratio).
UNITS = {
    180 / math.pi: ("deg", "rad"),
    math.pi / 180: ("rad", "deg"),
    1000.0: ("milli-units", "units"),
    0.001: ("units", "milli-units"),
    2 * math.pi: ("rad", "revolutions"),
}
UNIT_MATCH = math.log(1.6)
SCALE_BAND = (0.5, 2.0)
"""A velocity within this factor of its position's change is consistent (the estimate's own spread)."""
MIN_CORRELATION = 0.5
"""Velocity and position change must correlate this much for the kinematic check to judge."""
RESPONSE_MIN = 0.15
"""A command channel's standardised effect on a joint this large (and significant) counts."""
RESPONSE_T = 6.0
"""... and this many standard errors from 0."""
MIN_EXCITATION = 0.1
"""A command channel is judged by its effect only when at least this fraction of its variance is its own (not
explained by the state it answered): without exploration, what a command did cannot be told from what the
state did."""
MIN_PAIRS = 50
"""Fewer commands (or state pairs) than this: the check that needs them is not judged."""
STILL = 0.1
"""A joint whose position changes at under this fraction of its training velocity spread is not judged by the
kinematics (a robot at rest)."""
GAP_FACTOR = 1.5
"""A state interval longer than this many typical periods breaks the step pairs of the kinematic checks."""


@dataclass
class Log:
    """A recording gathered through the layout: ``n`` states and the ``m`` robot commands paired with them."""

    times: np.ndarray
    """[n] int64 ns: when each state was logged."""
    obs: np.ndarray
    """[n, obs_dim]: each state's observation."""
    policy: np.ndarray
    """[n, act_dim]: the policy's command for each state (layout units)."""
    fields: dict[str, np.ndarray]
    """field -> [n, joints]: the raw JointState values of ``IoLayout.state_joints`` (NaN: not published)."""
    command_steps: np.ndarray
    """[m] int: the state each robot command answered."""
    commands: np.ndarray
    """[m, act_dim]: the robot's commands."""


def analyse(log: Log, layout: IoLayout, slots: list[Slot], reference: Reference) -> tuple[list[Finding], dict]:
    """The whole-log findings and the facts behind them (``resemblance``, ``kinematics``, ``response``)."""
    findings: list[Finding] = []
    facts: dict[str, Any] = {}
    resemble = resemblance(log.obs, reference, slots)
    facts["resemblance"] = {slots[i].name: slots[j].name for i, j in resemble.items() if i != j}
    kin, facts["kinematics"] = kinematics(log, layout, slots, reference)
    findings += kin
    response, facts["response"] = command_response(log, layout, slots, reference)
    findings += response
    findings += commands_against_policy(log, layout)
    judged = facts["response"].get("effect") is not None and len(facts["response"]["not_judged"]) < layout.act_dim
    if not judged:  # no command channel to judge by: the training distribution alone
        findings += swapped_by_resemblance(resemble, slots, log.obs, reference)
    return findings, facts


# -- which training slot each recorded channel resembles -----------------------------------------------
PERCENTILES = np.arange(5, 96, 5)


def resemblance(obs: np.ndarray, reference: Reference, slots: list[Slot]) -> dict[int, int]:
    """For each joint slot: the joint slot of the same field whose training distribution the recorded one is
    closest to (quantiles over the training spread)."""
    if reference.states is None or len(obs) < MIN_PAIRS:
        return {}
    rec = np.percentile(obs, PERCENTILES, axis=0)
    train = np.percentile(reference.states, PERCENTILES, axis=0)
    spread = np.maximum(reference.spread, 1e-9)
    out = {}
    for i, slot in enumerate(slots):
        if slot.raw is None:
            continue
        same = [j for j, s in enumerate(slots) if s.raw is not None and s.raw[0] == slot.raw[0]]
        dist = {j: float(np.mean(np.abs(rec[:, i] - train[:, j])) / spread[j]) for j in same}
        out[i] = min(dist, key=lambda j: dist[j])
    return out


def exchange_ratio(obs: np.ndarray, reference: Reference, slots: list[Slot], a: str, b: str) -> float | None:
    """How far the recorded values of joints ``a`` and ``b`` are from each other's training values, over how
    far they are from their own (every field both have): below 1, they look exchanged. None without
    training states."""
    if reference.states is None or len(obs) < MIN_PAIRS:
        return None
    by_raw = {s.raw: i for i, s in enumerate(slots) if s.raw is not None}
    cross = own = 0.0
    for field in ("position", "velocity", "effort"):
        ia, ib = by_raw.get((field, a)), by_raw.get((field, b))
        if ia is None or ib is None:
            continue
        cross += _distance(obs, reference, ia, ib) + _distance(obs, reference, ib, ia)
        own += _distance(obs, reference, ia, ia) + _distance(obs, reference, ib, ib)
    return cross / own if own > 0 else None


def _distance(obs: np.ndarray, reference: Reference, i: int, j: int) -> float:
    assert reference.states is not None
    rec = np.percentile(obs[:, i], PERCENTILES)
    train = np.percentile(reference.states[:, j], PERCENTILES)
    return float(np.mean(np.abs(rec - train)) / max(reference.spread[j], 1e-9))


EXCHANGED = 0.5
"""Without commands, two joints are called swapped when their exchange ratio is below this."""


def swapped_by_resemblance(
    resemble: dict[int, int], slots: list[Slot], obs: np.ndarray, reference: Reference
) -> list[Finding]:
    """Pairs of joint slots that each resemble the other's training values far better than their own (no
    commands to confirm)."""
    out = []
    for i, j in resemble.items():
        if i < j and resemble.get(j) == i:
            a, b = slots[i].joints[0], slots[j].joints[0]
            ratio = exchange_ratio(obs, reference, slots, a, b)
            if ratio is None or ratio >= EXCHANGED:
                continue
            out.append(Finding(
                "swapped", (a, b),
                f"recorded {slots[i].name} looks like training {slots[j].name} and back (no commands in the log to "
                "confirm; check the JointState's joint order)",
            ))  # fmt: skip
    return out


# -- kinematics: velocity against the change of position ----------------------------------------------
def _steady_pairs(times: np.ndarray) -> np.ndarray:
    """Indices i where states i and i+1 are one typical period apart."""
    if len(times) < 2:
        return np.zeros(0, np.intp)
    dt = np.diff(times)
    typical = float(np.median(dt))
    return np.flatnonzero((dt > 0) & (dt < GAP_FACTOR * typical))


def kinematics(log: Log, layout: IoLayout, slots: list[Slot], reference: Reference) -> tuple[list[Finding], dict]:
    """``scale`` and ``sign`` findings for joints whose velocity disagrees with their position's change."""
    pos, vel = log.fields.get("position"), log.fields.get("velocity")
    pairs = _steady_pairs(log.times)
    if pos is None or vel is None or len(pairs) < MIN_PAIRS:
        return [], {}
    dt = (np.diff(log.times) / 1e9)[pairs]
    slot_of = {s.raw: i for i, s in enumerate(slots) if s.raw is not None}
    findings, facts = [], {}
    for j, joint in enumerate(layout.state_joints):
        dq = (pos[pairs + 1, j] - pos[pairs, j]) / dt
        vbar = (vel[pairs + 1, j] + vel[pairs, j]) / 2
        ok = np.isfinite(dq) & np.isfinite(vbar)
        if ok.sum() < MIN_PAIRS or np.std(dq[ok]) == 0 or np.std(vbar[ok]) == 0:
            continue
        i_vel = slot_of.get(("velocity", joint))
        if i_vel is not None and np.std(dq[ok]) < STILL * reference.spread[i_vel]:
            continue  # the joint barely moved: too little motion to judge its units by
        r = float(np.corrcoef(dq[ok], vbar[ok])[0, 1])
        k = math.copysign(float(np.std(vbar[ok]) / np.std(dq[ok])), r)
        facts[joint] = {"velocity_over_position_change": k, "correlation": r}
        if abs(r) < MIN_CORRELATION:
            continue
        if r < 0:
            findings.append(Finding(
                "sign", (joint,),
                f"the velocity of {joint} runs against its position's change (correlation {r:.2f}): one of the "
                "two has the opposite sign",
            ))  # fmt: skip
            continue
        if SCALE_BAND[0] <= k <= SCALE_BAND[1]:
            continue
        ratios = {}
        for field in ("position", "velocity"):
            i = slot_of.get((field, joint))
            if i is not None and reference.spread[i] > 0:
                ratios[field] = float(np.std(log.obs[:, i]) / reference.spread[i])
        wrong = "velocity"
        if ratios and max(ratios, key=lambda f: abs(math.log(max(ratios[f], 1e-12)))) == "position":
            wrong = "position"
        factor = ratios.get(wrong, k if wrong == "velocity" else 1 / k)
        findings.append(Finding("scale", (joint,), _scale_detail(joint, wrong, factor, k)))
    return findings, facts


def _scale_detail(joint: str, field: str, factor: float, k: float) -> str:
    unit = ""
    per = "/s" if field == "velocity" else ""
    for known, (given, meant) in UNITS.items():
        if abs(math.log(factor / known)) < UNIT_MATCH:
            unit = f" ({given}{per} for {meant}{per}?)"
            break
    return (
        f"the {field} of {joint} is x{factor:.3g} the training spread{unit}; its velocity is x{k:.3g} its "
        "position's change"
    )


# -- how each command channel moved the robot ---------------------------------------------------------
def command_response(log: Log, layout: IoLayout, slots: list[Slot], reference: Reference) -> tuple[list[Finding], dict]:
    """``swapped`` and ``sign`` findings from the standardised effect of each command channel on each
    commanded joint's next change."""
    field = "position" if layout.action.interface == "position" else "velocity"
    values = log.fields.get(field)
    if values is None or len(log.commands) < MIN_PAIRS:
        return [], {}
    steady = set(_steady_pairs(log.times).tolist())
    keep = np.array([s in steady for s in log.command_steps.tolist()], dtype=bool)
    steps, commands = log.command_steps[keep], log.commands[keep]
    joints = layout.action.joints
    cols = [layout.state_joints.index(j) for j in joints]
    change = values[steps + 1][:, cols] - values[steps][:, cols]
    state = np.asarray(log.obs[steps], np.float64)
    ok = np.isfinite(change).all(axis=1) & np.isfinite(commands).all(axis=1) & np.isfinite(state).all(axis=1)
    change, commands, state = change[ok], commands[ok], state[ok]
    if len(commands) < MIN_PAIRS:
        return [], {}
    effect, t = _standardised_effects(commands, change, state)
    excitation = _excitation(commands, state)
    facts = {
        "effect": {joints[k]: dict(zip(joints, np.round(effect[k], 3).tolist())) for k in range(len(joints))},
        "excitation": dict(zip(joints, np.round(excitation, 3).tolist())),
        "not_judged": [j for k, j in enumerate(joints) if excitation[k] < MIN_EXCITATION],
    }
    drives: dict[int, int] = {}
    findings = []
    for k, joint in enumerate(joints):
        if excitation[k] < MIN_EXCITATION:
            continue  # the channel only follows the state: its effect cannot be told from the state's
        strong = (np.abs(effect[k]) >= RESPONSE_MIN) & (np.abs(t[k]) >= RESPONSE_T)
        j = int(np.argmax(np.abs(effect[k])))
        if not strong[j]:
            continue
        if j != k and abs(effect[k, j]) > 2 * abs(effect[k, k]):
            drives[k] = j
        elif j == k and effect[k, k] < 0:
            findings.append(Finding(
                "sign", (joint,),
                f"a positive command for {joint} moves it backwards (effect {effect[k, k]:.2f} on its {field}): "
                "the robot applies it with the opposite sign",
            ))  # fmt: skip
    findings += _swaps(drives, joints, field, lambda a, b: exchange_ratio(log.obs, reference, slots, a, b))
    return findings, facts


def _excitation(commands: np.ndarray, state: np.ndarray) -> np.ndarray:
    """Per command channel: the fraction of its variance the state it answered does not explain (linearly);
    0 for a pure feedback law, near 1 with exploration or a person's input."""
    moving = state[:, state.std(axis=0) > 0]
    x = np.concatenate([moving, np.ones((len(moving), 1))], axis=1)
    coef, *_ = np.linalg.lstsq(x, commands, rcond=None)
    total = commands.var(axis=0)
    return np.where(total > 0, (commands - x @ coef).var(axis=0) / np.maximum(total, 1e-300), 0.0)


def _standardised_effects(
    x: np.ndarray, y: np.ndarray, covariates: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """OLS of each column of ``y`` on ``x``, the ``covariates`` and 1: the effects of ``x``'s columns [x col,
    y col] in standard deviations of y per standard deviation of x, and their t statistics. The covariates
    (the state the command answered) take what the state explains: a command that only follows the state (a
    feedback law with no exploration) has no effect of its own left, and large standard errors."""
    k = x.shape[1]
    if covariates is not None:
        moving = covariates.std(axis=0) > 0
        x = np.concatenate([x, covariates[:, moving]], axis=1)
    xs = (x - x.mean(axis=0)) / np.maximum(x.std(axis=0), 1e-12)
    ys = (y - y.mean(axis=0)) / np.maximum(y.std(axis=0), 1e-12)
    coef, *_ = np.linalg.lstsq(xs, ys, rcond=None)
    resid = ys - xs @ coef
    dof = max(len(xs) - xs.shape[1] - 1, 1)
    sigma2 = (resid**2).sum(axis=0) / dof
    inv = np.linalg.pinv(xs.T @ xs)
    se = np.sqrt(np.outer(np.diag(inv), sigma2))
    return coef[:k], (coef / np.maximum(se, 1e-12))[:k]


def _swaps(
    drives: dict[int, int], joints: tuple[str, ...], field: str, ratio: Callable[[str, str], float | None]
) -> list[Finding]:
    out: list[Finding] = []
    done: set[int] = set()
    for k, j in drives.items():
        if k in done:
            continue
        a, b = joints[k], joints[j]
        if drives.get(j) == k:
            done.update((k, j))
            exchange = ratio(a, b)
            if exchange is not None and exchange < 1:
                how = (
                    f"the JointState's values of {a} and {b} are exchanged: the command for each moves the "
                    f"other's reported {field}, and each one's recorded values look like the other's training "
                    f"values (x{exchange:.2f} the distance to its own)"
                )
            else:
                how = (
                    f"the command for {a} moves {b} and the command for {b} moves {a}: the command's joint "
                    "order differs from the robot's (or the JointState's names are exchanged)"
                )
            out.append(Finding("swapped", (a, b), how))
        else:
            done.add(k)
            out.append(Finding("swapped", (a, b), f"the command for {a} moves {b}'s {field}, not {a}'s"))
    return out


# -- the robot's commands against the policy's --------------------------------------------------------
def commands_against_policy(log: Log, layout: IoLayout) -> list[Finding]:
    """A command channel that carries another channel's action, the opposite of its own, or a multiple of it
    (where the policy's actions vary enough to tell)."""
    if len(log.commands) < MIN_PAIRS:
        return []
    policy = log.policy[log.command_steps]
    corr = _correlations(log.commands, policy)
    joints = layout.action.joints
    out = []
    for k, joint in enumerate(joints):
        j = int(np.nanargmax(np.abs(corr[k]))) if np.isfinite(corr[k]).any() else k
        best = corr[k, j]
        if not abs(best) >= MIN_CORRELATION:
            continue
        if j != k and abs(best) > 2 * abs(np.nan_to_num(corr[k, k])):
            out.append(Finding(
                "swapped", (joint, joints[j]),
                f"the robot's command for {joint} follows the policy's action for {joints[j]} (correlation "
                f"{best:.2f}): the command's joint order differs from the layout's",
            ))  # fmt: skip
        elif j == k and best < 0:
            out.append(Finding(
                "sign", (joint,),
                f"the robot's command for {joint} is the opposite of the policy's (correlation {best:.2f})",
            ))  # fmt: skip
        elif j == k:
            slope = _slope(policy[:, k], log.commands[:, k])
            if best > 0.8 and not 1 / 1.5 <= slope <= 1.5:
                out.append(Finding(
                    "scale", (joint,),
                    f"the robot's command for {joint} is x{slope:.3g} the policy's (an action scale or unit "
                    "differs between training and the robot)",
                ))  # fmt: skip
    return out


def _correlations(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[a col, b col] Pearson correlations (NaN where a column is constant)."""
    az = (a - a.mean(axis=0)) / a.std(axis=0)
    bz = (b - b.mean(axis=0)) / b.std(axis=0)
    with np.errstate(invalid="ignore"):
        return np.asarray(az.T @ bz / len(a))


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """The total-least-squares slope of y on x (neither is noise-free)."""
    return float(math.copysign(np.std(y) / max(np.std(x), 1e-12), np.cov(x, y)[0, 1]))


def action_statistics(log: Log, layout: IoLayout, divergence: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per action joint: the policy's command (mean, std, min, max), the robot's, their correlation and
    the divergence (``OnlineChecks.divergence``)."""
    out = {}
    policy = log.policy[log.command_steps] if len(log.commands) else np.zeros((0, layout.act_dim))
    corr = _correlations(log.commands, policy) if len(log.commands) >= 2 else None
    for k, joint in enumerate(layout.action.joints):
        p = log.policy[:, k]
        row: dict[str, Any] = {
            "policy_mean": _f(np.mean(p)) if len(p) else None,
            "policy_std": _f(np.std(p)) if len(p) else None,
            "policy_min": _f(np.min(p)) if len(p) else None,
            "policy_max": _f(np.max(p)) if len(p) else None,
        }
        if len(log.commands):
            c = log.commands[:, k]
            row.update(command_mean=_f(np.mean(c)), command_std=_f(np.std(c)),
                       correlation=_f(corr[k, k]) if corr is not None else None)  # fmt: skip
        row["divergence"] = divergence.get(joint)
        out[joint] = row
    return out


def _f(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
