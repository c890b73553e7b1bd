"""A robot script written top to bottom, without ``if __name__ == "__main__":``, that fine-tunes through
``Runtime``: its top level must run once. The learner is a ``spawn`` child, and ``spawn`` re-imports the
parent's ``__main__``: unguarded, the script ran a second time inside the learner (connecting to and homing
the robot twice), then failed on the fine-tuning lock. The script here counts its own top-level runs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys

    import numpy as np

    from sac_edge.edge_runtime.runtime import BackendSection, FinetuneSection, Runtime, RuntimeOptions

    bundle, counter, ft_dir = sys.argv[1:4]
    with open(counter, "a") as f:  # "connect to the robot and home it": once per run of the top level
        f.write("ran\\n")
    options = RuntimeOptions(
        bundle=bundle,
        backend=BackendSection(kind="onnxruntime"),
        finetune=FinetuneSection(enabled=True, finetune_dir=ft_dir, finetune_buffer=2000, finetune_batch=32),
    )
    obs = np.array([1.0, 0.0, 0.0], np.float32)
    with Runtime(options, obs_low=[-1, -1, -8], obs_high=[1, 1, 8]) as runtime:
        for t in range(300):
            action = runtime.act(obs)
            runtime.observe(obs, action, -1.0, obs, False, t % 100 == 99)
    summary = runtime.summary()
    print("finetune error:", summary.finetune["error"])
    """
)


@pytest.mark.torch
def test_a_script_without_a_main_guard_runs_its_top_level_once(clean_finetune_bundle: Path, tmp_path: Path) -> None:
    script, counter = tmp_path / "robot.py", tmp_path / "runs.txt"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(clean_finetune_bundle), str(counter), str(tmp_path / "ft")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert counter.read_text().splitlines() == ["ran"]  # was ["ran", "ran"]: the learner re-ran the script
    assert "finetune error: None" in done.stdout
