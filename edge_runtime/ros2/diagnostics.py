"""``/diagnostics`` (``diagnostic_msgs/DiagnosticArray``) from the node's status report, about once a second: what
``rqt_robot_monitor``, the diagnostic aggregator and Foxglove show."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

OK, WARN, ERROR = 0, 1, 2


def level_of(report: Mapping[str, Any]) -> tuple[int, str]:
    """The status level and its one-line message: ERROR when the runtime stopped serving, an input was stale
    past ``max_stale_s`` or configure failed; WARN while falling back, stale, with no command subscriber, after
    a QoS mismatch or with the recording stopped; else OK."""
    if report.get("stopped_by"):
        return ERROR, f"stopped serving: {report['stopped_by']}"
    if report.get("stale_stop"):
        return ERROR, f"stopped: {report['stale_stop']}"
    if report.get("configure_failed"):
        return ERROR, f"configure failed: {report['configure_failed']}"
    state = report.get("state")
    if state not in ("active", "inactive"):
        return OK, f"{state}: not publishing commands"
    if report.get("command_subscribers") == 0:
        return WARN, "no subscriber on the command topic (is the controller's topic the same?)"
    if report.get("recording_stopped"):
        return WARN, f"recording stopped: {report['recording_stopped']}"
    if state != "active":
        return OK, "inactive: not publishing commands"
    if report.get("stale_now"):
        return WARN, f"stale input: {report['stale_now']} (fallback action)"
    if report.get("falling_back"):
        return WARN, "shield fallback"
    if report.get("qos_incompatible"):
        return WARN, "incompatible QoS on a topic (see the log)"
    shadow = report.get("shadow")
    if isinstance(shadow, Mapping):
        if shadow.get("findings"):
            return WARN, f"shadow: {shadow['findings'][0]}"
        return OK, "shadow: the policy beside the robot's controller, commanding nothing"
    return OK, "serving the policy"


def plain(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The report as (key, value) text pairs: numbers and words as they read (a mapping's items as
    ``key.item``, nested ones as ``key.item.field``; None as an empty value)."""
    out: list[tuple[str, str]] = []
    for key, value in report.items():
        if isinstance(value, Mapping):
            out.extend((f"{key}.{k}", v) for k, v in plain(value))
        else:
            out.append((str(key), _text(value)))
    return out


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return (" | " if any(isinstance(v, str) and "," in v for v in value) else ",").join(_text(v) for v in value)
    return str(value)


def diagnostic_array(stamp: Any, name: str, hardware_id: str, report: Mapping[str, Any]) -> Any:
    """One ``DiagnosticArray`` with one status."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

    level, message = level_of(report)
    status = DiagnosticStatus()
    status.level = bytes([level])
    status.name = name
    status.message = message
    status.hardware_id = hardware_id
    status.values = [KeyValue(key=k, value=v) for k, v in plain(report)]
    array = DiagnosticArray()
    array.header.stamp = stamp
    array.status = [status]
    return array


class NodeDiagnostics:
    """/diagnostics for ``node`` from its construction, in every state: a status every
    ``diagnostics_period_s`` and at once on a failure or a stop (``publish``)."""

    def __init__(self, node: Any) -> None:
        from diagnostic_msgs.msg import DiagnosticArray

        self.node = node
        self._pub = node.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._name = f"{node.get_name()}: policy"
        node.create_timer(float(node.get_parameter("diagnostics_period_s").value), self.publish)

    def publish(self) -> None:
        node = self.node
        report = node.status_report()
        hardware_id = str(node.get_parameter("hardware_id").value)
        self._pub.publish(diagnostic_array(node.get_clock().now().to_msg(), self._name, hardware_id, report))
