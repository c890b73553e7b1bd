"""Regenerates ``data/pendulum_sac.safetensors``: a small SAC policy trained on Pendulum-v1 by sac-train.

    sac-train --env Pendulum-v1 --total-steps 8000 --learning-starts 1000 --hidden 64,64 \
        --buffer-size 20000 --threads 1 --seed 0 --out RUN      # ~40 s on 2 cores, eval return ~ -260
    python tests/calibration/make_pendulum_fixture.py RUN

It keeps what the calibration tests need: the actor and observation-normaliser tensors, the spec (as
metadata) and 600 rows of the run's ``calib_states.npy``. A trained policy matters for the gate: an
untrained one is chaotic on Pendulum, so tiny action errors change its returns by more than the 2% rule.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from sac_edge.train.checkpoint import CALIB_STATES, load_run, save_tensors

OUT = Path(__file__).parent / "data" / "pendulum_sac.safetensors"


def main(run_dir: str) -> None:
    run = load_run(run_dir)
    keep = {k: v for k, v in run.tensors.items() if k.startswith(("actor.", "obs_norm."))}
    states = np.load(Path(run_dir) / CALIB_STATES, allow_pickle=False)
    keep["calib_states"] = torch.from_numpy(states[np.random.default_rng(0).choice(len(states), 600, replace=False)])
    save_tensors(OUT, keep, metadata={"spec": json.dumps(run.spec.to_dict())})


if __name__ == "__main__":
    main(sys.argv[1])
