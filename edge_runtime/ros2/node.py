"""``SacEdgeNode``: the bundle's policy as a ROS 2 lifecycle node (docs/ROS2.md), a thin shell over its parts:
``NodeParameters`` (the schema), ``RobotInputs`` (the merged JointState and the other topics), ``CommandOutputs``
(the command, the trajectory, the safe command), ``Stepper`` (one step) and ``NodeDiagnostics`` (/diagnostics
in every state). What configure builds is one ``Configured`` record that cleanup drops whole.

- **configure**: the parameters checked, the bundle verified, the robot's JointState waited for until every
  layout joint has come (from any number of publishers), the runtime opened and warmed up, topics made.
- **activate**: the shield's ramp restarted from where the robot is (position commands: its joints' current
  positions from fresh states), then a step per timer tick (``timer``) or per state message (``message``).
- **every stop** (deactivate, a signal, an error, shutdown, ``stop()``, an input stale past ``max_stale_s``):
  the command of the configured safe action (``Runtime.safe_action``) as the last command, waited on until the
  reliable subscribers acknowledge it (bounded), then silence.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.summary import strict_json

from .configured import Configured, configure
from .diagnostics import NodeDiagnostics
from .parameters import LOOSE, NODE_NAME, declare, nearest

#: The lifecycle states the node reports (``status_report``'s ``state``).
STATES = ("unconfigured", "inactive", "active", "finalized")


def _lifecycle() -> tuple[Any, Any]:
    from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn

    return LifecycleNode, TransitionCallbackReturn


LifecycleNode, TransitionCallbackReturn = _lifecycle()


class SacEdgeNode(LifecycleNode):  # type: ignore[misc,valid-type]
    """The bundle's policy as a lifecycle node (module docstring). ``bundle`` (else the ``bundle`` parameter)
    names the bundle; ``stop_requested`` tells a long wait (configure's) that the process is ending;
    ``parameter_overrides`` as for any rclpy node."""

    def __init__(
        self,
        bundle: str | None = None,
        *,
        node_name: str = NODE_NAME,
        stop_requested: Callable[[], bool] = lambda: False,
        **kwargs: Any,
    ) -> None:
        from rclpy.parameter import Parameter

        overrides = list(kwargs.pop("parameter_overrides", None) or [])
        if bundle is not None:
            overrides.append(Parameter("bundle", value=bundle))
        super().__init__(node_name, parameter_overrides=overrides, **kwargs)
        self.stop_requested = stop_requested
        self.state = "unconfigured"
        self.configured: Configured | None = None
        self.last_failure: str | None = None
        """Why the last configure failed (shown on /diagnostics while unconfigured)."""
        self.final: dict[str, Any] | None = None
        """The last configuration's final report (its summary), kept after cleanup."""
        declare(self)
        self._warn_unknown_overrides()
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.clock_ns = self._node_clock()
        self.diagnostics = NodeDiagnostics(self)
        self.get_logger().info(
            f"ready, unconfigured: configure and activate through {self.get_fully_qualified_name()}/change_state "
            "(or set autostart)"
        )

    def _node_clock(self) -> Callable[[], int]:
        """The node's clock in ns for ages and deadlines: ROS time under ``use_sim_time``, else monotonic."""
        if self.get_parameter("use_sim_time").value:
            clock = self.get_clock()
            return lambda: clock.now().nanoseconds
        return time.monotonic_ns

    def _warn_unknown_overrides(self) -> None:
        """An override of a name the node does not declare (a typo) is dropped by rclpy: say so, once."""
        unknown = sorted(n for n in self._parameter_overrides if not self.has_parameter(n))
        if unknown:
            hints = ", ".join(f"{n} (did you mean {nearest(n)}?)" if nearest(n) else n for n in unknown)
            self.get_logger().warning(f"unknown parameters, ignored: {hints} (docs/ROS2.md lists the node's)")

    # -- parameters ------------------------------------------------------------------------------------
    def _on_set_parameters(self, params: list[Any]) -> Any:
        from rcl_interfaces.msg import SetParametersResult

        from .parameters import check_value

        for p in params:
            problem = check_value(p.name, p.value)
            if problem is not None:
                return SetParametersResult(successful=False, reason=problem)
        if self.configured is None:
            return SetParametersResult(successful=True)
        fixed = [p.name for p in params if p.name not in LOOSE]
        if fixed:
            return SetParametersResult(
                successful=False, reason=f"{fixed[0]} is fixed once configured: clean the node up, set it, configure"
            )
        self.configured.retune({p.name: p.value for p in params})
        return SetParametersResult(successful=True)

    # -- lifecycle -------------------------------------------------------------------------------------
    def _LifecycleNodeMixin__change_state(self, transition_id: int) -> Any:
        """A transition not available from the current state is refused (``success=false``), the node serving
        on: Humble's rclpy raises out of the service callback instead (rclpy#1209, fixed by #1319, not on
        Humble), which ends the process without a safe command."""
        available = {t[0] for t in self._state_machine.available_transitions}
        if transition_id not in available:
            label = self._state_machine.current_state[1]
            self.get_logger().error(f"transition {transition_id} is not available from state {label}: refused")
            return TransitionCallbackReturn.FAILURE
        return super()._LifecycleNodeMixin__change_state(transition_id)

    def on_configure(self, state: Any) -> Any:
        try:
            self.configured = configure(self)
        except Exception as err:
            why = str(err) if isinstance(err, SacEdgeError) else f"{type(err).__name__}: {err}"
            self.last_failure = why.splitlines()[0] if why else type(err).__name__
            self.get_logger().error(f"configure failed: {self.last_failure}")
            self.diagnostics.publish()
            return TransitionCallbackReturn.FAILURE
        self.last_failure, self.final, self.state = None, None, "inactive"
        self.get_logger().info(f"configured: {self.configured.describe()}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: Any) -> Any:
        assert self.configured is not None
        try:
            line = self.configured.activate(self)
        except SacEdgeError as err:
            self.get_logger().error(f"activate failed: {err}")
            return TransitionCallbackReturn.FAILURE
        self.state = "active"
        self.get_logger().info(line)
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: Any) -> Any:
        configured = self.configured
        if configured is not None:
            configured.stop_stepping(self)
            configured.send_safe(self.get_logger())
        self.state = "inactive"
        if configured is not None and configured.fatal is not None:
            return TransitionCallbackReturn.ERROR  # to ErrorProcessing: on_error closes the runtime
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: Any) -> Any:
        self._finish()
        self.state = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: Any) -> Any:
        self.stop()
        self.state = "finalized"
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: Any) -> Any:
        configured = self.configured
        fatal = configured.fatal if configured is not None else None
        self.get_logger().error(f"error: {fatal or 'a transition failed'}; safe command published, runtime closed")
        self.state = "error"
        self.diagnostics.publish()  # the ERROR status goes out before the teardown
        self.stop()
        self.state = "unconfigured"
        return TransitionCallbackReturn.SUCCESS

    def stop(self) -> Any:
        """The end of the process (a signal, an exception) or of the configuration: the safe command if
        serving, the runtime closed, the summary; returns the runtime's summary (None: never configured)."""
        configured = self.configured
        if configured is not None and self.state == "active":
            configured.stop_stepping(self)
            configured.send_safe(self.get_logger())
        self._finish()
        return self.final["summary"] if self.final else None

    def _finish(self) -> None:
        """Drop the configuration whole: the runtime closed, the summary logged and written, topics gone."""
        configured, self.configured = self.configured, None
        if configured is not None:
            self.final = configured.close(self, self.state)

    # -- reporting -------------------------------------------------------------------------------------
    def status_report(self, configured: Configured | None = None) -> dict[str, Any]:
        """What /diagnostics shows and the summary holds."""
        configured = configured or self.configured
        if configured is None:
            out = dict(self.final["node"]) if self.final else {}
            out["state"] = self.state
            if self.last_failure:
                out["configure_failed"] = self.last_failure
            return out
        return configured.report(self.state)


