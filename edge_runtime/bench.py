"""``sac-edge bench``: latency, throughput, energy per inference and peak memory per backend x precision x batch.

The bundle is verified by the run's builder (``compose.verified_bundle``) and each backend opens through
the registry (``registry.open_backend``, which gates it), as in ``sac-edge run``. Each row: ``warmup``
untimed calls, then ``calls`` timed ones (batch 1 through ``act``, the control loop's path; larger batches
through ``act_batch``), while a background thread samples the power sensor.
Energy per inference is the board (or package) energy over the timed window divided by the inferences
in it: measured where the machine has a power sensor, else the labelled estimate, and the row says which.
Peak memory is the process's resident high-water mark after the row.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sac_edge.common.atomic import atomic_path, atomic_write_json, check_new_file
from sac_edge.common.bundle import Bundle
from sac_edge.common.config import config_dict
from sac_edge.common.cpus import check_threads
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.latency import latency_us, time_calls
from sac_edge.common.table import format_table
from sac_edge.edge_runtime.backends.autoselect import is_absent, probe_observations
from sac_edge.edge_runtime.backends.base import Backend, BackendOptions
from sac_edge.edge_runtime.backends.registry import Candidate, candidates, check_precision, kind, open_backend
from sac_edge.edge_runtime.budget.memory import MemoryProbe
from sac_edge.edge_runtime.budget.sensors import EnergyMeter, detect_power_sensor

from .compose import verified_bundle
from .config import BenchConfig

#: The largest batch bench times (each probe batch is allocated up front).
MAX_BATCH = 1 << 16
MAX_CALLS = 10**7  # timed calls per row: their timings are kept (80 MB at the cap)


def _validate(cfg: BenchConfig) -> None:
    for name in cfg.backends:
        kind(name)
    for precision in cfg.precisions:
        check_precision(precision)
    if not cfg.batch or any(not 1 <= b <= MAX_BATCH for b in cfg.batch):
        raise SacEdgeError(f"--batch needs sizes from 1 to {MAX_BATCH}, got {','.join(map(str, cfg.batch))}")
    for flag, path in (("--out", cfg.out), ("--plot", cfg.plot)):
        if path:
            check_new_file(path, flag, replace=cfg.overwrite, replace_flag="--overwrite")
    if not (1 <= cfg.calls <= MAX_CALLS and 0 <= cfg.warmup <= MAX_CALLS):  # the timings are kept per call
        raise SacEdgeError(f"--calls must be from 1 and --warmup from 0, both to {MAX_CALLS}")
    check_threads(cfg.threads)
    if not os.path.isdir(cfg.sensor_root):  # as sac-edge run: else every power row is silently "no sensor"
        raise SacEdgeError(f"--sensor-root {cfg.sensor_root!r} is not a directory; pass / on the device")
    if cfg.plot:
        try:
            import matplotlib  # noqa: F401  (the device install has none; fail before measuring)
        except ImportError:
            raise SacEdgeError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None


def bench_command(cfg: BenchConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """Measure every usable backend x precision x batch; write ``--out`` and ``--plot`` when given."""
    _validate(cfg)
    bundle = verified_bundle(cfg)
    usable = _usable(cfg, bundle, log)
    meter = EnergyMeter(detect_power_sensor(Path(cfg.sensor_root)))
    rows = _Rows(cfg, meter, probe_observations(bundle.spec.obs_dim, count=max(cfg.batch) + 64))
    try:
        for cand in usable:
            backend = open_backend(bundle, cand.backend, cand.precision, BackendOptions(threads=cfg.threads))
            for batch in cfg.batch:
                row = rows.measure(backend, cand, batch)
                log(f"bench: {cand.backend}/{cand.precision}/b{batch}: p99 {row['latency_us']['p99']} us")
            backend.close()
    finally:
        meter.sensor.close()
    result = {
        "bundle": str(bundle.path),
        "rows": rows.rows,
        "power_source": meter.sensor.source,
        "power_measured": bool(meter.sensor.measured),
        "config": config_dict(cfg),
    }
    if cfg.out:
        atomic_write_json(cfg.out, result, replace=cfg.overwrite)
    if cfg.plot:
        plot(
            rows.samples, rows.power, Path(cfg.plot), meter.sensor.measured, meter.sensor.source, replace=cfg.overwrite
        )
    return result


def _usable(cfg: BenchConfig, bundle: Bundle, log: Callable[[str], None]) -> list[Candidate]:
    """The backend x precision pairs that can run here, or a refusal (one line) when ``--backend`` and
    ``--precision`` named exactly what to run. What does not exist here is one line (``skipped_line``); a
    refusal that is a finding (a precision the gate rejected) is a line of its own."""
    usable, skipped = [], []
    for cand in candidates(bundle, cfg.backends or None, cfg.precisions or None):
        if cand.refusal is None:
            usable.append(cand)
        elif cfg.backends and cfg.precisions:
            raise SacEdgeError(cand.refusal)
        elif is_absent(cand.refusal):
            skipped.append(cand)
        else:
            log(f"bench: skipping {cand.backend}/{cand.precision}: {cand.refusal}")
    if skipped:
        log(skipped_line(skipped))
    if not usable:
        raise SacEdgeError("bench: no backend x precision can run this bundle here")
    return usable


def skipped_line(skipped: Sequence[Candidate]) -> str:
    """One line for the candidates that do not exist here: the backends not installed (each once), then the
    backend/precision pairs the bundle has no graph for."""
    absent = list(dict.fromkeys(c.backend for c in skipped if "unavailable" in (c.refusal or "")))
    missing = [f"{c.backend}/{c.precision}" for c in skipped if c.backend not in absent]
    parts = [f"{', '.join(absent)} (not installed here: sac-edge doctor says why)"] if absent else []
    parts += [f"{', '.join(missing)} (not in the bundle)"] if missing else []
    return "bench: skipping " + "; ".join(parts)


class _Rows:
    """Times one backend x batch at a time and keeps the results: the rows, each row's latencies in us (for
    the plot) and the power readings over the whole bench, as (seconds since the first, watts, row)."""

    def __init__(self, cfg: BenchConfig, meter: EnergyMeter, probes: np.ndarray) -> None:
        self.calls, self.warmup, self.meter, self.probes = cfg.calls, cfg.warmup, meter, probes
        self.memory = MemoryProbe()
        self.rows: list[dict[str, Any]] = []
        self.samples: dict[str, np.ndarray] = {}
        self.power: list[tuple[float, float, str]] = []
        self.t0: float | None = None

    def measure(self, backend: Backend, cand: Candidate, batch: int) -> dict[str, Any]:
        """``warmup`` untimed and ``calls`` timed calls at ``batch`` while the power sensor is sampled."""
        meter, label = self.meter, f"{cand.backend}/{cand.precision}/b{batch}"
        meter.reset()
        with meter.sampling(0.02):
            ns = time_calls(_caller(backend, self.probes, batch), self.calls, self.warmup)
        if meter.readings:  # none where the machine has neither a sensor nor a power model
            self.t0 = meter.readings[0].timestamp if self.t0 is None else self.t0
            self.power += [(r.timestamp - self.t0, r.total_w, label) for r in meter.readings]
        inferences = self.calls * batch
        metered = len(meter.readings) > 1
        row = {
            "backend": cand.backend,
            "precision": cand.precision,
            "batch": batch,
            "calls": self.calls,
            "latency_us": latency_us(ns),
            "throughput_per_s": round(inferences / (ns.sum() / 1e9), 1),
            "energy_mj_per_inference": round(meter.millijoules_per(inferences), 6) if metered else None,
            "energy": ("measured" if meter.measured else "estimated") if metered else "none",
            "power_w": round(meter.mean_power_w, 3) if metered else None,
            "power_source": meter.sensor.source,
            "peak_rss_mb": round(self.memory.read().peak_rss_mb, 1),
        }
        self.rows.append(row)
        self.samples[label] = ns / 1000.0
        return row


def _caller(backend: Backend, probes: np.ndarray, batch: int) -> Callable[[int], object]:
    """Batch 1 through ``act`` (the control loop's path), larger batches through ``act_batch``."""
    if batch == 1:
        return lambda i: backend.act(probes[i % 64])
    return lambda i: backend.act_batch(probes[i % 64 : i % 64 + batch])


def bench_table(rows: list[dict[str, Any]]) -> str:
    header = ("backend", "precision", "batch", "p50 us", "p99 us", "max us", "inf/s", "mJ/inf", "energy", "peak MB")
    body = [
        (
            r["backend"],
            r["precision"],
            r["batch"],
            r["latency_us"]["p50"],
            r["latency_us"]["p99"],
            r["latency_us"]["max"],
            r["throughput_per_s"],
            r["energy_mj_per_inference"],
            r["energy"],
            r["peak_rss_mb"],
        )
        for r in rows
    ]
    return format_table(body, header)


def plot(
    samples: dict[str, np.ndarray],
    power: list[tuple[float, float, str]],
    path: Path,
    measured: bool,
    source: str = "",
    *,
    replace: bool = False,
) -> None:
    """Latency distributions per row (log scale) and, where a sensor measured it, power over the bench (seconds
    from its first sample), written atomically (an existing ``path`` replaced only with ``replace``). An
    estimate is no measurement: it is left out, and the title says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = measured and bool(power)
    fig, axes = plt.subplots(2 if drawn else 1, 1, figsize=(10, 8 if drawn else 4.5), squeeze=False)
    ax_lat = axes[0][0]
    labels = list(samples)
    ax_lat.boxplot([samples[k] for k in labels], whis=(1, 99), showfliers=False)
    ax_lat.set_xticks(range(1, len(labels) + 1), labels, rotation=30, ha="right", fontsize=8)
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("latency per call (us), whiskers p1-p99")
    unplotted = "" if drawn else f"\npower not plotted: {_no_power(measured, source)}"
    ax_lat.set_title(f"sac-edge bench: latency per backend / precision / batch{unplotted}", fontsize=10)
    if drawn:
        ax_pow, t0 = axes[1][0], min(t for t, _, _ in power)
        for label in labels:
            pts = [(t - t0, w) for t, w, lab in power if lab == label]
            if pts:
                ax_pow.plot(*zip(*pts), marker=".", label=label)
        ax_pow.set_xlabel("time since the first power sample (s)")
        ax_pow.set_ylabel("power (W)")
        ax_pow.set_title(f"power, measured by {source}", fontsize=10)
        ax_pow.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    with atomic_path(path, replace=replace) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)


def _no_power(measured: bool, source: str) -> str:
    """Why a plot has no power panel."""
    if not measured and source not in ("", "none"):
        return f"{source} is an estimate, not a measurement (bench.json keeps it, labelled)"
    return "no power sensor" if not measured else "no power sample was taken"
