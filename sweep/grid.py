"""The sweep's plan: ``--grid KEY=V1,V2`` specs parsed against ``sac-train``'s config, crossed with seeds.

Everything is checked here, before Ray starts: an unknown key, a key a sweep sets itself, or a value
``sac-train`` would not accept is one line naming the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import typing
from pathlib import Path
from typing import Any, NamedTuple

from sac_edge.common.config import parse_value
from sac_edge.common.errors import SacEdgeError
from sac_edge.train.config import TrainConfig, value_error

from .config import MAX_TRIALS

# Set by the sweep itself (per trial or for the whole sweep's resources), or of no use in a sweep (profile), so
# not grid keys.
NOT_GRID_KEYS = {
    "env": "--env",
    "seed": "--seeds (and --seed for the first)",
    "out": "--out",
    "resume": "--resume",
    "force": "--force",
    "json": "--json",
    "progress": "nothing (trials run without a progress bar)",
    "checkpoint_every": "--eval-every (a trial checkpoints at each evaluation)",
    "device": "--device for the whole sweep",
    "threads": "--threads for the whole sweep",
    "profile": "sac-train --profile on one run (a profiled run stops once profiled)",
}
TRIALS = "trials"


class GridPoint(NamedTuple):
    """One hyperparameter setting: its label as typed (``actor_lr=1e-4 batch_size=128``) and typed values."""

    label: str
    values: dict[str, Any]


class Trial(NamedTuple):
    """One grid point x one seed, and its run dir."""

    point: GridPoint
    seed: int
    run: Path


class TrialOutcome(NamedTuple):
    """What came back of one trial: the evaluations it reported (step, return) and its error, if any."""

    trial: Trial
    curve: list[tuple[int, float]]
    error: str | None


def _is_tuple(name: str) -> bool:
    return typing.get_origin(typing.get_type_hints(TrainConfig)[name]) is tuple


def _parse_one(spec: str, fields: set[str]) -> tuple[str, list[tuple[str, Any]]]:
    key, sep, values = spec.partition("=")
    name = key.strip().lstrip("-").replace("-", "_")
    if not sep or not name or not values.strip():
        raise SacEdgeError(f"--grid {spec!r}: expected KEY=V1,V2,... (for example actor_lr=1e-4,3e-4)")
    if name in NOT_GRID_KEYS:
        raise SacEdgeError(f"--grid {name}: the sweep sets it; use {NOT_GRID_KEYS[name]}")
    if name not in fields:
        near = difflib.get_close_matches(name, sorted(fields), n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        raise SacEdgeError(f"--grid {name}: not a sac-train option; {hint}see sac-train --help for the names")
    texts = [t.strip() for t in values.split("/" if _is_tuple(name) else ",")]
    if any(not t for t in texts) or len(set(texts)) != len(texts):
        raise SacEdgeError(f"--grid {spec!r}: empty or repeated value; give each value once")
    parsed = []
    for text in texts:
        try:
            value = parse_value(TrainConfig, name, text)
        except ValueError as err:
            raise SacEdgeError(f"--grid {name}: {err}") from None
        problem = value_error(name, value)
        if problem:  # here, not as a failed trial's traceback once Ray has started
            raise SacEdgeError(f"--grid {name}: {problem}")
        parsed.append((text, value))
    return name, parsed


def parse_grid(specs: typing.Sequence[str]) -> list[GridPoint]:
    """The cross product of ``specs`` (each ``KEY=V1,V2``) in the order given; no specs: one empty point."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    axes: dict[str, list[tuple[str, Any]]] = {}
    for spec in specs:
        name, values = _parse_one(spec, fields)
        if name in axes:
            raise SacEdgeError(f"--grid {name} given twice; list all its values in one --grid {name}=V1,V2")
        axes[name] = values
    names = list(axes)
    points = []
    for combo in itertools.product(*axes.values()):
        label = " ".join(f"{names[i]}={text}" for i, (text, _) in enumerate(combo))
        points.append(GridPoint(label or "default", {names[i]: value for i, (_, value) in enumerate(combo)}))
    return points


def run_name(label: str, seed: int) -> str:
    """A trial's name (its run dir under ``DIR/trials/``, its Tune trial): the label, '_' for spaces, the seed."""
    return f"{label.replace(' ', '_')}-seed{seed}"


def plan(points: list[GridPoint], first_seed: int, seeds: int, sweep_dir: Path) -> list[Trial]:
    """Every grid point x seed, grid point major."""
    if seeds < 1:
        raise SacEdgeError("--seeds must be at least 1")
    if len(points) * seeds > MAX_TRIALS:
        raise SacEdgeError(
            f"--grid and --seeds make {len(points)} x {seeds} trials, more than {MAX_TRIALS}; "
            "sweep fewer values or seeds"
        )
    trials_dir = sweep_dir.resolve() / TRIALS
    return [
        Trial(p, s, trials_dir / run_name(p.label, s)) for p in points for s in range(first_seed, first_seed + seeds)
    ]
