"""The node's parameters, written once: the node's own (topics, schedule, QoS, recording: ``NODE_PARAMETERS``)
and every ``sac-edge run`` option the runtime uses, under its flag's name (``run_parameters``), declared with
their descriptions and the ranges their flags' checks take. ``NodeParameters`` is what configure reads: every
value checked in one place, with the settings derived from them."""

from __future__ import annotations

import dataclasses
import difflib
import socket
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from sac_edge.common.config import flag_of, options, parse_value
from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime.config import MAX_RATE_HZ, MAX_REALTIME_PRIORITY, MIN_RATE_HZ, RunConfig
from sac_edge.edge_runtime.control.realtime import PM_QOS_MAX_US

from .qos import DURABILITIES, RELIABILITIES

NODE_NAME = "sac_edge"
#: ``sac-edge run`` options that are no node parameter: the env, the seed and the schedule are the robot's
#: (the node's own ``mode``/``rate_hz`` schedule it; ``bundle`` is a node parameter of its own).
NOT_PARAMETERS = frozenset({"bundle", "env", "seed", "shift", "json", "duration", "spin_us", "warm_cache"})
#: Run options whose unset value is not the parameter type's 0 (0 is a value of theirs): their unset value.
UNSET = {"idle_latency_us": -1}
#: The (low, high) range a run option's parameter declares: its flag's check's (``RunConfig.check``).
RANGES: dict[str, tuple[float, float]] = {
    "rate_hz": (MIN_RATE_HZ, MAX_RATE_HZ),
    "realtime_priority": (0, MAX_REALTIME_PRIORITY),
    "idle_latency_us": (UNSET["idle_latency_us"], PM_QOS_MAX_US),
}
MODES = ("timer", "message")


@dataclass(frozen=True)
class NodeParameter:
    """A parameter of the node's own (topics, schedule, QoS, recording)."""

    name: str
    default: Any
    help: str
    fixed: bool = True
    """Fixed once configured (changes refused until cleanup)."""
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()


NODE_PARAMETERS = (
    NodeParameter("bundle", "", "bundle directory written by sac-export with --layout (sac-edge ros2 BUNDLE sets it)"),
    NodeParameter(
        "state_topic",
        "joint_states",
        "sensor_msgs/JointState the layout's joints are read from, merged by joint name from every publisher "
        "(relative: in the node's namespace)",
    ),
    NodeParameter(
        "command_topic",
        "forward_command_controller/commands",
        "std_msgs/Float64MultiArray command, in the layout's action joint order (a forward command controller's)",
    ),
    NodeParameter("trajectory_topic", "", "also publish a one-point trajectory_msgs/JointTrajectory here ('': off)"),
    NodeParameter(
        "mode",
        "timer",
        "timer: a step every 1/rate_hz on the latest inputs; message: a step per state message",
        choices=MODES,
    ),
    NodeParameter(
        "max_input_age_ms",
        50.0,
        "an input older than this at a step makes the step the shield's fallback",
        False,
        0.01,
        6e5,
    ),
    NodeParameter(
        "max_stale_s",
        0.5,
        "an input stale this long in a row: the safe command, an ERROR status naming it, and the node inactive "
        "(shorter outages are the shield's fallback)",
        False,
        0.001,
        3600,
    ),
    NodeParameter("autostart", False, "configure and activate at start (as Nav2's lifecycle manager does)"),
    NodeParameter(
        "first_state_timeout_s", 10.0, "configure waits this long for the robot's first JointState", False, 0.01, 3600
    ),
    NodeParameter("reward_topic", "", "std_msgs/Float64 reward of each step, fed to Runtime.observe ('': off)"),
    NodeParameter("episode_end_topic", "", "std_msgs/Bool: true = terminated, false = truncated ('': off)"),
    NodeParameter("state_qos_reliability", "best_effort", "reliable or best_effort", choices=RELIABILITIES),
    NodeParameter(
        "state_qos_depth",
        10,
        "history depth of the state subscription (one slot per JointState publisher at least: their states merge)",
        True,
        1,
        1000,
    ),
    NodeParameter("state_qos_durability", "volatile", "volatile or transient_local", choices=DURABILITIES),
    NodeParameter(
        "command_qos_reliability",
        "reliable",
        "reliable (ros2_control's forward command controller) or best_effort",
        choices=RELIABILITIES,
    ),
    NodeParameter("command_qos_depth", 1, "history depth of the command publishers", True, 1, 1000),
    NodeParameter("command_qos_durability", "volatile", "volatile or transient_local", choices=DURABILITIES),
    NodeParameter("diagnostics_period_s", 1.0, "seconds between /diagnostics messages", True, 0.05, 3600),
    NodeParameter("record", "", "MCAP file: each step's state and command, and every event ('': off)"),
    NodeParameter("record_overwrite", False, "replace an existing record file"),
    NodeParameter("summary", "", "JSON file the final summary is written to at cleanup or shutdown ('': none)"),
    NodeParameter("summary_overwrite", False, "replace an existing summary file"),
    NodeParameter("hardware_id", socket.gethostname(), "the hardware_id of the /diagnostics status"),
    NodeParameter(
        "shadow",
        False,
        "run the policy beside the robot's controller: no publisher on command_topic or trajectory_topic; the "
        "controller's commands on command_topic compared with the policy's (/diagnostics, the summary's shadow)",
    ),
    NodeParameter(
        "executor",
        "auto",
        "auto: rclpy's EventsExecutor where it exists (Jazzy and newer), else the SingleThreadedExecutor; events; "
        "single (read at start)",
        choices=("auto", "events", "single"),
    ),
)
BY_NAME = {p.name: p for p in NODE_PARAMETERS}
LOOSE = frozenset(p.name for p in NODE_PARAMETERS if not p.fixed)
"""The parameters that may change while configured."""


