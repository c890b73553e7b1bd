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
from typing import Any

import numpy as np

from sac_edge.common.bundle import Bundle, open_bundle
from sac_edge.common.bundle_format import MANIFEST
from sac_edge.common.config import config_dict
from sac_edge.common.envs import file_env, make_env
from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.common.spec import PolicySpec
from sac_edge.common.table import format_table
from sac_edge.edge_runtime.control.loop import ControlLoop, LoopSettings, describe_error
from sac_edge.edge_runtime.control.realtime import enter_realtime, hold_idle_latency
from sac_edge.edge_runtime.control.shield import Shield
from sac_edge.edge_runtime.control.telemetry import StatusLine, TelemetryWriter
from sac_edge.edge_runtime.finetune.promotion import LastGood
from sac_edge.edge_runtime.finetune.shift import parse_shift, shifted

from .compose import Composition, attach_shield, compose, last_good_weights, locked, make_shield, validate
from .config import RunConfig


def check_env_matches(env: Any, spec: PolicySpec, name: str) -> None:
    """The env's observation and action sizes must be the bundle's, or the policy would be fed garbage."""
    obs_shape, act_shape = tuple(env.observation_space.shape), tuple(env.action_space.shape)
    if obs_shape != (spec.obs_dim,) or act_shape != (spec.act_dim,):
        raise SacEdgeError(
            f"{name}: observation {obs_shape} / action {act_shape} do not match the bundle's spec "
            f"(obs_dim={spec.obs_dim}, act_dim={spec.act_dim}, trained on {spec.env_id})"
        )


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
    with last_good_weights(cfg) as last:
        return _run_with(cfg, bundle, env, env_name, last, log, on_hang)


def _run_with(
    cfg: RunConfig,
    bundle: Bundle,
    env: Any,
    env_name: str,
    last: LastGood | None,
    log: Callable[[str], None],
    on_hang: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Compose the run (backends, fine-tuner, governor, monitor), drive the loop and write the summary."""
    with TelemetryWriter(cfg.telemetry, overwrite=cfg.overwrite_telemetry) as telemetry:
        emit = locked(telemetry.write)
        shield = make_shield(cfg, bundle, emit)
        parts = compose(cfg, bundle, last, emit, log)
        attach_shield(parts, shield)
        tuner = parts.tuner

        def finish(summary: dict[str, Any]) -> dict[str, Any]:
            """After the loop (or the watchdog): the fine-tuner's part and the telemetry's summary record."""
            if tuner is not None:  # the learner process stops and its shared memory goes, whatever happened
                tuner.stop()
            summary.update(telemetry_records=telemetry.records + 1, resume=parts.resumed)
            if tuner is not None:
                summary["finetune"] = tuner.summary()
                if tuner.error:
                    log(f"sac-edge run: fine-tuning stopped early: {tuner.error}")
            summary["telemetry_dropped"] = telemetry.dropped
            telemetry.write({"type": "summary", **summary})
            return summary

        hang = None if on_hang is None else (lambda summary: on_hang(finish(summary)))
        try:
            summary = _drive(cfg, env, env_name, parts, emit, log, hang, shield)
        except BaseException:
            if tuner is not None:
                tuner.stop()
            raise
        return finish(summary)


def _drive(
    cfg: RunConfig,
    env: Any,
    env_name: str,
    parts: Composition,
    emit: Callable[[dict[str, Any]], None],
    log: Callable[[str], None],
    on_hang: Callable[[dict[str, Any]], None] | None = None,
    shield: Shield | None = None,
) -> dict[str, Any]:
    """The loop on the composed run (the fine-tuner started before it when there is one; the caller stops
    it)."""
    backends, tuner, monitor, sensor, first = parts.backends, parts.tuner, parts.monitor, parts.sensor, parts.first
    status = StatusLine() if sys.stderr.isatty() else None
    settings = LoopSettings(
        cfg.loop.rate_hz,
        cfg.loop.duration,
        cfg.loop.obs_fault,
        cfg.loop.inference_budget,
        cfg.loop.spin_us,
        cfg.seed,
        cfg.loop.warm_cache,
        cfg.loop.inference_timeout,
        cfg.loop.max_backend_errors,
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
            "auto": parts.auto(unavailable=False),
            "torch_imported": "torch" in sys.modules,
        }

    hang = None if on_hang is None else (lambda summary: on_hang(finish(summary)))
    loop = ControlLoop(
        env, backends, first, settings, monitor, emit, status, experience=tuner, on_hang=hang, shield=shield
    )
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
                    "auto": parts.auto(),
                    "power_source": sensor.source if sensor else None,
                    "loaded_precisions": list(backends),
                }
            )
            if tuner is not None:
                tuner.start()
            rt = cfg.realtime
            for line in enter_realtime(rt.realtime_priority, rt.cpus, rt.lock_memory):  # after the tuner starts
                log(f"sac-edge run: {line}")
            idle_us = rt.idle_latency_us if rt.idle_latency_us is not None else (0 if rt.realtime_priority else None)
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
        ("shield", shield_line(summary["shield"])),
        ("peak RSS", "unknown" if np.isnan(summary["peak_rss_mb"]) else f"{summary['peak_rss_mb']:.1f} MB"),
        ("budget events", str(summary["budget_events"])),
        *_finetune_rows(summary.get("finetune")),
        ("stopped by", str(summary["stopped_by"])),
    ]
    return format_table(rows, ("sac-edge run", summary["env"]))


def shield_line(shield: dict[str, Any]) -> str:
    """The summary table's shield row."""
    if shield["mode"] != "on":
        return f"{shield['mode']} (no shield)"
    causes = ", ".join(f"{k} {v}" for k, v in shield["fallback_causes"].items() if v)
    return (
        f"fallbacks {shield['fallbacks']}" + (f" ({causes})" if causes else "") + f", {shield['fallback_steps']} "
        f"steps in fallback, out of envelope {shield['out_of_envelope']}"
        + ("" if shield["envelope"] else " (no envelope)")
        + f", stuck {shield['stuck']}, ramps {shield['ramps']} + {shield['swap_ramps']} after swaps, "
        f"slew-limited {shield['slew_limited']}"
    )


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
