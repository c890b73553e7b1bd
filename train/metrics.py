"""Training metrics: ``metrics.csv`` always, TensorBoard event files when tensorboard is installed."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

COLUMNS = (
    "step",
    "updates",
    "episodes",
    "train_return",
    "eval_return",
    "critic_loss",
    "actor_loss",
    "alpha",
    "steps_per_s",
    "updates_per_s",
    # The interval's cost (train/monitor.py); empty where this machine cannot measure it.
    "update_ms_p50",
    "update_ms_p99",
    "rss_mb",
    "peak_rss_mb",
    "cpu_util_pct",
    "cuda_max_allocated_mb",
    "cuda_max_reserved_mb",
    "gpu_util_pct",
    "gpu_power_w",
    "eta_s",
    "wall_s",
)


class MetricsLog:
    """Appends one CSV row per log event (every ``--log-every`` steps, each evaluation, the end); on resume,
    rows after the resumed step are dropped first."""

    def __init__(self, run_dir: Path, resume_step: int | None) -> None:
        self.path = run_dir / "metrics.csv"
        if resume_step is not None and self.path.exists():
            with open(self.path, newline="") as fh:
                rows = [r for r in csv.DictReader(fh) if int(r["step"]) <= resume_step]
        else:
            rows = []
        with open(self.path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        self._tb = _tensorboard(run_dir)

    def log(self, row: dict[str, Any]) -> None:
        with open(self.path, "a", newline="") as fh:
            csv.DictWriter(fh, fieldnames=COLUMNS).writerow({k: row.get(k, "") for k in COLUMNS})
        if self._tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(f"sac/{key}", value, row["step"])
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _tensorboard(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional; metrics.csv always exists
        return None
    return SummaryWriter(log_dir=str(run_dir / "tb"))
