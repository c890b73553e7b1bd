"""``sac-edge replay --plot FILE``: one PNG read at a glance. Left: every observation slot's recorded range
against its training range, in training standard deviations from the training mean (a finding's slots in
red). Right: per action joint, the policy's command and the robot's over the log, the states the shield
stepped in on shaded, and the joint's findings in its title. matplotlib is imported here only."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from sac_edge.common.atomic import atomic_write_bytes
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.io_layout import IoLayout

from .analysis import Log
from .findings import Slot
from .reference import Reference

WINDOW = 300
"""States drawn in the command traces: the first ones, where a start-up problem shows (the statistics and
the findings are of the whole log)."""


def write_plot(
    path: str,
    report: dict[str, Any],
    log: Log,
    layout: IoLayout,
    slots: list[Slot],
    reference: Reference,
    overwrite: bool,
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SacEdgeError("--plot needs matplotlib (pip install matplotlib)") from None
    joints = layout.action.joints
    flagged = {j for f in report["findings"] for j in f["joints"]}
    fig = plt.figure(figsize=(14, max(6.0, 1.6 * len(joints))), constrained_layout=True)
    grid = fig.add_gridspec(len(joints), 2, width_ratios=[1, 1.6])
    _ranges(fig.add_subplot(grid[:, 0]), log, slots, reference, flagged)
    _commands(fig, grid, report, log, joints)
    verdict = report["verdict"].upper()
    fig.suptitle(
        f"sac-edge replay: {report['steps']} states, {report['commands_compared']} commands: {verdict}"
        + "".join(f"\n{f['kind']}: {', '.join(f['joints'])}" for f in report["findings"][:6]),
        color="tab:red" if report["findings"] else "tab:green",
        fontsize=10,
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue(), replace=overwrite)


def _ranges(ax: Any, log: Log, slots: list[Slot], reference: Reference, flagged: set[str]) -> None:
    mean = reference.states.mean(axis=0) if reference.states is not None else (reference.low + reference.high) / 2
    std = np.maximum(reference.spread, 1e-9)
    y = np.arange(len(slots))[::-1]
    low, high = (reference.low - mean) / std, (reference.high - mean) / std
    rec = (np.asarray(log.obs, np.float64) - mean) / std
    r_lo, r_hi = np.percentile(rec, 1, axis=0), np.percentile(rec, 99, axis=0)
    ax.barh(y, high - low, left=low, height=0.7, color="0.85", label="training range")
    colors = ["tab:red" if set(s.joints) & flagged else "tab:blue" for s in slots]
    ax.hlines(y, np.clip(r_lo, -12, 12), np.clip(r_hi, -12, 12), colors=colors, lw=3, label="recorded p1-p99")
    ax.set_yticks(y, [s.name for s in slots], fontsize=7)
    ax.set_xlim(-12, 12)
    ax.set_xlabel("training std from the training mean (clipped at 12)")
    ax.legend(loc="lower right", fontsize=7)
    ax.set_title("observation: recorded vs training", fontsize=9)


def _commands(fig: Any, grid: Any, report: dict[str, Any], log: Log, joints: tuple[str, ...]) -> None:
    shown = np.arange(min(WINDOW, len(log.times)))
    shielded = report.get("shield", {}).get("first_steps", [])
    by_joint: dict[str, list[str]] = {}
    for f in report["findings"]:
        for joint in f["joints"]:
            by_joint.setdefault(joint, []).append(f["kind"])
    for k, joint in enumerate(joints):
        ax = fig.add_subplot(grid[k, 1])
        if len(log.commands):
            keep = log.command_steps < len(shown)
            ax.plot(log.command_steps[keep], log.commands[keep, k], lw=0.7, color="tab:orange", alpha=0.8,
                    label="robot command")  # fmt: skip
        ax.plot(shown, log.policy[shown, k], lw=1.2, color="tab:blue", label="policy")
        for s in shielded:
            if s < len(shown):
                ax.axvspan(s - 0.5, s + 0.5, color="tab:red", alpha=0.2)
        kinds = by_joint.get(joint)
        ax.set_title(f"{joint}" + (f": {', '.join(kinds)}" if kinds else ""), fontsize=8,
                     color="tab:red" if kinds else "black")  # fmt: skip
        ax.tick_params(labelsize=7)
        if k == 0:
            ax.legend(loc="upper right", fontsize=7)
    ax.set_xlabel("state")
