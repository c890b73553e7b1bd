"""The Ray Tune side of ``sac-sweep``: a local or joined Ray, the trial function, the Tuner and its restore.

A trial is ``sac-train``'s own ``Trainer`` in a Ray worker, writing an ordinary run dir; the only addition
is that each evaluation is reported to Tune right after the checkpoint holding it is on disk, so a trial
that ASHA stops (or Ctrl-C interrupts) is a whole run dir whose last reported return was measured on its
saved weights. A trial Tune restarts on ``--resume`` continues its run dir with ``sac-train --resume``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from sac_edge.common.errors import SacEdgeError
from sac_edge.train import checkpoint as ckpt
from sac_edge.train.config import TrainConfig
from sac_edge.train.trainer import Trainer

from .grid import Trial, TrialOutcome, run_name

EVAL = "eval_return"
STEP = "step"
TUNE_DIR = "tune"
ASHA_REDUCTION = 2


class _ReportingTrainer(Trainer):
    """``sac-train``'s trainer, reporting each new evaluation to Tune once its checkpoint is written."""

    reported_step = -1

    def save(self) -> None:
        super().save()
        if self.last_eval is not None and self.step != self.reported_step:
            self.reported_step = self.step
            tune.report({EVAL: self.last_eval, STEP: self.step})


def _name(trial: Any) -> str:
    """The run name of a Tune trial, from its config (grid point label and seed)."""
    return run_name(trial.config["config"], trial.config["seed"])


def _run_trial(config: dict[str, Any], base: TrainConfig, trials: dict[str, Trial]) -> None:
    """One Tune trial: ``config`` holds the grid point's label and the seed; ``base`` every other option."""
    trial = trials[run_name(config["config"], config["seed"])]
    resume = (trial.run / ckpt.CHECKPOINT).exists()
    cfg = dataclasses.replace(
        base,
        **trial.point.values,
        seed=trial.seed,
        out=str(trial.run),
        resume=resume,
        force=not resume,
        progress=False,
        json=False,
        checkpoint_every=base.eval_every,
    )
    _ReportingTrainer(cfg).train()


def trial_resources(base: TrainConfig) -> dict[str, float]:
    """CPUs per trial = ``--threads`` (0 means 1, so trials do not oversubscribe); one GPU with ``--device cuda``."""
    return {"cpu": max(base.threads, 1), "gpu": 1 if base.device == "cuda" else 0}


@contextmanager
def ray_session(address: str | None, cpus: int, resources: dict[str, float]) -> Iterator[None]:
    """A local Ray on this machine's cores (loopback only, no dashboard), shut down at the end, or the cluster
    at ``address``, left running. Refuses, before any trial starts, a trial bigger than the whole cluster."""
    if address is None:
        ray.init(
            address="local",
            num_cpus=cpus or os.cpu_count(),
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            _node_ip_address="127.0.0.1",
        )
    else:
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except ConnectionError as err:
            raise SacEdgeError(f"cannot join the Ray cluster at {address} ({err}); check --address") from None
    try:
        total = ray.cluster_resources()
        for name, need in resources.items():
            have = total.get(name.upper(), 0.0)
            if need > have:
                where = "this machine's Ray" if address is None else f"the cluster at {address}"
                raise SacEdgeError(
                    f"a trial needs {need:g} {name.upper()} but {where} has {have:g}; lower --threads or "
                    "use --device cpu" + (" or --cpus" if address is None else "")
                )
        yield
    finally:
        ray.shutdown()


class _Progress(tune.Callback):
    """One stderr line as each trial ends."""

    def __init__(self, total: int, total_steps: int) -> None:
        self.total, self.total_steps, self.done = total, total_steps, 0

    def _line(self, trial: Any, what: str) -> None:
        self.done += 1
        print(f"sac-sweep: [{self.done}/{self.total}] {_name(trial)}: {what}", file=sys.stderr, flush=True)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        last = trial.last_result or {}
        if last.get(EVAL) is None:
            self._line(trial, "no evaluation")
        else:
            stopped = f" (stopped at step {last[STEP]})" if last[STEP] < self.total_steps else ""
            self._line(trial, f"return {last[EVAL]:.1f}{stopped}")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._line(trial, "failed")


def _scheduler(name: str, base: TrainConfig) -> TrialScheduler:
    if name == "asha":
        return ASHAScheduler(
            time_attr=STEP,
            max_t=base.total_steps,
            grace_period=base.eval_every,
            reduction_factor=ASHA_REDUCTION,
        )
    return FIFOScheduler()


def _error_line(err: BaseException) -> str:
    """The last line of a trial's error (Ray wraps the worker's traceback around it)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def run_trials(
    trials: Sequence[Trial],
    base: TrainConfig,
    sweep_dir: Path,
    *,
    scheduler: str,
    max_concurrent: int,
    resume: bool,
) -> list[TrialOutcome]:
    """Run (or, with ``resume``, restore and finish) every trial on the current Ray; one outcome per trial.

    A trial that raises is an outcome with its error; the others go on. Ctrl-C stops Tune cleanly (its state
    is saved for ``--resume``) and the outcomes so far are returned.
    """
    by_name = {t.run.name: t for t in trials}
    trainable = tune.with_resources(tune.with_parameters(_run_trial, base=base, trials=by_name), trial_resources(base))
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no Tune tables on stdout
    storage = str(sweep_dir.resolve())
    if resume:
        tuner = tune.Tuner.restore(os.path.join(storage, TUNE_DIR), trainable, resume_unfinished=True)
    else:
        labels = list(dict.fromkeys(t.point.label for t in trials))
        seeds = list(dict.fromkeys(t.seed for t in trials))
        tuner = tune.Tuner(
            trainable,
            param_space={"config": tune.grid_search(labels), "seed": tune.grid_search(seeds)},
            tune_config=tune.TuneConfig(
                metric=EVAL,
                mode="max",
                scheduler=_scheduler(scheduler, base),
                max_concurrent_trials=max_concurrent or None,
                reuse_actors=True,  # a worker keeps torch imported for its next trial
                trial_name_creator=_name,
                trial_dirname_creator=_name,
            ),
            run_config=tune.RunConfig(
                name=TUNE_DIR, storage_path=storage, verbose=0, callbacks=[_Progress(len(trials), base.total_steps)]
            ),
        )
    outcomes = []
    grid = tuner.fit()
    # A trial that never reported has no config, but always its directory.
    for result in (grid[i] for i in range(len(grid))):
        frame = result.metrics_dataframe
        rows = [] if frame is None or EVAL not in frame else frame[[STEP, EVAL]].itertuples(index=False, name=None)
        curve = [(int(step), float(ret)) for step, ret in rows]
        error = None if result.error is None else _error_line(result.error)
        outcomes.append(TrialOutcome(by_name[Path(result.path).name], curve, error))
    order = {t.run.name: i for i, t in enumerate(trials)}
    return sorted(outcomes, key=lambda o: order[o.trial.run.name])