class RunParameter(NamedTuple):
    """A ``sac-edge run`` option as a parameter."""

    name: str
    default: Any
    """Its ROS default (unset: 0, '' or ``UNSET``'s; a list: the flag's comma-separated text)."""
    help: str
    type: Any
    may_be_unset: bool


def run_parameters() -> list[RunParameter]:
    """Every ``sac-edge run`` option the node takes, as a parameter."""
    out = []
    for opt in options(RunConfig):
        if opt.dest in NOT_PARAMETERS:
            continue
        default: Any = opt.field.default
        tp = opt.type
        if typing.get_origin(tp) is tuple:
            ros_default: Any = ",".join(map(str, default))
            note = " (comma-separated, as the flag takes it; '': none)"
        elif default is None and opt.dest in UNSET:
            ros_default = UNSET[opt.dest]
            note = f" ({ros_default}: not set)"
        elif default is None:
            ros_default = {str: "", int: 0, float: 0.0}[tp]
            note = " ('' or 0: not set)"
        else:
            ros_default, note = default, ""
        text = str(opt.field.metadata.get("help", "")) + note
        out.append(RunParameter(opt.dest, ros_default, text, tp, default is None))
    return out


RUN_PARAMETERS = run_parameters()


def declare(node: Any) -> None:
    """Declare every parameter on ``node`` (an rclpy node), described, with its range. An integer override of
    a floating-point parameter (``-p rate_hz:=200``) is taken as that number."""
    from rclpy.parameter import Parameter

    overrides = node._parameter_overrides
    floats = [p.name for p in NODE_PARAMETERS if isinstance(p.default, float)]
    floats += [r.name for r in RUN_PARAMETERS if isinstance(r.default, float)]
    for name in floats:
        given = overrides.get(name)
        if given is not None and type(given.value) is int:
            overrides[name] = Parameter(name, value=float(given.value))
    for p in NODE_PARAMETERS:
        node.declare_parameter(p.name, p.default, descriptor(p.help, p.default, p.low, p.high))
    for r in RUN_PARAMETERS:
        low, high = RANGES.get(r.name, (None, None))
        described = descriptor(r.help, r.default, low, high)
        described.dynamic_typing = typing.get_origin(r.type) is tuple  # a list may come as text, number or list
        node.declare_parameter(r.name, r.default, described)


