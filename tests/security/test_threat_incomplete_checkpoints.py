"""A run dir whose checkpoint holds the actor but no critics: sac-export exported it, and the bundle's
``learner.safetensors`` (what ``sac-edge run --finetune`` learns from) lacked the critics, found only on the
device. The policy alone would be enough to serve, but a bundle is also the fine-tuner's starting point, and a
Stable-Baselines3 zip without critics is refused already: sac-export refuses it in one line, before any work.
So is one whose learner tensors hold NaN (a diverged run)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from sac_edge.export import cli as export_cli


def _run_dir(clean_bundle: Path, tmp_path: Path, tensors: dict) -> Path:
    """A run dir of the clean bundle's spec whose checkpoint holds ``tensors``."""
    run = tmp_path / "run"
    run.mkdir()
    save_file(tensors, str(run / "checkpoint.safetensors"))
    spec = json.loads((clean_bundle / "manifest.json").read_text())["spec"]
    (run / "config.json").write_text(json.dumps({"spec": spec, "env": spec["env_id"]}))
    return run


@pytest.mark.parametrize("dropped", ["critic.", "critic_target."])
def test_a_checkpoint_without_critics_is_refused_before_any_work(
    clean_bundle: Path, tmp_path: Path, refused: Callable[..., str], dropped: str
) -> None:
    tensors = load_file(str(clean_bundle / "learner.safetensors"))
    run = _run_dir(clean_bundle, tmp_path, {k: v for k, v in tensors.items() if not k.startswith(dropped)})
    err = refused(export_cli.main, [str(run), "--out", str(tmp_path / "out")], prog="sac-export")
    assert f"its checkpoint holds no {dropped}* tensors" in err and "full sac-train checkpoint" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("poisoned", ["critic.weights.0", "critic_target.biases.1", "log_alpha"])
def test_a_checkpoint_with_nan_learner_tensors_is_refused(
    clean_bundle: Path, tmp_path: Path, refused: Callable[..., str], poisoned: str
) -> None:
    """A diverged run's NaN critics (or alpha) exported cleanly, and fine-tuning on the device then discarded
    every update without saying why."""
    tensors = load_file(str(clean_bundle / "learner.safetensors"))
    tensors[poisoned] = tensors[poisoned].copy()
    tensors[poisoned].reshape(-1)[0] = float("nan")
    run = _run_dir(clean_bundle, tmp_path, tensors)
    err = refused(export_cli.main, [str(run), "--out", str(tmp_path / "out")], prog="sac-export")
    assert f"checkpoint.safetensors: {poisoned} holds NaN" in err and "export an earlier checkpoint" in err
    assert not (tmp_path / "out").exists()
