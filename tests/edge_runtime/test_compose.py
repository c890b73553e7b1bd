"""Every ``sac-edge run`` flag is checked before any work: a bad value is refused before a backend opens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# flags -> what the one line says; all with --backend auto, which would time every backend first
BAD = {
    "--finetune --promotion-window 0": "--promotion-window must be >= 1",
    "--finetune --rollback-threshold -1": "--rollback-threshold must be >= 0",
    "--finetune --rollback-threshold nan": "--rollback-threshold must be a finite number",
    "--finetune --rollback-noise-z -0.5": "--rollback-noise-z must be >= 0",
    "--finetune --shadow-max-diff 0": "--shadow-max-diff is a fraction of the action range in (0, 1]",
    "--finetune --shadow-max-diff 1.5": "--shadow-max-diff is a fraction of the action range in (0, 1]",
    "--finetune --finetune-utd 0": "--finetune-utd must be a positive number",
    "--finetune --finetune-buffer 500": "--finetune-buffer 500 is below the 1000 rows fine-tuning needs",
    "--finetune --learning-starts 5000 --finetune-buffer 2000": "is below the 5000 rows",
    "--finetune --learner-cpu 2": "--learner-cpu is a fraction of one core",
    "--finetune --explore-std -1": "--explore-std non-negative",
    "--finetune (no torch)": "--finetune needs the Python package 'torch'",
}

# In one child process: each case through the real CLI, then whether onnxruntime (which every backend
# here imports when it opens) was imported by then. The last case is a valid run, which must import it.
CHILD = """
import contextlib, io, json, sys
from sac_edge.edge_runtime.cli import main
bundle, cases = sys.argv[1], json.loads(sys.argv[2])
out = []
for flags in cases:
    if "(no torch)" in flags:
        sys.modules["torch"] = None  # as on a device without it: find_spec("torch") is None
    argv = ["run", bundle, "--backend", "auto", "--duration", "0.05", *flags.replace("(no torch)", "").split()]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    out.append({"rc": rc, "err": err.getvalue(), "onnxruntime": "onnxruntime" in sys.modules})
print(json.dumps(out))
"""


def test_every_bad_flag_is_refused_before_any_backend_opens(pendulum_bundle: Path) -> None:
    cases = [*BAD, ""]  # the torch case last but one: the valid run, last, needs no torch either
    cases.sort(key=lambda flags: (flags == "", "(no torch)" in flags))
    argv = [sys.executable, "-c", CHILD, str(pendulum_bundle), json.dumps(cases)]
    child = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    results = dict(zip(cases, json.loads(child.stdout.strip().splitlines()[-1])))
    for flags, message in BAD.items():
        result = results[flags]
        lines = result["err"].strip().splitlines()
        assert result["rc"] == 2 and len(lines) == 1, (flags, result)
        assert lines[0].startswith("sac-edge: error: ") and message in lines[0], (flags, lines)
        assert not result["onnxruntime"], f"{flags}: a backend was opened before the refusal"
    valid = results[""]
    assert valid["rc"] == 0 and valid["onnxruntime"], valid  # the observable does see a backend open


@pytest.mark.parametrize("flags", ["--finetune-utd inf", "--finetune-lr 0"])
def test_finetune_numbers_are_checked_without_fine_tuning_work(flags: str, tmp_path: Path) -> None:
    from sac_edge.common.errors import SacEdgeError
    from sac_edge.edge_runtime.compose import validate
    from sac_edge.edge_runtime.config import RunConfig

    name, value = flags.split()
    cfg = RunConfig(bundle=str(tmp_path / "absent"), finetune=True, **{name[2:].replace("-", "_"): float(value)})
    with pytest.raises(SacEdgeError, match=name):  # the bundle is not even looked at
        validate(cfg)
