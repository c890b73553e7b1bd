"""QoS for each topic from the node's parameters, and a warning when a peer's QoS is incompatible (a
mismatch otherwise drops every message without a word: moveit2#1190).

Defaults: the state subscription is best effort, depth 10 (it then matches both a sensor driver's best-effort
publisher and joint_state_broadcaster's reliable one; the states of several publishers merge by joint name, so
each needs a slot); the command publisher is reliable, depth 1, as ros2_control's forward command controller
subscribes (SystemDefaultsQoS).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sac_edge.common.errors import SacEdgeError

RELIABILITIES = ("reliable", "best_effort")
DURABILITIES = ("volatile", "transient_local")


def profile(reliability: str, depth: int, durability: str, what: str) -> Any:
    """An rclpy ``QoSProfile`` (keep last ``depth``); one line on a bad value."""
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    if reliability not in RELIABILITIES:
        raise SacEdgeError(f"{what}_qos_reliability must be reliable or best_effort, got {reliability!r}")
    if durability not in DURABILITIES:
        raise SacEdgeError(f"{what}_qos_durability must be volatile or transient_local, got {durability!r}")
    if not 1 <= depth <= 1000:
        raise SacEdgeError(f"{what}_qos_depth must be from 1 to 1000, got {depth}")
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
        reliability=ReliabilityPolicy.RELIABLE if reliability == "reliable" else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.VOLATILE if durability == "volatile" else DurabilityPolicy.TRANSIENT_LOCAL,
    )


def incompatible_warning(
    topic: str, side: str, warn: Callable[[str], None], count: Callable[[], None]
) -> Callable[[Any], None]:
    """The callback an rclpy event handler calls on an incompatible peer: one warning naming the policy."""

    def on_event(event: Any) -> None:
        count()
        policy = getattr(event, "last_policy_kind", "?")
        name = getattr(policy, "name", str(policy))
        warn(
            f"QoS mismatch on {topic}: a {side} with incompatible QoS ({name}) was found, and no message passes "
            f"between them; set this node's {topic} QoS parameters to match (ros2 topic info -v {topic})"
        )

    return on_event
