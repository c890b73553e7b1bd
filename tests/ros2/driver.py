"""Steps a lifecycle node through its transitions over ``~/change_state`` (no ``ros2`` CLI), in its own
process (the ROS venv). ``driver.py NODE configure activate sleep:2 deactivate cleanup`` prints one JSON line
per step ({"step", "ok", "state"}); ``state`` prints the state; ``diagnostics:N`` waits for N /diagnostics
messages and prints the last; ``parameters`` prints every parameter's descriptor (``ros2 param describe``'s
fields); ``set:NAME=VALUE`` sets one (VALUE as YAML, as ``ros2 param set`` takes it) and prints the outcome;
``graph:TOPIC`` prints the nodes publishing and subscribing TOPIC, as the ROS graph has them (``ros2 topic info
-v``)."""

from __future__ import annotations

import json
import sys
import time

import rclpy
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rcl_interfaces.srv import DescribeParameters, ListParameters, SetParameters
from rclpy.node import Node
from rclpy.parameter import Parameter

IDS = {
    "configure": Transition.TRANSITION_CONFIGURE,
    "activate": Transition.TRANSITION_ACTIVATE,
    "deactivate": Transition.TRANSITION_DEACTIVATE,
    "cleanup": Transition.TRANSITION_CLEANUP,
    "shutdown": Transition.TRANSITION_INACTIVE_SHUTDOWN,
    "shutdown_active": Transition.TRANSITION_ACTIVE_SHUTDOWN,
}


def call(node: Node, client, request, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    future = client.call_async(request)
    rclpy.spin_until_future_complete(node, future, timeout_sec=timeout)
    return future.result()


def describe(node: Node, target: str) -> dict:
    """Every parameter of ``target``: its type, description, read-only flag and range."""
    listing = node.create_client(ListParameters, f"{target}/list_parameters")
    describing = node.create_client(DescribeParameters, f"{target}/describe_parameters")
    listing.wait_for_service(timeout_sec=30.0)
    names = list(call(node, listing, ListParameters.Request()).result.names)
    descriptors = call(node, describing, DescribeParameters.Request(names=names)).descriptors
    out = {}
    for d in descriptors:
        ranges = [(r.from_value, r.to_value) for r in (*d.integer_range, *d.floating_point_range)]
        out[d.name] = {"type": d.type, "description": d.description, "read_only": d.read_only,
                       "dynamic": d.dynamic_typing, "range": ranges[0] if ranges else None}  # fmt: skip
    return out


def main() -> None:
    target, steps = sys.argv[1], sys.argv[2:]
    rclpy.init()
    node = Node("driver")
    change = node.create_client(ChangeState, f"{target}/change_state")
    get = node.create_client(GetState, f"{target}/get_state")
    t0 = time.monotonic()
    if not (change.wait_for_service(timeout_sec=60.0) and get.wait_for_service(timeout_sec=60.0)):
        print(json.dumps({"step": "wait", "ok": False}), flush=True)
        sys.exit(1)
    print(json.dumps({"step": "wait", "ok": True, "s": round(time.monotonic() - t0, 3)}), flush=True)
    for step in steps:
        t = time.monotonic()
        if step.startswith("sleep:"):
            end = t + float(step.split(":")[1])
            while time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.05)
            continue
        if step == "state":
            state = call(node, get, GetState.Request())
            label = state.current_state.label if state else None
            print(json.dumps({"step": step, "ok": state is not None, "state": label}), flush=True)
            continue
        if step == "parameters":
            print(json.dumps({"step": step, "ok": True, "parameters": describe(node, target)}), flush=True)
            continue
        if step.startswith("set:"):
            name, _, text = step[4:].partition("=")
            client = node.create_client(SetParameters, f"{target}/set_parameters")
            client.wait_for_service(timeout_sec=30.0)
            value = yaml.safe_load(text)
            request = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
            result = call(node, client, request).results[0]
            print(json.dumps({"step": step, "ok": result.successful, "reason": result.reason}), flush=True)
            continue
        if step.startswith("graph:"):
            topic = step[6:]

            def ends(topic: str = topic) -> tuple[list[str], list[str]]:
                return (sorted(i.node_name for i in node.get_publishers_info_by_topic(topic)),
                        sorted(i.node_name for i in node.get_subscriptions_info_by_topic(topic)))  # fmt: skip

            seen, settled = ends(), time.monotonic()  # discovery: until the graph holds still for 2 s
            while time.monotonic() - settled < 2.0 and time.monotonic() - t < 30:
                rclpy.spin_once(node, timeout_sec=0.05)
                now = ends()
                if now != seen:
                    seen, settled = now, time.monotonic()
            publishers, subscribers = seen
            print(json.dumps({"step": step, "ok": True, "publishers": publishers, "subscribers": subscribers}),
                  flush=True)  # fmt: skip
            continue
        if step.startswith("diagnostics:"):
            seen: list = []
            node.create_subscription(DiagnosticArray, "/diagnostics", seen.append, 10)
            while len(seen) < int(step.split(":")[1]) and time.monotonic() - t < 30:
                rclpy.spin_once(node, timeout_sec=0.05)
            last = seen[-1].status[0] if seen else None
            values = {kv.key: kv.value for kv in last.values} if last else {}
            level = last.level[0] if last else None
            message = last.message if last else None
            out = {"step": step, "ok": bool(seen), "count": len(seen), "level": level, "message": message,
                   "hardware_id": last.hardware_id if last else None}  # fmt: skip
            print(json.dumps({**out, "values": values}), flush=True)
            continue
        request = ChangeState.Request()
        request.transition.id = IDS[step]
        result = call(node, change, request)
        state = call(node, get, GetState.Request())
        label = state.current_state.label if state else None
        ok = bool(result and result.success)
        print(json.dumps({"step": step, "ok": ok, "state": label, "s": round(time.monotonic() - t, 3)}), flush=True)
    node.destroy_node()
    rclpy.try_shutdown()


if __name__ == "__main__":
    main()
