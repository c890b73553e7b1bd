"""What configure builds (``configure``): one ``Configured`` record holding the checked parameters, the runtime,
the inputs, the outputs, the recorder, the stepper and every ROS entity made for them; cleanup drops it whole
(``Configured.close``). A configure that fails part way drops what it made (the runtime closed, a record file
it created removed), so that a retry starts clean."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.io_layout import IoLayout, bundle_layout
from sac_edge.common.summary import strict_json
from sac_edge.edge_runtime.compose import verified_bundle
from sac_edge.edge_runtime.config import RealtimeSection
from sac_edge.edge_runtime.control.realtime import enter_realtime, hold_idle_latency
from sac_edge.edge_runtime.runtime import Caller, Runtime

from .compat import event_callbacks
from .inputs import STATE, RobotInputs, escaped
from .outputs import CommandOutputs
from .parameters import NodeParameters
from .qos import incompatible_warning, profile
from .recorder import Recorder
from .shadow import Shadow, ShadowOutputs
from .status import status_report
from .step import Stepper, Transitions


def output_file(path: str, overwrite: bool, what: str) -> None:
    """An output file's rules (as ``--out``'s): its directory exists; an existing path is replaced only with
    the overwrite flag and only when it is a regular file (never a symlink, FIFO or directory)."""
    target = Path(path)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        info = None
    if info is not None:
        if not stat.S_ISREG(info.st_mode):
            raise SacEdgeError(f"{what} {path}: a symlink or not a regular file; choose another path")
        if not overwrite:
            raise SacEdgeError(f"{what} {path} already exists; choose another path or set {what}_overwrite")
    if not target.parent.is_dir():
        raise SacEdgeError(f"{what} {path}: its directory does not exist")


def resolved(node: Any, parameter: str, name: str) -> str:
    """``name`` as the node resolves it (namespace, remaps); one line when it is no valid topic name."""
    try:
        return str(node.resolve_topic_name(name))
    except Exception as err:
        why = str(err).split(", at ")[0].splitlines()[0]
        raise SacEdgeError(f"{parameter} '{escaped(name)}' is not a valid topic name ({why})") from None


class Entities:
    """The subscriptions, publishers and timers one configuration made, destroyed together."""

    def __init__(self, node: Any, count_incompatible: Callable[[], None]) -> None:
        self.node, self.made = node, []  # type: ignore[var-annotated]
        self._count = count_incompatible
        self._sub_events, self._pub_events = event_callbacks()

    def sub(self, msg_type: Any, topic: str, callback: Any, qos: Any) -> Any:
        warn = self.node.get_logger().warning
        events = self._sub_events(incompatible_qos=incompatible_warning(topic, "publisher", warn, self._count))
        entity = self.node.create_subscription(msg_type, topic, callback, qos, event_callbacks=events)
        self.made.append(entity)
        return entity

    def pub(self, msg_type: Any, topic: str, qos: Any) -> Any:
        warn = self.node.get_logger().warning
        events = self._pub_events(incompatible_qos=incompatible_warning(topic, "subscription", warn, self._count))
        entity = self.node.create_publisher(msg_type, topic, qos, event_callbacks=events)
        self.made.append(entity)
        return entity

    def timer(self, period_s: float, callback: Any) -> Any:
        entity = self.node.create_timer(period_s, callback)
        self.made.append(entity)
        return entity

    def destroy(self, entity: Any) -> None:
        node = self.node
        if entity in self.made:
            self.made.remove(entity)
        if hasattr(entity, "cancel"):
            entity.cancel()
            node.destroy_timer(entity)
        elif hasattr(entity, "publish"):
            node.destroy_publisher(entity)
        else:
            node.destroy_subscription(entity)

    def destroy_all(self) -> None:
        for entity in list(reversed(self.made)):
            self.destroy(entity)


def wait_for_joints(node: Any, inputs: RobotInputs, topic: str, qos: Any, timeout_s: float) -> None:
    """Configure's wait for the robot: JointStates on ``topic`` (resolved) merged until every layout joint has
    come, up to ``timeout_s``; a signal (``node.stop_requested``) ends it at once. A node of its own spins the
    subscription (the node's executor is inside this configure callback)."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import JointState

    problems: list[str] = []
    names: list[Any] = []

    def on_state(msg: Any) -> None:
        names[:] = [msg.name]
        problem = inputs.on_state(msg, node.clock_ns())
        if problem is not None and problem not in problems:
            problems.append(problem)

    waiter = rclpy.create_node(
        f"{node.get_name()}_first_state", context=node.context, use_global_arguments=False,
        start_parameter_services=False, enable_rosout=False,
    )  # fmt: skip
    executor = SingleThreadedExecutor(context=node.context)
    try:
        waiter.create_subscription(JointState, topic, on_state, qos)
        executor.add_node(waiter)
        end = time.monotonic() + timeout_s
        while inputs.missing() is not None and time.monotonic() < end:
            if node.stop_requested() or not rclpy.ok(context=node.context):
                raise SacEdgeError("stopped while waiting for the robot's first JointState")
            executor.spin_once(timeout_sec=0.05)
    finally:
        executor.shutdown(timeout_sec=0)
        waiter.destroy_node()
    missing = inputs.missing()
    if missing is None:
        return
    if names and inputs.latest is None:  # only invalid ones: the latest one's first problem, missing joints first
        inputs.layout.joint_map([escaped(n) for n in names[0]], inputs.source)
    if problems:
        raise SacEdgeError(problems[-1])
    if inputs.latest is not None:
        raise SacEdgeError(
            f"{inputs.source}: joint '{escaped(missing)}' of the layout is missing (the robot publishes "
            f"{', '.join(escaped(n) for n in inputs.latest.name)}); fix the joint's name in the layout"
        )
    raise SacEdgeError(
        f"no sensor_msgs/JointState on {topic} within {timeout_s:g} s; check state_topic and the robot's QoS"
    )


def configure(node: Any) -> Configured:
    """Everything configure makes, in the order that fails cheapest first; on a failure, what was made goes."""
    params = NodeParameters.read(lambda name: node.get_parameter(name).value)
    options = params.run.check()  # every value, one line, before the bundle is verified or the robot waited for
    if params.record:
        output_file(params.record, params.record_overwrite, "record")
    if params.summary:
        output_file(params.summary, params.summary_overwrite, "summary")
    bundle = verified_bundle(options)
    layout = bundle_layout(bundle)
    if layout is None:
        raise SacEdgeError(f"{bundle.path} has no layout: export it with sac-export --layout FILE (docs/CONTRACTS.md)")
    state_topic = resolved(node, "state_topic", params.state_topic)
    state_qos = profile(*params.state_qos, "state")
    command_qos = profile(*params.command_qos, "command")
    inputs = RobotInputs(layout, state_topic, node.clock_ns)
    shadow = _shadow(node, bundle, layout, params) if params.shadow else None
    wait_for_joints(node, inputs, state_topic, state_qos, params.first_state_timeout_s)
    log = node.get_logger()
    runtime = Runtime(options, bundle=bundle, log=log.info, caller=Caller("sac_edge"))
    made = contextlib.ExitStack()
    with made:
        made.callback(runtime.close)
        runtime.open()
        configured = Configured(node, params, layout, runtime, inputs, shadow)
        if params.record:
            configured.open_recorder()
            made.callback(configured.drop_recorder)
        made.callback(configured.entities.destroy_all)
        configured.connect(state_qos, command_qos)
        configured.idle_us = _enter_realtime(log, params.run.realtime)
        configured.warm_up()
        made.pop_all()
    return configured


def _shadow(node: Any, bundle: Any, layout: IoLayout, params: NodeParameters) -> Shadow:
    """Shadow mode's comparison against the bundle's training distribution (none without one: the commands
    are still compared)."""
    from sac_edge.edge_runtime.replay.online import OnlineChecks
    from sac_edge.edge_runtime.replay.reference import bundle_reference, no_reference

    try:
        reference = bundle_reference(bundle)
    except SacEdgeError as err:
        node.get_logger().warning(f"shadow: {err}; no range or frozen checks")
        reference = no_reference(layout.obs_dim)
    clock = node.get_clock()
    return Shadow(OnlineChecks(layout, reference), lambda: clock.now().nanoseconds,
                  resolved(node, "command_topic", params.command_topic))  # fmt: skip


def _enter_realtime(log: Any, rt: RealtimeSection) -> int | None:
    """``sac-edge run``'s realtime options, on this thread (the executor's, which runs every step), now that
    ``Runtime.open`` has started the fine-tuner; the idle-latency cap is tried now (a refusal is one line at
    configure) and held while active. Returns the cap (None: none)."""
    for line in enter_realtime(rt.realtime_priority, rt.cpus, rt.lock_memory):
        log.info(f"realtime: {line}")
    idle_us = rt.idle_cap_us
    if idle_us is not None:
        with hold_idle_latency(idle_us):
            pass
    return idle_us


class Configured:
    """One configuration of the node: its parts and entities, the step's callbacks, the safe command, the
    final report. ``close`` drops it."""

    def __init__(
        self,
        node: Any,
        params: NodeParameters,
        layout: IoLayout,
        runtime: Runtime,
        inputs: RobotInputs,
        shadow: Shadow | None = None,
    ):
        self.node, self.params, self.layout, self.runtime, self.inputs = node, params, layout, runtime, inputs
        self.shadow = shadow
        self.entities = Entities(node, self._count_incompatible)
        self.recorder: Recorder | None = None
        self.idle_us: int | None = None
        self.idle_hold = contextlib.ExitStack()
        self.fatal: str | None = None
        """Why the runtime stopped serving (the error state's cause)."""
        self.stale_stop: str | None = None
        """The input stale past ``max_stale_s`` that made the node inactive (until the next activate)."""
        self.timer: Any = None
        self.rate_hz = params.rate_hz
        """The rate the timer runs at (the governor may lower it)."""
        self.transitions = Transitions() if params.reward_topic else None
        self.stepper: Stepper
        self._stale_since = 0

    # -- building ----------------------------------------------------------------------------------------
    def connect(self, state_qos: Any, command_qos: Any) -> None:
        from sensor_msgs.msg import Imu, JointState
        from std_msgs.msg import Bool, Float64, Float64MultiArray

        p, e, node = self.params, self.entities, self.node
        outputs: CommandOutputs | ShadowOutputs
        if self.shadow is not None:  # no publisher on the command or trajectory topic: the controller commands
            outputs = ShadowOutputs(self.layout, p.period_ns)
        else:
            outputs = CommandOutputs(
                self.layout, resolved(node, "command_topic", p.command_topic),
                resolved(node, "trajectory_topic", p.trajectory_topic) if p.trajectory_topic else "",
                lambda msg_type, topic: e.pub(msg_type, topic, command_qos), p.period_ns,
            )  # fmt: skip
        self.stepper = Stepper(self.runtime, self.inputs, outputs, self.transitions, int(p.max_input_age_ms * 1e6),
                               node.get_logger(), resolved(node, "state_topic", p.state_topic))  # fmt: skip
        self.stepper.recorder = self.recorder
        if self.recorder is not None:
            self.recorder.declare(self.stepper.state_topic, "sensor_msgs/msg/JointState", p.state_qos)
            self.recorder.declare(outputs.command_topic, "std_msgs/msg/Float64MultiArray", p.command_qos)
        if self.shadow is not None:  # the controller's commands: compared, and recorded on their own topic
            self.stepper.shadow, self.shadow.record = self.shadow, self.stepper.record
            if self.recorder is not None:
                self.recorder.declare(self.shadow.command_topic, "std_msgs/msg/Float64MultiArray", p.command_qos)
            e.sub(Float64MultiArray, p.command_topic, self.shadow.on_command, command_qos)
        e.sub(JointState, p.state_topic, self._on_state, state_qos)
        topics: set[str] = set()
        for part in self.layout.parts:
            if part.topic is not None and part.topic not in topics:
                topics.add(part.topic)
                msg_type = Imu if part.source == "imu" else Float64MultiArray
                e.sub(msg_type, part.topic, self.inputs.topic_callback(part.topic, part.source), state_qos)
        if self.transitions is not None:
            e.sub(Float64, p.reward_topic, self.transitions.on_reward, 10)
        if p.episode_end_topic:
            sink = self.transitions.on_episode_end if self.transitions is not None else (lambda msg: None)
            e.sub(Bool, p.episode_end_topic, sink, 10)

    def open_recorder(self) -> None:
        clock = self.node.get_clock()
        self.recorder = Recorder(self.params.record, self.params.record_overwrite, lambda: clock.now().nanoseconds)

    def drop_recorder(self) -> None:
        """A configure that failed after the record file was opened: the file goes (a retry starts clean)."""
        recorder, self.recorder = self.recorder, None
        if hasattr(self, "stepper"):
            self.stepper.recorder = None
        if recorder is not None:
            recorder.abandon()

    def warm_up(self) -> None:
        """The step on the robot's first state, without its effects."""
        if not self.layout.topics:
            obs = self.stepper.obs
            self.inputs.read(self.node.clock_ns(), 1 << 62, obs)
            self.runtime.warm_up(obs)

    def _count_incompatible(self) -> None:
        if hasattr(self, "stepper"):
            self.stepper.stats.qos_incompatible += 1

    def describe(self) -> str:
        backend = self.runtime.backend.describe()
        return (
            f"{backend.get('backend')} {backend.get('precision')}, {self.layout.obs_dim} inputs -> "
            f"{self.layout.act_dim} {self.layout.action.interface} commands on {self.stepper.outputs.command_topic}"
        )

    def retune(self, values: dict[str, Any]) -> None:
        """Parameters that may change while configured, applied at once."""
        if "max_input_age_ms" in values:
            self.stepper.age_ns = int(float(values["max_input_age_ms"]) * 1e6)
        if "max_stale_s" in values:
            self.params = _replace(self.params, max_stale_s=float(values["max_stale_s"]))

    # -- active ------------------------------------------------------------------------------------------
    def activate(self, node: Any) -> str:
        if self.idle_us is not None:
            line = self.idle_hold.enter_context(hold_idle_latency(self.idle_us))
            node.get_logger().info(f"realtime: {line}, while active")
        shield = self.runtime.shield
        origin = self._ramp_origin() if shield is not None else None
        if shield is not None:
            shield.restart(origin)
        self.stale_stop, self._stale_since = None, 0
        self.stepper.restart(self.params.message_mode)
        if not self.params.message_mode:
            self.timer = self.entities.timer(1.0 / self.rate_hz, self._on_timer)
        self.stepper.event({"type": "lifecycle", "state": "active"})
        start = "no ramp (no shield)" if shield is None else "ramp from the " + (
            "robot's pose" if origin is not None else "safe action")  # fmt: skip
        return f"active: {self.params.mode} mode at {self.params.rate_hz:g} Hz, {start}"

    def _ramp_origin(self) -> list[float] | None:
        """Position commands: the action joints' current positions (when fresh); else None, the safe action.
        Velocity and effort commands start at the safe action: neither zero velocity nor zero effort is safe
        for every robot (zero effort drops an arm under gravity), and ``safe_action`` is the user's to set."""
        if self.layout.action.interface != "position":
            return None
        now, limit = self.node.clock_ns(), self.stepper.age_ns
        seen = self.inputs.seen_ns(STATE)
        if now - seen > limit:  # NEVER is older than any limit
            self.node.get_logger().warning(
                f"activate: the latest JointState is {(now - seen) / 1e6:.0f} ms old (limit {limit / 1e6:g} ms): "
                "the ramp starts at the shield's safe action, not at the robot's pose"
            )
            return None
        origin = self.inputs.pose_action()
        self.stepper.event({"type": "ramp_origin", "action": origin})
        return origin

    def _on_state(self, msg: Any) -> None:
        now = self.node.clock_ns()
        self.stepper.on_state(self.inputs.on_state(msg, now))
        if self.timer is None and self.params.message_mode and self.node.state == "active":
            self._step(now)

    def _on_timer(self) -> None:
        if self.node.state == "active":
            self._step(self.node.clock_ns())

    def _step(self, t0: int) -> None:
        stepper = self.stepper
        stopped = stepper.step(t0, self.node.clock_ns)
        if stopped is not None:
            self.fatal = stopped.reason
            self.node.get_logger().error(f"{stopped}; going to the error state")
            self.node.trigger_deactivate()
            return
        rate_hz = self.runtime.tick().rate_hz  # budgets once a second (cached in between)
        if rate_hz != self.rate_hz:
            self._retime(rate_hz)
        if stepper.ended_episode and self.runtime.shield is not None and self.layout.action.interface == "position":
            origin = self.inputs.pose_action()  # the next step ramps from the robot's pose, as after activate
            self.runtime.shield.restart(origin)
            stepper.event(
                {"type": "ramp_origin", "action": origin, "cause": "episode_end", "step": stepper.stats.steps}
            )
        stale = stepper.stale_now
        if stale is None:
            self._stale_since = 0
            return
        if not self._stale_since:
            self._stale_since = t0
        elif t0 - self._stale_since >= self.params.max_stale_s * 1e9:
            self.stale_stop = (
                f"input {stale} stale for {(t0 - self._stale_since) / 1e9:.3g} s (max_stale_s "
                f"{self.params.max_stale_s:g}): safe command sent, node inactive; activate again to resume"
            )
            self.node.get_logger().error(self.stale_stop)
            self.node.trigger_deactivate()
            self.node.diagnostics.publish()

    def _retime(self, rate_hz: float) -> None:
        """The governor lowered (or restored) the rate: the timer follows."""
        self.rate_hz = rate_hz
        self.stepper.period_ns = int(1e9 / rate_hz)
        if self.timer is not None:
            self.entities.destroy(self.timer)
            self.timer = self.entities.timer(1.0 / rate_hz, self._on_timer)

    def stop_stepping(self, node: Any) -> None:
        self.idle_hold.close()
        if self.timer is not None:
            self.entities.destroy(self.timer)
            self.timer = None

    def send_safe(self, log: Any) -> None:
        """The configured safe action's command, acknowledged by the reliable subscribers (bounded wait)."""
        safe = self.runtime.safe_action()
        msg, acked = self.stepper.outputs.publish_safe(safe)
        self.stepper.record_command(msg)
        self.stepper.event({"type": "safe_command", "command": list(msg.data), "acknowledged": acked})
        if not acked:
            log.warning("the safe command was not acknowledged by every command subscriber in time")

    # -- reporting and the end ---------------------------------------------------------------------------
    def report(self, state: str, summary: Any = None) -> dict[str, Any]:
        stepper = self.stepper
        extra: dict[str, Any] = {
            "stale_now": stepper.stale_now,
            "stale_stop": self.stale_stop,
            "command_subscribers": stepper.outputs.subscribers(),
            "commands_nonfinite": stepper.outputs.nonfinite,
            "record_drops": stepper.record_drops,
            "recording_stopped": stepper.recording_stopped,
            "inputs_invalid": self.inputs.invalid,
        }
        if self.shadow is not None:
            extra["shadow"] = self.shadow.section()
        return status_report(state, stepper.stats, None if summary is not None else self.runtime, summary, extra)

    def close(self, node: Any, state: str) -> dict[str, Any]:
        """Close the runtime, log and write the summary, destroy the entities and the recorder. A report that
        fails (a bug) still leaves everything closed."""
        self.idle_hold.close()
        summary = self.runtime.close()
        try:
            status = self.report(state, summary)
        except Exception as err:  # the close goes on: the runtime is closed already
            status = {"state": state, "report_failed": f"{type(err).__name__}: {err}".splitlines()[0]}
        node.get_logger().info("summary: " + strict_json(status))
        if self.params.summary:
            try:
                output_file(self.params.summary, self.params.summary_overwrite, "summary")
                atomic_write_json(self.params.summary, {"node": status, "runtime": summary.to_dict()})
            except (SacEdgeError, OSError) as err:
                node.get_logger().error(f"summary not written: {err}")
        self.entities.destroy_all()
        self.stepper.close_recorder()
        return {"node": status, "summary": summary}


def _replace(params: NodeParameters, **changes: Any) -> NodeParameters:
    import dataclasses

    return dataclasses.replace(params, **changes)
