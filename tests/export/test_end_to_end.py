"""Train tiny with sac-train -> sac-export --int8 -> the manifest verifies -> onnxruntime runs the bundle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from sac_edge.common.manifest import read_manifest

BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_train_export_run(tmp_path: Path) -> None:
    run, bundle = tmp_path / "run", tmp_path / "bundle"
    train = [
        str(BIN / "sac-train"), "--env", "Pendulum-v1", "--total-steps", "400", "--learning-starts", "300",
        "--batch-size", "64", "--hidden", "64,64", "--eval-every", "0", "--no-progress", "--out", str(run), "--json",
    ]  # fmt: skip
    subprocess.run(train, check=True, capture_output=True, text=True, timeout=300)
    export = [
        str(BIN / "sac-export"), str(run), "--out", str(bundle), "--int8", "--calib-samples", "256",
        "--gate-episodes", "2", "--json",
    ]  # fmt: skip
    proc = subprocess.run(export, check=True, capture_output=True, text=True, timeout=300)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["bundle"] == str(bundle) and summary["parity_max_abs"] <= 1e-5
    manifest = read_manifest(bundle)
    assert manifest["source"]["path"] == str(run.resolve())
    obs = np.load(run / "calib_states.npy")[:32]
    for name in [n for n in ("policy.onnx", "policy.int8.onnx") if n in manifest["files"]]:
        sess = ort.InferenceSession(str(bundle / name), providers=["CPUExecutionProvider"])
        action = sess.run(["action"], {"obs": obs})[0]
        assert action.shape == (32, 1) and np.all(np.abs(action) <= 2.0 + 1e-5)
