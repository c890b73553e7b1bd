"""What a sweep leaves behind: ``summary.json`` (per config IQM, 95% interval, median, per-seed returns and
the ranking), the terminal table and ``curves.png``. Pure functions of the trials' outcomes; no Ray."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sac_edge.common.atomic import atomic_path, atomic_write_json
from sac_edge.common.summary import json_safe
from sac_edge.common.table import format_table

from .grid import TrialOutcome
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


def _trial_row(outcome: TrialOutcome, total_steps: int) -> dict[str, Any]:
    status = trial_status(outcome, total_steps)
    last = outcome.curve[-1] if outcome.curve else (None, None)
    return {
        "config": outcome.trial.point.label,
        "seed": outcome.trial.seed,
        "run": str(outcome.trial.run),
        "status": status,
        "step": last[0],
        "return": last[1],
        "error": outcome.error,
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


def summarize(outcomes: Sequence[TrialOutcome], total_steps: int, **facts: Any) -> dict[str, Any]:
    """The sweep's summary: ``facts`` (engine, versions, wall time, ...), every trial, every config ranked by
    IQM of the final deterministic return over its completed seeds (configs without one last), and the best."""
    rows = [_trial_row(o, total_steps) for o in outcomes]
    labels: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        labels.setdefault(o.trial.point.label, o.trial.point.values)
    configs = [_config_entry(label, [r for r in rows if r["config"] == label], v) for label, v in labels.items()]
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
    """The ranking as a plain-text table, one row per config."""
    rows = []
    for c in summary["configs"]:
        ci = "-" if c["ci95"] is None else f"[{_fmt(c['ci95'][0])}, {_fmt(c['ci95'][1])}]"
        per_seed = " ".join(_fmt(v) for v in c["per_seed"].values())
        rank = "-" if c["rank"] is None else c["rank"]
        rows.append(
            [rank, c["config"], _fmt(c["iqm"]), ci, _fmt(c["median"]), f"{c['completed']}/{c['seeds']}", per_seed]
        )
    return format_table(rows, ["rank", "config", "IQM", "95% CI", "median", "seeds", "final return per seed"])


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
