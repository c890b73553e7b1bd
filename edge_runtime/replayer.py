"""``sac-edge replay BUNDLE RECORDING``: a bundle checked against a robot's recorded log (``replay/``).

Each recorded state is gathered through the bundle's layout with the code the ROS 2 node uses
(``IoLayout.joint_map`` / ``gather``), the policy runs on it through ``Runtime`` (the bundle's backends and
shield, as on the robot), and ``replay.OnlineChecks`` is fed in message order as the node's shadow mode feeds
it; then ``replay.analysis`` judges the whole log. ``--vs BUNDLE2`` runs a second bundle on the same states.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sac_edge.common.bundle import Bundle, open_bundle
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.io_layout import IoLayout, JointMap, bundle_layout
from sac_edge.edge_runtime.replay import analysis, recording
from sac_edge.edge_runtime.replay.findings import Finding
from sac_edge.edge_runtime.replay.online import OnlineChecks
from sac_edge.edge_runtime.replay.reference import Reference, bundle_reference, no_reference

from .config import ReplayConfig
from .runtime import Caller, Runtime

JOINT_STATE = "sensor_msgs/msg/JointState"
COMMAND = "std_msgs/msg/Float64MultiArray"
MAX_STATES = 2_000_000
"""States a replay holds at most (about 7 hours at 100 Hz); a longer log is refused: split it."""
EXIT_AGREE, EXIT_MISMATCH = 0, 3


@dataclass
class _Policy:
    """One bundle on the log: its layout, its reference, its runtime, the commands it makes per state and
    the states its shield stepped in on."""

    path: str
    bundle: Bundle
    layout: IoLayout
    runtime: Runtime
    commands: list[np.ndarray]
    shielded: list[int]


def _open_policy(cfg: ReplayConfig, path: str, log: Callable[[str], None]) -> _Policy:
    options = cfg.runtime_options(path)
    bundle = open_bundle(path, cfg.trusted_keys, allow_downgrade=cfg.allow_downgrade)
    layout = bundle_layout(bundle)
    if layout is None:
        raise SacEdgeError(f"{path}: the bundle has no layout.json; export it with sac-export --layout FILE")
    runtime = Runtime(options, bundle=bundle, log=log, caller=Caller("replay"))
    return _Policy(path, bundle, layout, runtime, [], [])


def _reference(policy: _Policy, log: Callable[[str], None]) -> Reference:
    """The first bundle's training distribution; without one (a bundle exported before sac-export kept it),
    none: the commands and the kinematics are still checked, as the node's shadow mode does."""
    try:
        return bundle_reference(policy.bundle)
    except SacEdgeError as err:
        log(f"sac-edge replay: {err}; no range, frozen or resemblance checks")
        return no_reference(policy.layout.obs_dim)


def _topics(cfg: ReplayConfig, files: list[Any], layout: IoLayout) -> tuple[list[str], bool]:
    """The topics to read; whether the log has the command topic. One line when the state topic is missing
    or a topic has another type than the one read from it."""
    types = recording.topic_types(files)
    state = types.get(cfg.state_topic)
    if state is None:
        states = [t for t, ty in types.items() if ty == JOINT_STATE]
        hint = f"--state-topic {states[0]}" if states else "record the robot's JointState topic"
        raise SacEdgeError(
            f"{cfg.recording}: no {cfg.state_topic} in the log (its topics: {', '.join(sorted(types)) or 'none'}); "
            f"{hint}"
        )
    if state != JOINT_STATE:
        raise SacEdgeError(f"{cfg.recording}: {cfg.state_topic} carries {state}, not {JOINT_STATE}; --state-topic")
    command = types.get(cfg.command_topic)
    if command is not None and command != COMMAND:
        raise SacEdgeError(f"{cfg.recording}: {cfg.command_topic} carries {command}, not {COMMAND}; --command-topic")
    missing = [t for t in layout.topics if t not in types]
    if missing:
        raise SacEdgeError(f"{cfg.recording}: the layout reads {missing[0]}, which the log does not hold")
    topics = [cfg.state_topic, *layout.topics] + ([cfg.command_topic] if command else [])
    return topics, command is not None


