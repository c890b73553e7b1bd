"""The system's rclpy, imported once: one line naming the fix when it is missing or too old (Foxy has no
``rclpy.lifecycle``), and the few names whose module moved between releases (Humble's ``rclpy.qos_event``
became ``rclpy.event_handler`` in Iron). Only APIs that exist from Humble on are used anywhere in the node
(``tests/ros2/test_rclpy_surface.py`` checks every call against Humble's sources)."""

from __future__ import annotations

from typing import Any

from sac_edge.common.errors import SacEdgeError

NO_RCLPY = (
    "rclpy is not importable here: source the robot's ROS 2 first (source /opt/ros/humble/setup.bash) and run "
    "sac-edge from the same Python (ROS 2 Humble or newer)"
)
FOXY = (
    "this ROS 2 has no rclpy.lifecycle (Foxy or older): the sac-edge node needs Humble or newer "
    "(on JetPack 5, run Humble in a container)"
)


def require_rclpy() -> Any:
    """``rclpy`` with ``rclpy.lifecycle`` imported, or one SacEdgeError line."""
    try:
        import rclpy
    except ImportError:
        raise SacEdgeError(NO_RCLPY) from None
    try:
        import rclpy.lifecycle
    except ImportError:
        raise SacEdgeError(FOXY) from None
    return rclpy


def event_callbacks() -> tuple[Any, Any]:
    """(SubscriptionEventCallbacks, PublisherEventCallbacks) wherever this release keeps them."""
    try:
        from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
    except ImportError:  # Humble
        from rclpy.qos_event import PublisherEventCallbacks, SubscriptionEventCallbacks
    return SubscriptionEventCallbacks, PublisherEventCallbacks


def ros2_status() -> tuple[str, str]:
    """``sac-edge doctor``'s ROS 2 row: (``ok``, ``missing``, ``old`` or ``broken``; what was found)."""
    try:
        rclpy = require_rclpy()
    except SacEdgeError as err:
        return ("old" if str(err) == FOXY else "missing"), str(err)
    import os

    distro = os.environ.get("ROS_DISTRO") or "ROS_DISTRO unset"
    try:
        from rclpy.utilities import get_rmw_implementation_identifier

        rmw = get_rmw_implementation_identifier()
    except Exception as err:  # the middleware's library may fail to load
        line = str(err).splitlines()[0] if str(err) else type(err).__name__
        return "broken", f"rclpy imports but its middleware does not load: {line}"
    return "ok", f"rclpy {os.path.dirname(rclpy.__file__)} ({distro}, {rmw})"
