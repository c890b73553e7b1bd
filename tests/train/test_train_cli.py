"""sac-train end to end on CPU, and its one-line errors (exit 2, nothing overwritten)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sac_edge.common.manifest import sha256_file
from sac_edge.train.checkpoint import load_run
from sac_edge.train.cli import main

TINY = ["--hidden", "32,32", "--batch-size", "32", "--eval-episodes", "1", "--no-progress"]


def _train(out: Path, *extra: str) -> int:
    return main(
        ["--env", "Pendulum-v1", "--total-steps", "400", "--learning-starts", "200", "--out", str(out), *TINY, *extra]
    )


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("sac-train: error: ")
    return err[0]


def test_tiny_run_writes_the_run_dir_and_json_summary(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run, "--json", "--eval-every", "200") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 400 and summary["updates"] == 201
    assert summary["updates_per_s"] > 0 and summary["final_eval_return"] is not None
    for name in ("config.json", "checkpoint.safetensors", "trainer_state.json", "calib_states.npy", "metrics.csv"):
        assert (run / name).is_file(), name
    config = json.loads((run / "config.json").read_text())
    assert config["env"] == "Pendulum-v1" and config["spec"]["obs_dim"] == 3 and config["versions"]["torch"]
    states = np.load(run / "calib_states.npy")
    assert states.shape == (400, 3) and np.isfinite(states).all()
    loaded = load_run(run)
    assert loaded.spec.action_high == (2.0,) and "critic_target.weights.0" in loaded.tensors


def test_unknown_env_is_one_line(tmp_path, capsys):
    assert main(["--env", "NoSuchEnv-v9", "--out", str(tmp_path / "r")]) == 2
    assert "unknown environment 'NoSuchEnv-v9'" in _one_error_line(capsys)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("flag", "text", "message"), [
    ("--price-per-hour", "-2.5e-1", "--price-per-hour must be a price of 0 or more, got -0.25"),
    ("--init-alpha", "-inf", "--init-alpha must be a finite number, got -inf"),
])  # fmt: skip
def test_a_negative_number_is_read_as_the_flag_s_value(tmp_path, capsys, flag, text, message):
    """On bca952e ``--price-per-hour -2.5e-1`` was "expected one argument" (only ``=-2.5e-1`` worked)."""
    assert main([flag, text, "--out", str(tmp_path / "r")]) == 2
    assert message in _one_error_line(capsys)
    assert not (tmp_path / "r").exists()


def test_discrete_action_space_is_refused(tmp_path, capsys):
    assert main(["--env", "CartPole-v1", "--out", str(tmp_path / "r")]) == 2
    assert "continuous Box action space" in _one_error_line(capsys)


def test_unbounded_action_space_is_refused(tmp_path, capsys):
    assert main(["--env", "train_toy_envs:UnboundedActionEnv", "--out", str(tmp_path / "r")]) == 2
    assert "unbounded" in _one_error_line(capsys)


def test_existing_run_needs_resume_or_force(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run) == 0
    before = sha256_file(run / "checkpoint.safetensors")
    capsys.readouterr()
    assert _train(run) == 2
    assert "--resume" in _one_error_line(capsys)
    assert sha256_file(run / "checkpoint.safetensors") == before


def test_resume_from_another_env_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run) == 0
    before = sha256_file(run / "checkpoint.safetensors")
    capsys.readouterr()
    assert main(["--env", "MountainCarContinuous-v0", "--out", str(run), "--resume", "--total-steps", "600"]) == 2
    assert "was trained on Pendulum-v1" in _one_error_line(capsys)
    assert sha256_file(run / "checkpoint.safetensors") == before


def test_a_setting_resume_would_replace_is_refused_the_same_one_passes(tmp_path, capsys):
    """Before, ``--resume --hidden 64,64 --seed 3`` trained on with the saved 32,32 and seed 0 in silence."""
    run = tmp_path / "run"
    assert _train(run) == 0
    before = sha256_file(run / "checkpoint.safetensors")
    capsys.readouterr()
    assert main(["--out", str(run), "--resume", "--total-steps", "600", "--hidden", "64,64", "--seed", "3"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"sac-train: error: --resume continues {run} with its settings, not "), line
    assert "--seed 3 (saved: 0)" in line and "--hidden 64,64 (saved: 32,32)" in line, line
    assert sha256_file(run / "checkpoint.safetensors") == before
    again = ["--out", str(run), "--resume", "--total-steps", "600", "--hidden", "32,32", "--no-progress"]
    assert main(again) == 0  # the same settings again: taken


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_checkpoint_is_one_line(tmp_path, capsys, damage):
    run = tmp_path / "run"
    assert _train(run) == 0
    path = run / "checkpoint.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x07" * 64)
    capsys.readouterr()
    assert main(["--out", str(run), "--resume", "--total-steps", "600", "--no-progress"]) == 2
    assert "corrupt or truncated" in _one_error_line(capsys)
    with pytest.raises(Exception, match="corrupt or truncated"):
        load_run(run)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(
        [
            "--env",
            "train_toy_envs:NanRewardEnv",
            "--total-steps",
            "2000",
            "--learning-starts",
            "100",
            "--checkpoint-every",
            "500",
            "--eval-every",
            "0",
            "--out",
            str(run),
            *TINY,
        ]
    )
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "non-finite loss" in err[0] and "step 500" in err[0]
    kept = load_run(run)
    assert all(bool(t.float().isfinite().all()) for k, t in kept.tensors.items() if k.startswith("actor."))
    assert json.loads((run / "trainer_state.json").read_text())["step"] == 500


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_envs_collect_k_transitions_per_step(tmp_path, capsys, mode):
    run = tmp_path / "run"
    code = main(
        ["--env", "Pendulum-v1", "--num-envs", "2", "--vector-mode", mode, "--total-steps", "600",
         "--learning-starts", "300", "--eval-every", "0", "--out", str(run), "--json", *TINY]
    )  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # 300 vector steps of 2 envs; 2 updates per vector step once learning starts (utd 1 per transition).
    assert summary["steps"] == 600 and summary["updates"] == 302
    assert summary["episodes"] == 2  # 300 steps per env; Pendulum truncates at 200: one episode each


def test_bf16_on_a_cpu_without_bf16_units_warns(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert _train(tmp_path / "run", "--amp", "bf16", "--total-steps", "210") == 0
    err = capsys.readouterr().err
    assert "no bf16 matmul units" in err and "--amp off" in err