def make_executor(choice: str) -> Any:
    """rclpy's EventsExecutor where it exists (Jazzy and newer) for ``auto``/``events``, else the
    SingleThreadedExecutor (Humble). Spun with ``spin_once`` in a loop: the EventsExecutor's ``spin`` busy-loops
    on some releases (docs/ROS2.md)."""
    from rclpy.executors import SingleThreadedExecutor

    if choice != "single":
        try:
            from rclpy.experimental import EventsExecutor
        except ImportError:
            if choice == "events":
                raise SacEdgeError("executor events: this rclpy has no EventsExecutor (Jazzy and newer)") from None
        else:
            return EventsExecutor()
    return SingleThreadedExecutor()


def split_args(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(BUNDLE, the ROS arguments) of ``sac-edge ros2 BUNDLE [--ros-args ...]``; one line on anything else."""
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
    """``sac-edge ros2 BUNDLE [--ros-args ...]``: spin the node until SIGINT/SIGTERM (or an exception), then
    publish the safe command, close the runtime and print the summary (one JSON line last)."""
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    bundle, ros_args = split_args(argv)
    rclpy.init(args=["sac-edge", *ros_args], signal_handler_options=SignalHandlerOptions.NO)
    stop: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: stop.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    node, failure, status, summary = None, None, {}, None
    try:
        node = SacEdgeNode(bundle, stop_requested=lambda: bool(stop))
        executor = make_executor(str(node.get_parameter("executor").value))
        executor.add_node(node)
        try:
            if node.get_parameter("autostart").value and node.trigger_configure() == TransitionCallbackReturn.SUCCESS:
                node.trigger_activate()
            while not stop and rclpy.ok():
                executor.spin_once(timeout_sec=0.1)
        except Exception as err:
            failure = f"{type(err).__name__}: {err}".splitlines()[0]
            node.get_logger().error(f"internal error: {failure}; sending the safe command and stopping")
        summary = node.stop()
        status = node.status_report()  # after stop: the final report, kept
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    why = signal.Signals(stop[0]).name if stop else (failure or "ROS shutdown")
    print(f"sac-edge ros2: stopped by {why} after {status.get('steps', 0)} steps", flush=True)
    record = {"stopped_by_signal": why, "node": status, "runtime": summary.to_dict() if summary else None}
    print(strict_json(record), flush=True)
    return 1 if failure else 0
