"""Run dirs as sac-train leaves them, built from the clean bundle for tests that tamper with them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def run_dir_from(clean_bundle: Path, root: Path, env_id: str = "Pendulum-v1") -> Path:
    """A run dir ``root/run`` whose config.json names ``env_id`` (the checkpoint is the bundle's learner)."""
    run = root / "run"
    run.mkdir()
    shutil.copyfile(clean_bundle / "learner.safetensors", run / "checkpoint.safetensors")
    spec = json.loads((clean_bundle / "manifest.json").read_text())["spec"]
    (run / "config.json").write_text(json.dumps({"spec": {**spec, "env_id": env_id}, "env": env_id}))
    return run
