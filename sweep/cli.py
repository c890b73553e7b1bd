"""``sac-sweep``: seeds x hyperparameter grids of sac-train on Ray Tune; each trial an ordinary run dir under
DIR/trials/, ranked by the IQM of the final evaluation return with a 95% bootstrap interval."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sac_edge.common.config import build_parser, config_dict, config_from_dict
from sac_edge.common.errors import InternalError, SacEdgeError, run_cli
from sac_edge.common.jsonfile import read_json
from sac_edge.common.summary import emit_json
from sac_edge.train.config import TrainConfig

from .config import SweepConfig
from .grid import parse_grid, plan

PROG = "sac-sweep"
INSTALL = "pip install 'sac-edge[sweep]'"
SAVED = "sweep_config.json"
# On --resume these come from the command line; everything else from DIR/sweep_config.json.
# `out` above all: the directory resumed is the one named here, never one a copied sweep_config.json names.
RESUME_FROM_FLAGS = ("address", "cpus", "json", "out", "resume")
JSON_KEYS = (
    "engine",
    "ray_version",
    "trials",
    "completed",
    "errors",
    "unfinished",
    "configs",
    "best",
    "summary",
    "wall_s",
)


def parse_args(argv: Sequence[str] | None) -> tuple[SweepConfig, TrainConfig]:
    """The sweep's own flags, then every other flag as sac-train's (for all trials)."""
    sweep_parser = build_parser(SweepConfig, PROG, __doc__ or "")
    sweep_parser.allow_abbrev = False  # --seed is sac-train's, not an abbreviation of --seeds
    sweep_parser.epilog = "Every other option is sac-train's (see sac-train --help) and applies to every trial."
    ns, rest = sweep_parser.parse_known_args(argv)
    sweep = config_from_dict(SweepConfig, vars(ns), PROG)
    train_ns = build_parser(TrainConfig, PROG, "").parse_args(rest)
    train = dataclasses.replace(config_from_dict(TrainConfig, vars(train_ns), PROG), env=sweep.env)
    return sweep, train


def _require_extra() -> None:
    try:
        import ray.tune  # noqa: F401
        import scipy.stats  # noqa: F401
    except ImportError as err:
        raise SacEdgeError(f"sac-sweep needs Ray Tune and scipy ({err.name} is missing); {INSTALL}") from None


def _saved(sweep_dir: Path, sweep: SweepConfig) -> tuple[SweepConfig, TrainConfig]:
    saved = read_json(sweep_dir / SAVED, "sweep config", "nothing to resume; run without --resume")
    flags = {k: getattr(sweep, k) for k in RESUME_FROM_FLAGS}
    source = str(sweep_dir / SAVED)
    return (
        config_from_dict(SweepConfig, {**saved["sweep"], **flags}, source),
        config_from_dict(TrainConfig, saved["train"], source),
    )


def _prepare(sweep: SweepConfig, train: TrainConfig) -> tuple[SweepConfig, TrainConfig]:
    """Checks that need no Ray; on --resume the saved settings, otherwise a fresh DIR with them saved."""
    sweep_dir = Path(sweep.out)
    if sweep.resume:
        return _saved(sweep_dir, sweep)
    if train.eval_every <= 0 or train.eval_every > train.total_steps:
        raise SacEdgeError("a sweep ranks trials by their evaluations; give 0 < --eval-every <= --total-steps")
    if (sweep_dir / SAVED).exists():
        if not sweep.force:
            raise SacEdgeError(
                f"{sweep_dir} already holds a sweep; pass --resume to continue it or --force to replace it"
            )
        shutil.rmtree(sweep_dir)
    elif sweep_dir.exists() and any(sweep_dir.iterdir()):
        raise SacEdgeError(f"{sweep_dir} is not empty and holds no sweep; choose another --out")
    return sweep, train


def _main(argv: Sequence[str] | None) -> int:
    sweep, train = parse_args(argv)
    sweep, train = _prepare(sweep, train)
    trials = plan(parse_grid(sweep.grid), train.seed, sweep.seeds, Path(sweep.out))
    _require_extra()
    import ray

    from . import state
    from .report import CURVES, curves, plot_curves, summarize, write_summary
    from .tune_run import ray_session, run_trials, trial_resources

    sweep_dir = Path(sweep.out)
    if not sweep.resume:
        from sac_edge.common.atomic import atomic_write_json

        atomic_write_json(sweep_dir / SAVED, {"sweep": config_dict(sweep), "train": config_dict(train)})
    ended = state.ended(sweep_dir) if sweep.resume else {}
    pending = state.to_run(trials, train.total_steps, ended)
    start = time.perf_counter()
    if pending:
        with ray_session(sweep.address, sweep.cpus, trial_resources(train)):
            run_trials(
                pending, train, sweep_dir, scheduler=sweep.scheduler, max_concurrent=sweep.max_concurrent, ended=ended
            )
    outcomes = state.outcomes(trials, ended)
    wall = time.perf_counter() - start
    summary = summarize(
        outcomes,
        train.total_steps,
        target_return=sweep.target_return,
        price_per_hour=train.price_per_hour,
        engine="ray",
        ray_version=ray.__version__,
        env=train.env,
        scheduler=sweep.scheduler,
        wall_s=round(wall, 1),
        summary=str((sweep_dir / "summary.json").resolve()),
    )
    # Under fifo a trial short of --total-steps was interrupted; under asha it may have been stopped early.
    unfinished = {"pending"} | ({"stopped"} if sweep.scheduler == "fifo" else set())
    summary["unfinished"] = sum(r["status"] in unfinished for r in summary["trial_results"])
    write_summary(summary, sweep_dir)
    plot_curves(curves(outcomes), sweep_dir / CURVES, f"{train.env}: {len(outcomes)} trials")
    _report(summary, sweep_dir, sweep.json)
    if summary["trials"] and summary["errors"] == summary["trials"]:
        raise InternalError("every trial failed (their errors are above); fix the first and run again")
    if summary["unfinished"]:
        print(
            f"{PROG}: interrupted with {summary['unfinished']} trials unfinished (the summary covers the others); "
            f"continue with: {PROG} --out {sweep_dir} --resume",
            file=sys.stderr,
        )
        return 130
    return 0


def _report(summary: dict[str, Any], sweep_dir: Path, as_json: bool) -> None:
    from .report import table

    out = sys.stderr if as_json else sys.stdout
    for row in summary["trial_results"]:
        if row["status"] == "error":
            print(f"{PROG}: trial {Path(row['run']).name} failed: {row['error']}", file=sys.stderr)
    print(table(summary), file=out)
    print(
        f"{PROG}: {summary['completed']}/{summary['trials']} trials completed, {summary['errors']} failed, "
        f"{summary['wall_s']} s; {sweep_dir / 'summary.json'}, {sweep_dir / 'curves.png'}",
        file=out,
    )
    if as_json:
        emit_json({k: summary[k] for k in JSON_KEYS})


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(PROG, _main, argv)


if __name__ == "__main__":
    sys.exit(main())
