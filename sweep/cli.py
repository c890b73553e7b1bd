"""``sac-sweep``: seeds x hyperparameter grids of sac-train on Ray Tune; each trial an ordinary run dir under
DIR/trials/, ranked by the IQM of the final evaluation return with a 95% bootstrap interval."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.config import build_parser, check_fields, config_dict, config_from_dict, resume_conflicts
from sac_edge.common.errors import InternalError, SacEdgeError, run_cli
from sac_edge.common.jsonfile import read_json
from sac_edge.common.summary import emit_json
from sac_edge.train.config import TrainConfig, check_values

from .config import RESUME_FROM_FLAGS, RESUME_IF_GIVEN, TUNE_DIR, SweepConfig, check_sizes, sweep_name
from .grid import Trial, TrialOutcome, parse_grid, plan

if TYPE_CHECKING:
    from .storage import Storage

PROG = "sac-sweep"
INSTALL = "pip install 'sac-edge[sweep]'"
SAVED = "sweep_config.json"
WRITTEN_BACK = {"sweep": ("target_return",), "train": ("price_per_hour",)}
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
    if train.profile:  # each trial would stop once profiled, and the sweep would rank runs cut short
        raise SacEdgeError("--profile stops a run once profiled, so no sweep takes it; profile one run with sac-train")
    # Here, not as every trial's error once Ray has started (--price-per-hour -1 failed them all). --threads is
    # left to each trial: a cluster's workers may have more CPUs than this machine.
    check_values(dataclasses.replace(train, threads=0))
    return sweep, train


def _require_extra() -> None:
    try:
        import ray.tune  # noqa: F401
        import scipy.stats  # noqa: F401
    except ImportError as err:
        raise SacEdgeError(f"sac-sweep needs Ray Tune and scipy ({err.name} is missing); {INSTALL}") from None


def _given(cfg: Any, names: Sequence[str]) -> dict[str, Any]:
    """The settings of ``cfg`` among ``names`` that the command line gave (a value other than the default)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    return {name: getattr(cfg, name) for name in names if getattr(cfg, name) != defaults[name]}


def _saved(sweep_dir: Path, sweep: SweepConfig, train: TrainConfig) -> tuple[SweepConfig, TrainConfig]:
    saved = read_json(sweep_dir / SAVED, "sweep config", "nothing to resume; run without --resume")
    source = str(sweep_dir / SAVED)
    if not all(isinstance(saved.get(part), dict) for part in ("sweep", "train")):  # was a KeyError, exit 1
        raise SacEdgeError(f"{source}: holds no 'sweep' and 'train' settings; nothing to resume; run without --resume")
    flags = {k: getattr(sweep, k) for k in RESUME_FROM_FLAGS}
    saved["sweep"].setdefault("name", TUNE_DIR)  # saved before sweeps shared a storage: its one folder
    ignored = resume_conflicts(sweep, saved["sweep"], (*RESUME_FROM_FLAGS, *RESUME_IF_GIVEN["sweep"]))
    ignored += resume_conflicts(train, saved["train"], (*RESUME_IF_GIVEN["train"], "env"))  # env: the sweep's
    if ignored:  # the same command line again with --resume passes; a changed setting would be lost in silence
        raise SacEdgeError(
            f"--resume continues the sweep saved in {source} with its settings, not {', '.join(ignored)}; "
            "drop them, or start a new sweep (another --out)"
        )
    sweep_given, train_given = _given(sweep, RESUME_IF_GIVEN["sweep"]), _given(train, RESUME_IF_GIVEN["train"])
    sweep_cfg = config_from_dict(SweepConfig, {**saved["sweep"], **flags, **sweep_given}, source)
    train_cfg = config_from_dict(TrainConfig, {**saved["train"], **train_given}, source)
    try:  # the types the command line's parser would have checked (a str seed count was a TypeError, exit 1)
        check_fields(sweep_cfg)
        check_fields(train_cfg)
        check_values(train_cfg)
    except SacEdgeError as err:
        raise SacEdgeError(f"{source} holds a setting no sweep can use ({err}); restore it") from None
    _write_back(sweep_dir / SAVED, saved, sweep_cfg, train_cfg)
    return sweep_cfg, train_cfg


