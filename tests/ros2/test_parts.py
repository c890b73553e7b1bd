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


GATHER = """
import json, math, numpy as np
from sensor_msgs.msg import JointState
from sac_edge.common.io_layout import parse_layout
from sac_edge.edge_runtime.ros2.inputs import RobotInputs
raw = {"observation": [
    {"source": "joint_states", "field": "position", "joints": ["a", "b", "c"], "transform": "cos", "offset": 0.25},
    {"source": "joint_states", "field": "position", "joints": ["b", "a"], "transform": "sin", "scale": [2.0, -0.5]},
    {"source": "joint_states", "field": "velocity", "joints": ["c", "a", "b"], "offset": [0.1, 0.0, -3.0],
     "scale": 0.3},
], "action": {"interface": "effort", "joints": ["a"]}, "ignore_joints": ["g"]}
layout = parse_layout(json.dumps(raw), "test")
inputs = RobotInputs(layout, "/joint_states", lambda: 0)
rng = np.random.default_rng(0)
special = [math.inf, -math.inf, math.nan, 1e300, -0.0, 1e-320]
mismatches, checked = [], 0
for i in range(400):
    names = ["a", "b", "c", "g"] if i % 3 else ["c", "g", "a", "b"]
    if i % 5 == 0:
        names = ["a", "b", "c"]  # the layout's joints in its order: copied whole
    pos, vel = rng.uniform(-7, 7, len(names)), rng.uniform(-7, 7, len(names))
    if i % 7 == 0:
        pos[i % len(names)] = special[i % len(special)]
        vel[(i + 1) % len(names)] = special[(i + 2) % len(special)]
    msg = JointState()
    msg.name, msg.position, msg.velocity = names, pos.tolist(), vel.tolist()
    assert inputs.on_state(msg, i) is None
    obs = np.zeros(layout.obs_dim, np.float32)
    assert inputs.read(i, 10, obs) is None
    want = np.zeros(layout.obs_dim, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        layout.gather(want, layout.joint_map(names), {"position": pos, "velocity": vel}, {})
    checked += 1
    canonical = [np.where(np.isnan(x), np.float32(np.nan), x).tobytes() for x in (obs, want)]  # NaN's sign aside
    if canonical[0] != canonical[1]:
        mismatches.append([names, pos.tolist(), obs.tolist(), want.tolist()])
# two publishers: the oldest joint's age decides staleness
split = RobotInputs(layout, "/joint_states", lambda: 0)
def part(names, t):
    m = JointState()
    m.name, m.position, m.velocity = names, [0.0] * len(names), [0.0] * len(names)
    return split.on_state(m, t)
part(["a", "b"], 100)
stale_before_c = split.read(100, 50, np.zeros(layout.obs_dim, np.float32))
part(["c", "g"], 140)
ages = [split.read(t, 50, np.zeros(layout.obs_dim, np.float32)) for t in (150, 151)]
part(["b", "a"], 160)
ages.append(split.read(185, 50, np.zeros(layout.obs_dim, np.float32)))
print(json.dumps({"checked": checked, "mismatches": mismatches[:3], "stale_before_c": stale_before_c, "ages": ages}))
"""


def test_the_merged_read_is_the_layouts_gather_bit_for_bit_and_the_oldest_joint_ages() -> None:
    """The step's read (the precomputed gather over Python floats) gives the layout's reference gather bit for
    bit (a NaN's sign bit aside), in any name order, with ignored joints, infinities, NaN and overflow; with
    split publishers the oldest joint's arrival decides staleness."""
    proc = subprocess.run([str(PYTHON), "-c", GATHER], capture_output=True, text=True, timeout=100, cwd=ROOT,
                          env=ros_env(), check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["checked"] == 400 and result["mismatches"] == [], result["mismatches"]
    # c never came: stale; at 150 a and b are 50 old (not past the limit), at 151 past it; b and a again at 160
    # leave c (140) the oldest: 45 at 185
    assert result["stale_before_c"] == "state" and result["ages"] == [None, "state", None], result
