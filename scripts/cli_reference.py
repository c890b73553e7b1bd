#!/usr/bin/env python
"""Write docs/CLI.md, every command's flags, from the commands' config classes (``make docs``).

``--check`` only compares: exit 1 with one line when the committed page differs from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sac_edge.common.config import reference_markdown
from sac_edge.edge_runtime.config import BenchConfig, DoctorConfig, DrillConfig, ReplayConfig, RunConfig
from sac_edge.edge_runtime.ros2.parameters import NODE_PARAMETERS, RUN_PARAMETERS
from sac_edge.export.config import ExportConfig
from sac_edge.sweep.config import SweepConfig
from sac_edge.train.config import TrainConfig

PAGE = Path(__file__).resolve().parents[1] / "docs" / "CLI.md"

#: (command line, config class, positional fields, what the command does)
COMMANDS = (
    ("sac-train", TrainConfig, (), "train a SAC policy and write a run dir"),
    ("sac-export RUN", ExportConfig, ("run",), "a run dir or a Stable-Baselines3 SAC .zip -> a bundle"),
    ("sac-edge run BUNDLE", RunConfig, ("bundle",), "drive an environment with the bundle's policy"),
    ("sac-edge bench BUNDLE", BenchConfig, ("bundle",), "time every backend x precision x batch"),
    ("sac-edge drill BUNDLE", DrillConfig, ("bundle",), "injected sensor faults with and without the shield"),
    (
        "sac-edge replay BUNDLE RECORDING",
        ReplayConfig,
        ("bundle", "recording"),
        "a bundle checked against a robot's recorded log: findings by joint (exit 0 agree, 3 mismatch)",
    ),
    ("sac-edge doctor [BUNDLE]", DoctorConfig, ("bundle",), "this device's stack and what can run here"),
    ("sac-sweep", SweepConfig, (), "seeds x grids of sac-train on Ray Tune; any other flag goes to sac-train"),
)


def render() -> str:
    parts = [
        "# sac-edge command-line reference\n",
        "Generated from the commands' config classes by `scripts/cli_reference.py` (`make docs`); a test fails"
        " when this page and the code differ. Each command also takes `--help` and `--version`. `sac-edge keygen"
        " NAME` writes an Ed25519 key pair (NAME, NAME.pub) for `sac-export --sign-key` and `--trusted-keys`. Outputs,"
        " `--json` keys and exit codes: [CONTRACTS.md](CONTRACTS.md).\n",
    ]
    for line, cls, positional, what in COMMANDS:
        parts.append(f"## {line}\n\n{what[0].upper() + what[1:]}.\n\n{reference_markdown(cls, positional)}")
    parts.append(ros2_parameters())
    return "\n".join(parts)


def ros2_parameters() -> str:
    """The node's own parameters (``sac-edge ros2 BUNDLE --ros-args -p NAME:=VALUE``), from their schema."""
    rows = ["| parameter | default | range | while configured | what |", "|---|---|---|---|---|"]
    for p in NODE_PARAMETERS:
        span = f"{p.low:g} .. {p.high:g}" if p.low is not None and p.high is not None else ""
        span = span or " / ".join(p.choices)
        default = "the host name" if p.name == "hardware_id" else f"`{p.default!r}`"
        rows.append(f"| `{p.name}` | {default} | {span} | {'fixed' if p.fixed else 'may change'} | {p.help} |")
    runs = ", ".join(f"`{r.name}`" for r in RUN_PARAMETERS)
    return (
        "## sac-edge ros2 BUNDLE [--ros-args ...]\n\nThe bundle's policy as a ROS 2 lifecycle node "
        "([ROS2.md](ROS2.md)). Its own parameters:\n\n" + "\n".join(rows) + "\n\nand every `sac-edge run` option "
        f"above the runtime uses, under its flag's name (dashes as underscores), fixed once configured: {runs}.\n"
    )


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is out of date with the config classes; run make docs", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
