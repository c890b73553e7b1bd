"""--resume continues bit-for-bit on CPU: stop at N, resume to 2N, compare with an uninterrupted 2N run."""

import json

import pytest
import torch
from safetensors.torch import load_file

from sac_edge.train.cli import main
from sac_edge.train.metrics import COLUMNS

ARGS = [
    "--env",
    "Pendulum-v1",
    "--learning-starts",
    "150",
    "--hidden",
    "32,32",
    "--batch-size",
    "32",
    "--eval-every",
    "0",
    "--no-progress",
    "--threads",
    "1",
]


@pytest.mark.parametrize(
    "extra",
    [[], ["--obs-history", "2", "--action-delay", "1-2"]],
    ids=["frame", "history-and-delay"],  # the assembled history and the delayed actions in flight resume too
)
def test_resume_matches_uninterrupted_run(tmp_path, extra):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main([*ARGS, *extra, "--total-steps", "500", "--out", str(straight)]) == 0
    assert main([*ARGS, *extra, "--total-steps", "300", "--out", str(split)]) == 0
    assert main(["--resume", "--total-steps", "500", "--out", str(split), "--no-progress", "--threads", "1"]) == 0
    a = load_file(str(straight / "checkpoint.safetensors"))
    b = load_file(str(split / "checkpoint.safetensors"))
    assert a.keys() == b.keys()
    diff = [k for k in a if not torch.equal(a[k], b[k])]
    assert diff == []
    sa = json.loads((straight / "trainer_state.json").read_text())
    sb = json.loads((split / "trainer_state.json").read_text())
    assert sa.pop("wall_s") > 0 and sb.pop("wall_s") > 0  # seconds trained: the clock's, not the learner's
    assert sa == sb
    # The last metrics row (step 500) agrees in everything up to the machine's measurements (rates, memory).
    learned = COLUMNS[: COLUMNS.index("alpha") + 1]
    last_a = (straight / "metrics.csv").read_text().splitlines()[-1].split(",")[: len(learned)]
    last_b = (split / "metrics.csv").read_text().splitlines()[-1].split(",")[: len(learned)]
    assert last_a == last_b
