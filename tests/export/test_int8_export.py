"""sac-export --int8: calibration/ writes the Q/DQ model, the cache and the gate into the bundle."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from sac_edge.calibration.check import check_qdq
from sac_edge.common.manifest import read_manifest
from sac_edge.export.cli import main
from sac_edge.export.onnx_export import check_tensorrt_ops


def test_int8_bundle_with_gate(pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bundle"
    args = [str(pendulum_run), "--out", str(out), "--int8", "--calib-samples", "256", "--gate-episodes", "2", "--json"]
    assert main(args) == 0
    stdout = capsys.readouterr().out
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert "INT8 accuracy gate" in stdout
    manifest = read_manifest(out)
    gate = manifest["gate"]
    assert summary["int8_verdict"] == gate["verdict"] in ("accepted", "rejected")
    assert summary["int8"]["mean_action_error_frac"] == gate["mean_action_error_frac"]
    assert manifest["calibration"]["method"] == "percentile"
    assert manifest["calibration"]["states"]["calibration"] == 256  # --calib-samples reached the calibration
    if gate["verdict"] == "accepted":
        assert {"policy.int8.onnx", "calib.cache"} <= set(manifest["files"])
        model = onnx.load(str(out / "policy.int8.onnx"))
        assert check_qdq(model) == []
        check_tensorrt_ops(model)
        assert manifest["tensorrt"]["int8"]["status"] in ("deferred", "built")
    else:
        assert "policy.int8.onnx" not in manifest["files"]
        assert manifest["tensorrt"]["int8"]["status"] == "skipped"


def test_bad_calib_override_is_one_line(pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(pendulum_run), "--out", str(tmp_path / "b"), "--int8", "--calib-overrides", "obs=magic"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "magic" in err
    assert not (tmp_path / "b").exists()


def test_calib_method_choices_match_calibration() -> None:
    from sac_edge.calibration.calibrators import METHODS
    from sac_edge.export.config import CALIB_METHODS

    assert CALIB_METHODS == METHODS