def _write_back(path: Path, saved: dict[str, Any], sweep: SweepConfig, train: TrainConfig) -> None:
    """The report's settings taken on --resume into the saved config (atomically), so the next resume and the
    saved config agree with the summary; the rest of the file as it was."""
    now = {"sweep": config_dict(sweep), "train": config_dict(train)}
    changed = {part: {k: now[part][k] for k in names} for part, names in WRITTEN_BACK.items()}
    if any(saved[part].get(k) != v for part, values in changed.items() for k, v in values.items()):
        atomic_write_json(path, {**saved, **{part: {**saved[part], **changed[part]} for part in changed}})


def _check_address(address: str | None) -> None:
    """Ray Client (``ray://``) would run the sweep's driver on the cluster, so its records (trial_state.json,
    the copies in DIR/trials) would stay there: refused with the two ways that keep them here."""
    if address is not None and address.startswith("ray://"):
        raise SacEdgeError(
            f"--address {address}: Ray Client keeps the sweep's records on the cluster; run sac-sweep on a node of "
            f"the cluster with --address auto (or HOST:PORT of its head), or submit it there with "
            f"`ray job submit --working-dir . -- sac-sweep ... --address auto`"
        )


def _prepare(sweep: SweepConfig, train: TrainConfig) -> tuple[SweepConfig, TrainConfig]:
    """Checks that need no Ray; on --resume the saved settings, otherwise a fresh DIR (the config is saved
    once the storage is known to work)."""
    _check_address(sweep.address)
    check_sizes(sweep)
    sweep_dir = Path(sweep.out)
    if sweep_dir.exists() and not sweep_dir.is_dir():  # was a NotADirectoryError, exit 1
        raise SacEdgeError(f"--out {sweep_dir} is a file; pass a directory path")
    if sweep.resume:
        return _saved(sweep_dir, sweep, train)
    if sweep.storage:  # saved, so a resume finds the same folder whatever DIR is called then
        sweep = dataclasses.replace(sweep, name=sweep_name(sweep))
    if train.eval_every <= 0 or train.eval_every > train.total_steps:
        raise SacEdgeError("a sweep ranks trials by their evaluations; give 0 < --eval-every <= --total-steps")
    if (sweep_dir / SAVED).exists():
        if not sweep.force:
            raise SacEdgeError(
                f"{sweep_dir} already holds a sweep; pass --resume to continue it or --force to replace it"
            )
        if sweep_dir.is_symlink():  # the link goes, never what it points to
            sweep_dir.unlink()
        else:
            shutil.rmtree(sweep_dir)
    elif sweep_dir.exists() and any(sweep_dir.iterdir()):
        raise SacEdgeError(f"{sweep_dir} is not empty and holds no sweep; choose another --out")
    return sweep, train


def _fresh_storage(storage: Storage, force: bool) -> None:
    """A new sweep starts on an empty folder of its own in the storage: --force clears that folder (no other
    sweep's), otherwise an earlier sweep's checkpoints there refuse."""
    from .storage import clear, newest_any

    if force:
        clear(storage)
    elif newest_any(storage):
        raise SacEdgeError(
            f"--storage {storage.uri} already holds a sweep named {storage.experiment} (its checkpoints are in "
            f"{storage.experiment_dir}); pass --force to clear them, or --name to give this sweep another folder"
        )


def _resume_from(sweep: SweepConfig, storage: Storage, trials: list[Trial]) -> dict[str, str]:
    """Where each trial continues: its newest checkpoint in storage; on a local Ray also a newer run dir in
    DIR/trials (every worker sees it)."""
    from .state import saved_step
    from .storage import newest

    found = newest(storage, {t.run.name for t in trials})
    starts = {name: n.path for name, n in found.items()}
    if sweep.address is None and storage.local:
        for t in trials:
            if saved_step(t.run) > (found[t.run.name].step if t.run.name in found else 0):
                starts[t.run.name] = str(t.run)
    return starts


def _main(argv: Sequence[str] | None) -> int:
    sweep, train = _prepare(*parse_args(argv))
    trials = plan(parse_grid(sweep.grid), train.seed, sweep.seeds, Path(sweep.out))
    _require_extra()
    from . import state
    from .storage import open_storage

    sweep_dir = Path(sweep.out)
    # Sweeps share a --storage, each in its own folder; the sweep dir, the default storage, holds one: tune/.
    storage = open_storage(sweep.storage, sweep_name(sweep)) if sweep.storage else open_storage(str(sweep_dir))
    _ready_storage(sweep, storage, trials)
    ended = state.ended(sweep_dir) if sweep.resume else {}
    pending = state.to_run(trials, train.total_steps, ended)
    start = time.perf_counter()
    lost = _run_pending(sweep, train, storage, pending, ended, trials)
    outcomes = state.outcomes(trials, ended)
    summary = _summarize(sweep, train, outcomes, lost, time.perf_counter() - start)
    _write_outputs(summary, outcomes, sweep, train)
    return _exit_code(summary, sweep_dir)


