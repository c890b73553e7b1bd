"""``sac-edge run``: verify the bundle, check the env against it, open the runtime, then drive the loop.

A client of the runtime library (``runtime.py``), like a robot's own loop: the builder's steps in order
(the config validated, the bundle verified, the env made and checked against it, then ``Runtime.open``:
the last good weights under the lock, the shield, the backends, the learner process and its sizing, the
governor, the fine-tuner, the monitor), then the fixed-rate scheduler (``control/loop.py``) calling the
runtime's ``act``/``observe``/``warm_up``/``tick``. What is added here is what a CLI owns: the env, the
signals, the real-time setup, the status line and the summary's table. ``Run`` is also the runtime's hang
policy: when a backend call hangs, it ends the run from the inference watchdog's thread.

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
from dataclasses import replace
from typing import Any

import numpy as np

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import MANIFEST
from sac_edge.common.config import config_dict
from sac_edge.common.envs import file_env, make_env
from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.common.spec import PolicySpec
from sac_edge.common.table import format_table
from sac_edge.edge_runtime.control.loop import ControlLoop, LoopSettings, ScheduleSummary, error_line
from sac_edge.edge_runtime.control.realtime import enter_realtime, hold_idle_latency
from sac_edge.edge_runtime.control.telemetry import StatusLine
from sac_edge.edge_runtime.finetune.finetuner import FinetuneSummary
from sac_edge.edge_runtime.finetune.shift import parse_shift, shifted

from .compose import Log, validate, verified_bundle
from .config import RealtimeSection, RunConfig, RuntimeOptions
from .runtime import Caller, RunSummary, Runtime


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


def run_command(cfg: RunConfig, log: Log, on_hang: Callable[[RunSummary], None] | None = None) -> RunSummary:
    """Run the loop per ``cfg`` and return the summary (also printed as a table by the CLI): the flags
    checked, the bundle verified, the env made and checked against it, then the run (``Run``).

    ``on_hang`` gets the summary on the inference watchdog's thread when a backend call hangs, after the run
    ended there as after a normal end; it is expected to report it and end the process (the control thread
    is still inside the call)."""
    options = validate(cfg)
    bundle = verified_bundle(options)
    env_name = cfg.env or file_env(bundle.spec.env_id, str(bundle.path / MANIFEST))
    env = make_env(env_name)
    check_env_matches(env, bundle.frame_spec, env_name)
    env = shifted(env, parse_shift(cfg.shift))
    return Run(cfg, options, bundle, env, env_name, log, on_hang).execute()


class Run:
    """One ``sac-edge run`` on an env already made: the runtime and its scheduler composed once, then
    ``execute``: open, loop, finish. It is also the runtime's hang policy (``hung``), which ends the run
    from the watchdog's thread when a backend call hangs."""

    def __init__(
        self,
        cfg: RunConfig,
        options: RuntimeOptions,
        bundle: Bundle,
        env: Any,
        env_name: str,
        log: Log,
        on_hang: Callable[[RunSummary], None] | None,
    ) -> None:
        self._cfg, self._env, self._env_name, self._log, self._on_hang = cfg, env, env_name, log, on_hang
        self._shift = getattr(env, "shift", None)
        space = env.observation_space
        caller = Caller("sac-edge run", config_dict(cfg), env_name, self._shift)
        self._status = StatusLine() if sys.stderr.isatty() else None
        self._runtime = Runtime(
            options, obs_low=space.low, obs_high=space.high, bundle=bundle, log=self._say, hang=self, caller=caller
        )
        loop = cfg.loop
        settings = LoopSettings(loop.rate_hz, loop.duration, loop.spin_us, cfg.seed, loop.warm_cache)
        self._loop = ControlLoop(env, self._runtime, settings, self._status)
        self._opened = False
        self._finishing = threading.Lock()
        """Held by whichever thread ends the run (the control thread, or the watchdog's on a hang)."""
        self._summary: RunSummary | None = None

    def execute(self) -> RunSummary:
        """Open the runtime, run the loop (with the real-time setup) and finish; on any exception the env and
        the runtime are closed before it propagates."""
        with stop_on_signals(self._on_signal):  # before the config record: a test (or a service manager)
            try:  # may signal as soon as it sees it
                self._runtime.open()
                self._opened = True
                with realtime_setup(self._cfg.realtime, self._log):  # after the tuner starts: the learner
                    schedule = self._loop.run()  # process keeps the default policy
            except BaseException:
                self._abandon()
                raise
        return self.finish(schedule)

    def _say(self, message: str) -> None:
        """The runtime's log lines (a governor event), on a line of their own beside the status line."""
        if self._status is not None:
            self._status.clear()
        self._log(message)

    def hung(self, reason: str) -> None:
        """The hang policy (``runtime.HangPolicy``), on the watchdog's thread: the env gets the last safe
        action and the run ends with its summary, which goes to ``on_hang`` (the lock stays held meanwhile,
        so a call that returns late finds the run ended). Without ``on_hang`` the control thread ends the
        run should the call return."""
        with self._finishing:
            schedule = self._loop.hung()
            if schedule is not None and self._on_hang is not None:
                self._on_hang(self._finished(schedule))

    def finish(self, schedule: ScheduleSummary) -> RunSummary:
        """After the loop: the status line, the env and the runtime closed; the summary (once)."""
        with self._finishing:
            return self._finished(schedule)

    def _finished(self, schedule: ScheduleSummary) -> RunSummary:
        if self._summary is None:
            if self._status is not None:
                self._status.finish()
            schedule = close_env(self._env, schedule)
            self._summary = RunSummary(self._runtime.close(schedule), schedule, self._env_name, self._shift)
        return self._summary

    def _on_signal(self, name: str) -> None:
        if not self._opened:  # still opening (an engine build can take minutes): give it up, as before any run
            raise KeyboardInterrupt
        self._loop.stop(name)

    def _abandon(self) -> None:
        """The run failed before its summary: status line, env and runtime closed, errors of their own kept quiet."""
        if self._status is not None:
            self._status.finish()
        with contextlib.suppress(BaseException):
            self._env.close()
        with contextlib.suppress(SacEdgeError):  # not opened: nothing to close
            self._runtime.close()


