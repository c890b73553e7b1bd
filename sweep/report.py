"""What a sweep leaves behind: ``summary.json`` (per config IQM, 95% interval, median, per-seed returns, wall
time, cost and time to a target return, and the ranking), the terminal table and ``curves.png``. Functions
of the trials' outcomes and their run dirs' clocks (``wall_s`` in ``trainer_state.json`` and ``metrics.csv``);
no Ray."""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sac_edge.common.atomic import atomic_path, atomic_write_json
from sac_edge.common.bounded import read_capped
from sac_edge.common.jsonfile import read_json_or_none
from sac_edge.common.summary import json_safe
from sac_edge.common.table import format_table
from sac_edge.train import checkpoint as ckpt
from sac_edge.train.cost import dollars

from .grid import TrialOutcome
from .state import MAX_METRICS_BYTES
from .stats import iqm_interval

SUMMARY = "summary.json"
CURVES = "curves.png"


def trial_status(outcome: TrialOutcome, total_steps: int) -> str:
    """completed (reached --total-steps), error, stopped (by ASHA or Ctrl-C), or pending (never reported)."""
    if outcome.error is not None:
        return "error"
    if not outcome.curve:
        return "pending"
    return "completed" if outcome.curve[-1][0] >= total_steps else "stopped"


def _clock(run: Path) -> dict[int, float]:
    """step -> the run's training seconds at that ``metrics.csv`` row (none for runs older than ``wall_s``)."""
    path = run / ckpt.METRICS
    if not path.is_file():
        return {}
    text = read_capped(path, MAX_METRICS_BYTES, "metrics log", "delete the trial's run dir to rerun it")
    clock = {}
    for row in csv.DictReader(io.StringIO(text.decode(errors="replace"))):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            clock[int(row["step"])] = float(row["wall_s"])
    return clock


def _trial_time(outcome: TrialOutcome, target: float | None) -> tuple[float | None, float | None]:
    """(seconds trained up to the last checkpoint, seconds to the first evaluation at or above ``target``)."""
    state = read_json_or_none(outcome.trial.run / ckpt.TRAINER_STATE)
    wall = state.get("wall_s") if state else None
    reached = next((step for step, ret in outcome.curve if target is not None and ret >= target), None)
    to_target = None if reached is None else _clock(outcome.trial.run).get(reached)
    return (float(wall) if isinstance(wall, (int, float)) else None), to_target


def _trial_row(outcome: TrialOutcome, total_steps: int, target: float | None) -> dict[str, Any]:
    status = trial_status(outcome, total_steps)
    last = outcome.curve[-1] if outcome.curve else (None, None)
    wall, to_target = _trial_time(outcome, target)
    return {
        "config": outcome.trial.point.label,
        "seed": outcome.trial.seed,
        "run": str(outcome.trial.run),
        "status": status,
        "step": last[0],
        "return": last[1],
        "error": outcome.error,
        "wall_s": wall,
        "time_to_target_s": to_target,
    }


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else None


def _time_entry(rows: list[dict[str, Any]], price_per_hour: float) -> dict[str, Any]:
    """A config's clock: median seconds (and dollars) per run over its completed seeds (a stopped or
    interrupted run's time is not a run's), and time to the target over every seed that reached it."""
    wall = _median([r["wall_s"] for r in rows if r["status"] == "completed"])
    return {
        "wall_s": wall,
        "cost_usd": dollars(wall, price_per_hour),
        "time_to_target_s": _median([r["time_to_target_s"] for r in rows]),
        "reached_target": sum(r["time_to_target_s"] is not None for r in rows),
    }


def _config_entry(label: str, rows: list[dict[str, Any]], values: dict[str, Any]) -> dict[str, Any]:
    done = [r for r in rows if r["status"] == "completed"]
    returns = [float(r["return"]) for r in done]
    entry: dict[str, Any] = {
        "config": label,
        "values": values,
        "seeds": len(rows),
        "completed": len(done),
        "per_seed": {str(r["seed"]): r["return"] if r["status"] == "completed" else None for r in rows},
        "iqm": None,
        "ci95": None,
        "median": None,
        "best_run": None,
    }
    if returns:
        interval = iqm_interval(returns)
        best = max(done, key=lambda r: float(r["return"]))
        entry.update(
            iqm=interval.iqm,
            ci95=None if interval.low is None else [interval.low, interval.high],
            median=float(np.median(returns)),
            best_run=best["run"],
            best_seed=best["seed"],
            best_return=best["return"],
        )
    return entry


