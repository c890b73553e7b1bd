"""Fixtures of the ROS 2 tests: skip with the reason where the ROS venv is missing; bundles with a layout."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Procs, ros_env, why_not

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "edge_runtime"))  # bundles.py, shared with those tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))  # hostile_graphs.py: plant()

from hostile_graphs import fails_past_speed, plant

from bundles import make_bundle
from sac_edge.common.bundle_format import LAYOUT

ROOT = Path(__file__).resolve().parents[2]
PENDULUM_LAYOUT = ROOT / "docs" / "examples" / "pendulum.layout.json"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = why_not()
    if reason is None:
        return
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent and item.get_closest_marker("ros2"):
            item.add_marker(pytest.mark.skip(reason=reason))


def bundle_with_layout(out: Path, env_id: str, layout: dict) -> Path:
    """A test bundle (bundles.py) with ``layout`` stored as sac-export stores it, under the checksums."""
    out.mkdir(parents=True)
    (out / LAYOUT).write_text(json.dumps(layout))
    return make_bundle(out, env_id, int8=None)


@pytest.fixture(scope="session")
def pendulum_layout_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundle_with_layout(
        tmp_path_factory.mktemp("ros2") / "pendulum", "Pendulum-v1", json.loads(PENDULUM_LAYOUT.read_text())
    )


@pytest.fixture(scope="session")
def failing_bundle(pendulum_layout_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Pendulum layout bundle whose backend fails once the pendulum swings faster than 3 rad/s."""
    bundle = Path(shutil.copytree(pendulum_layout_bundle, tmp_path_factory.mktemp("ros2") / "failing"))
    plant(bundle, fails_past_speed(3.0), ["Add", "Cast", "Clip", "MatMul", "Max", "Mul", "Reshape", "Sub"])
    return bundle


#: HalfCheetah-v5's 17 inputs and 6 actions as a 6-joint robot's layout (an unused gripper joint ignored).
MULTI_LAYOUT = {
    "observation": [
        {"source": "joint_states", "field": "position", "joints": ["j0", "j1", "j2", "j3", "j4", "j5"]},
        {"source": "joint_states", "field": "velocity", "joints": ["j0", "j1", "j2", "j3", "j4", "j5"]},
        {"source": "joint_states", "field": "position", "joints": ["j0", "j1", "j2", "j3", "j4"], "transform": "sin"},
    ],
    "action": {"interface": "effort", "joints": ["j0", "j1", "j2", "j3", "j4", "j5"], "scale": 10.0},
    "ignore_joints": ["gripper"],
}


@pytest.fixture(scope="session")
def multi_layout_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundle_with_layout(tmp_path_factory.mktemp("ros2") / "multi", "HalfCheetah-v5", MULTI_LAYOUT)


#: The same robot commanded by joint position, the action joints in another order than the state's, with a
#: scale and an offset (command = 0.05 + 0.5 * action).
POSITION_LAYOUT = {
    **MULTI_LAYOUT,
    "action": {"interface": "position", "joints": ["j5", "j4", "j3", "j2", "j1", "j0"], "scale": 0.5, "offset": 0.05},
}


@pytest.fixture(scope="session")
def position_layout_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundle_with_layout(tmp_path_factory.mktemp("ros2") / "position", "HalfCheetah-v5", POSITION_LAYOUT)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(ros_env(), tmp_path)
    try:
        yield p
    finally:
        p.close()