@contextlib.contextmanager
def realtime_setup(rt: RealtimeSection, log: Log) -> Iterator[None]:
    """The control thread's priority, CPUs and memory locking (``--realtime-priority``, ``--cpus``,
    ``--lock-memory``) and the CPUs' idle-state cap for the loop's duration (default 0 with a priority)."""
    for line in enter_realtime(rt.realtime_priority, rt.cpus, rt.lock_memory):
        log(f"sac-edge run: {line}")
    with contextlib.ExitStack() as held:
        if rt.idle_cap_us is not None:
            log(f"sac-edge run: {held.enter_context(hold_idle_latency(rt.idle_cap_us))}")
        yield


def close_env(env: Any, schedule: ScheduleSummary) -> ScheduleSummary:
    """``env.close()``, whose exception (foreign code) is kept in the summary's ``env_error`` unless the run
    already ended on one, instead of replacing the summary."""
    try:
        env.close()
    except BaseException as err:
        if schedule.env_error is None:
            error = {"call": "close", "type": type(err).__name__, "message": error_line(err)}
            return replace(schedule, env_error=error)
    return schedule


def raise_env_error(summary: RunSummary) -> None:
    """After the summary was printed and written: the run's failure as the command's outcome.

    A ``KeyboardInterrupt`` from the env stays an interrupt (exit 130); an env error, a hung inference or
    a run ended by backend errors is one line, exit 1."""
    error = summary.schedule.env_error
    until = "the summary above covers the run until then"
    if error:
        if error["type"] == "KeyboardInterrupt":
            raise KeyboardInterrupt
        message = error["type"] + (f": {error['message']}" if error.get("message") else "")
        raise InternalError(f"environment error in {error['call']}(): {message}; {until}")
    stopped = str(summary.schedule.stopped_by)
    if summary.runtime.inference_hang or stopped.startswith("backend error"):
        raise InternalError(f"{stopped}; {until}")


def summary_table(summary: RunSummary) -> str:
    """The end-of-run table (stdout)."""
    r, s = summary.runtime, summary.schedule
    lat, jit, work = r.latency_us, s.jitter_us, s.loop_work_us
    rows = [
        ("steps / episodes", f"{s.steps} / {r.episodes}"),
        ("duration", f"{s.duration_s:.2f} s at {r.rate_hz:g} Hz (now {r.final_rate_hz:g})"),
        ("deadline misses", f"{s.deadline_misses} ({100 * s.miss_rate:.3f}%), skipped slots {s.skipped_slots}"),
        ("inference latency", f"p50 {lat['p50']} us  p99 {lat['p99']} us  max {lat['max']} us"),
        ("loop jitter", f"p50 {jit['p50']} us  p99 {jit['p99']} us  max {jit['max']} us"),
        (
            "loop's own work",
            f"p50 {work['p50']} us  p99 {work['p99']} us; env step p50 {s.env_step_us['p50']} us; misses by cause "
            + ", ".join(f"{k} {v}" for k, v in s.miss_causes.items()),
        ),
        ("backend", f"{r.backend['backend']}/{r.precision} (switches {r.precision_switches})"),
        (
            "safety",
            f"obs non-finite {r.obs_nonfinite}, out of range {r.obs_out_of_range}, malformed {r.obs_malformed}, "
            f"held {r.obs_held}, overruns {r.inference_overruns}, "
            f"actions clipped {r.action_clipped}, non-finite {r.action_nonfinite}",
        ),
        ("shield", shield_line(r.shield)),
        ("peak RSS", "unknown" if np.isnan(r.peak_rss_mb) else f"{r.peak_rss_mb:.1f} MB"),
        ("budget events", str(r.budget_events)),
        *_finetune_rows(r.finetune),
        ("stopped by", str(s.stopped_by)),
    ]
    return format_table(rows, ("sac-edge run", summary.env))


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


def _finetune_rows(ft: FinetuneSummary | None) -> list[tuple[str, str]]:
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