def replay_command(cfg: ReplayConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """The replay's report (``--json``'s object); ``report["verdict"]`` is ``agree`` or ``mismatch``."""
    cfg.check()
    files = recording.recording_files(cfg.recording)
    main = _open_policy(cfg, cfg.bundle, log)
    reference = _reference(main, log)
    topics, has_commands = _topics(cfg, files, main.layout)
    policies = [main]
    if cfg.vs is not None:
        other = _open_policy(cfg, cfg.vs, log)
        if other.layout.to_dict() != main.layout.to_dict():
            raise SacEdgeError(f"--vs {cfg.vs}: its layout differs from {cfg.bundle}'s; compare bundles of one robot")
        policies.append(other)
    layout = main.layout
    online = OnlineChecks(layout, reference)
    with main.runtime, policies[-1].runtime if len(policies) > 1 else _Nothing():
        data = _replay(cfg, files, topics, policies, online)
        backend = main.runtime.backend.describe()
    if not len(data.times):
        raise SacEdgeError(f"{cfg.recording}: no {cfg.state_topic} message in the log")
    found, facts = analysis.analyse(data, layout, online.slots, reference)
    findings = _merge(online, found)
    report = _report(cfg, data, online, findings, facts, policies, has_commands, reference)
    report["backend"] = backend
    if cfg.plot:
        from sac_edge.edge_runtime.replay.plot import write_plot

        write_plot(cfg.plot, report, data, layout, online.slots, reference, cfg.overwrite)
        log(f"sac-edge replay: plot written to {cfg.plot}")
    return report


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _replay(
    cfg: ReplayConfig, files: list[Any], topics: list[str], policies: list[_Policy], online: OnlineChecks
) -> analysis.Log:
    layout = policies[0].layout
    joints = layout.state_joints
    obs = np.empty(layout.obs_dim, np.float32)
    times: list[int] = []
    rows: list[np.ndarray] = []
    fields: dict[str, list[np.ndarray]] = {"position": [], "velocity": [], "effort": []}
    command_steps: list[int] = []
    commands: list[np.ndarray] = []
    topic_values: dict[str, Any] = {}
    jmap: JointMap | None = None
    for topic, t_ns, msg in recording.messages(files, topics):
        if topic == cfg.state_topic:
            if len(times) >= MAX_STATES:
                raise SacEdgeError(f"{cfg.recording}: more than {MAX_STATES} states; replay it in parts")
            names = tuple(msg.name)
            if jmap is None or jmap.names != names:
                jmap = layout.joint_map(list(names), f"{cfg.recording}: state {len(times)}")
            values = {"position": msg.position, "velocity": msg.velocity, "effort": msg.effort}
            layout.gather(obs, jmap, values, topic_values, f"{cfg.recording}: state {len(times)}")
            _raw_fields(fields, values, names, joints)
            step = len(times)
            times.append(t_ns)
            rows.append(obs.copy())
            online.state(t_ns, obs)
            for policy in policies:
                action = policy.runtime.act(obs)
                shield = policy.runtime.shield
                if shield is not None and shield.falling_back:
                    policy.shielded.append(step)
                policy.commands.append(policy.layout.command_vector(action))
                policy.runtime.tick()
            online.action(policies[0].commands[-1])
        elif topic == cfg.command_topic:
            if online.command(t_ns, msg.data) is not None:
                command_steps.append(len(times) - 1)
                commands.append(np.asarray(msg.data, np.float64))
        else:
            topic_values[topic] = _topic_value(msg)
    k = layout.act_dim
    return analysis.Log(
        times=np.asarray(times, np.int64),
        obs=np.asarray(rows, np.float32).reshape(-1, layout.obs_dim),
        policy=np.asarray(policies[0].commands, np.float64).reshape(-1, k),
        fields={f: np.asarray(v, np.float64).reshape(-1, len(joints)) for f, v in fields.items()},
        command_steps=np.asarray(command_steps, np.intp),
        commands=np.asarray(commands, np.float64).reshape(-1, k),
    )


def _raw_fields(out: dict[str, list[np.ndarray]], values: dict[str, Any], names: tuple[str, ...], joints: Any) -> None:
    """The message's values of ``joints`` by field (NaN where the field is not published)."""
    where = [names.index(j) if j in names else -1 for j in joints]
    for field, given in values.items():
        arr = np.asarray(given, np.float64)
        row = np.full(len(joints), np.nan)
        if arr.shape[0] == len(names):
            row = np.array([arr[i] if i >= 0 else np.nan for i in where])
        out[field].append(row)


def _topic_value(msg: Any) -> Any:
    """An imu or vector topic's value as ``IoLayout.gather`` takes it (as the node's callbacks make it)."""
    if hasattr(msg, "orientation"):
        v, w, a = msg.orientation, msg.angular_velocity, msg.linear_acceleration
        return {
            "orientation": (v.x, v.y, v.z, v.w),
            "angular_velocity": (w.x, w.y, w.z),
            "linear_acceleration": (a.x, a.y, a.z),
        }
    return list(msg.data)


def _merge(online: OnlineChecks, found: list[Finding]) -> list[Finding]:
    """The online and whole-log findings, each once; an out_of_range on joints a scale or swapped finding
    names is left out (that finding names its cause)."""
    explained = {j for f in found if f.kind in ("scale", "swapped") for j in f.joints}
    out = [f for f in online.findings() if not (f.kind == "out_of_range" and set(f.joints) <= explained)]
    seen = set()
    for f in found:
        key = (f.kind, tuple(sorted(f.joints)))
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def _report(
    cfg: ReplayConfig,
    data: analysis.Log,
    online: OnlineChecks,
    findings: list[Finding],
    facts: dict[str, Any],
    policies: list[_Policy],
    has_commands: bool,
    reference: Reference,
) -> dict[str, Any]:
    main = policies[0]
    layout = main.layout
    divergence = online.divergence()
    report: dict[str, Any] = {
        "bundle": cfg.bundle,
        "recording": cfg.recording,
        "steps": len(data.times),
        "verdict": "mismatch" if findings else "agree",
        "findings": [f.to_dict() for f in findings],
        "commands_compared": online.compared,
        "command_topic_in_log": has_commands,
        "actions": analysis.action_statistics(data, layout, divergence),
        "timing": online.timing(),
        "shield": _shield(main),
        "reference": reference.source,
        **facts,
    }
    if len(policies) > 1:
        report["vs"] = _versus(policies)
    return report


def _shield(policy: _Policy) -> dict[str, Any]:
    summary = policy.runtime.summary().to_dict().get("shield", {})
    return {"steps_stepped_in": len(policy.shielded), "first_steps": policy.shielded[:10], "summary": summary}


def _versus(policies: list[_Policy]) -> dict[str, Any]:
    """Per joint: |command of the first bundle - command of the second| p50, p99, max; each one's shield."""
    a = np.asarray(policies[0].commands, np.float64)
    b = np.asarray(policies[1].commands, np.float64)
    diff = np.abs(a - b)
    joints = {}
    for k, joint in enumerate(policies[0].layout.action.joints):
        col = diff[:, k]
        joints[joint] = {"p50": float(np.percentile(col, 50)), "p99": float(np.percentile(col, 99)),
                         "max": float(col.max())}  # fmt: skip
    return {
        "bundle": policies[1].path,
        "divergence": joints,
        "shield": {p.path: _shield(p) for p in policies},
    }


def replay_table(report: dict[str, Any]) -> str:
    """The report for a person: the verdict, one line per finding, the per-joint divergence."""
    lines = [
        f"sac-edge replay: {report['steps']} states, {report['commands_compared']} commands compared, "
        f"verdict {report['verdict'].upper()}"
    ]
    for f in report["findings"]:
        lines.append("  " + Finding(f["kind"], tuple(f["joints"]), f["detail"]).line())
    lines.append(f"  {'joint':<12} {'policy mean':>12} {'robot mean':>12} {'div p50':>10} {'div p99':>10}")
    for joint, row in report["actions"].items():
        div = row.get("divergence") or {}
        lines.append(
            f"  {joint:<12} {_num(row.get('policy_mean')):>12} {_num(row.get('command_mean')):>12} "
            f"{_num(div.get('p50')):>10} {_num(div.get('p99')):>10}"
        )
    if "vs" in report:
        lines.append(f"  vs {report['vs']['bundle']}: per-joint |difference| p99 " + ", ".join(
            f"{j} {_num(v['p99'])}" for j, v in report["vs"]["divergence"].items()))  # fmt: skip
        for path, shield in report["vs"]["shield"].items():
            lines.append(f"  shield stepped in on {shield['steps_stepped_in']} states with {path}")
    return "\n".join(lines)


def _num(value: Any) -> str:
    return "-" if value is None or value != value else f"{value:.4g}"
