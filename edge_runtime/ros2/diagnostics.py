"""``/diagnostics`` (``diagnostic_msgs/DiagnosticArray``) from the node's status report, about once a second: what
``rqt_robot_monitor``, the diagnostic aggregator and Foxglove show."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

OK, WARN, ERROR = 0, 1, 2


def level_of(report: Mapping[str, Any]) -> tuple[int, str]:
    """The status level and its one-line message: ERROR when the runtime stopped serving, WARN while
    falling back, stale or after a QoS mismatch, else OK."""
    if report.get("stopped_by"):
        return ERROR, f"stopped serving: {report['stopped_by']}"
    if report.get("state") != "active":
        return OK, f"{report.get('state')}: not publishing commands"
    if report.get("stale_now"):
        return WARN, f"stale input: {report['stale_now']} (fallback action)"
    if report.get("falling_back"):
        return WARN, "shield fallback"
    if report.get("qos_incompatible"):
        return WARN, "incompatible QoS on a topic (see the log)"
    return OK, "serving the policy"


def _text(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def diagnostic_array(msgs: Any, stamp: Any, name: str, hardware_id: str, report: Mapping[str, Any]) -> Any:
    """One ``DiagnosticArray`` with one status (``msgs``: a namespace holding DiagnosticArray, DiagnosticStatus
    and KeyValue)."""
    level, message = level_of(report)
    status = msgs.DiagnosticStatus()
    status.level = bytes([level])
    status.name = name
    status.message = message
    status.hardware_id = hardware_id
    status.values = [msgs.KeyValue(key=str(k), value=_text(v)) for k, v in report.items()]
    array = msgs.DiagnosticArray()
    array.header.stamp = stamp
    array.status = [status]
    return array
