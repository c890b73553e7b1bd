"""What the node sends the robot: the command (``std_msgs/Float64MultiArray`` in the layout's action joint
order, what a ros2_control forward command controller takes), the one-point ``trajectory_msgs/JointTrajectory``
where a trajectory topic is set, and the safe command at every stop, waited on until the reliable
subscribers acknowledge it (bounded)."""

from __future__ import annotations

import array
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sac_edge.common.io_layout import IoLayout

#: How long a stop waits for the reliable subscribers to acknowledge the safe command.
SAFE_ACK_TIMEOUT_S = 0.5


class CommandOutputs:
    """The command publishers of one configured node (``make_pub(type, topic)`` makes a publisher)."""

    def __init__(
        self,
        layout: IoLayout,
        command_topic: str,
        trajectory_topic: str,
        make_pub: Callable[[Any, str], Any],
        period_ns: int,
    ) -> None:
        from std_msgs.msg import Float64MultiArray

        self.layout = layout
        self.command_topic = command_topic
        self._pub = make_pub(Float64MultiArray, command_topic)
        self._trajectory_pub = None
        if trajectory_topic:
            from trajectory_msgs.msg import JointTrajectory

            self._trajectory_pub = make_pub(JointTrajectory, trajectory_topic)
        self._msg = Float64MultiArray()
        self._msg.data = array.array("d", bytes(8 * layout.act_dim))
        self._data = self._msg.data  # the buffer the message holds (its setter may copy): commands go into it
        self._terms = layout.command_terms()
        self.period_ns = period_ns
        self.nonfinite = 0
        """Commands that came out non-finite (a layout's scale or offset overflowing): the safe one went instead."""
        self.sent = 0

    def publish(self, action: np.ndarray, safe: np.ndarray | None = None) -> Any:
        """Publish ``action``'s command; where it is not finite, ``safe``'s (counted in ``nonfinite``). Returns
        the message sent (reused: the next ``publish`` rewrites it; copy its ``data`` to keep it)."""
        data = self._data
        values = action.tolist() if action.ndim == 1 else action.reshape(-1).tolist()
        if not self.layout.command_into(values, self._terms, data):
            self.nonfinite += 1
            for i, v in enumerate(self._finite(safe)):
                data[i] = v
        msg = self._msg
        self._pub.publish(msg)  # serialised now: the next step's write into ``data`` cannot reach this message
        self.sent += 1
        if self._trajectory_pub is not None:
            self._trajectory_pub.publish(self._trajectory(data.tolist()))
        return msg

    def _finite(self, safe: np.ndarray | None) -> list[float]:
        """The safe action's command, where finite; else the layout's offset (the action 0), else 0."""
        if safe is not None:
            values = self.layout.command_vector(safe).tolist()
            if all(math.isfinite(v) for v in values):
                return values
        offset = self.layout.action.offset.tolist()
        return [v if math.isfinite(v) else 0.0 for v in offset]

    def _trajectory(self, values: list[float]) -> Any:
        from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

        trajectory = JointTrajectory()
        trajectory.joint_names = list(self.layout.action.joints)
        point = JointTrajectoryPoint()
        interface = self.layout.action.interface
        if interface == "position":
            point.positions = values
        elif interface == "velocity":
            point.velocities = values
        else:
            point.effort = values
        period = self.period_ns
        point.time_from_start.sec, point.time_from_start.nanosec = period // 1_000_000_000, period % 1_000_000_000
        trajectory.points = [point]
        return trajectory

    def subscribers(self) -> int:
        """Subscriptions matched on the command topic (0: a misspelt controller topic commands nothing)."""
        return int(self._pub.get_subscription_count())

    def publish_safe(self, safe: np.ndarray, timeout_s: float = SAFE_ACK_TIMEOUT_S) -> tuple[Any, bool]:
        """The safe command, then wait (up to ``timeout_s``) until every reliable subscriber has acknowledged
        it. Returns (the message, whether acknowledged)."""
        msg = self.publish(safe, safe)
        acked = True
        wait = getattr(self._pub, "wait_for_all_acked", None)
        if wait is not None:
            from rclpy.duration import Duration

            try:
                acked = bool(wait(Duration(nanoseconds=int(timeout_s * 1e9))))
            except Exception:  # a best-effort publisher or an rmw without it: nothing to wait for
                acked = False
        return msg, acked
