"""The node's parts on real rclpy (the ROS venv), without a robot: what they send and take."""

from __future__ import annotations

import json
import subprocess

import pytest
from harness import PYTHON, ROOT, ros_env

pytestmark = [pytest.mark.ros2, pytest.mark.timeout(120)]

NONFINITE = """
import json, numpy as np, rclpy
from std_msgs.msg import Float64MultiArray
from sac_edge.common.io_layout import ActionLayout, IoLayout, ObsPart
from sac_edge.edge_runtime.ros2.outputs import CommandOutputs
rclpy.init()
node = rclpy.create_node("outputs_check")
part = ObsPart("joint_states", "position", ("a", "b"), None, 2, np.zeros(2), np.ones(2), "none")
# a layout whose scale overflows a float64 command (export refuses it; a bundle made otherwise may not)
layout = IoLayout((part,), ActionLayout("effort", ("a", "b"), np.array([1e308, 1.0]), np.array([0.0, 0.5])), ())
outputs = CommandOutputs(layout, "commands", "", lambda t, topic: node.create_publisher(t, topic, 10), 10**7)
sent = [list(outputs.publish(np.array([0.5, 0.5]), np.array([0.0, 0.1])).data)]
sent.append(list(outputs.publish(np.array([2.0, 0.5]), np.array([0.0, 0.1])).data))
sent.append(list(outputs.publish(np.array([2.0, 0.5]), np.array([1e308 * 10, 0.1])).data))
print(json.dumps({"sent": sent, "nonfinite": outputs.nonfinite}))
"""


def test_a_non_finite_command_is_never_published_the_safe_one_goes_instead() -> None:
    proc = subprocess.run([str(PYTHON), "-c", NONFINITE], capture_output=True, text=True, timeout=100, cwd=ROOT,
                          env=ros_env(), check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["sent"][0] == [5e307, 1.0]
    assert result["sent"][1] == [0.0, 0.6]  # 2e308 overflows: the safe action's command
    assert result["sent"][2] == [0.0, 0.5]  # a safe command that is not finite either: the layout's offsets
    assert result["nonfinite"] == 2


INVALID = """
import json, time
from sensor_msgs.msg import JointState
from sac_edge.common.io_layout import load_layout
from sac_edge.edge_runtime.ros2.inputs import RobotInputs
layout = load_layout("docs/examples/pendulum.layout.json")
inputs = RobotInputs(layout, "/joint_states", time.monotonic_ns)
def state(names, positions):
    msg = JointState()
    msg.name, msg.position, msg.velocity = names, positions, [0.0] * len(positions)
    return msg
problems = [
    inputs.on_state(state(["pendulum", "evil\\n[ERROR] [0.0] [sac_edge]: forged"], [0.1, 0.2]), 1),
    inputs.on_state(state(["pendulum", "pendulum"], [0.1, 0.2]), 2),
    inputs.on_state(state(["pendulum"], [0.1, 0.2]), 3),
    inputs.on_state(state(["pendulum"], [0.3]), 4),
]
print(json.dumps({"problems": problems, "invalid": inputs.invalid, "missing": inputs.missing()}))
"""


def test_every_invalid_joint_state_is_named_with_the_robots_names_escaped() -> None:
    """Each invalid JointState is dropped with its own problem (a forged log line stays one escaped line);
    a valid one after them merges."""
    proc = subprocess.run([str(PYTHON), "-c", INVALID], capture_output=True, text=True, timeout=100, cwd=ROOT,
                          env=ros_env(), check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    first, twice, short, valid = result["problems"]
    assert "joint 'evil\\n[ERROR] [0.0] [sac_edge]: forged' is published by the robot but not in the layout" in first
    assert "\n" not in first and "joint 'pendulum' appears twice" in twice, result
    assert "its position has 2 values for 1 joints" in short and valid is None, result
    assert result["invalid"] == 3 and result["missing"] is None, result
