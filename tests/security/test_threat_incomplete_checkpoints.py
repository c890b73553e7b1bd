"""A run dir whose checkpoint holds the actor but no critics: sac-export exported it, and the bundle's
``learner.safetensors`` (what ``sac-edge run --finetune`` learns from) lacked the critics, found only on the
device. The policy alone would be enough to serve, but a bundle is also the fine-tuner's starting point, and a
Stable-Baselines3 zip without critics is refused already: sac-export refuses it in one line, before any work."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from sac_edge.export import cli as export_cli


@pytest.mark.parametrize("dropped", ["critic.", "critic_target."])
def test_a_checkpoint_without_critics_is_refused_before_any_work(
    clean_bundle: Path, tmp_path: Path, refused: Callable[..., str], dropped: str
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    tensors = load_file(str(clean_bundle / "learner.safetensors"))
    save_file({k: v for k, v in tensors.items() if not k.startswith(dropped)}, str(run / "checkpoint.safetensors"))
    spec = json.loads((clean_bundle / "manifest.json").read_text())["spec"]
    (run / "config.json").write_text(json.dumps({"spec": spec, "env": spec["env_id"]}))
    err = refused(export_cli.main, [str(run), "--out", str(tmp_path / "out")], prog="sac-export")
    assert f"its checkpoint holds no {dropped}* tensors" in err and "full sac-train checkpoint" in err
    assert not (tmp_path / "out").exists()
