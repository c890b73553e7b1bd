"""``sac-edge ros2 BUNDLE [--ros-args ...]``: the bundle's policy as a ROS 2 lifecycle node on the robot's
topics (docs/ROS2.md), built on ``Runtime`` like ``sac-edge run``.

- **configure**: the options checked, the bundle verified, the backend opened and parity-gated
  (``Runtime.open``), the bundle's layout checked against the robot's first ``JointState`` (a missing or extra
  joint is one line naming it), the step warmed up on that state; topics and publishers made.
- **activate**: the shield's ramp restarted from where the robot is (position commands: its joints' current
  positions from the latest fresh ``JointState``, as an action; velocity and effort commands, or no fresh
  state: the shield's safe action), then one step per timer tick (``mode`` ``timer`` at ``rate_hz``) or per
  incoming state message (``mode`` ``message``, lockstep).
- Each step: every input's age checked against ``max_input_age_ms``; a stale or missing input makes the step
  the shield's fallback (counted), and fresh inputs come back through the ramp. The command goes out as
  ``std_msgs/Float64MultiArray`` in the layout's joint order (a ros2_control forward command controller's
  ``joints``), and as a one-point ``trajectory_msgs/JointTrajectory`` where ``trajectory_topic`` is set.
- **deactivate**: the safe command published once, then silence. **cleanup/shutdown**: the runtime closed,
  the summary logged (and written to ``summary``). An unrecoverable error (the runtime stops serving)
  publishes the safe command and goes through deactivate into the error state.
- ``/diagnostics`` about once a second; ``reward_topic`` / ``episode_end_topic`` feed ``Runtime.observe``
  (fine-tuning with ``finetune``); ``record`` writes inputs, commands and events to an MCAP file.

Every ``sac-edge run`` option the runtime uses is a parameter under its flag's name (``shield``,
``mem_budget_mb``, ``finetune``...), fixed once configured. rclpy is the system's (Humble and newer): this
module imports it, so import it only where ROS 2 is sourced; ``sac-edge ros2`` says in one line when it is not.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, SetParametersResult
from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
from rclpy.parameter import Parameter
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Bool, Float64, Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.config import flag_of, options, parse_value
from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.common.io_layout import IoLayout, bundle_layout
from sac_edge.common.summary import strict_json
from sac_edge.edge_runtime.control.loop import StoppedServing
from sac_edge.edge_runtime.control.realtime import PM_QOS_MAX_US, enter_realtime, hold_idle_latency
from sac_edge.edge_runtime.ros2 import diagnostics
from sac_edge.edge_runtime.ros2.compat import event_callbacks
from sac_edge.edge_runtime.ros2.qos import incompatible_warning, profile
from sac_edge.edge_runtime.ros2.recorder import Recorder

from .compose import verified_bundle
from .config import RealtimeSection, RunConfig
from .runtime import Caller, Runtime, RuntimeSummary

NODE_NAME = "sac_edge"

#: ``sac-edge run`` options that are no node parameter: the env, the seed and the schedule are the robot's
#: (the node's own ``mode``/``rate_hz`` schedule it; ``bundle`` is a node parameter of its own).
NOT_PARAMETERS = frozenset({"bundle", "env", "seed", "shift", "json", "duration", "spin_us", "warm_cache"})
#: Run options whose unset value is not the parameter type's 0 (0 is a value of theirs): their unset value.
UNSET = {"idle_latency_us": -1}
#: The (low, high) range a run option's parameter declares, where its flag's check has one.
RANGES: dict[str, tuple[float, float]] = {
    "rate_hz": (1e-3, 1e5),
    "realtime_priority": (0, 99),
    "idle_latency_us": (-1, PM_QOS_MAX_US),
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


NODE_PARAMETERS = (
    NodeParameter("bundle", "", "bundle directory written by sac-export with --layout (sac-edge ros2 BUNDLE sets it)"),
    NodeParameter("state_topic", "/joint_states", "sensor_msgs/JointState the layout's joints are read from"),
    NodeParameter(
        "command_topic",
        "/forward_command_controller/commands",
        "std_msgs/Float64MultiArray command, in the layout's action joint order (a forward command controller's)",
    ),
    NodeParameter("trajectory_topic", "", "also publish a one-point trajectory_msgs/JointTrajectory here ('': off)"),
    NodeParameter(
        "mode", "timer", "timer: a step every 1/rate_hz on the latest inputs; message: a step per state message"
    ),
    NodeParameter(
        "max_input_age_ms",
        50.0,
        "an input older than this at a step makes the step the shield's fallback",
        False,
        0.01,
        6e5,
    ),
    NodeParameter("autostart", False, "configure and activate at start (as Nav2's lifecycle manager does)"),
    NodeParameter(
        "first_state_timeout_s", 10.0, "configure waits this long for the robot's first JointState", False, 0.01, 3600
    ),
    NodeParameter("reward_topic", "", "std_msgs/Float64 reward of each step, fed to Runtime.observe ('': off)"),
    NodeParameter("episode_end_topic", "", "std_msgs/Bool: true = terminated, false = truncated ('': off)"),
    NodeParameter("state_qos_reliability", "best_effort", "reliable or best_effort"),
    NodeParameter("state_qos_depth", 1, "history depth of the state subscription", True, 1, 1000),
    NodeParameter("state_qos_durability", "volatile", "volatile or transient_local"),
    NodeParameter(
        "command_qos_reliability", "reliable", "reliable (ros2_control's forward command controller) or best_effort"
    ),
    NodeParameter("command_qos_depth", 1, "history depth of the command publishers", True, 1, 1000),
    NodeParameter("command_qos_durability", "volatile", "volatile or transient_local"),
    NodeParameter("diagnostics_period_s", 1.0, "seconds between /diagnostics messages", True, 0.05, 3600),
    NodeParameter("record", "", "MCAP file: each step's state and command, and every event ('': off)"),
    NodeParameter("record_overwrite", False, "replace an existing record file"),
    NodeParameter("summary", "", "JSON file the final summary is written to at cleanup or shutdown ('': none)"),
)


def run_config(bundle: str, flags: dict[str, Any]) -> RunConfig:
    """``sac-edge run``'s config from the run-option parameters (flag names, dashes as underscores): the one
    place the node builds it. Its ``check()`` checks every value and returns the runtime's options."""
    return RunConfig.of(bundle, **flags)


