"""Step a lifecycle node through its transitions without the ``ros2`` command (PyPI's ROS 2 wheels have none):
the node's own ``~/get_available_transitions``, ``~/change_state`` and ``~/get_state`` services, as
``ros2 lifecycle set`` calls them. Run it with the Python that has rclpy (the robot's ROS 2, or .venv-ros2)::

    python docs/examples/lifecycle.py /sac_edge configure activate   # later: deactivate, cleanup, shutdown

One line per transition (``/sac_edge: configure -> inactive``); exit 1 at the first one refused.
"""

from __future__ import annotations

import sys

import rclpy
from lifecycle_msgs.srv import ChangeState, GetAvailableTransitions, GetState


def call(node, kind, service, request, timeout=30.0):  # type: ignore[no-untyped-def]
    client = node.create_client(kind, service)
    if not client.wait_for_service(timeout_sec=timeout):
        raise SystemExit(f"{service}: no such service after {timeout:g} s (is the node running, on this domain?)")
    future = client.call_async(request)
    rclpy.spin_until_future_complete(node, future, timeout_sec=timeout)
    if future.result() is None:
        raise SystemExit(f"{service}: no answer within {timeout:g} s")
    return future.result()


def main(target: str, labels: list[str]) -> int:
    rclpy.init()
    node = rclpy.create_node("lifecycle_example")
    try:
        for label in labels:
            available = call(node, GetAvailableTransitions, f"{target}/get_available_transitions",
                             GetAvailableTransitions.Request()).available_transitions  # fmt: skip
            match = [t.transition for t in available if t.transition.label == label]
            state = call(node, GetState, f"{target}/get_state", GetState.Request()).current_state.label
            if not match:
                print(f"{target}: {label} is not a transition from {state} "
                      f"(these are: {', '.join(t.transition.label for t in available)})")  # fmt: skip
                return 1
            ok = call(node, ChangeState, f"{target}/change_state", ChangeState.Request(transition=match[0])).success
            state = call(node, GetState, f"{target}/get_state", GetState.Request()).current_state.label
            print(f"{target}: {label} -> {state}" if ok else f"{target}: {label} failed, still {state}", flush=True)
            if not ok:
                return 1
        return 0
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
