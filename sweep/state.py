"""A sweep's progress read back without Ray: each trial's evaluations from its run dir and the trials that
ended (completed, stopped by the scheduler, failed) from ``DIR/trial_state.json``.

``--resume`` is rebuilt from these JSON and CSV files only. Ray Tune's own experiment state is pickled
(``tuner.pkl``, trial states): restoring it from a directory that may have been copied from elsewhere would
run whatever code the pickles name, so it is never read back.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.bounded import MAX_JSON_BYTES, read_capped
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.jsonfile import read_json_or_none
from sac_edge.train import checkpoint as ckpt

from .grid import Trial, TrialOutcome

TRIAL_STATE = "trial_state.json"
#: DIR/logs/<trial>.log: the traceback of a trial that failed, the Ray error of one that lost its node.
LOGS = "logs"
#: metrics.csv holds one row per 1000 steps: 16 MiB is far more than any sweep's trial writes.
MAX_METRICS_BYTES = MAX_JSON_BYTES


def saved_step(run: Path) -> int:
    """The step of a run dir's last checkpoint (0 when it has none or its state file is unreadable)."""
    state = read_json_or_none(run / ckpt.TRAINER_STATE)
    step = state.get("step") if state else None
    return step if isinstance(step, int) and step >= 0 else 0


def curve(run: Path) -> list[tuple[int, float]]:
    """The (step, eval_return) rows of ``run/metrics.csv`` up to its last checkpoint (the evaluations a trial
    reported: each is followed by the checkpoint holding the weights it measured)."""
    path = run / ckpt.METRICS
    if not path.is_file():
        return []
    last = saved_step(run)
    text = read_capped(path, MAX_METRICS_BYTES, "metrics log", "delete the trial's run dir to rerun it")
    points = []
    try:
        for row in csv.DictReader(io.StringIO(text.decode())):
            step, ret = int(row["step"]), row.get("eval_return") or ""
            if ret and step <= last and math.isfinite(float(ret)):
                points.append((step, float(ret)))
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, csv.Error) as err:
        fix = "delete the trial's run dir to rerun it"
        raise SacEdgeError(f"{path}: not a sac-train metrics log ({err}); {fix}") from None
    return points


def ended(sweep_dir: Path) -> dict[str, str | None]:
    """The trials that ended in an earlier session: run name -> its error line (None: completed or stopped)."""
    data = read_json_or_none(sweep_dir / TRIAL_STATE) or {}
    trials = data.get("ended")
    if not isinstance(trials, dict):
        return {}
    return {k: v if isinstance(v, str) else None for k, v in trials.items() if isinstance(k, str)}


def record_ended(sweep_dir: Path, trials: dict[str, str | None]) -> None:
    """Save the ended trials (atomically; rewritten as each trial ends, so a killed sweep keeps them)."""
    atomic_write_json(sweep_dir / TRIAL_STATE, {"ended": trials})


def to_run(trials: Sequence[Trial], total_steps: int, done: dict[str, str | None]) -> list[Trial]:
    """The trials a session still has to run: not ended before and not at ``total_steps`` in their run dir."""
    return [t for t in trials if t.run.name not in done and saved_step(t.run) < total_steps]


def outcomes(trials: Sequence[Trial], errors: dict[str, str | None]) -> list[TrialOutcome]:
    """Every trial's outcome from its run dir, with the error of those in ``errors`` that failed."""
    return [TrialOutcome(t, curve(t.run), errors.get(t.run.name)) for t in trials]
