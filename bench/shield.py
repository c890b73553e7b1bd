"""The safety shield's cost per step and the envelope's detection, against references measured in the same run.

For each bundle given (sac-export writes ``envelope.json``):

1. per step, in this process, interleaved, on the observations and actions of a rollout of the bundle's
   policy in its env (observations in the env's dtype; consecutive actions close, as in the loop): the
   guards with the shield as ``Runtime.act`` runs them (the observation guard testing the envelope's
   bounds in its pass, ``ActionGuard.take``, ``Shield.filter_action`` on what they hand on) against the guards alone
   (``check`` and ``apply``, what every step runs without the shield); their difference is
   ``shield_in_act``. Also ``Shield.step`` (the library call on arrays, which converts and checks for
   itself: envelope, stuck sensor, fallback state, ramp, slew limit) and the envelope check alone.
   Goal: the shield under 5 us at HalfCheetah's size.
2. the envelope's score, chosen by measurement: the Mahalanobis check (``Shield.inside``) against a
   nearest-neighbour distance in the same normalised space (brute force over half the parity states, its
   threshold the same quantile of the other half's distances): cost per call, and the share detected of
   states with a spike of ``--sigma`` standard deviations on one dimension and of states whose dimensions
   were shuffled independently (each within its own range, the correlations broken), and the share of
   the other parity states flagged (an upper bound on false positives: a tenth of the parity states are
   calibration states perturbed by 3 standard deviations on purpose).
3. in the loop: the runtime library's control loop (``Runtime`` and ``ControlLoop``, what ``sac-edge run``
   composes) at ``--rate-hz`` with the shield on and with the guards alone, in this one process,
   alternating ``--seconds`` segments (the order swapped each round), ``--repeats`` rounds: the summary's
   ``loop_work_us`` (a step less its inference and env step, so the shield's work is in it) p50/p99 each,
   and the rounds' p50 differences (median and quartiles). A shared machine's speed drifts from one second
   to the next (the env step's own p50, printed as ``env_p50``, shows it), so the comparison is made of
   many short pairs, each pair's two segments next to each other in time.

Prints one table per section, then one JSON line (``--out`` writes it to a file too).
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.bundle import open_bundle
from sac_edge.common.bundle_format import PARITY_STATES
from sac_edge.common.envelope import Envelope, parse_envelope
from sac_edge.common.latency import interleaved
from sac_edge.common.table import format_table
from sac_edge.edge_runtime.control.safety import ActionGuard, ObservationGuard
from sac_edge.edge_runtime.control.shield import Shield, ShieldOptions


def load(bundle_dir: Path) -> tuple[Envelope, np.ndarray, tuple[np.ndarray, np.ndarray], str]:
    bundle = open_bundle(bundle_dir)
    spec = bundle.spec
    names = bundle.files("envelope")
    if not names:
        raise SystemExit(f"shield: {bundle_dir} has no envelope.json; export it with sac-export (not --no-envelope)")
    envelope = parse_envelope(bundle.read(bundle.path / names[0]), bundle.path / names[0], spec.obs_dim, spec.act_dim)
    states = np.load(io.BytesIO(bundle.read(bundle.path / PARITY_STATES)), allow_pickle=False)
    return envelope, states, (np.array(spec.action_low), np.array(spec.action_high)), spec.env_id


def rollout(bundle_dir: Path, env_id: str, steps: int = 256) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The observations (in the env's dtype) and the policy's actions (fp32, onnxruntime) of ``steps`` steps
    in the env from seed 0: what the shield sees in the loop, where consecutive actions are close."""
    from sac_edge.common.envs import make_env
    from sac_edge.edge_runtime.backends.registry import open_backend

    backend = open_backend(open_bundle(bundle_dir), "onnxruntime", "fp32")
    env = make_env(env_id)
    observations, actions = [], []
    try:
        obs, _ = env.reset(seed=0)
        for _ in range(steps):
            action = backend.act(np.asarray(obs, np.float32)).copy()
            observations.append(np.asarray(obs))
            actions.append(action)
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs, _ = env.reset()
    finally:
        env.close()
        backend.close()
    return observations, actions


