"""sac-export: the bundle, the --json line, and every bad input as one line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.manifest import read_manifest
from sac_edge.common.trt.builder import tensorrt_unavailable
from sac_edge.export.cli import main
from sac_edge.train.checkpoint import CALIB_STATES, CHECKPOINT, CONFIG


def _copy_run(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def _one_line_error(capsys: pytest.CaptureFixture[str], *fragments: str) -> None:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("sac-export: error:"), err
    for fragment in fragments:
        assert fragment in err, err


def _no_bundle(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def test_export_writes_verified_bundle_and_json(
    pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    assert main([str(pendulum_run), "--out", str(out), "--json"]) == 0
    stdout = capsys.readouterr().out
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["bundle"] == str(out) and summary["parity_max_abs"] <= 1e-5
    assert "parity vs torch" in stdout
    manifest = read_manifest(out)
    assert set(manifest["files"]) == {
        "policy.onnx",
        "policy.fp16.onnx",
        "parity_states.npy",
        "learner.safetensors",
        "export_config.json",
        "envelope.json",
    }
    assert manifest["parity_fp16"]["passed"] and manifest["parity_fp16"]["max_abs"] > 0
    for entry in manifest["files"].values():
        assert len(entry["sha256"]) == 64 and entry["bytes"] > 0
    assert manifest["parity"]["states"] == 10_000 and manifest["parity"]["passed"]
    assert isinstance(manifest["release"], int) and manifest["release"] > 1_700_000_000_000  # signed: export ms
    assert manifest["spec"]["obs_dim"] == 3 and manifest["action_low"] == [-2.0]
    assert manifest["source"]["kind"] == "sac-edge" and len(manifest["source"]["checkpoint_sha256"]) == 64
    assert manifest["tensorrt"]["fp16"]["status"] == "deferred"  # no TensorRT here: built on the device
    learner = load_file(str(out / "learner.safetensors"))
    assert {"log_alpha", "obs_norm.mean", "actor.mu.weight", "critic.weights.0", "critic_target.weights.0"} <= set(
        learner
    )
    assert not any(k.startswith(("optim.", "rng.")) for k in learner)
    config = json.loads((out / "export_config.json").read_text())
    assert config["run"] == str(pendulum_run) and config["spec"]["env_id"] == "Pendulum-v1"


def test_tampered_bundle_fails_verification(pendulum_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    assert main([str(pendulum_run), "--out", str(out), "--no-fp16"]) == 0
    with (out / "policy.onnx").open("ab") as fh:
        fh.write(b"\0")
    with pytest.raises(SacEdgeError, match=r"checksum mismatch for policy\.onnx"):
        read_manifest(out)


def test_existing_out_needs_force_and_force_replaces(
    pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    assert main([str(pendulum_run), "--out", str(out)]) == 0
    before = (out / "manifest.json").read_text()
    assert main([str(pendulum_run), "--out", str(out)]) == 2
    _one_line_error(capsys, "already exists", "--force")
    assert (out / "manifest.json").read_text() == before
    assert main([str(pendulum_run), "--out", str(out), "--force"]) == 0
    read_manifest(out)


def test_failed_reexport_keeps_the_old_bundle(
    pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    assert main([str(pendulum_run), "--out", str(out)]) == 0
    before = (out / "manifest.json").read_text()
    # an impossible parity tolerance fails inside the staging dir: exit 1, old bundle untouched
    assert main([str(pendulum_run), "--out", str(out), "--force", "--parity-tol", "1e-30"]) == 1
    err = capsys.readouterr().err
    assert "parity failed" in err and err.count("\n") == 1
    assert (out / "manifest.json").read_text() == before
    read_manifest(out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bundle.")]


def test_run_without_checkpoint(pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy_run(pendulum_run, tmp_path)
    (run / CHECKPOINT).unlink()
    assert main([str(run), "--out", str(tmp_path / "b")]) == 2
    _one_line_error(capsys, "checkpoint not found")
    _no_bundle(tmp_path / "b")


def test_truncated_checkpoint(pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy_run(pendulum_run, tmp_path)
    data = (run / CHECKPOINT).read_bytes()
    (run / CHECKPOINT).write_bytes(data[: len(data) // 2])
    assert main([str(run), "--out", str(tmp_path / "b")]) == 2
    _one_line_error(capsys, "corrupt or truncated")
    _no_bundle(tmp_path / "b")


def test_obs_shape_mismatch_with_config(pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy_run(pendulum_run, tmp_path)
    config = json.loads((run / CONFIG).read_text())
    config["spec"]["obs_dim"] = 5
    (run / CONFIG).write_text(json.dumps(config))
    assert main([str(run), "--out", str(tmp_path / "b")]) == 2
    _one_line_error(capsys, "do not match config.json")
    _no_bundle(tmp_path / "b")


def test_env_flag_mismatch(pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(pendulum_run), "--out", str(tmp_path / "b"), "--env", "MountainCarContinuous-v0"]) == 2
    _one_line_error(capsys, "observation shape (2,)")
    _no_bundle(tmp_path / "b")


@pytest.mark.parametrize("bad", ["nan", "shape"])
def test_bad_calibration_states(
    pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    run = _copy_run(pendulum_run, tmp_path)
    states = np.load(run / CALIB_STATES)
    if bad == "nan":
        states[3, 1] = np.nan
        states[7, 0] = np.inf
    else:
        states = states[:, :2]
    np.save(run / CALIB_STATES, states)
    assert main([str(run), "--out", str(tmp_path / "b")]) == 2
    _one_line_error(capsys, "non-finite" if bad == "nan" else "expected [N, 3]")
    _no_bundle(tmp_path / "b")


def test_engine_always_without_tensorrt(pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if tensorrt_unavailable() is None:
        pytest.skip("TensorRT and a GPU are present here")
    assert main([str(pendulum_run), "--out", str(tmp_path / "b"), "--engine", "always"]) == 2
    _one_line_error(capsys, "--engine always")
    _no_bundle(tmp_path / "b")


def test_missing_run_dir_and_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope"), "--out", str(tmp_path / "b")]) == 2
    _one_line_error(capsys, "run dir not found")
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "--calib-samples" in capsys.readouterr().out


def test_import_is_lazy() -> None:
    """Importing the CLI loads neither TensorRT nor the calibration package."""
    code = (
        "import sys, sac_edge.export.cli, sac_edge.export.bundle, sac_edge.common.trt.builder; "
        "bad = [m for m in ('tensorrt', 'sac_edge.calibration') if m in sys.modules]; "
        "sys.exit(f'imported {bad}' if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_force_never_replaces_a_non_bundle_dir(
    pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main([str(pendulum_run), "--out", str(out), "--force"]) == 2
    _one_line_error(capsys, "is not a bundle")
    assert (out / "notes.txt").read_text() == "keep me"


def test_signed_export_runs_only_under_its_trusted_key(pendulum_run: Path, tmp_path: Path) -> None:
    from sac_edge.common.signing import TRUSTED, generate_keypair, signature_state
    from sac_edge.edge_runtime.cli import main as edge_main

    private, public = generate_keypair(tmp_path / "fleet")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    public.rename(trusted / public.name)
    out = tmp_path / "bundle"
    assert main([str(pendulum_run), "--out", str(out), "--sign-key", str(private)]) == 0
    assert signature_state(out, trusted).state == TRUSTED
    run = ["run", str(out), "--duration", "0.05", "--backend", "onnxruntime", "--trusted-keys", str(trusted)]
    assert edge_main(run) == 0


def test_layout_is_checked_against_the_policy_and_stored_under_the_checksums(
    pendulum_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sac_edge.common.bundle import open_bundle
    from sac_edge.common.io_layout import bundle_layout

    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "pendulum.layout.json"
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"observation": [{"source": "joint_states", "field": "position", "joints": ["a", "b"]}],
                                 "action": {"interface": "effort", "joints": ["a"]}}))  # fmt: skip
    out = tmp_path / "bundle"
    assert main([str(pendulum_run), "--out", str(out), "--layout", str(wrong)]) == 2
    _one_line_error(capsys, "the layout's observation has 2 values (2) but the policy takes 3")
    _no_bundle(out)
    assert main([str(pendulum_run), "--out", str(out), "--layout", str(example)]) == 0
    manifest = read_manifest(out)
    assert manifest["files"]["layout.json"]["kind"] == "io-layout"
    layout = bundle_layout(open_bundle(out))
    assert layout is not None and layout.action.joints == ("pendulum",) and layout.obs_dim == 3
    (out / "layout.json").write_text((out / "layout.json").read_text().replace("pendulum", "pendulun"))
    with pytest.raises(SacEdgeError, match=r"layout\.json"):
        open_bundle(out)  # its checksum no longer matches