def summarize(
    outcomes: Sequence[TrialOutcome],
    total_steps: int,
    target_return: float | None = None,
    price_per_hour: float = 0.0,
    **facts: Any,
) -> dict[str, Any]:
    """The sweep's summary: ``facts`` (engine, versions, wall time, ...), every trial, every config ranked by
    IQM of the final deterministic return over its completed seeds (configs without one last) with its time
    and cost per run and time to ``target_return``, and the best."""
    rows = [_trial_row(o, total_steps, target_return) for o in outcomes]
    labels: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        labels.setdefault(o.trial.point.label, o.trial.point.values)
    configs = []
    for label, values in labels.items():
        config_rows = [r for r in rows if r["config"] == label]
        configs.append({**_config_entry(label, config_rows, values), **_time_entry(config_rows, price_per_hour)})
    configs.sort(key=lambda c: (c["iqm"] is None, -(c["iqm"] or 0.0)))
    for rank, entry in enumerate(configs, 1):
        entry["rank"] = rank if entry["iqm"] is not None else None
    top = configs[0] if configs and configs[0]["iqm"] is not None else None
    best = None
    if top is not None:
        best = {k: top[k] for k in ("config", "values", "iqm", "ci95", "median")}
        best.update(run=top["best_run"], seed=top["best_seed"], final_return=top["best_return"])
    return json_safe(
        {
            **facts,
            "total_steps": total_steps,
            "target_return": target_return,
            "price_per_hour": price_per_hour or None,
            "trials": len(rows),
            "completed": sum(r["status"] == "completed" for r in rows),
            "errors": sum(r["status"] == "error" for r in rows),
            "configs": configs,
            "best": best,
            "trial_results": rows,
        }
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(summary: dict[str, Any]) -> str:
    """The ranking as a plain-text table, one row per config; time per run, its cost (with a price) and the
    time to the target return (with one) before the per-seed returns."""
    price, target = summary.get("price_per_hour"), summary.get("target_return")
    header = ["rank", "config", "IQM", "95% CI", "median", "seeds", "wall s/run"]
    header += (["$/run"] if price else []) + ([f"s to {target:g}", "reached"] if target is not None else [])
    rows = []
    for c in summary["configs"]:
        ci = "-" if c["ci95"] is None else f"[{_fmt(c['ci95'][0])}, {_fmt(c['ci95'][1])}]"
        per_seed = " ".join(_fmt(v) for v in c["per_seed"].values())
        rank = "-" if c["rank"] is None else c["rank"]
        row = [rank, c["config"], _fmt(c["iqm"]), ci, _fmt(c["median"]), f"{c['completed']}/{c['seeds']}"]
        row.append(_fmt(c["wall_s"]))
        row += [f"{c['cost_usd']:.2f}" if c["cost_usd"] is not None else "-"] if price else []
        if target is not None:
            row += [_fmt(c["time_to_target_s"]), f"{c['reached_target']}/{c['seeds']}"]
        rows.append([*row, per_seed])
    return format_table(rows, [*header, "final return per seed"])


def curves(outcomes: Sequence[TrialOutcome]) -> dict[str, list[dict[str, Any]]]:
    """Per config, at each evaluation step: the IQM over the seeds that reached it, with its 95% interval."""
    out: dict[str, list[dict[str, Any]]] = {}
    for label in dict.fromkeys(o.trial.point.label for o in outcomes):
        by_step: dict[int, list[float]] = {}
        for o in outcomes:
            if o.trial.point.label == label:
                for step, ret in o.curve:
                    by_step.setdefault(step, []).append(ret)
        points = []
        for step in sorted(by_step):
            interval = iqm_interval(by_step[step])
            points.append({"step": step, "iqm": interval.iqm, "low": interval.low, "high": interval.high})
        out[label] = points
    return out


def plot_curves(data: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    """``curves.png``: IQM of the evaluation return per config, the 95% interval as a band (written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for label, points in data.items():
        if not points:
            continue
        steps = [p["step"] for p in points]
        (line,) = ax.plot(steps, [p["iqm"] for p in points], label=label)
        band = [p for p in points if p["low"] is not None]
        if band:
            ax.fill_between(
                [p["step"] for p in band],
                [p["low"] for p in band],
                [p["high"] for p in band],
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
            )
    ax.set_xlabel("environment steps")
    ax.set_ylabel("evaluation return (IQM, 95% CI)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


def write_summary(summary: dict[str, Any], sweep_dir: Path) -> Path:
    """``DIR/summary.json``, atomically."""
    path = sweep_dir / SUMMARY
    atomic_write_json(path, summary)
    return path