def descriptor(text: str, default: Any, low: float | None, high: float | None) -> Any:
    """A ``ParameterDescriptor`` with its range (floating point or integer, as the default's type)."""
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    described = ParameterDescriptor(description=text)
    if low is not None and high is not None:
        if isinstance(default, float):
            described.floating_point_range = [FloatingPointRange(from_value=float(low), to_value=float(high))]
        elif isinstance(default, int) and not isinstance(default, bool):
            described.integer_range = [IntegerRange(from_value=int(low), to_value=int(high), step=1)]
    return described


def check_value(name: str, value: Any) -> str | None:
    """What is wrong with a value set for ``name`` (one line), or None; a choice is checked when set."""
    p = BY_NAME.get(name)
    if p is not None and p.choices and value not in p.choices:
        return f"{name} must be one of {', '.join(p.choices)}, got {value!r}"
    return None


def nearest(name: str) -> str:
    """The declared parameter name nearest to ``name`` (for a line about an unknown one), or ''."""
    names = [p.name for p in NODE_PARAMETERS] + [r.name for r in RUN_PARAMETERS]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    return close[0] if close else ""


def _flag_value(r: RunParameter, value: Any) -> Any:
    """A run option's parameter value as its flag's value."""
    if typing.get_origin(r.type) is tuple:  # the flag's text, a number (-p cpus:=3) or a YAML list (-p cpus:=[2,3])
        text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        return parse_value(RunConfig, r.name, text) if text else ()
    if r.may_be_unset and value == UNSET.get(r.name, "" if r.type is str else 0):
        return None
    return float(value) if r.type is float else value


def run_config(bundle: str, flags: dict[str, Any]) -> RunConfig:
    """``sac-edge run``'s config from the run-option parameters (flag names, dashes as underscores): the one
    place the node builds it. Its ``check()`` checks every value and returns the runtime's options."""
    return RunConfig.of(bundle, **flags)


@dataclass(frozen=True)
class NodeParameters:
    """The parameters configure reads, checked (``read``), and what the node derives from them."""

    bundle: str
    state_topic: str
    command_topic: str
    trajectory_topic: str
    mode: str
    max_input_age_ms: float
    max_stale_s: float
    first_state_timeout_s: float
    reward_topic: str
    episode_end_topic: str
    state_qos: tuple[str, int, str]
    command_qos: tuple[str, int, str]
    diagnostics_period_s: float
    record: str
    record_overwrite: bool
    summary: str
    summary_overwrite: bool
    hardware_id: str
    shadow: bool
    rate_hz: float
    run: RunConfig

    @classmethod
    def read(cls, get: Callable[[str], Any]) -> NodeParameters:
        """The values ``get(name)`` gives, every one checked: one line naming the first bad one."""
        bundle = str(get("bundle"))
        if not bundle:
            raise SacEdgeError("no bundle: sac-edge ros2 BUNDLE, or set the bundle parameter")
        for p in NODE_PARAMETERS:
            problem = check_value(p.name, get(p.name))
            if problem is not None:
                raise SacEdgeError(problem)
        flags = {}
        for r in RUN_PARAMETERS:
            try:
                flags[r.name] = _flag_value(r, get(r.name))
            except ValueError as err:
                raise SacEdgeError(
                    f"parameter {r.name}: {err}; set it as its flag takes it ({flag_of(r.name)})"
                ) from None

        own = {f.name for f in dataclasses.fields(cls)} & set(BY_NAME)  # typed as the schema's defaults
        values: dict[str, Any] = {name: type(BY_NAME[name].default)(get(name)) for name in own}
        for side in ("state", "command"):
            values[f"{side}_qos"] = (str(get(f"{side}_qos_reliability")), int(get(f"{side}_qos_depth")),
                                     str(get(f"{side}_qos_durability")))  # fmt: skip
        return cls(**values, rate_hz=float(get("rate_hz")), run=run_config(bundle, flags))

    @property
    def message_mode(self) -> bool:
        return self.mode == "message"

    @property
    def period_ns(self) -> int:
        return int(1e9 / self.rate_hz)