def declared(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The observation bounds most envs declare (Pendulum's and HalfCheetah's included): none."""
    return np.full(dim, -np.inf), np.full(dim, np.inf)


def runtime_path(
    envelope: Envelope, bounds: tuple[np.ndarray, np.ndarray]
) -> tuple[Shield, ObservationGuard, ActionGuard]:
    """The shield and the guards as ``Runtime.act`` composes them with the shield on."""
    low, high = bounds
    shield = Shield(ShieldOptions(), low.tolist(), high.tolist(), envelope)
    guard = ObservationGuard(*declared(envelope.obs_dim), "clip", shield.obs_bounds, dtype=np.float32)
    return shield, guard, ActionGuard(low, high)


def step_cost(
    envelope: Envelope, bounds: tuple[np.ndarray, np.ndarray], obs: list[np.ndarray], actions: list[np.ndarray]
) -> dict[str, Any]:
    low, high = bounds
    shield, obs_guard, act_guard = runtime_path(envelope, bounds)
    plain_obs = ObservationGuard(*declared(envelope.obs_dim), dtype=np.float32)
    plain_act = ActionGuard(low, high)
    n = len(obs)
    i = 0

    def guards() -> None:
        nonlocal i
        i = (i + 1) % n
        plain_obs.check(obs[i])
        plain_act.apply(actions[i])

    def guards_and_shield() -> None:  # Runtime.act's path with the shield on
        nonlocal i
        i = (i + 1) % n
        observed, _, inside = obs_guard.check(obs[i])
        shield.filter_action(observed, inside, act_guard.take(actions[i]), True)

    def shield_step() -> None:  # the library call on arrays, converting and checking for itself
        nonlocal i
        i = (i + 1) % n
        shield.step(obs[i], actions[i], True)

    def inside() -> None:
        nonlocal i
        i = (i + 1) % n
        shield.inside(obs[i])

    p50 = interleaved(
        {"guards": guards, "guards_and_shield": guards_and_shield, "shield_step": shield_step, "envelope_check": inside}
    )
    p50["shield_in_act"] = round(p50["guards_and_shield"] - p50["guards"], 2)
    return {"obs_dim": envelope.obs_dim, "act_dim": len(low), "obs_dtype": obs[0].dtype.name, **p50}


def detection(envelope: Envelope, states: np.ndarray, sigma: float) -> list[dict[str, Any]]:
    """Mahalanobis against nearest neighbour: cost and detection (section 2)."""
    rng = np.random.default_rng(1)
    states = states[rng.permutation(len(states))].astype(np.float64)
    half = len(states) // 2
    ref, held = states[:half], states[half:]
    spiked = held.copy()
    dims = rng.integers(envelope.obs_dim, size=len(held))
    spiked[np.arange(len(held)), dims] += sigma * envelope.scale[dims]
    shuffled = np.column_stack([rng.permutation(held[:, d]) for d in range(envelope.obs_dim)])
    shield = Shield(ShieldOptions(), [0.0], [0.0], envelope)
    z_ref = (ref - envelope.mean) / envelope.scale

    def nn_distance(x: np.ndarray) -> float:
        z = (x - envelope.mean) / envelope.scale
        return float(np.min(np.einsum("ij,ij->i", z_ref - z, z_ref - z)))

    fpr = envelope.facts.get("false_positive_rate", 0.001)
    threshold = float(np.quantile([nn_distance(x) for x in held[: len(held) // 2]], 1 - fpr, method="higher"))
    test = held[len(held) // 2 :]
    one = test[0]
    cost = interleaved({"mahalanobis": lambda: shield.inside(one), "nearest": lambda: nn_distance(one)}, 500, 5)
    rows = []
    for name, check in (
        ("mahalanobis", lambda x: shield.inside(x)),
        ("nearest", lambda x: nn_distance(x) <= threshold),
    ):
        rows.append(
            {
                "score": name,
                "us_per_call": cost[name],
                "stored_states": 0 if name == "mahalanobis" else len(ref),
                "false_positives": round(1 - float(np.mean([check(x) for x in test])), 4),
                "spike_detected": round(1 - float(np.mean([check(x) for x in spiked])), 4),
                "shuffled_detected": round(1 - float(np.mean([check(x) for x in shuffled])), 4),
            }
        )
    return rows


def loop_work(bundle: Path, env_id: str, args: argparse.Namespace) -> dict[str, Any]:
    """The library's control loop with the shield on and with the guards alone, alternating (section 3)."""
    from sac_edge.common.envs import make_env
    from sac_edge.edge_runtime.control.loop import ControlLoop, LoopSettings
    from sac_edge.edge_runtime.runtime import Runtime, RuntimeOptions

    def segment(mode: str) -> dict[str, float]:
        env = make_env(env_id)
        try:
            space = env.observation_space
            config = RuntimeOptions.of(
                str(bundle), backend="onnxruntime", precision="fp32", rate_hz=args.rate_hz, shield=mode
            )
            with Runtime(config, obs_low=space.low, obs_high=space.high) as runtime:  # type: ignore[attr-defined]
                done = ControlLoop(env, runtime, LoopSettings(args.rate_hz, args.seconds)).run()
        finally:
            env.close()
        return {**done.loop_work_us, "miss_rate": done.miss_rate, "env_p50": done.env_step_us["p50"]}

    runs: dict[str, list[dict[str, float]]] = {"on": [], "guards": []}
    for round_ in range(args.repeats):
        for mode in ("on", "guards") if round_ % 2 == 0 else ("guards", "on"):
            runs[mode].append(segment(mode))
    out: dict[str, Any] = {}
    for mode, rounds in runs.items():
        for key in ("p50", "p99", "miss_rate", "env_p50"):
            out[f"{mode}_{key}"] = round(float(np.median([f[key] for f in rounds])), 5 if key == "miss_rate" else 2)
    diffs = [a["p50"] - b["p50"] for a, b in zip(runs["on"], runs["guards"])]
    low, mid, high = (round(v, 2) for v in np.percentile(np.asarray(diffs), [25.0, 50.0, 75.0]).tolist())
    out.update(p50_difference=mid, difference_q1=low, difference_q3=high, rounds=len(diffs))
    return out


def shape_calls(bundle: Path, calls: int) -> None:
    """``Shield.filter_action`` ``calls`` times (after 300 to warm up) on what the guards hand it on the policy's
    rollout, nothing else in the loop: what an instruction count of the shield's step runs."""
    from sac_edge.edge_runtime.control.loop import paused_gc

    envelope, _, bounds, env_id = load(bundle)
    shield, obs_guard, act_guard = runtime_path(envelope, bounds)
    inputs = []
    for o, a in zip(*rollout(bundle, env_id)):  # the backend is closed before the calls: no threads beside them
        observed, _, inside = obs_guard.check(o)
        inputs.append((observed, inside, act_guard.take(a)))
    n = len(inputs)
    with paused_gc():  # as in the control loop, which collects at a known point outside the step's work
        for j in range(300 + calls):
            observed, inside, action = inputs[j % n]
            shield.filter_action(observed, inside, action, True)
    print(f"shield: {calls} calls of Shield.filter_action on {bundle}")


def act_calls(bundle: Path, calls: int) -> None:
    """``Runtime.act`` ``calls`` times (after 300 to warm up) on the policy's rollout (onnxruntime fp32, the
    shield on), untimed: what an instruction count of the whole step runs."""
    from sac_edge.edge_runtime.control.loop import paused_gc
    from sac_edge.edge_runtime.runtime import Runtime, RuntimeOptions

    _, _, _, env_id = load(bundle)
    observations, _ = rollout(bundle, env_id)
    options = RuntimeOptions.of(str(bundle), backend="onnxruntime", precision="fp32", rate_hz=1000.0)
    with Runtime(options) as runtime, paused_gc():
        for j in range(300 + calls):
            runtime.act(observations[j % len(observations)])
    print(f"shield: {calls} calls of Runtime.act on {bundle}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", nargs="+", type=Path)
    parser.add_argument("--sigma", type=float, default=8.0, help="spike size in standard deviations")
    parser.add_argument("--rate-hz", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=0.5, help="length of each segment in the loop")
    parser.add_argument("--repeats", type=int, default=30, help="rounds in the loop (0: skip section 3)")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--shape-calls",
        type=int,
        help="only call Shield.filter_action this many times on what the guards hand on for the rollout, untimed, "
        "and exit: for an instruction count, under valgrind with N and with 0 (the difference over N)",
    )
    parser.add_argument(
        "--act-calls",
        type=int,
        help="only call Runtime.act this many times on the rollout, untimed, and exit (valgrind, as --shape-calls)",
    )
    args = parser.parse_args()
    if args.act_calls is not None:
        for bundle in args.bundles:
            act_calls(bundle, args.act_calls)
        return
    if args.shape_calls is not None:
        for bundle in args.bundles:
            shape_calls(bundle, args.shape_calls)
        return
    result: dict[str, Any] = {"bench": "shield", "bundles": {}}
    for bundle in args.bundles:
        envelope, states, bounds, env_id = load(bundle)
        cost = step_cost(envelope, bounds, *rollout(bundle, env_id))
        scores = detection(envelope, states, args.sigma)
        loop = loop_work(bundle, env_id, args) if args.repeats > 0 else None
        result["bundles"][str(bundle)] = {"env": env_id, "step_us": cost, "scores": scores, "loop_work_us": loop}
        print(f"\n{bundle} ({env_id}, obs {cost['obs_dim']}, act {cost['act_dim']})")
        print(format_table([(k, v) for k, v in cost.items() if isinstance(v, float)], ("per step, p50", "us")))
        print(format_table([tuple(r.values()) for r in scores], tuple(scores[0])))
        if loop is not None:
            print(format_table([(k, v) for k, v in loop.items()], (f"loop's own work at {args.rate_hz:g} Hz", "us")))
    if args.out:
        atomic_write_json(args.out, result)
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