def run_parameters() -> list[tuple[str, Any, str, Any, bool]]:
    """(name, ROS default, description, option type, may be unset) of every ``sac-edge run`` option the node
    takes. A setting that may be unset is 0 or '' for unset; a list is the flag's comma-separated text."""
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
        out.append((opt.dest, ros_default, text, tp, default is None))
    return out


def _flag_value(name: str, value: Any, tp: Any, may_be_unset: bool) -> Any:
    """A run option's parameter value as its flag's value."""
    if typing.get_origin(tp) is tuple:  # the flag's text, a number (-p cpus:=3) or a YAML list (-p cpus:=[2,3])
        text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        return parse_value(RunConfig, name, text) if text else ()
    if may_be_unset and value == UNSET.get(name, "" if tp is str else 0):
        return None
    return float(value) if tp is float else value


class _Steps:
    """Per-step counts and times for /diagnostics and the summary: step time (callback to publish), deadline misses,
    stale steps by input."""

    def __init__(self) -> None:
        self.took_ns: list[int] = []
        self.steps = self.misses = self.stale_steps = self.invalid_states = 0
        self.stale_by: dict[str, int] = {}
        self.qos_incompatible = 0

    def step_percentiles_us(self) -> dict[str, float]:
        if not self.took_ns:
            return {"step_p50_us": math.nan, "step_p99_us": math.nan}
        us = np.asarray(self.took_ns[-10000:], dtype=np.float64) / 1e3
        return {"step_p50_us": float(np.percentile(us, 50)), "step_p99_us": float(np.percentile(us, 99))}


