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


def _local_env_class() -> type:
    """A gymnasium env defined only here (nothing can import it): 5 observations, 3 actions with asymmetric
    bounds per dimension."""
    import gymnasium as gym

    class LocalEnv(gym.Env):  # type: ignore[type-arg]
        observation_space = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
        action_space = gym.spaces.Box(np.array([-1.0, 0.0, -3.0], np.float32), np.array([2.0, 0.5, -1.0], np.float32))

        def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
            super().reset(seed=seed)
            self.t = 0
            return self.np_random.normal(2.0, 3.0, 5).astype(np.float32), {}

        def step(self, action):  # type: ignore[no-untyped-def]
            self.t += 1
            obs = self.np_random.normal(2.0, 3.0, 5).astype(np.float32)
            return obs, -float(np.square(action).sum()), False, self.t >= 50, {}

    return LocalEnv


@pytest.fixture(scope="module")
def local_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path, object, Path]:
    """An SB3 SAC on the local env, its zip, a VecNormalize of that env with real statistics, its .pkl."""
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    env_cls = _local_env_class()
    venv = VecNormalize(DummyVecEnv([env_cls]), clip_obs=2.5)
    model = sb3.SAC(
        "MlpPolicy", venv, learning_starts=50, batch_size=16, buffer_size=500, seed=1,
        policy_kwargs={"net_arch": [32, 32]}, device="cpu",
    )  # fmt: skip
    model.learn(120)
    root = tmp_path_factory.mktemp("local")
    model.save(root / "local.zip")
    venv.save(root / "vecnormalize.pkl")
    return model, root / "local.zip", venv, root / "vecnormalize.pkl"


def _onnx_actions(bundle: Path, obs: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(bundle / "policy.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"obs": obs.astype(np.float32)})[0]


def test_sb3_zip_of_an_unimportable_env_exports_without_env(
    local_model: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --env: the spaces come from the zip's plain fields; the bundle acts as SB3's predict does."""
    model, path, _, _ = local_model
    out = tmp_path / "bundle"
    assert main([str(path), "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["parity_max_abs"] <= 1e-5
    manifest = read_manifest(out)
    assert manifest["action_low"] == [-1.0, 0.0, -3.0] and manifest["action_high"] == [2.0, 0.5, -1.0]
    assert manifest["parity"]["reference"].startswith("stable-baselines3 predict")
    obs = np.random.default_rng(0).normal(0.0, 2.0, (512, 5)).astype(np.float32)
    want, _ = model.predict(obs, deterministic=True)  # SB3 itself, on raw observations
    np.testing.assert_allclose(_onnx_actions(out, obs), want, atol=1e-5)


def test_vecnormalize_is_baked_into_the_graph(local_model: tuple, tmp_path: Path) -> None:
    """--vecnormalize: the graph takes raw observations and acts as predict on VecNormalize's output."""
    model, path, venv, pkl = local_model
    out = tmp_path / "bundle"
    assert main([str(path), "--vecnormalize", str(pkl), "--out", str(out)]) == 0
    assert read_manifest(out)["parity"]["reference"].endswith("on VecNormalize-normalised obs")
    obs = np.random.default_rng(1).normal(2.0, 6.0, (512, 5)).astype(np.float32)  # reaches clip_obs too
    assert (np.abs(venv.normalize_obs(obs)) >= 2.5).any()
    want, _ = model.predict(venv.normalize_obs(obs), deterministic=True)
    np.testing.assert_allclose(_onnx_actions(out, obs), want, atol=1e-5)


class _Evil:
    def __reduce__(self) -> tuple:
        return (Path.touch, (Path("/nonexistent-dir/pwned"),))


def test_vecnormalize_refuses_foreign_globals(local_model: tuple, tmp_path: Path, capsys) -> None:
    """A pickle naming any other callable is refused before anything in it runs."""
    import pickle

    _, path, _, _ = local_model
    bad = tmp_path / "evil.pkl"
    bad.write_bytes(pickle.dumps({"obs_rms": _Evil()}))
    assert main([str(path), "--vecnormalize", str(bad), "--out", str(tmp_path / "b")]) == 2
    _one_line_error(capsys, "refused global pathlib")
    assert not (tmp_path / "b").exists()


def _with_action_space(src: Path, dst: Path, **fields: object) -> Path:
    """A copy of the zip ``src`` whose recorded action space has ``fields`` replaced (None: removed)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            raw = zin.read(name)
            if name == "data":
                data = json.loads(raw)
                for key, value in fields.items():
                    data["action_space"].pop(key) if value is None else data["action_space"].update({key: value})
                raw = json.dumps(data).encode()
            zout.writestr(name, raw)
    return dst


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"high": "[2.  inf 1. ]", "bounded_above": "[ True False  True]"}, "unbounded in dimensions [1]"),
        ({"low": "[-1. ... -3.]"}, "abridged in numpy's repr"),
        ({"low": None}, "bounds are missing"),
        ({"_shape": None}, "records no action_space shape"),
    ],
    ids=["unbounded", "abridged", "absent", "no-shape"],
)
def test_recorded_spaces_refused(local_model: tuple, tmp_path: Path, capsys, fields: dict, fragment: str) -> None:
    bad = _with_action_space(local_model[1], tmp_path / "bad.zip", **fields)
    assert main([str(bad), "--out", str(tmp_path / "b")]) == 2
    _one_line_error(capsys, fragment)
    assert not (tmp_path / "b").exists()


def test_int8_without_env_gates_on_action_error_alone(local_model: tuple, tmp_path: Path, capsys) -> None:
    _, path, _, pkl = local_model
    out = tmp_path / "bundle"
    args = ["--vecnormalize", str(pkl), "--int8", "--calib-samples", "512", "--parity-states", "1000"]
    assert main([str(path), *args, "--out", str(out), "--json"]) == 0
    report = capsys.readouterr().out
    assert "skipped: no --env, the action-error rule alone decides" in report
    gate = read_manifest(out)["gate"]
    assert gate["episode_seeds"] == [] and gate["fp32_mean_return"] is None
    assert gate["verdict"] == "accepted" and gate["mean_action_error_frac"] <= 0.01


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
