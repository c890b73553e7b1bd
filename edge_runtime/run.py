"""``sac-edge run``: verify the bundle, check the env against it, pick the backend, then drive the loop.

Everything that can be wrong with the input (bundle, checksum, env, shapes, backend, precision, gate,
budgets) is checked before the first step and is a one-line error. With budgets, the backend is also
opened at each cheaper precision the gate accepted, so a governor precision switch is a reference swap.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sac_edge.common.config import config_dict
from sac_edge.common.envs import make_env
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.spec import PolicySpec

from .autoselect import autoselect
from .backend import PRECISION_ORDER, Backend, BackendOptions, open_bundle
from .config import RunConfig
from .governor import Governor, GovernorConfig, build_ladder
from .loop import ControlLoop, LoopSettings
from .memory import MemoryProbe
from .monitor import BudgetMonitor
from .registry import open_backend, refusal
from .sensors import detect_power_sensor
from .table import format_table
from .telemetry import StatusLine, TelemetryWriter

FINETUNE_NOT_BUILT = (
    "--finetune is not built yet (on-device fine-tuning arrives with the fine-tuning issue); run without it"
)


def check_env_matches(env: Any, spec: PolicySpec, name: str) -> None:
    """The env's observation and action sizes must be the bundle's, or the policy would be fed garbage."""
    obs_shape, act_shape = tuple(env.observation_space.shape), tuple(env.action_space.shape)
    if obs_shape != (spec.obs_dim,) or act_shape != (spec.act_dim,):
        raise SacEdgeError(
            f"{name}: observation {obs_shape} / action {act_shape} do not match the bundle's spec "
            f"(obs_dim={spec.obs_dim}, act_dim={spec.act_dim}, trained on {spec.env_id})"
        )


def validate(cfg: RunConfig) -> None:
    if cfg.finetune:
        raise SacEdgeError(FINETUNE_NOT_BUILT)
    if not cfg.rate_hz > 0:
        raise SacEdgeError(f"--rate-hz must be positive, got {cfg.rate_hz}")
    if cfg.duration < 0:
        raise SacEdgeError(f"--duration must be >= 0 (0 runs until stopped), got {cfg.duration}")
    if not 0 < cfg.inference_budget <= 1:
        raise SacEdgeError(f"--inference-budget is a fraction of the period in (0, 1], got {cfg.inference_budget}")
    if cfg.threads < 1 or cfg.auto_calls < 1:
        raise SacEdgeError("--threads and --auto-calls must be at least 1")


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[str], None]) -> Iterator[None]:
    """SIGINT and SIGTERM ask the loop to stop after its current step (handlers restored afterwards)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, lambda signum, _frame: stop(signal.Signals(signum).name))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def open_backends(cfg: RunConfig, bundle: Any, log: Callable[[str], None]) -> tuple[dict[str, Backend], list[Any]]:
    """The serving backend, plus (with budgets) the same backend at each cheaper accepted precision."""
    options = BackendOptions(threads=cfg.threads)
    figures: list[Any] = []
    if cfg.backend == "auto":
        precisions = [cfg.precision] if cfg.precision else None
        backend, figures = autoselect(bundle, options, precisions, calls=cfg.auto_calls, log=log)
    else:
        backend = open_backend(bundle, cfg.backend, cfg.precision or "fp32", options)
    backends = {backend.precision: backend}
    if cfg.mem_budget_mb is not None or cfg.power_budget_w is not None:
        cheaper = PRECISION_ORDER[PRECISION_ORDER.index(backend.precision) + 1 :]
        for precision in cheaper:
            if refusal(bundle, backend.name, precision) is None:
                backends[precision] = open_backend(bundle, backend.name, precision, options)
    return backends, figures


def run_command(cfg: RunConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """Run the loop per ``cfg`` and return the summary (also printed as a table by the CLI)."""
    validate(cfg)
    bundle = open_bundle(cfg.bundle)
    env_name = cfg.env or bundle.spec.env_id
    env = make_env(env_name)
    check_env_matches(env, bundle.spec, env_name)
    backends, figures = open_backends(cfg, bundle, log)
    first = next(iter(backends))
    governor = None
    if cfg.mem_budget_mb is not None or cfg.power_budget_w is not None:
        ladder = build_ladder(cfg.rate_hz, first, list(backends))
        governor = Governor(GovernorConfig(cfg.mem_budget_mb, cfg.power_budget_w), ladder)
    root = Path(cfg.sensor_root)
    sensor = detect_power_sensor(root) if cfg.telemetry or cfg.power_budget_w is not None else None
    monitor = BudgetMonitor(MemoryProbe(root), sensor, governor)
    status = StatusLine() if sys.stderr.isatty() else None
    settings = LoopSettings(cfg.rate_hz, cfg.duration, cfg.obs_fault, cfg.inference_budget, cfg.spin_us, cfg.seed)
    with TelemetryWriter(cfg.telemetry) as telemetry:
        telemetry.write(
            {
                "type": "config",
                "config": config_dict(cfg),
                "env": env_name,
                "backend": backends[first].describe(),
                "auto": [m._asdict() for m in figures],
                "power_source": sensor.source if sensor else None,
                "loaded_precisions": list(backends),
            }
        )
        loop = ControlLoop(env, backends, first, settings, monitor, telemetry.write, status)
        try:
            with stop_on_signals(loop.stop):
                summary = loop.run()
        finally:
            if status is not None:
                status.finish()
            monitor.close()
            env.close()
        summary |= {
            "env": env_name,
            "auto": [m._asdict() for m in figures if m.refusal is None or "unavailable" not in m.refusal],
            "torch_imported": "torch" in sys.modules,
            "telemetry_records": telemetry.records + 1,
        }
        telemetry.write({"type": "summary", **summary})
    return summary


def summary_table(summary: dict[str, Any]) -> str:
    """The end-of-run table (stdout)."""
    lat, jit = summary["latency_us"], summary["jitter_us"]
    rows = [
        ("steps / episodes", f"{summary['steps']} / {summary['episodes']}"),
        ("duration", f"{summary['duration_s']:.2f} s at {summary['rate_hz']:g} Hz (now {summary['final_rate_hz']:g})"),
        (
            "deadline misses",
            f"{summary['deadline_misses']} ({100 * summary['miss_rate']:.3f}%), "
            f"skipped slots {summary['skipped_slots']}",
        ),
        ("inference latency", f"p50 {lat['p50']} us  p99 {lat['p99']} us  max {lat['max']} us"),
        ("loop jitter", f"p50 {jit['p50']} us  p99 {jit['p99']} us  max {jit['max']} us"),
        (
            "backend",
            f"{summary['backend']['backend']}/{summary['precision']} (switches {summary['precision_switches']})",
        ),
        (
            "safety",
            f"obs non-finite {summary['obs_nonfinite']}, out of range {summary['obs_out_of_range']}, "
            f"held {summary['obs_held']}, overruns {summary['inference_overruns']}, "
            f"actions clipped {summary['action_clipped']}, non-finite {summary['action_nonfinite']}",
        ),
        ("peak RSS", "unknown" if np.isnan(summary["peak_rss_mb"]) else f"{summary['peak_rss_mb']:.1f} MB"),
        ("budget events", str(summary["budget_events"])),
        ("stopped by", str(summary["stopped_by"])),
    ]
    return format_table(rows, ("sac-edge run", summary["env"]))