class SacEdgeNode(LifecycleNode):
    """The bundle's policy as a lifecycle node (module docstring). ``bundle`` (else the ``bundle`` parameter)
    names the bundle; ``parameter_overrides`` as for any rclpy node."""

    def __init__(self, bundle: str | None = None, *, node_name: str = NODE_NAME, **kwargs: Any) -> None:
        overrides = list(kwargs.pop("parameter_overrides", None) or [])
        if bundle is not None:
            overrides.append(Parameter("bundle", value=bundle))
        super().__init__(node_name, parameter_overrides=overrides, **kwargs)
        self._declare()
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._state = "unconfigured"
        self._runtime: Runtime | None = None
        self._summary: RuntimeSummary | None = None
        self._fatal: str | None = None
        self._entities: list[tuple[str, Any]] = []
        self._timer: Any = None
        self._recorder: Recorder | None = None
        self._idle_us: int | None = None
        self._idle_hold = contextlib.ExitStack()
        """The idle-latency cap while active (``_enter_realtime``)."""
        self.get_logger().info(
            f"ready, unconfigured: configure and activate through {self.get_fully_qualified_name()}/change_state "
            "(or set autostart)"
        )

    # -- parameters ----------------------------------------------------------------------------------
    def _declare(self) -> None:
        for p in NODE_PARAMETERS:
            self.declare_parameter(p.name, p.default, self._descriptor(p.help, p.default, p.low, p.high))
        self._run_params = run_parameters()
        for name, default, text, tp, _ in self._run_params:
            low, high = RANGES.get(name, (None, None))
            descriptor = self._descriptor(text, default, low, high)
            descriptor.dynamic_typing = typing.get_origin(tp) is tuple  # a list may come as text, number or list
            self.declare_parameter(name, default, descriptor)

    @staticmethod
    def _descriptor(text: str, default: Any, low: float | None, high: float | None) -> ParameterDescriptor:
        descriptor = ParameterDescriptor(description=text)
        if low is not None and high is not None:
            if isinstance(default, float):
                descriptor.floating_point_range = [FloatingPointRange(from_value=float(low), to_value=float(high))]
            elif isinstance(default, int) and not isinstance(default, bool):
                descriptor.integer_range = [IntegerRange(from_value=int(low), to_value=int(high), step=1)]
        return descriptor

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        if self._state == "unconfigured":
            return SetParametersResult(successful=True)
        loose = {p.name for p in NODE_PARAMETERS if not p.fixed}
        fixed = [p.name for p in params if p.name not in loose]
        if fixed:
            return SetParametersResult(
                successful=False, reason=f"{fixed[0]} is fixed once configured: clean the node up, set it, configure"
            )
        return SetParametersResult(successful=True)

    def _param(self, name: str) -> Any:
        return self.get_parameter(name).value

    def run_config(self) -> RunConfig:
        """The run options from the parameters, unchecked (``RunConfig.check``); one line on a value that does
        not parse."""
        flags = {}
        for name, _, _, tp, may_be_unset in self._run_params:
            try:
                flags[name] = _flag_value(name, self._param(name), tp, may_be_unset)
            except ValueError as err:
                raise SacEdgeError(f"parameter {name}: {err}; set it as its flag takes it ({flag_of(name)})") from None
        return run_config(str(self._param("bundle")), flags)

    # -- lifecycle -----------------------------------------------------------------------------------
    def on_configure(self, state: Any) -> Any:
        try:
            self._configure()
        except (SacEdgeError, InternalError) as err:
            self.get_logger().error(f"configure failed: {err}")
            runtime, self._runtime = self._runtime, None
            if runtime is not None:  # opened before the failure: its fine-tuning lock and threads go
                runtime.close()
            self._release()
            return TransitionCallbackReturn.FAILURE
        self._state = "inactive"
        self.get_logger().info(
            f"configured: {self._runtime_describe()}, {self._layout.obs_dim} inputs -> {self._layout.act_dim} "
            f"{self._layout.action.interface} commands on {self._param('command_topic')}"
        )
        return TransitionCallbackReturn.SUCCESS

    def _configure(self) -> None:
        if not self._param("bundle"):
            raise SacEdgeError("no bundle: sac-edge ros2 BUNDLE, or set the bundle parameter")
        mode = self._param("mode")
        if mode not in MODES:
            raise SacEdgeError(f"mode must be timer or message, got {mode!r}")
        run = self.run_config()
        options = run.check()  # every value, one line, before the bundle is verified or the robot waited for
        bundle = verified_bundle(options)
        layout = bundle_layout(bundle)
        if layout is None:
            raise SacEdgeError(
                f"{bundle.path} has no layout: export it with sac-export --layout FILE (docs/CONTRACTS.md)"
            )
        self._layout = layout
        state_topic = str(self._param("state_topic"))
        state_qos = profile(*self._qos("state"), "state")
        command_qos = profile(*self._qos("command"), "command")
        ok, first = _wait_for_message(
            JointState, self, state_topic, state_qos, float(self._param("first_state_timeout_s"))
        )
        if not ok:
            raise SacEdgeError(
                f"no sensor_msgs/JointState on {self.resolve_topic_name(state_topic)} within "
                f"{self._param('first_state_timeout_s')} s; check state_topic and the robot's QoS"
            )
        self._jmap = layout.joint_map(list(first.name), f"JointState on {state_topic}")
        self._obs = np.zeros(layout.obs_dim, np.float32)
        self._cmd: np.ndarray = np.zeros(layout.act_dim, np.float64)
        self._topic_values: dict[str, Any] = {}
        self._topic_ns: dict[str, int] = {}
        self._steps = _Steps()
        record = str(self._param("record"))
        self._recorder = Recorder(record, bool(self._param("record_overwrite"))) if record else None
        runtime = Runtime(options, bundle=bundle, log=self.get_logger().warning, caller=Caller("sac_edge"))
        self._runtime = runtime.open()
        self._idle_us = self._enter_realtime(run.realtime)
        self._summary = None
        self._fatal = None
        self._state_msg: Any = first  # as old as it is: stale unless a newer one comes in time
        self._state_ns = time.monotonic_ns()
        self._pending_reward: float | None = None
        self._pending_end: bool | None = None
        self._previous: tuple[np.ndarray, np.ndarray] | None = None
        self._rate_hz = float(self._param("rate_hz"))  # the parameter: the runtime's options stay opaque here
        self._period_ns = int(1e9 / self._rate_hz)
        self._age_ns = int(float(self._param("max_input_age_ms")) * 1e6)
        self._message_mode = mode == "message"
        self._stale_now: str | None = None
        self._state_topic = state_topic
        self._last_step_ns = 0
        self._make_entities(state_topic, state_qos, command_qos)
        if not layout.topics:  # the warm-up: the step on the robot's own first state, without its effects
            layout.gather(self._obs, self._jmap, _fields(first), {}, f"JointState on {state_topic}")
            self._runtime.warm_up(self._obs)

    def _enter_realtime(self, rt: RealtimeSection) -> int | None:
        """``sac-edge run``'s realtime options, on this thread (the executor's, which runs every step): pinned
        to ``cpus``, SCHED_FIFO at ``realtime_priority``, memory locked, now that ``Runtime.open`` has started
        the fine-tuner (its threads and learner process keep the default policy; the learner keeps off
        ``cpus``). The idle-latency cap (0 by default with a priority, as in ``sac-edge run``) is tried now, so
        that a refusal is one line at configure, and held while active. Returns the cap (None: none)."""
        for line in enter_realtime(rt.realtime_priority, rt.cpus, rt.lock_memory):
            self.get_logger().info(f"realtime: {line}")
        idle_us = rt.idle_cap_us
        if idle_us is not None:
            with hold_idle_latency(idle_us):
                pass
        return idle_us

    def _qos(self, side: str) -> tuple[str, int, str]:
        return (
            str(self._param(f"{side}_qos_reliability")),
            int(self._param(f"{side}_qos_depth")),
            str(self._param(f"{side}_qos_durability")),
        )

    def _make_entities(self, state_topic: str, state_qos: Any, command_qos: Any) -> None:
        sub_events, pub_events = event_callbacks()
        warn = self.get_logger().warning

        def count() -> None:
            self._steps.qos_incompatible += 1

        def sub(msg_type: Any, topic: str, callback: Any, qos: Any) -> Any:
            events = sub_events(incompatible_qos=incompatible_warning(topic, "publisher", warn, count))
            entity = self.create_subscription(msg_type, topic, callback, qos, event_callbacks=events)
            self._entities.append(("sub", entity))
            return entity

        def pub(msg_type: Any, topic: str, qos: Any) -> Any:
            events = pub_events(incompatible_qos=incompatible_warning(topic, "subscription", warn, count))
            entity = self.create_publisher(msg_type, topic, qos, event_callbacks=events)
            self._entities.append(("pub", entity))
            return entity

        sub(JointState, state_topic, self._on_state, state_qos)
        for part in self._layout.parts:
            if part.topic is not None and part.topic not in self._topic_values:
                self._topic_values[part.topic] = None
                msg_type = Imu if part.source == "imu" else Float64MultiArray
                sub(msg_type, part.topic, self._topic_callback(part.topic, part.source), state_qos)
        if self._param("reward_topic"):
            sub(Float64, str(self._param("reward_topic")), self._on_reward, 10)
        if self._param("episode_end_topic"):
            sub(Bool, str(self._param("episode_end_topic")), self._on_episode_end, 10)
        self._command_topic = str(self._param("command_topic"))
        self._command_pub = pub(Float64MultiArray, self._command_topic, command_qos)
        trajectory = str(self._param("trajectory_topic"))
        self._trajectory_pub = pub(JointTrajectory, trajectory, command_qos) if trajectory else None
        self._diagnostics_pub = pub(DiagnosticArray, "/diagnostics", 10)
        self._diagnostics_timer = self.create_timer(
            float(self._param("diagnostics_period_s")), self._publish_diagnostics
        )
        self._entities.append(("timer", self._diagnostics_timer))
        self._command = Float64MultiArray()

    def on_activate(self, state: Any) -> Any:
        assert self._runtime is not None
        if self._idle_us is not None:
            try:
                line = self._idle_hold.enter_context(hold_idle_latency(self._idle_us))
            except SacEdgeError as err:
                self.get_logger().error(f"activate failed: {err}")
                return TransitionCallbackReturn.FAILURE
            self.get_logger().info(f"realtime: {line}, while active")
        shield = self._runtime.shield
        origin = self._ramp_origin() if shield is not None else None
        if shield is not None:
            shield.restart(origin)
        self._previous = None
        self._state = "active"
        if not self._message_mode:
            self._timer = self.create_timer(self._period_ns / 1e9, self._on_timer)
        self._last_step_ns = 0
        self._event({"type": "lifecycle", "state": "active"})
        start = (
            "no ramp (no shield)"
            if shield is None
            else "ramp from the " + ("robot's pose" if origin is not None else "safe action")
        )
        self.get_logger().info(f"active: {self._param('mode')} mode at {self._rate_hz:g} Hz, {start}")
        return TransitionCallbackReturn.SUCCESS

    def _ramp_origin(self) -> list[float] | None:
        """Where the activation ramp starts, as an action: with position commands the action joints' current
        positions (the latest JointState, when fresh); else None, the shield's safe action. Velocity and effort
        commands start there because neither zero velocity nor zero effort is safe for every robot (zero effort
        drops an arm under gravity): ``safe_action`` is the user's to set."""
        layout = self._layout
        if layout.action.interface != "position":
            return None
        age_ns = time.monotonic_ns() - self._state_ns
        if self._state_msg is None or age_ns > self._age_ns:
            self.get_logger().warning(
                f"activate: the latest JointState is {age_ns / 1e6:.0f} ms old (limit {self._age_ns / 1e6:g} ms): "
                "the ramp starts at the shield's safe action, not at the robot's pose"
            )
            return None
        origin = pose_action(layout, self._state_msg)
        self._event({"type": "ramp_origin", "action": origin})
        return origin

    def on_deactivate(self, state: Any) -> Any:
        self._stop_stepping()
        self._publish_safe()
        self._state = "inactive"
        self._event({"type": "lifecycle", "state": "inactive"})
        if self._fatal is not None:
            return TransitionCallbackReturn.ERROR  # to ErrorProcessing: on_error closes the runtime
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: Any) -> Any:
        self._finish()
        self._state = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: Any) -> Any:
        if self._state == "active":
            self._stop_stepping()
            self._publish_safe()
        self._finish()
        self._state = "finalized"
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: Any) -> Any:
        self.get_logger().error(
            f"error: {self._fatal or 'a transition failed'}; safe command published, runtime closed"
        )
        self._stop_stepping()
        self._publish_safe()
        self._state = "error"  # what the summary says
        self._finish()
        self._state = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def stop(self) -> RuntimeSummary | None:
        """The end of the process (a signal): the safe command if active, the runtime closed; the summary."""
        if self._state == "active":
            self._stop_stepping()
            self._publish_safe()
        self._finish()
        return self._summary

    def _stop_stepping(self) -> None:
        self._state = "stopping"
        self._idle_hold.close()
        if self._timer is not None:
            self._timer.cancel()
            self.destroy_timer(self._timer)
            self._timer = None

    def _publish_safe(self) -> None:
        runtime = self._runtime
        if runtime is None or self._summary is not None:
            return
        try:
            action = runtime.safe_action()
        except SacEdgeError:
            return
        self._publish(action, time.monotonic_ns())

    def _finish(self) -> None:
        """Close the runtime (once), log and write the summary, destroy topics and the recorder."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            self._summary = runtime.close()
            status = self.status_report()
            self.get_logger().info("summary: " + strict_json(status))
            path = str(self._param("summary"))
            if path:
                atomic_write_json(path, {"node": status, "runtime": self._summary.to_dict()})
        self._release()

    def _release(self) -> None:
        for kind, entity in self._entities:
            if kind == "sub":
                self.destroy_subscription(entity)
            elif kind == "pub":
                self.destroy_publisher(entity)
            else:
                entity.cancel()
                self.destroy_timer(entity)
        self._entities = []
        if self._recorder is not None:
            self._recorder.close()
            self._recorder = None

    # -- inputs --------------------------------------------------------------------------------------
    def _on_state(self, msg: Any) -> None:
        t0 = time.monotonic_ns()
        self._state_msg, self._state_ns = msg, t0
        if self._message_mode and self._state == "active":
            self._step(t0)

    def _topic_callback(self, topic: str, source: str) -> Any:
        def on_message(msg: Any) -> None:
            if source == "imu":
                v, w, a = msg.orientation, msg.angular_velocity, msg.linear_acceleration
                value: Any = {
                    "orientation": (v.x, v.y, v.z, v.w),
                    "angular_velocity": (w.x, w.y, w.z),
                    "linear_acceleration": (a.x, a.y, a.z),
                }
            else:
                value = msg.data
            self._topic_values[topic] = value
            self._topic_ns[topic] = time.monotonic_ns()

        return on_message

    def _on_reward(self, msg: Any) -> None:
        self._pending_reward = float(msg.data)

    def _on_episode_end(self, msg: Any) -> None:
        self._pending_end = bool(msg.data)

    def _on_timer(self) -> None:
        if self._state == "active":
            self._step(time.monotonic_ns())

    # -- the step ------------------------------------------------------------------------------------
    def _stale(self, now: int) -> str | None:
        """The first input that is missing or older than ``max_input_age_ms``, else None."""
        limit = self._age_ns
        if self._state_msg is None or now - self._state_ns > limit:
            return "state"
        for topic, seen in self._topic_values.items():
            if seen is None or now - self._topic_ns[topic] > limit:
                return topic
        return None

    def _step(self, t0: int) -> None:
        runtime = self._runtime
        assert runtime is not None
        steps = self._steps
        steps.steps += 1
        since = t0 - self._last_step_ns if self._last_step_ns else 0
        self._last_step_ns = t0
        if not self._message_mode and since > self._period_ns * 3 // 2:
            steps.misses += 1
        stale = self._stale(t0)
        msg = self._state_msg
        if stale is None:
            try:
                if msg.name != self._jmap.names and tuple(msg.name) != self._jmap.names:
                    self._jmap = self._layout.joint_map(list(msg.name), "JointState")
                self._layout.gather(self._obs, self._jmap, _fields(msg), self._topic_values)
            except SacEdgeError as err:
                steps.invalid_states += 1
                if steps.invalid_states == 1:
                    self.get_logger().error(f"{err} (fallback action until the state is right)")
                stale = "invalid_state"
        if stale != self._stale_now:
            self._note_stale(stale, t0, since)
        try:
            if stale is not None:
                steps.stale_steps += 1
                steps.stale_by[stale] = steps.stale_by.get(stale, 0) + 1
                action = runtime.hold(self._obs)  # the shield's fallback, counted by the runtime
            else:
                if self._recorder is not None:
                    self._recorder.write(self._state_topic, "sensor_msgs/msg/JointState", msg, time.time_ns())
                action = runtime.act(self._obs)
                self._learn(runtime, action)
        except StoppedServing as err:
            self._fatal = str(err)
            self._publish(err.action, t0)
            self.get_logger().error(f"{err}; going to the error state")
            self._state = "stopping"
            self.trigger_deactivate()
            return
        self._publish(action, t0)
        steps.took_ns.append(time.monotonic_ns() - t0)
        if len(steps.took_ns) > 20000:
            del steps.took_ns[:10000]
        report = runtime.tick()
        if not self._message_mode and report.rate_hz != self._rate_hz:
            self._retime(report.rate_hz)

    def _note_stale(self, stale: str | None, t0: int, since: int) -> None:
        """An input went stale (or came back): logged once, and an event in the recording."""
        self._stale_now = stale
        if stale is None:
            self.get_logger().info("inputs fresh again: back to the policy through the ramp")
            self._event({"type": "fresh", "step": self._steps.steps})
            return
        seen = self._state_ns if stale in ("state", "invalid_state") else self._topic_ns.get(stale, 0)
        age_ms = (t0 - seen) / 1e6 if seen else None
        self.get_logger().warning(
            f"input {stale} is stale ({'never received' if age_ms is None else f'{age_ms:.1f} ms old'}, limit "
            f"{self._age_ns / 1e6:g} ms): the shield's fallback until it is fresh"
        )
        self._event(
            {"type": "stale", "input": stale, "step": self._steps.steps, "age_ms": age_ms,
             "since_previous_step_ms": since / 1e6, "limit_ms": self._age_ns / 1e6}
        )  # fmt: skip

    def _learn(self, runtime: Runtime, action: np.ndarray) -> None:
        """The transition that ended at this step's observation, to ``Runtime.observe`` (with a reward topic)."""
        if not self._param("reward_topic"):
            return
        previous = self._previous
        obs = self._obs.copy()
        if previous is not None:
            end = self._pending_end
            runtime.observe(previous[0], previous[1], self._pending_reward, obs, end is True, end is False)
        self._pending_reward, self._pending_end = None, None
        self._previous = (obs, np.array(action, copy=True))

    def _retime(self, rate_hz: float) -> None:
        """The governor lowered (or restored) the rate: the timer follows."""
        self._rate_hz = rate_hz
        self._period_ns = int(1e9 / rate_hz)
        if self._timer is not None:
            self._timer.cancel()
            self.destroy_timer(self._timer)
            self._timer = self.create_timer(self._period_ns / 1e9, self._on_timer)

    def _publish(self, action: np.ndarray, t0: int) -> None:
        cmd = self._layout.command_vector(action, self._cmd)
        command = self._command
        command.data = cmd.tolist()
        self._command_pub.publish(command)
        if self._trajectory_pub is not None:
            trajectory = JointTrajectory()
            trajectory.joint_names = list(self._layout.action.joints)
            point = JointTrajectoryPoint()
            values = cmd.tolist()
            interface = self._layout.action.interface
            if interface == "position":
                point.positions = values
            elif interface == "velocity":
                point.velocities = values
            else:
                point.effort = values
            period = self._period_ns
            point.time_from_start.sec, point.time_from_start.nanosec = period // 1_000_000_000, period % 1_000_000_000
            trajectory.points = [point]
            self._trajectory_pub.publish(trajectory)
        if self._recorder is not None:
            self._recorder.write(self._command_topic, "std_msgs/msg/Float64MultiArray", command, time.time_ns())

    def _event(self, record: dict[str, Any]) -> None:
        if self._recorder is not None:
            self._recorder.event(record, time.time_ns())

    # -- reporting -----------------------------------------------------------------------------------
    def _runtime_describe(self) -> str:
        runtime = self._runtime
        if runtime is None:
            return "not configured"
        backend = runtime.backend.describe()
        return f"{backend.get('backend')} {backend.get('precision')}"

    def status_report(self) -> dict[str, Any]:
        """What /diagnostics shows and the summary holds: the node's step counts and times and the runtime's."""
        steps = getattr(self, "_steps", None) or _Steps()
        summary = self._summary
        if summary is None and self._runtime is not None:
            summary = self._runtime.summary()
        out: dict[str, Any] = {"state": self._state, "steps": steps.steps, **steps.step_percentiles_us()}
        out.update(
            deadline_misses=steps.misses,
            stale_steps=steps.stale_steps,
            stale_by=dict(steps.stale_by),
            stale_now=getattr(self, "_stale_now", None),
            invalid_states=steps.invalid_states,
            qos_incompatible=steps.qos_incompatible,
        )
        if summary is not None:
            shield = dict(summary.shield)
            out.update(
                backend=summary.backend.get("backend"),
                precision=summary.precision,
                inference_p50_us=summary.latency_us.get("p50"),
                inference_p99_us=summary.latency_us.get("p99"),
                inference_overruns=summary.inference_overruns,
                held_steps=summary.obs_held,  # Runtime.hold's steps (the stale ones) and held observations
                shield_fallbacks=shield.get("fallbacks", 0),
                shield_fallback_steps=shield.get("fallback_steps", 0),
                shield_ramps=shield.get("ramps", 0),
                falling_back=bool(self._runtime is not None and self._runtime.shield is not None
                                  and self._runtime.shield.falling_back),
                rate_hz=summary.final_rate_hz,
                governor_events=summary.budget_events,
                peak_rss_mb=summary.peak_rss_mb,
                transitions=summary.transitions,
                episodes=summary.episodes,
                finetune=summary.finetune is not None,
                stopped_by=summary.stopped_by,
            )  # fmt: skip
        return out

    def _publish_diagnostics(self) -> None:
        status = self.status_report()
        if self._runtime is not None:
            report = self._runtime.tick() if self._state != "active" else None
            power = (report.power if report is not None else None) or {}
            status["power_w"] = power.get("watts", power.get("power_w")) if isinstance(power, dict) else None
        msgs = _DiagnosticMsgs
        stamp = self.get_clock().now().to_msg()
        name = f"{self.get_name()}: policy"
        self._diagnostics_pub.publish(
            diagnostics.diagnostic_array(msgs, stamp, name, str(self._param("bundle")), status)
        )


