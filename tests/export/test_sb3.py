"""Stable-Baselines3 SAC zips: read without unpickling, exported, parity against SB3's own predict."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from sac_edge.common.manifest import read_manifest
from sac_edge.export.cli import main
from sac_edge.export.source import load_source
from sac_edge.train.checkpoint import build_critic

sb3 = pytest.importorskip("stable_baselines3")


@pytest.fixture(scope="module")
def sb3_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny SB3 SAC trained for 300 steps on Pendulum-v1 (small nets keep it fast)."""
    model = sb3.SAC(
        "MlpPolicy",
        "Pendulum-v1",
        learning_starts=100,
        batch_size=32,
        buffer_size=1000,
        seed=0,
        policy_kwargs={"net_arch": [64, 64]},
        device="cpu",
    )
    model.learn(300)
    path = tmp_path_factory.mktemp("sb3") / "sac_pendulum.zip"
    model.save(path)
    return path


def _one_line_error(capsys: pytest.CaptureFixture[str], fragment: str) -> None:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("sac-export: error:") and fragment in err, err


def test_sb3_export_parity_against_predict(sb3_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bundle"
    assert main([str(sb3_zip), "--env", "Pendulum-v1", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["parity_max_abs"] <= 1e-5 and summary["parity_states"] == 10_000
    manifest = read_manifest(out)
    assert manifest["parity"]["reference"].startswith("stable-baselines3 predict")
    assert manifest["source"]["kind"] == "stable-baselines3" and manifest["spec"]["hidden"] == [64, 64]


def test_sb3_mapping_matches_sb3_networks(sb3_zip: Path) -> None:
    """The mapped actor and fused critics compute what SB3's networks compute."""
    model = sb3.SAC.load(sb3_zip, device="cpu")  # trusted here: the test wrote this file
    source = load_source(str(sb3_zip), "Pendulum-v1")
    obs = np.random.default_rng(0).uniform(-1, 1, size=(256, 3)).astype(np.float32) * [1, 1, 8]
    want, _ = model.predict(obs, deterministic=True)
    with torch.inference_mode():
        got = source.policy(torch.as_tensor(obs, dtype=torch.float32)).numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
        act = torch.as_tensor(want / 2.0, dtype=torch.float32)
        q_sb3 = torch.stack(model.critic(torch.as_tensor(obs, dtype=torch.float32), act)).squeeze(-1)
        q_ours = build_critic(source.spec, source.learner)(torch.as_tensor(obs, dtype=torch.float32), act)
        np.testing.assert_allclose(q_ours.numpy(), q_sb3.numpy(), atol=1e-5)
        assert torch.allclose(source.learner["log_alpha"], model.log_ent_coef.detach().reshape(1))


def test_sb3_zip_needs_env(sb3_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(sb3_zip), "--out", str(tmp_path / "b")]) == 2
    _one_line_error(capsys, "pass --env")
    assert not (tmp_path / "b").exists()


def test_sb3_zip_env_mismatch(sb3_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(sb3_zip), "--env", "MountainCarContinuous-v0", "--out", str(tmp_path / "b")]) == 2
    _one_line_error(capsys, "obs_dim=3")
    assert not (tmp_path / "b").exists()


def test_truncated_sb3_zip(sb3_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.zip"
    data = sb3_zip.read_bytes()
    bad.write_bytes(data[: len(data) // 3])
    assert main([str(bad), "--env", "Pendulum-v1", "--out", str(tmp_path / "b")]) == 2
    _one_line_error(capsys, "corrupt or truncated")
    assert not (tmp_path / "b").exists()


class _Payload:
    """Not a tensor: torch.load(weights_only=True) must refuse to rebuild it."""


def test_pickled_objects_are_never_loaded(sb3_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "evil.zip"
    buffer = io.BytesIO()
    torch.save({"actor.mu.weight": _Payload()}, buffer)
    with zipfile.ZipFile(sb3_zip) as src, zipfile.ZipFile(bad, "w") as dst:
        for name in src.namelist():
            dst.writestr(name, buffer.getvalue() if name == "policy.pth" else src.read(name))
    assert main([str(bad), "--env", "Pendulum-v1", "--out", str(tmp_path / "b")]) == 2
    _one_line_error(capsys, "policy.pth is corrupt or not a plain tensor file")
    assert not (tmp_path / "b").exists()
