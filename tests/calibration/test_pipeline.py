from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from sac_edge.calibration.cache import cache_tensors
from sac_edge.calibration.check import check_qdq
from sac_edge.calibration.pipeline import CalibrationOptions, calibrate_and_gate, quantize_and_gate
from sac_edge.calibration.session import OnnxPolicy
from sac_edge.calibration.states import StateSets
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.spec import PolicySpec
from sac_edge.common.trt.calib_cache import read_cache


def test_calibrate_and_gate_writes_checked_artefacts(
    fp32_onnx: Path, states: StateSets, spec: PolicySpec, tmp_path: Path
) -> None:
    result = calibrate_and_gate(
        fp32_onnx, tmp_path, states, spec, CalibrationOptions(method="entropy", gate_episodes=2)
    )
    assert result.report.accepted
    assert result.int8_onnx == tmp_path / "policy.int8.onnx" and result.calib_cache == tmp_path / "calib.cache"
    model = onnx.load(str(result.int8_onnx))
    assert check_qdq(model) == []
    actions = OnnxPolicy(result.int8_onnx)(states.holdout[:8])
    assert actions.shape == (8, 1) and np.all(np.abs(actions) <= 2.0)
    cache = read_cache(result.calib_cache)
    assert cache.trt_version == 8502
    assert set(cache.scales) == set(cache_tensors(onnx.load(str(fp32_onnx)), result.report.float_layers))
    for name, scale in cache.scales.items():
        assert scale == pytest.approx(result.calibration["amax"][name] / 127, rel=1e-6)
    info = result.to_dict()
    assert info["gate"]["verdict"] == "accepted" and "INT8 accuracy gate" in info["table"]
    assert info["calibration"]["states"]["calibration"] == len(states.calibration)
    cpu = result.calibration["cpu_graph"]
    assert cpu["passed"] and cpu["file"] == "policy.int8-cpu.onnx" and result.int8_cpu_onnx is not None
    assert cpu["mean_action_error_frac"] <= 0.01
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.cache", "policy.int8-cpu.onnx", "policy.int8.onnx"]
    assert sorted(info["files"]) == ["calib.cache", "policy.int8-cpu.onnx", "policy.int8.onnx"]


def test_rejected_int8_writes_nothing(fp32_onnx: Path, states: StateSets, spec: PolicySpec, tmp_path: Path) -> None:
    options = CalibrationOptions(method="percentile", percentile=0.5, gate_episodes=1)
    result = calibrate_and_gate(fp32_onnx, tmp_path, states, spec, options)
    assert result.report.verdict == "rejected"
    assert len(result.report.attempts) == 3  # full INT8, then 1 and 2 most sensitive layers in float
    assert result.int8_onnx is None and result.calib_cache is None and result.int8_cpu_onnx is None
    assert not list(tmp_path.iterdir())


def test_quantize_and_gate_builds_its_states(
    fp32_onnx: Path, replay: np.ndarray, spec: PolicySpec, tmp_path: Path
) -> None:
    options = CalibrationOptions(method="minmax", gate_episodes=1, calib_samples=256, holdout_samples=128)
    result = quantize_and_gate(fp32_onnx, tmp_path, replay, spec, options)
    assert result.calibration["states"]["calibration_replay"] == 128
    assert (result.int8_onnx is not None) == result.report.accepted


def test_non_finite_states_fail_cleanly(fp32_onnx: Path, states: StateSets, spec: PolicySpec, tmp_path: Path) -> None:
    bad = states.calibration.copy()
    bad[0, 1] = np.nan
    with pytest.raises(SacEdgeError, match="1 of 1024 rows with non-finite"):
        calibrate_and_gate(
            fp32_onnx, tmp_path, states._replace(calibration=bad), spec, CalibrationOptions(gate_episodes=1)
        )
    assert not list(tmp_path.iterdir())
    with pytest.raises(SacEdgeError, match="cannot read the fp32 ONNX"):
        calibrate_and_gate(tmp_path / "missing.onnx", tmp_path, states, spec, CalibrationOptions(gate_episodes=1))


def test_gate_episodes_checked_before_any_work(states: StateSets, spec: PolicySpec, tmp_path: Path) -> None:
    # The gate's settings are checked first: a missing model is not even opened.
    with pytest.raises(SacEdgeError, match="--gate-episodes must be >= 1, got 0"):
        calibrate_and_gate(tmp_path / "missing.onnx", tmp_path, states, spec, CalibrationOptions(gate_episodes=0))