def _ready_storage(sweep: SweepConfig, storage: Storage, trials: list[Trial]) -> None:
    """On --resume the trials' newest checkpoints copied back into DIR/trials (a driver killed outright copied
    nothing back); a new sweep with --storage starts on an empty prefix. A remote storage must answer first,
    within a bound (``remote``); a failure of its client is one line naming what to check."""
    from .remote import check_reachable, first_line, hint
    from .storage import checked_trials_dir, collect

    if not storage.local:
        check_reachable(storage.fs, storage.root, storage.uri)
    try:
        if sweep.resume:
            checked_trials_dir(Path(sweep.out))
            collect(storage, trials, Path(sweep.out))
        elif sweep.storage:
            _fresh_storage(storage, sweep.force)
    except OSError as err:
        if storage.local:
            raise
        raise SacEdgeError(f"--storage {storage.uri}: {first_line(err)}; check {hint(storage.fs)}") from None


def _run_pending(
    sweep: SweepConfig,
    train: TrainConfig,
    storage: Storage,
    pending: list[Trial],
    ended: dict[str, str | None],
    trials: list[Trial],
) -> dict[str, str]:
    """The trials still to run, on Ray (none to run: no Ray); the sweep's config is saved once the storage is
    known to work. Adds each trial that ends to ``ended``; returns those the cluster lost."""
    if not pending:
        return {}
    from .storage import collect
    from .tune_run import probe_storage, ray_session, run_trials, trial_resources

    sweep_dir = Path(sweep.out)
    with ray_session(sweep.address, sweep.cpus, trial_resources(train)):
        if sweep.address is not None or sweep.storage:
            probe_storage(storage, given=bool(sweep.storage))
        if not sweep.resume:
            atomic_write_json(sweep_dir / SAVED, {"sweep": config_dict(sweep), "train": config_dict(train)})
        try:
            return run_trials(
                pending,
                train,
                sweep_dir,
                storage,
                scheduler=sweep.scheduler,
                max_concurrent=sweep.max_concurrent,
                ended=ended,
                resume_from=_resume_from(sweep, storage, pending),
            )
        finally:  # after the run and after Ctrl-C: each trial's newest checkpoint into DIR/trials
            collect(storage, trials, sweep_dir)


def _summarize(
    sweep: SweepConfig, train: TrainConfig, outcomes: list[TrialOutcome], lost: dict[str, str], wall: float
) -> dict[str, Any]:
    """summary.json's contents: the ranking, each config's time and cost, and how many trials are unfinished."""
    import ray

    from .report import summarize

    sweep_dir = Path(sweep.out)
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
    # Under fifo a trial short of --total-steps was interrupted; under asha it may have been stopped early,
    # unless the cluster lost it.
    unfinished = {"pending"} | ({"stopped"} if sweep.scheduler == "fifo" else set())
    summary["unfinished"] = sum(
        r["status"] in unfinished or Path(r["run"]).name in lost for r in summary["trial_results"]
    )
    return summary


def _write_outputs(
    summary: dict[str, Any], outcomes: list[TrialOutcome], sweep: SweepConfig, train: TrainConfig
) -> None:
    """summary.json, curves.png, and the table (with --json, the JSON line last on stdout)."""
    from .report import CURVES, curves, plot_curves, write_summary

    sweep_dir = Path(sweep.out)
    write_summary(summary, sweep_dir)
    plot_curves(curves(outcomes), sweep_dir / CURVES, f"{train.env}: {len(outcomes)} trials")
    _report(summary, sweep_dir, sweep.json)


def _exit_code(summary: dict[str, Any], sweep_dir: Path) -> int:
    """0; 130 with how to continue when trials are unfinished; an error when every trial failed."""
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
    from . import state
    from .report import table

    out = sys.stderr if as_json else sys.stdout
    for row in summary["trial_results"]:
        if row["status"] == "error":
            log = sweep_dir / state.LOGS / f"{Path(row['run']).name}.log"
            where = f" (traceback: {log})" if log.is_file() else ""
            print(f"{PROG}: trial {Path(row['run']).name} failed: {row['error']}{where}", file=sys.stderr)
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
