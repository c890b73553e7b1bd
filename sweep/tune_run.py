"""The Ray Tune side of ``sac-sweep``: a local or joined Ray, the trial function and the Tuner.

A trial is ``sac-train``'s own ``Trainer`` in a Ray worker, writing an ordinary run dir; the only addition
is that each evaluation is reported to Tune right after the checkpoint holding it is on disk, so a trial
that ASHA stops (or Ctrl-C interrupts) is a whole run dir whose last reported return was measured on its
saved weights. On ``--resume`` a fresh Tuner runs the trials that had not ended (``state``), each continuing
its run dir with ``sac-train --resume``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import shutil
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
from sac_edge.train.threads import usable_cpus
from sac_edge.train.trainer import Trainer

from . import state
from .grid import Trial

EVAL = "eval_return"
STEP = "step"
TUNE_DIR = "tune"
NAME = "trial"
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
    """The run name of a Tune trial (its run dir under ``DIR/trials/``), from its config."""
    return str(trial.config[NAME])


def _run_trial(config: dict[str, Any], base: TrainConfig, trials: dict[str, Trial]) -> None:
    """One Tune trial: ``config`` names the trial (grid point and seed); ``base`` holds every other option."""
    trial = trials[config[NAME]]
    resume = (trial.run / ckpt.CHECKPOINT).exists()
    cfg = dataclasses.replace(
        base,
        **trial.point.values,
        seed=trial.seed,
        threads=int(trial_resources(base)["cpu"]),  # its share of the node: no probe, no oversubscription
        out=str(trial.run),
        resume=resume,
        force=not resume,
        progress=False,
        json=False,
        checkpoint_every=base.eval_every,
    )
    _ReportingTrainer(cfg).train()


def trial_resources(base: TrainConfig) -> dict[str, float]:
    """CPUs per trial = ``--threads`` (0 means 1, so trials do not oversubscribe: the trial runs with that many
    threads, ``--threads 0``'s probe off); one GPU with ``--device cuda``."""
    return {"cpu": max(base.threads, 1), "gpu": 1 if base.device == "cuda" else 0}


LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's single-machine mode, node IP 127.0.0.1


@contextmanager
def _loopback_only() -> Iterator[None]:
    """Ray's single-machine mode for the ``with`` block, whenever ray was imported.

    Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, at import, into ``ray_constants.ENABLE_RAY_CLUSTER``;
    while it is true ``ray.init`` replaces a loopback ``_node_ip_address`` by the machine's routable address
    and GCS, raylet, agents and workers listen on every interface. Setting both (the constant for this
    process, the variable for the processes it starts) makes the node address, and so every listener, the
    loopback; both are restored afterwards.
    """
    from ray._private import ray_constants

    saved_env, saved = os.environ.get(LOOPBACK_ONLY), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOOPBACK_ONLY], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(LOOPBACK_ONLY, None)
        else:
            os.environ[LOOPBACK_ONLY] = saved_env


@contextmanager
def ray_session(address: str | None, cpus: int, resources: dict[str, float]) -> Iterator[None]:
    """A local Ray on this machine's cores (every listener on the loopback, no dashboard), shut down at the
    end, or the cluster at ``address``, left running. Refuses, before any trial starts, a trial bigger than
    the whole cluster, and a local Ray whose node address is not the loopback."""
    with contextlib.ExitStack() as stack:
        if address is None:
            stack.enter_context(_loopback_only())
            ray.init(
                address="local",
                num_cpus=cpus or usable_cpus().n,  # the CPUs this process may use, not the host's
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
            node_ip = ray.util.get_node_ip_address()
            if address is None and not ipaddress.ip_address(node_ip).is_loopback:
                raise SacEdgeError(
                    f"the local Ray came up on {node_ip}, not the loopback (this Ray release ignores its "
                    "single-machine mode); install ray[tune] 2.50 to 2.60, or start a Ray yourself and pass --address"
                )
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
    """One stderr line as each trial ends, and the ended trials saved in ``DIR/trial_state.json`` (what
    ``--resume`` does not run again: Tune calls neither hook for a trial that Ctrl-C interrupts)."""

    def __init__(self, total: int, total_steps: int, sweep_dir: Path, ended: dict[str, str | None]) -> None:
        self.total, self.total_steps, self.done = total, total_steps, len(ended)
        self.sweep_dir, self.ended = sweep_dir, ended

    def _line(self, trial: Any, what: str, error: str | None = None) -> None:
        self.done += 1
        self.ended[_name(trial)] = error
        state.record_ended(self.sweep_dir, self.ended)
        print(f"sac-sweep: [{self.done}/{self.total}] {_name(trial)}: {what}", file=sys.stderr, flush=True)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        last = trial.last_result or {}
        if last.get(EVAL) is None:
            self._line(trial, "no evaluation")
        else:
            stopped = f" (stopped at step {last[STEP]})" if last[STEP] < self.total_steps else ""
            self._line(trial, f"return {last[EVAL]:.1f}{stopped}")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._line(trial, "failed", _error_line(RuntimeError(trial.get_error() or "failed")))


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
    ended: dict[str, str | None],
) -> None:
    """Run ``trials`` (those not yet ended; each continues its run dir if it has a checkpoint) on the current
    Ray, adding each trial that ends to ``ended`` (with its error line if it failed).

    A trial that raises is recorded with its error; the others go on. Ctrl-C stops Tune cleanly and returns.
    Tune's experiment state (``DIR/tune``) is written for Tune's own use only: a fresh Tuner replaces it
    each session and nothing of it is ever restored.
    """
    by_name = {t.run.name: t for t in trials}
    trainable = tune.with_resources(tune.with_parameters(_run_trial, base=base, trials=by_name), trial_resources(base))
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no Tune tables on stdout
    storage = sweep_dir.resolve()
    _remove(storage / TUNE_DIR)
    total = len(ended) + len(trials)
    tuner = tune.Tuner(
        trainable,
        param_space={NAME: tune.grid_search(list(by_name))},
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
            name=TUNE_DIR,
            storage_path=str(storage),
            verbose=0,
            callbacks=[_Progress(total, base.total_steps, storage, ended)],
        ),
    )
    grid = tuner.fit()
    # A trial that never reported has no config, but always its directory.
    for result in (grid[i] for i in range(len(grid))):
        if result.error is not None:
            ended[Path(result.path).name] = _error_line(result.error)
    state.record_ended(storage, ended)


def _remove(path: Path) -> None:
    """Delete an earlier session's Tune state (a symlink itself, never what it points to)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
