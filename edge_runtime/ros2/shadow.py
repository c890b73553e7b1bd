"""Shadow mode (parameter ``shadow``): the policy runs on the live inputs every step beside the robot's active
controller and commands nothing. ``ShadowOutputs`` stands where ``CommandOutputs`` stands and never makes a
publisher on the command or trajectory topic; the policy's would-be command is recorded on ``SHADOW_TOPIC``.
``Shadow`` subscribes the command topic, records each controller command there, and feeds
``replay.OnlineChecks`` in the order the callbacks run (state, the policy's command, then the controller's), as
``sac-edge replay`` feeds it from the record: the divergence and the online findings are the replay's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sac_edge.common.io_layout import IoLayout
from sac_edge.edge_runtime.replay.online import OnlineChecks

#: Where the record holds the policy's would-be commands (the controller's stay on the command topic).
SHADOW_TOPIC = "/sac_edge/shadow/commands"
FLOAT64_ARRAY = "std_msgs/msg/Float64MultiArray"


class ShadowOutputs:
    """``CommandOutputs``' interface with nothing sent: each command is made as ``CommandOutputs`` makes it."""

    def __init__(self, layout: IoLayout, period_ns: int) -> None:
        from std_msgs.msg import Float64MultiArray

        self.layout = layout
        self.command_topic = SHADOW_TOPIC
        """The topic the stepper records the policy's commands on."""
        self.period_ns = period_ns
        self._msg = Float64MultiArray()
        self._cmd: np.ndarray = np.zeros(layout.act_dim, np.float64)
        self.nonfinite = 0
        self.sent = 0

    def publish(self, action: np.ndarray, safe: np.ndarray | None = None) -> Any:
        """The message the policy's ``action`` would be (not sent)."""
        self._msg.data = self.layout.command_vector(action, self._cmd).tolist()
        return self._msg

    def publish_safe(self, safe: np.ndarray, timeout_s: float = 0.0) -> tuple[Any, bool]:
        """Nothing to stop: the controller is in charge. The safe command's message, unsent."""
        return self.publish(safe, safe), True

    def subscribers(self) -> None:
        return None  # no publisher, so no subscriber count to warn about


class Shadow:
    """The comparison with the robot's controller: ``acted`` after each step the policy ran on a fresh state,
    ``on_command`` for each controller command (``record``: the stepper's recording, ``clock_ns``: the node's
    clock)."""

    def __init__(self, checks: OnlineChecks, clock_ns: Callable[[], int], command_topic: str) -> None:
        self.checks = checks
        self.clock_ns = clock_ns
        self.command_topic = command_topic
        self.record: Callable[[str, str, Any], None] | None = None

    def acted(self, obs: np.ndarray, action: np.ndarray) -> None:
        self.checks.state(self.clock_ns(), obs)
        self.checks.action(self.checks.layout.command_vector(action))

    def on_command(self, msg: Any) -> None:
        if self.record is not None:
            self.record(self.command_topic, FLOAT64_ARRAY, msg)
        self.checks.command(self.clock_ns(), msg.data)

    def section(self) -> dict[str, Any]:
        """The summary's and /diagnostics' ``shadow`` section: commands compared, per-joint divergence (p50,
        p99, max of |controller command - policy command|), the timing, and the online findings as lines."""
        report = self.checks.report()
        return {
            "states": report["states"],
            "commands_compared": report["commands_compared"],
            "divergence": report["divergence"],
            "timing": report["timing"],
            "findings": [f"{f['kind']} {', '.join(f['joints'])}: {f['detail']}" for f in report["findings"]],
        }
