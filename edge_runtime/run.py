"""``sac-edge run``: verify the bundle, check the env against it, pick the backend, then drive the loop.

Everything that can be wrong with the input (bundle, checksum, env, shapes, backend, precision, gate,
budgets) is checked before the first step and is a one-line error. With budgets, the backend is also
opened at each cheaper precision the gate accepted, so a governor precision switch is a reference swap.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from sac_edge.common.atomic import check_output_path
from sac_edge.common.config import config_dict
from sac_edge.common.envs import file_env, make_env
from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.common.lockfile import pid_lock
from sac_edge.common.manifest import MANIFEST
from sac_edge.common.spec import PolicySpec
from sac_edge.common.table import format_table
from sac_edge.edge_runtime.backends.autoselect import autoselect
from sac_edge.edge_runtime.backends.base import PRECISION_ORDER, Backend, BackendOptions, open_bundle
from sac_edge.edge_runtime.backends.registry import open_backend, refusal
from sac_edge.edge_runtime.budget.governor import Governor, GovernorConfig, build_ladder
from sac_edge.edge_runtime.budget.memory import MemoryProbe
from sac_edge.edge_runtime.budget.monitor import BudgetMonitor
from sac_edge.edge_runtime.budget.sensors import NoPowerSensor, detect_power_sensor
from sac_edge.edge_runtime.control.loop import ControlLoop, LoopSettings, describe_error
from sac_edge.edge_runtime.control.realtime import check_idle_latency, enter_realtime, hold_idle_latency
from sac_edge.edge_runtime.control.telemetry import StatusLine, TelemetryWriter
from sac_edge.edge_runtime.finetune.finetuner import build_finetuner, finetune_dir, install_last_good
from sac_edge.edge_runtime.finetune.promotion import LastGood, LastGoodStore
from sac_edge.edge_runtime.finetune.shift import parse_shift, shifted
from sac_edge.edge_runtime.finetune.weight_swap import WeightSwapper

from .config import RunConfig

#: The fastest control rate accepted (a 10 us period; faster is not a control loop Python can keep).
MAX_RATE_HZ = 100_000.0
#: The slowest: one step every 1000 s (slower is not a control loop; the loop still sees a stop at once).
MIN_RATE_HZ = 1e-3
#: The longest ``--duration`` other than 0 (run until stopped): about 31 years.
MAX_DURATION_S = 1e9
#: The longest busy-wait before a slot and the longest inference watchdog limit.
MAX_SPIN_US, MAX_INFERENCE_TIMEOUT_S = 1e6, 3600.0


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
        for name in ("finetune_buffer", "finetune_batch", "swap_every", "learning_starts"):
            if getattr(cfg, name) < 1:
                raise SacEdgeError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
        if not 0 < cfg.learner_cpu <= 1:
            raise SacEdgeError(f"--learner-cpu is a fraction of one core in (0, 1], got {cfg.learner_cpu}")
        if not cfg.finetune_lr > 0 or cfg.explore_std < 0:
            raise SacEdgeError("--finetune-lr must be positive and --explore-std non-negative")
    if cfg.resume and cfg.restart:
        raise SacEdgeError("--resume and --restart exclude each other: continue from the last good weights, or not")
    if cfg.restart and not cfg.finetune:
        raise SacEdgeError("--restart only applies with --finetune")
    if not MIN_RATE_HZ <= cfg.rate_hz <= MAX_RATE_HZ:
        raise SacEdgeError(
            f"--rate-hz must be from {MIN_RATE_HZ:g} to {MAX_RATE_HZ:g} steps per second, got {cfg.rate_hz}"
        )
    if not 0 <= cfg.duration <= MAX_DURATION_S:
        raise SacEdgeError(
            f"--duration must be from 0 (run until stopped) to {MAX_DURATION_S:g} seconds, got {cfg.duration}"
        )
    if not 0 <= cfg.spin_us <= MAX_SPIN_US:
        raise SacEdgeError(f"--spin-us must be from 0 to {MAX_SPIN_US:g} microseconds, got {cfg.spin_us}")
    if not 0 <= cfg.realtime_priority <= 99:
        raise SacEdgeError(f"--realtime-priority must be 1..99 (0: off), got {cfg.realtime_priority}")
    if not 0 <= cfg.seed < 2**64:
        raise SacEdgeError(f"--seed must be from 0 to 2**64 - 1 (numpy's seeds), got {cfg.seed}")
    if any(cpu < 0 for cpu in cfg.cpus):
        raise SacEdgeError(f"--cpus takes CPU numbers from 0, got {','.join(map(str, cfg.cpus))}")
    if cfg.max_backend_errors < 1:
        raise SacEdgeError(f"--max-backend-errors must be at least 1, got {cfg.max_backend_errors}")
    for flag, budget in (("--mem-budget-mb", cfg.mem_budget_mb), ("--power-budget-w", cfg.power_budget_w)):
        if budget is not None and not 0 < budget < math.inf:
            raise SacEdgeError(f"{flag} must be a positive number, got {budget}")
    if cfg.telemetry:
        check_output_path(cfg.telemetry, "--telemetry")
        if os.path.lexists(cfg.telemetry) and not cfg.overwrite_telemetry:
            raise SacEdgeError(
                f"--telemetry {cfg.telemetry} already exists; choose another path or pass --overwrite-telemetry"
            )
        if os.path.islink(cfg.telemetry) or (os.path.lexists(cfg.telemetry) and not os.path.isfile(cfg.telemetry)):
            raise SacEdgeError(f"--telemetry {cfg.telemetry} is a symlink or not a regular file; choose another path")
    if not 0 < cfg.inference_budget <= 1:
        raise SacEdgeError(f"--inference-budget is a fraction of the period in (0, 1], got {cfg.inference_budget}")
    if not 0 < cfg.inference_timeout <= MAX_INFERENCE_TIMEOUT_S:
        raise SacEdgeError(
            f"--inference-timeout must be more than 0 and at most {MAX_INFERENCE_TIMEOUT_S:g} seconds, "
            f"got {cfg.inference_timeout}"
        )
    if cfg.finetune:  # a read-only bundle would otherwise fail at the lock, after the bundle was verified
        check_output_path(finetune_dir(cfg), "--finetune-dir", directory=True)
    if cfg.threads < 1 or cfg.auto_calls < 1:
        raise SacEdgeError("--threads and --auto-calls must be at least 1")
    if cfg.idle_latency_us is not None:
        check_idle_latency(cfg.idle_latency_us)


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
    options = BackendOptions(threads=cfg.threads, refit=cfg.finetune)
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


def run_command(
    cfg: RunConfig, log: Callable[[str], None], on_hang: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Run the loop per ``cfg`` and return the summary (also printed as a table by the CLI).

    When a backend call hangs, the inference watchdog finishes the run on its own thread (env, monitor,
    fine-tuner, telemetry, as after a normal end) and hands the summary to ``on_hang``, which is expected
    to report it and end the process: the control thread is still inside the call."""
    validate(cfg)
    bundle = open_bundle(cfg.bundle, cfg.trusted_keys, allow_downgrade=cfg.allow_downgrade)
    env_name = cfg.env or file_env(bundle.spec.env_id, str(bundle.path / MANIFEST))
    env = make_env(env_name)
    check_env_matches(env, bundle.spec, env_name)
    env = shifted(env, parse_shift(cfg.shift))
    store = LastGoodStore(finetune_dir(cfg))
    with contextlib.ExitStack() as held:
        if cfg.finetune:  # one fine-tuner per weights directory, or each would overwrite the other's
            held.enter_context(pid_lock(store.lock, f"fine-tuning directory {store.dir}"))
            if store.holds_weights() and not (cfg.resume or cfg.restart):
                held_path = store.path if store.exists() else store.previous
                raise SacEdgeError(
                    f"{held_path} holds fine-tuned weights; pass --resume to continue from them or "
                    "--restart to start again from the bundle weights (they are then kept as previous.safetensors "
                    "at the first promotion)"
                )
        last = store.load() if cfg.resume else None
        return _run_with(cfg, bundle, env, env_name, last, log, on_hang)


