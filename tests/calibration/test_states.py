from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sac_edge.calibration.session import OnnxPolicy
from sac_edge.calibration.states import (
    CALIB_STATES,
    StateSets,
    build_state_sets,
    load_calib_states,
    rollout_states,
    validate_states,
)
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.spec import PolicySpec


def test_load_calib_states_from_run_dir(tmp_path: Path, replay: np.ndarray) -> None:
    np.save(tmp_path / CALIB_STATES, replay)
    loaded = load_calib_states(tmp_path, 3)
    assert loaded.dtype == np.float32
    np.testing.assert_array_equal(loaded, replay)


def test_non_finite_calibration_set_is_one_line_error(tmp_path: Path, replay: np.ndarray) -> None:
    bad = replay[:10].copy()
    bad[2, 0] = np.nan
    bad[5, 2] = np.inf
    np.save(tmp_path / CALIB_STATES, bad)
    with pytest.raises(SacEdgeError) as err:
        load_calib_states(tmp_path, 3)
    message = str(err.value)
    assert "2 of 10 rows" in message and "non-finite" in message and "\n" not in message


@pytest.mark.parametrize("shape", [(10, 4), (10,), (0, 3)])
def test_wrong_shape_is_rejected(shape: tuple[int, ...]) -> None:
    with pytest.raises(SacEdgeError, match=r"expected \[N, 3\]"):
        validate_states(np.zeros(shape, np.float32), 3, "states")


def test_missing_and_pickled_files_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(SacEdgeError, match="not found"):
        load_calib_states(tmp_path, 3)
    np.save(tmp_path / CALIB_STATES, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(SacEdgeError, match="not a readable"):
        load_calib_states(tmp_path, 3)


def test_rollout_states_are_real_pendulum_observations(fp32_onnx: Path) -> None:
    states = rollout_states(OnnxPolicy(fp32_onnx), "Pendulum-v1", 300, seed=3)
    assert states.shape == (300, 3)
    np.testing.assert_allclose(states[:, 0] ** 2 + states[:, 1] ** 2, 1.0, atol=1e-5)  # cos^2 + sin^2
    assert np.all(np.abs(states[:, 2]) <= 8.0)
    again = rollout_states(OnnxPolicy(fp32_onnx), "Pendulum-v1", 300, seed=3)
    np.testing.assert_array_equal(states, again)  # deterministic policy, seeded episodes


def test_state_sets_mix_sources_and_are_disjoint(states: StateSets, replay: np.ndarray) -> None:
    assert len(states.calibration) == 1024
    assert states.counts["calibration_replay"] == 300 and states.counts["calibration_rollout"] == 724
    assert states.counts["holdout_replay"] == 256 and len(states.holdout) == 512
    cal = {r.tobytes() for r in states.calibration}
    assert not any(r.tobytes() in cal for r in states.holdout)
    replay_rows = {r.tobytes() for r in replay}
    assert sum(r.tobytes() in replay_rows for r in states.calibration) == 300


def test_state_sets_without_replay(fp32_onnx: Path, spec: PolicySpec) -> None:
    sets = build_state_sets(fp32_onnx, spec, calib_samples=64, holdout_samples=32, seed=1)
    assert sets.counts["calibration_rollout"] == 64 and sets.counts["holdout_rollout"] == 32
    with pytest.raises(SacEdgeError, match="non-finite"):
        build_state_sets(fp32_onnx, spec, calib_samples=8, holdout_samples=8, replay=np.full((4, 3), np.nan))
