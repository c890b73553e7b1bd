"""Parity: held-out states are not the calibration rows, and a disagreeing graph fails with exit 1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sac_edge.common.errors import InternalError
from sac_edge.export.onnx_export import export_policy
from sac_edge.export.parity import held_out_states, measure_parity, require_parity
from sac_edge.export.source import load_source


def test_held_out_states_are_not_calibration_rows(pendulum_run: Path, tmp_path: Path) -> None:
    source = load_source(str(pendulum_run))
    assert source.replay_states is not None
    states, origin = held_out_states(source.replay_states, tmp_path / "unused.onnx", source.spec, 10_000, seed=0)
    assert states.shape == (10_000, 3) and states.dtype == np.float32 and np.all(np.isfinite(states))
    calib = {row.tobytes() for row in source.replay_states}
    assert not any(row.tobytes() in calib for row in states)
    assert "perturbed" in origin


def test_parity_passes_and_a_wrong_graph_fails(pendulum_run: Path, tmp_path: Path) -> None:
    source = load_source(str(pendulum_run))
    onnx_path = tmp_path / "policy.onnx"
    export_policy(source.policy, 3, onnx_path)
    assert source.replay_states is not None
    states, origin = held_out_states(source.replay_states, onnx_path, source.spec, 2_000, seed=1)
    good = measure_parity(onnx_path, source.reference, "torch", states, origin)
    assert good.passed and good.max_abs <= 1e-5 and good.mean_abs <= good.max_abs
    require_parity(good)

    def off_by_a_bit(obs: np.ndarray) -> np.ndarray:
        return source.reference(obs) + 1e-4

    bad = measure_parity(onnx_path, off_by_a_bit, "shifted", states, origin)
    assert not bad.passed and bad.max_abs == pytest.approx(1e-4, rel=0.05)
    with pytest.raises(InternalError, match="parity failed") as exc:
        require_parity(bad)
    assert exc.value.exit_code == 1