class _DiagnosticMsgs:
    DiagnosticArray = DiagnosticArray
    DiagnosticStatus = DiagnosticStatus
    KeyValue = KeyValue


def pose_action(layout: IoLayout, msg: Any) -> list[float]:
    """The action that commands the positions ``msg`` (a JointState) gives the action's joints: the layout's
    ``offset + scale * action`` solved for the action; NaN where a joint has no finite position or a scale of
    0 (``Shield.restart`` takes the safe action's value there)."""
    where = {name: i for i, name in enumerate(msg.name)}
    positions = list(msg.position)
    action = layout.action
    out = []
    for joint, scale, offset in zip(action.joints, action.scale.tolist(), action.offset.tolist()):
        i = where.get(joint, len(positions))
        value = float(positions[i]) if i < len(positions) else math.nan
        out.append((value - offset) / scale if scale and math.isfinite(value) else math.nan)
    return out


def _fields(msg: Any) -> dict[str, Any]:
    return {"position": msg.position, "velocity": msg.velocity, "effort": msg.effort}


def _wait_for_message(msg_type: Any, node: Any, topic: str, qos: Any, timeout_s: float) -> tuple[bool, Any]:
    """rclpy's ``wait_for_message`` (Humble and on): the robot's first state, inside the configure callback."""
    from rclpy.wait_for_message import wait_for_message

    return wait_for_message(msg_type, node, topic, qos_profile=qos, time_to_wait=timeout_s)