def _run_with(
    cfg: RunConfig,
    bundle: Any,
    env: Any,
    env_name: str,
    last: LastGood | None,
    log: Callable[[str], None],
    on_hang: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Open the backends, build the fine-tuner when asked, drive the loop and write the summary."""
    backends, figures = open_backends(cfg, bundle, log)
    probe = MemoryProbe(Path(cfg.sensor_root))
    with TelemetryWriter(cfg.telemetry, overwrite=cfg.overwrite_telemetry) as telemetry:
        emit = locked(telemetry.write)
        tuner, resumed = None, None
        if cfg.finetune:
            tuner, resumed = build_finetuner(cfg, bundle, backends, probe, last, emit, log)
        elif last is not None:
            resumed = install_last_good(WeightSwapper(backends, bundle), last)[1]

        def finish(summary: dict[str, Any]) -> dict[str, Any]:
            """After the loop (or the watchdog): the fine-tuner's part and the telemetry's summary record."""
            if tuner is not None:  # the learner process stops and its shared memory goes, whatever happened
                tuner.stop()
            summary.update(telemetry_records=telemetry.records + 1, resume=resumed)
            if tuner is not None:
                summary["finetune"] = tuner.summary()
                if tuner.error:
                    log(f"sac-edge run: fine-tuning stopped early: {tuner.error}")
            summary["telemetry_dropped"] = telemetry.dropped
            telemetry.write({"type": "summary", **summary})
            return summary

        hang = None if on_hang is None else (lambda summary: on_hang(finish(summary)))
        try:
            summary = _drive(cfg, bundle, env, env_name, backends, figures, probe, tuner, emit, log, hang)
        except BaseException:
            if tuner is not None:
                tuner.stop()
            raise
        return finish(summary)


def locked(write: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """``write`` behind a lock: the loop and the fine-tuner's coordinator thread both emit records."""
    lock = threading.Lock()

    def emit(record: dict[str, Any]) -> None:
        with lock:
            write(record)

    return emit


def _drive(
    cfg: RunConfig,
    bundle: Any,
    env: Any,
    env_name: str,
    backends: dict[str, Backend],
    figures: list[Any],
    probe: MemoryProbe,
    tuner: Any,
    emit: Callable[[dict[str, Any]], None],
    log: Callable[[str], None],
    on_hang: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The governor, the monitor and the loop (with the fine-tuner started before it when there is one; the
    caller stops it)."""
    first = next(iter(backends))
    governor = None
    if cfg.mem_budget_mb is not None or cfg.power_budget_w is not None:
        batch = tuner.sizing["batch_size"] if tuner is not None else None
        ladder = build_ladder(
            cfg.rate_hz, first, list(backends), finetune_batch=batch, min_finetune_batch=min(32, batch or 32)
        )
        governor = Governor(GovernorConfig(cfg.mem_budget_mb, cfg.power_budget_w), ladder)
    if tuner is not None:
        tuner.governor = governor
    root = Path(cfg.sensor_root)
    sensor = detect_power_sensor(root) if cfg.telemetry or cfg.power_budget_w is not None else None
    if isinstance(sensor, NoPowerSensor):
        if cfg.power_budget_w is not None:
            log(f"sac-edge run: --power-budget-w {cfg.power_budget_w:g} cannot be enforced: {sensor.reason}")
        sensor = None
    monitor = BudgetMonitor(probe, sensor, governor)
    status = StatusLine() if sys.stderr.isatty() else None
    settings = LoopSettings(
        cfg.rate_hz,
        cfg.duration,
        cfg.obs_fault,
        cfg.inference_budget,
        cfg.spin_us,
        cfg.seed,
        cfg.warm_cache,
        cfg.inference_timeout,
        cfg.max_backend_errors,
    )
    closed = False

    def finish(summary: dict[str, Any]) -> dict[str, Any]:
        """After the loop (on the watchdog's thread when a call hung): status line, monitor, env."""
        nonlocal closed
        if not closed:
            closed = True
            if status is not None:
                status.finish()
            monitor.close()
            close_env(env, summary)
        return {
            **summary,
            "env": env_name,
            "shift": getattr(env, "shift", None),
            "auto": [m._asdict() for m in figures if m.refusal is None or "unavailable" not in m.refusal],
            "torch_imported": "torch" in sys.modules,
        }

    hang = None if on_hang is None else (lambda summary: on_hang(finish(summary)))
    loop = ControlLoop(env, backends, first, settings, monitor, emit, status, experience=tuner, on_hang=hang)
    summary: dict[str, Any] = {}
    try:
        with stop_on_signals(loop.stop), contextlib.ExitStack() as held:
            emit(  # once a stop is handled: a test (or a service manager) may signal as soon as it sees this
                {
                    "type": "config",
                    "config": config_dict(cfg),
                    "env": env_name,
                    "shift": getattr(env, "shift", None),
                    "backend": backends[first].describe(),
                    "auto": [m._asdict() for m in figures],
                    "power_source": sensor.source if sensor else None,
                    "loaded_precisions": list(backends),
                }
            )
            if tuner is not None:
                tuner.start()
            for line in enter_realtime(cfg.realtime_priority, cfg.cpus, cfg.lock_memory):  # after the tuner starts
                log(f"sac-edge run: {line}")
            idle_us = cfg.idle_latency_us if cfg.idle_latency_us is not None else (0 if cfg.realtime_priority else None)
            if idle_us is not None:
                log(f"sac-edge run: {held.enter_context(hold_idle_latency(idle_us))}")
            summary = loop.run()
    finally:
        summary = finish(summary)
    if tuner is not None and tuner.error:
        log(f"sac-edge run: fine-tuning stopped early: {tuner.error}")
    return summary


def close_env(env: Any, summary: dict[str, Any]) -> None:
    """``env.close()``, whose exception (foreign code) is kept in the summary's ``env_error`` unless the run
    already ended on one, instead of replacing the summary."""
    try:
        env.close()
    except BaseException as err:
        if summary.get("env_error") is None:
            text = describe_error(err)
            text = text.splitlines()[0][:200] if text else ""
            summary["env_error"] = {"call": "close", "type": type(err).__name__, "message": text}


def raise_env_error(summary: dict[str, Any]) -> None:
    """After the summary was printed and written: the run's failure as the command's outcome.

    A ``KeyboardInterrupt`` from the env stays an interrupt (exit 130); an env error, a hung inference or
    a run ended by backend errors is one line, exit 1."""
    error = summary.get("env_error")
    until = "the summary above covers the run until then"
    if error:
        if error["type"] == "KeyboardInterrupt":
            raise KeyboardInterrupt
        message = error["type"] + (f": {error['message']}" if error.get("message") else "")
        raise InternalError(f"environment error in {error['call']}(): {message}; {until}")
    stopped = str(summary.get("stopped_by"))
    if summary.get("inference_hang") or stopped.startswith("backend error"):
        raise InternalError(f"{stopped}; {until}")


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
            "loop's own work",
            f"p50 {summary['loop_work_us']['p50']} us  p99 {summary['loop_work_us']['p99']} us; env step p50 "
            f"{summary['env_step_us']['p50']} us; misses by cause "
            + ", ".join(f"{k} {v}" for k, v in summary["miss_causes"].items()),
        ),
        (
            "backend",
            f"{summary['backend']['backend']}/{summary['precision']} (switches {summary['precision_switches']})",
        ),
        (
            "safety",
            f"obs non-finite {summary['obs_nonfinite']}, out of range {summary['obs_out_of_range']}, "
            f"malformed {summary['obs_malformed']}, held {summary['obs_held']}, "
            f"overruns {summary['inference_overruns']}, "
            f"actions clipped {summary['action_clipped']}, non-finite {summary['action_nonfinite']}",
        ),
        ("peak RSS", "unknown" if np.isnan(summary["peak_rss_mb"]) else f"{summary['peak_rss_mb']:.1f} MB"),
        ("budget events", str(summary["budget_events"])),
        *_finetune_rows(summary.get("finetune")),
        ("stopped by", str(summary["stopped_by"])),
    ]
    return format_table(rows, ("sac-edge run", summary["env"]))


def _finetune_rows(ft: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not ft:
        return []
    sizing = ft["sizing"]
    swap = ", ".join(f"{p} p50 {v['p50'] * 1e3:.2f} ms max {v['max'] * 1e3:.2f} ms" for p, v in ft["swap_s"].items())
    return [
        (
            "fine-tune sizing",
            f"{sizing['buffer_rows']} rows, batch {sizing['batch_size']}, checkpointing {sizing['grad_checkpoint']}, "
            f"utd {sizing['utd']:g} (est. {sizing['estimate_mb']['total']:.1f} MiB)",
        ),
        ("fine-tune updates", f"{ft['updates']} on {ft['steps_collected']} steps (utd {ft['achieved_utd']:.2f})"),
        (
            "candidates",
            f"{ft['candidates']}: promoted {ft['promotions']}, rolled back {ft['rollbacks']}, "
            f"shadow-rejected {ft['shadow_rejections']}, int8-skipped {ft['int8_skipped']}",
        ),
        ("weight swaps", f"{ft['swaps']}" + (f" ({swap})" if swap else "")),
        (
            "served return",
            f"first window {_mean(ft['initial_mean_return'])}, last good {_mean(ft['last_good_mean_return'])}",
        ),
        ("last good", f"{ft['last_good'] or 'the bundle weights'}"),
    ]


def _mean(value: float | None) -> str:
    """A window's mean episode return (with exploration noise) for the table; n/a before one completes."""
    return "n/a" if value is None else f"{value:.1f}"
