"""Sweep dirs and stored checkpoints as sac-sweep leaves them, for tests that read or tamper with them
without running Ray."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.config import config_dict
from sac_edge.sweep.cli import SAVED, parse_args
from sac_edge.sweep.storage import write_manifest
from sac_edge.train import checkpoint as ckpt

TINY = [
    "--learning-starts", "100", "--eval-every", "300", "--eval-episodes", "1", "--hidden", "8,8",
    "--batch-size", "16", "--threads", "1",
]  # fmt: skip


def new_sweep(root: Path, *flags: str) -> Path:
    """``root/sweep``: a one-trial sweep of 600 steps with nothing run yet (so --resume has a trial to continue)."""
    out = root / "sweep"
    sweep, train = parse_args(["--out", str(out), "--seeds", "1", "--total-steps", "600", *TINY, *flags])
    atomic_write_json(out / SAVED, {"sweep": config_dict(sweep), "train": config_dict(train)})
    return out


def stored_checkpoint(experiment: Path, trial: str, session: str, index: int, step: int) -> Path:
    """A checkpoint dir in a sweep's folder of the storage as a trial uploads it: sac-train's files (stand-ins,
    the weights a real safetensors file) and their manifest."""
    path = experiment / f"{trial}@{session}" / f"checkpoint_{index:06d}"
    path.mkdir(parents=True)
    save_file({"w": np.zeros(step, dtype=np.float32)}, str(path / ckpt.CHECKPOINT))
    (path / ckpt.TRAINER_STATE).write_text(json.dumps({"step": step}))
    (path / ckpt.CONFIG).write_text("{}")
    (path / ckpt.METRICS).write_text("step,eval_return\n")
    write_manifest(path)
    return path