# -- the command -----------------------------------------------------------------------------------------
def _split(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    args = list(argv)
    if "--ros-args" in args:
        i = args.index("--ros-args")
        ours, ros = args[:i], args[i:]
    else:
        ours, ros = args, []
    bundle = None
    for arg in ours:
        if arg.startswith("-"):
            raise SacEdgeError(
                f"sac-edge ros2: unknown option {arg}; node settings are ROS parameters: --ros-args -p name:=value "
                "or --params-file FILE (docs/ROS2.md)"
            )
        if bundle is not None:
            raise SacEdgeError("sac-edge ros2 takes one BUNDLE, then --ros-args ...")
        bundle = arg
    return bundle, ros


def main(argv: Sequence[str]) -> int:
    """``sac-edge ros2 BUNDLE [--ros-args ...]``: spin the node until SIGINT/SIGTERM, then publish the safe
    command, close the runtime and print the summary (one JSON line last)."""
    bundle, ros_args = _split(argv)
    from rclpy.signals import SignalHandlerOptions

    rclpy.init(args=["sac-edge", *ros_args], signal_handler_options=SignalHandlerOptions.NO)
    stop: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        stop.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    node = None
    try:
        node = SacEdgeNode(bundle)
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        if node.get_parameter("autostart").value and node.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            node.trigger_activate()
        # spin_once in a loop: the EventsExecutor's spin busy-loops on some releases (docs/ROS2.md)
        while not stop and rclpy.ok():
            executor.spin_once(timeout_sec=0.1)
        summary = node.stop()
        status = node.status_report()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    why = signal.Signals(stop[0]).name if stop else "ROS shutdown"
    print(f"sac-edge ros2: stopped by {why} after {status['steps']} steps", flush=True)
    record = {"stopped_by_signal": why, "node": status, "runtime": summary.to_dict() if summary else None}
    print(strict_json(record), flush=True)
    sys.stdout.flush()
    return 0
