"""``sac-sweep``'s own frozen config. Every other flag is a ``sac-train`` option applied to all trials; both
are saved as ``DIR/sweep_config.json``, which ``--resume`` reads back."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from sac_edge.common.config import flag_of
from sac_edge.common.cpus import usable_cpus
from sac_edge.common.errors import SacEdgeError

#: The sweep's folder in the default storage, the sweep dir (and in the --storage of a sweep saved before
#: sweeps shared one).
TUNE_DIR = "tune"
# On --resume these come from the command line; everything else from DIR/sweep_config.json.
# `out` above all: the directory resumed is the one named here, never one a copied sweep_config.json names.
RESUME_FROM_FLAGS = ("address", "cpus", "json", "out", "resume")
# On --resume these replace the saved ones when given (a value other than the default), else the saved ones stay:
# --storage (the same store reached another way) and what the report measures against, the target return and the
# price; those two are also written back to DIR/sweep_config.json, as settings of the sweep rather than of a session.
RESUME_IF_GIVEN = {"sweep": ("storage", "target_return"), "train": ("price_per_hour",)}
MAX_TRIALS = 10_000
"""Grid points x seeds at most: past it a sweep would not end (``--seeds 100000000000`` started Ray and ran on)."""


RESUME_TAKES_IF_GIVEN = (*RESUME_IF_GIVEN["sweep"], *RESUME_IF_GIVEN["train"])


def _flags(names: tuple[str, ...]) -> str:
    return ", ".join(flag_of(name) for name in names if name != "resume")


@dataclass(frozen=True)
class SweepConfig:
    env: str = field(default="Pendulum-v1", metadata={"help": "gymnasium id or module:Class, for every trial"})
    seeds: int = field(
        default=5, metadata={"help": "seeds per grid point: --seed, --seed + 1, ... (sac-train's --seed, default 0)"}
    )
    grid: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "KEY=V1,V2,... over sac-train's options (names as in sac-train --help, dashes or underscores); "
            "several KEYs cross; a list-valued KEY separates its values with '/' (hidden=64,64/256,256)",
            "repeat": True,
        },
    )
    scheduler: str = field(
        default="fifo",
        metadata={
            "help": "fifo runs every trial to the end; asha stops weak trials at evaluations",
            "choices": [
                "fifo",
                "asha",
            ],
        },
    )
    max_concurrent: int = field(default=0, metadata={"help": "trials at once (0: as many as the resources allow)"})
    address: str | None = field(
        default=None,
        metadata={
            "help": "Ray cluster to join from one of its nodes ('auto' or HOST:PORT); default: a local Ray for this "
            "sweep (docs/CLUSTER.md)"
        },
    )
    storage: str | None = field(
        default=None,
        metadata={
            "help": "where trials persist their checkpoints: a path every node sees, or a filesystem URI "
            "(s3://bucket/prefix?endpoint_override=HOST:PORT, gs://...); default: --out (enough on one machine)"
        },
    )
    name: str | None = field(
        default=None,
        metadata={
            "help": "the sweep's own folder under --storage, which sweeps share as Ray Tune's storage_path "
            "(default: --out's name); --force clears only this folder"
        },
    )
    cpus: int = field(
        default=0,
        metadata={"help": "CPUs of the local Ray (0: the CPUs this process may use, a cgroup quota included)"},
    )
    out: str = field(default="sweeps/latest", metadata={"help": "sweep directory (trials/, summary.json, curves.png)"})
    resume: bool = field(
        default=False,
        metadata={
            "help": "continue the sweep in --out with its saved settings (Tune's restore); taken from the command "
            f"line: {_flags(RESUME_FROM_FLAGS)}, and when given {_flags(RESUME_TAKES_IF_GIVEN)} (any other "
            "setting given must be the saved one)"
        },
    )
    force: bool = field(default=False, metadata={"help": "replace an existing sweep in --out"})
    json: bool = field(default=False, metadata={"help": "print a one-line JSON summary last on stdout"})
    target_return: float | None = field(
        default=None,
        metadata={
            "help": "evaluation return to reach: the table and summary.json add each config's seconds to it "
            "(given with --resume, it replaces the saved one)"
        },
    )


def check_sizes(cfg: SweepConfig) -> None:
    """``--seeds``, ``--max-concurrent`` and ``--cpus`` within what a sweep can start: one line before Ray
    (``--cpus 100000000000`` failed Ray's start-up after 38 s, exit 1)."""
    if cfg.seeds > MAX_TRIALS:  # fewer than 1: grid.plan's line
        raise SacEdgeError(f"--seeds must be at most {MAX_TRIALS}, got {cfg.seeds}")
    if cfg.max_concurrent < 0:
        raise SacEdgeError(f"--max-concurrent must be 0 (as many as resources allow) or more, got {cfg.max_concurrent}")
    most = usable_cpus()
    if cfg.address is None and not 0 <= cfg.cpus <= most:
        raise SacEdgeError(f"--cpus must be from 0 (all) to {most} (the CPUs this process may use), got {cfg.cpus}")


#: A sweep's folder name under --storage: one plain path component.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=,+-]{0,127}")


def sweep_name(cfg: SweepConfig) -> str:
    """The sweep's folder under ``--storage``: ``--name``, else ``--out``'s name, one plain path component."""
    name = cfg.name if cfg.name is not None else Path(cfg.out).resolve().name
    if not NAME.fullmatch(name):
        given = "--name" if cfg.name is not None else f"the name of --out {cfg.out}:"
        raise SacEdgeError(
            f"{given} {name!r} cannot name the sweep's folder in --storage (letters, digits and . _ = , + -, at "
            "most 128, first a letter or digit); pass --name NAME"
        )
    return name
