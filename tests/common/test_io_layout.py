"""The robot's I/O layout (common/io_layout.py): the issue's JSON form, the helpers a loop without ROS uses,
and every mistake as one line naming the joint, the part or the size."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.io_layout import load_layout, parse_layout

ROOT = Path(__file__).resolve().parents[2]
ISSUE_FORM = {
    "observation": [
        {"source": "joint_states", "field": "position", "joints": ["j1", "j2"]},
        {"source": "joint_states", "field": "velocity", "joints": ["j1", "j2"]},
    ],
    "action": {"interface": "effort", "joints": ["j1", "j2"]},
}


def _layout(raw: object = None):  # type: ignore[no-untyped-def]
    return parse_layout(json.dumps(ISSUE_FORM if raw is None else raw), "test")


def test_the_issue_form_builds_the_observation_and_splits_the_action() -> None:
    layout = _layout()
    assert (layout.obs_dim, layout.act_dim, layout.state_joints) == (4, 2, ("j1", "j2"))
    obs = layout.observation({"position": {"j2": 2.0, "j1": 1.0}, "velocity": {"j1": -1.0, "j2": -2.0}})
    assert obs.dtype == np.float32 and obs.tolist() == [1.0, 2.0, -1.0, -2.0]
    assert layout.command([0.5, -0.25]) == {"j1": 0.5, "j2": -0.25}
    layout.check_dims(4, 2, "test")


def test_offsets_scales_transforms_and_other_topics() -> None:
    layout = _layout(
        {
            "observation": [
                {
                    "source": "joint_states",
                    "field": "position",
                    "joints": ["a", "b"],
                    "offset": [0.5, -0.5],
                    "scale": 2,
                },
                {"source": "joint_states", "field": "position", "joints": ["a"], "transform": "sin"},
                {"source": "imu", "field": "angular_velocity", "topic": "/imu"},
                {"source": "vector", "topic": "/cmd", "size": 2, "scale": [1, 10]},
            ],
            "action": {"interface": "position", "joints": ["b", "a"], "scale": [2, 3], "offset": 1},
            "ignore_joints": ["gripper"],
        }
    )
    obs = layout.observation(
        {"position": {"a": 1.0, "b": 1.0}}, {"/imu": {"angular_velocity": [1, 2, 3]}, "/cmd": [0.1, 0.2]}
    )
    expected = [1.0, 3.0, math.sin(1.0), 1, 2, 3, 0.1, 2.0]
    assert np.allclose(obs, expected) and layout.obs_dim == 8
    assert layout.command([1.0, -1.0]) == {"b": 3.0, "a": -2.0}
    assert layout.topics == ("/imu", "/cmd")
    again = parse_layout(json.dumps(layout.to_dict()), "again")  # what the bundle stores reads back the same
    assert again.to_dict() == layout.to_dict()


def test_the_joint_map_gathers_in_the_robots_order() -> None:
    layout = _layout()
    jmap = layout.joint_map(["j2", "j1"])
    out = np.empty(4, np.float32)
    layout.gather(out, jmap, {"position": [2.0, 1.0], "velocity": [-2.0, -1.0]}, {})
    assert out.tolist() == [1.0, 2.0, -1.0, -2.0]
    assert (
        out.tolist() == layout.observation({"position": {"j1": 1, "j2": 2}, "velocity": {"j1": -1, "j2": -2}}).tolist()
    )


@pytest.mark.parametrize(
    ("names", "fragment"),
    [
        (["j1"], "joint 'j2' of the layout is missing (the robot publishes j1)"),
        (["j1", "j2", "j3"], "joint 'j3' is published by the robot but not in the layout"),
        (["j1", "j1", "j2"], "joint 'j1' appears twice"),
    ],
)
def test_a_missing_or_extra_joint_is_one_line_naming_it(names: list[str], fragment: str) -> None:
    with pytest.raises(SacEdgeError, match=None) as err:
        _layout().joint_map(names)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_ignored_joints_and_short_arrays() -> None:
    layout = _layout({**ISSUE_FORM, "ignore_joints": ["gripper"]})
    jmap = layout.joint_map(["gripper", "j1", "j2"])
    with pytest.raises(SacEdgeError, match="its velocity has 0 values for 3 joints"):
        layout.gather(np.empty(4, np.float32), jmap, {"position": [0, 1, 2], "velocity": []}, {})
    with pytest.raises(SacEdgeError, match="joint 'j2' has no velocity value"):
        layout.observation({"position": {"j1": 1, "j2": 2}, "velocity": {"j1": 0}})


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"observation": [], "action": ISSUE_FORM["action"]}, "'observation' must be a non-empty list"),
        ({**ISSUE_FORM, "extra": 1}, "unknown key 'extra'"),
        ({**ISSUE_FORM, "version": 2}, "layout version 2"),
        ({"observation": [{"source": "joint_states", "field": "torque", "joints": ["j1"]}],
          "action": ISSUE_FORM["action"]}, "observation[0].field must be one of position, velocity, effort"),
        ({"observation": [{"source": "joint_states", "field": "position", "joints": ["j1", "j1"]}],
          "action": ISSUE_FORM["action"]}, "joint 'j1' is listed twice"),
        ({"observation": [{"source": "vector", "topic": "/x"}], "action": ISSUE_FORM["action"]}, "needs its 'size'"),
        ({"observation": ISSUE_FORM["observation"], "action": {"interface": "torque", "joints": ["j1"]}},
         "action.interface must be one of position, velocity, effort"),
        ({"observation": ISSUE_FORM["observation"],
          "action": {"interface": "effort", "joints": ["j1"], "scale": [1, 2]}},
         "action.scale has 2 values for 1 slots"),
        ({**ISSUE_FORM, "ignore_joints": ["j1"]}, "joint 'j1' is both used and listed in ignore_joints"),
    ],
)  # fmt: skip
def test_a_bad_layout_is_one_line(raw: object, fragment: str) -> None:
    with pytest.raises(SacEdgeError) as err:
        _layout(raw)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_sizes_are_checked_against_the_policy_and_files_are_read_bounded(tmp_path: Path) -> None:
    layout = _layout()
    with pytest.raises(SacEdgeError, match=r"observation has 4 values \(2 \+ 2\) but the policy takes 3"):
        layout.check_dims(3, 2, "test")
    with pytest.raises(SacEdgeError, match="action names 2 joints but the policy outputs 1"):
        layout.check_dims(4, 1, "test")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SacEdgeError, match="not a valid layout file"):
        load_layout(bad)
    with pytest.raises(SacEdgeError, match="no such file"):
        load_layout(tmp_path / "none.json")


def test_the_documented_example_is_pendulums() -> None:
    layout = load_layout(ROOT / "docs" / "examples" / "pendulum.layout.json")
    layout.check_dims(3, 1, "example")
    obs = layout.observation({"position": {"pendulum": 0.5}, "velocity": {"pendulum": -1.0}})
    assert np.allclose(obs, [math.cos(0.5), math.sin(0.5), -1.0])


def test_action_joint_limits_clamp_the_command_and_min_above_max_is_refused() -> None:
    """Per action joint ``min``/``max`` (after scale and offset): the command is clamped there (a forward
    command controller passes on anything); the stored form keeps them; min above max is one line."""
    raw = {**ISSUE_FORM, "action": {"interface": "position", "joints": ["j1", "j2"], "scale": 2.0,
                                    "min": [-0.5, -1.0], "max": 0.5}}  # fmt: skip
    layout = _layout(raw)
    assert layout.command([1.0, -1.0]) == {"j1": 0.5, "j2": -1.0}
    assert layout.command([0.1, 0.2]) == {"j1": 0.2, "j2": 0.4}
    assert _layout(layout.to_dict()).command([1.0, -1.0]) == {"j1": 0.5, "j2": -1.0}
    assert "min" not in _layout().to_dict()["action"]  # no limits: none stored
    with pytest.raises(SacEdgeError, match=r"joint .j2. has min 1 above max 0\.5; swap them"):
        _layout({**raw, "action": {**raw["action"], "min": [0.0, 1.0]}})


@pytest.mark.parametrize("limits", [{}, {"min": [-0.5, -1.0], "max": 0.5}])
def test_the_command_over_python_floats_is_command_vectors_bit_for_bit(limits: dict[str, object]) -> None:
    """``command_into`` (the ROS 2 node's per-step form) writes exactly ``command_vector``'s float64 values,
    limits and non-finite results included, and says when one is not finite."""
    import array

    raw = {**ISSUE_FORM, "action": {"interface": "effort", "joints": ["j1", "j2"], "scale": [2.5, 1e308],
                                    "offset": [0.1, -0.3], **limits}}  # fmt: skip
    layout = _layout(raw)
    terms, out = layout.command_terms(), array.array("d", [0.0, 0.0])
    rng = np.random.default_rng(0)
    actions = [*rng.uniform(-1, 1, (200, 2)).astype(np.float32), np.array([0.5, 2.0], np.float32),
               np.array([np.nan, 0.0], np.float32), np.array([np.inf, -np.inf], np.float32)]  # fmt: skip
    for action in actions:
        with np.errstate(over="ignore", invalid="ignore"):  # the 1e308 scale overflows on purpose
            want = layout.command_vector(action)
        finite = layout.command_into(action.tolist(), terms, out)
        assert np.array_equal(np.frombuffer(out), want, equal_nan=True), (action, list(out), want)
        assert finite == bool(np.isfinite(want).all())
    with pytest.raises(SacEdgeError, match="the action has 3 values for 2 joints"):
        layout.command_into([0.0, 0.0, 0.0], terms, out)
