"""The runtime as a library: a robot's own control loop asks it for actions.

``sac-edge run`` owns the schedule and drives a gymnasium env; robot software usually owns its loop (a ROS 2
timer callback, a robot SDK's callback, a hand-written loop). :class:`Runtime` gives that loop the same
guarantees, composed by the same builder as ``sac-edge run`` (``compose.py``): a verified bundle, a
parity-gated backend (``--backend auto`` timed at open), the observation and action guards, the last safe
action on an overrun, memory and power budgets with the governor, fine-tuning with promotion and rollback
(the last good weights kept on disk), and telemetry::

    from sac_edge.edge_runtime.runtime import FinetuneSection, Runtime, RuntimeOptions

    options = RuntimeOptions("bundles/pend", rate_hz=100, finetune=FinetuneSection(enabled=True))
    with Runtime(options) as runtime:
        obs = robot.read()
        try:
            while robot.ok():
                action = runtime.act(obs)
                next_obs, reward, terminated, truncated = robot.apply(action)
                runtime.observe(obs, action, reward, next_obs, terminated, truncated)
                obs = robot.reset() if terminated or truncated else next_obs
                runtime.tick()  # budgets once a second; its rate_hz is the rate the governor asks for
        finally:  # every way the loop ends (its end, a signal, an error) ends in the configured safe command
            robot.apply(runtime.safe_action())
    print(runtime.summary())

Options are ``RuntimeOptions`` (``config.py``): what the runtime works from and nothing else, checked with
``sac-edge run``'s flag messages when made. Its sections (``BackendSection``, ``BudgetSection``,
``FinetuneSection``) are ``sac-edge run``'s, its ``shield`` the shield's options (``ShieldOptions``; None:
the guards alone); ``RuntimeOptions.of(bundle, rate_hz=100, finetune=True)`` takes the flags' names flat,
and ``sac-edge run`` makes them from its config (``RunConfig.runtime_options()``). ``inference_timeout`` is
the inference watchdog's limit (a call that runs past it stops the runtime, the ``HangPolicy`` is told on the
watchdog's thread, and ``act`` raises once the call returns); ``rate_hz`` is the rate the caller runs at (the
period the inference budget is a fraction of, the learner's sizing, the governor's top rung); ``cpus`` are the
CPUs the caller's loop runs on (the learner process keeps off them).

``sac-edge run`` is a client of this class too: its scheduler (``control/loop.py``) calls ``act``,
``observe``, ``warm_up`` (the step on scratch state before each slot, to warm the caches) and ``tick`` with
each second's schedule window, so the step cannot differ between the two. ``Runtime`` is the lifecycle
(``RuntimeState``) and the thread rules; the step itself is ``control/step.py``'s ``StepPipeline``, the
budgets ``BudgetTicker``, all composed once at ``open`` (``compose.step_pipeline``).

Threads: ``act``, ``warm_up``, ``observe``, ``tick`` and ``close`` come from one thread, the control thread:
the first one that calls one of them after ``open``. ``summary`` may come from any thread. A call from
another thread, or before ``open`` or after ``close``, is refused with a one-line :class:`SacEdgeError`. The
fine-tuner's coordinator thread, the inference watchdog's thread and the learner process run beside it, as
under ``sac-edge run``. torch is imported (in the learner process only) only when ``finetune.enabled`` is set.
"""

from __future__ import annotations

import contextlib
import enum
import math
import sys
import threading
import time
from dataclasses import asdict, dataclass, fields
from types import TracebackType
from typing import Any, Protocol, SupportsFloat

import numpy as np

from sac_edge.common.bundle import Bundle
from sac_edge.common.config import config_dict
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.inputs import done_flag, ordered_bounds
from sac_edge.edge_runtime.backends.base import Backend
from sac_edge.edge_runtime.budget.governor import event_line
from sac_edge.edge_runtime.control.history import InputHistory
from sac_edge.edge_runtime.control.loop import ScheduleSummary, ScheduleWindow, StoppedServing, finite_reward
from sac_edge.edge_runtime.control.safety import plain_array
from sac_edge.edge_runtime.control.shield import Shield, ShieldOptions, ShieldSummary, guards_summary
from sac_edge.edge_runtime.control.step import BackendFailed, CallTaken, StepPipeline
from sac_edge.edge_runtime.control.step_stats import StepStats
from sac_edge.edge_runtime.control.telemetry import TelemetryWriter
from sac_edge.edge_runtime.control.watchdog import InferenceWatchdog
from sac_edge.edge_runtime.finetune.finetuner import FinetuneSummary
from sac_edge.edge_runtime.finetune.settings import FinetuneSection

from .compose import (
    Composition,
    Emit,
    Log,
    compose,
    last_good_weights,
    locked,
    make_shield,
    step_pipeline,
    verified_bundle,
)
from .config import (
    BackendSection,
    BudgetSection,
    LoopSection,
    RealtimeSection,
    RuntimeOptions,
)
from .preflight import checked_bundle

__all__ = [
    "BackendSection",
    "BudgetSection",
    "Caller",
    "FinetuneSection",
    "HangPolicy",
    "LogHang",
    "LoopSection",
    "RealtimeSection",
    "RunSummary",
    "Runtime",
    "RuntimeOptions",
    "RuntimeState",
    "RuntimeSummary",
    "ShieldOptions",
    "StoppedServing",
    "TickReport",
]

TICK_NS = 1_000_000_000
"""``tick`` reads the budgets and ticks the governor at most once a second (its hysteresis counts samples
at that pace); calls in between return the last report."""

_get_ident = threading.get_ident


@dataclass(frozen=True)
class TickReport:
    """The budgets as last read, and the knobs the caller applies (precision and fine-tuning apply
    themselves)."""

    t_s: float
    """Seconds since ``open`` (or the schedule's start) when these readings were taken."""
    rate_hz: float
    """The control rate the governor asks for (``rate_hz`` of the options unless a budget lowered it)."""
    precision: str
    """The precision serving now."""
    events: tuple[dict[str, Any], ...]
    """The governor's actions at this reading (``degrade``, ``recover``, ``unmeetable``)."""
    memory: dict[str, Any]
    power: dict[str, Any] | None
    latency_us: dict[str, float]
    """Inference time per ``act`` since the previous reading (p50, p99, max, mean; NaN without one)."""


@dataclass(frozen=True)
class RuntimeSummary:
    """What the runtime did, at any time and on ``close`` (the shared names mean what they mean in
    ``sac-edge run --json``; docs/CONTRACTS.md)."""

    steps: int
    """``act`` and ``hold`` calls."""
    transitions: int
    """``observe`` calls."""
    episodes: int
    """Transitions that ended an episode (terminated or truncated)."""
    rate_hz: float
    """The rate of the options."""
    final_rate_hz: float
    """The rate the governor asks for now."""
    latency_us: dict[str, float]
    """Inference time per ``act`` that inferred, up to the last ``tick`` (p50, p99, max, mean)."""
    inference_overruns: int
    """Inferences over ``inference_budget`` of the period (the last safe action was returned)."""
    obs_nonfinite: int
    obs_out_of_range: int
    obs_malformed: int
    obs_held: int
    action_nonfinite: int
    action_clipped: int
    backend_errors: int
    backend_error: dict[str, str] | None
    inference_hang: dict[str, Any] | None
    """When the inference watchdog gave up on a call: the backend, precision, limit and how long it had run."""
    reward_invalid: int
    """Transitions whose reward was missing or not finite (not given to the fine-tuner)."""
    shield: ShieldSummary
    """The shield's settings and counts (``mode`` alone without a shield: ``shield=None``)."""
    backend: dict[str, Any]
    """The serving backend's description."""
    precision: str
    precision_switches: int
    auto: tuple[dict[str, Any], ...]
    """With ``backend="auto"``: each candidate's start-up timing or refusal."""
    peak_rss_mb: float
    """NaN when unknown."""
    budget_events: int
    events: tuple[dict[str, Any], ...]
    resume: dict[str, Any] | None
    finetune: FinetuneSummary | None
    telemetry_records: int
    """Records written to the telemetry (on ``close``, its summary record included)."""
    telemetry_dropped: int
    stopped_by: str | None
    """Why the runtime refuses further actions (``backend error xN: ...``, ``inference watchdog: ...``),
    else None."""
    torch_imported: bool
    """Whether this process imported torch (the learner process is another)."""
    closed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: ``RuntimeSummary`` fields that ``sac-edge run --json`` takes from the schedule instead, or leaves out.
_NOT_RUN_KEYS = frozenset({"steps", "transitions", "stopped_by", "closed"})


@dataclass(frozen=True)
class RunSummary:
    """``sac-edge run``'s summary: the runtime's, the schedule's and the env's (``to_json`` gives the
    keys of ``sac-edge run --json``, docs/CONTRACTS.md)."""

    runtime: RuntimeSummary
    schedule: ScheduleSummary
    env: str
    """The env id or class."""
    shift: dict[str, Any] | None
    """The env wrapper's shift description (tests and drills), else None."""

    def to_json(self) -> dict[str, Any]:
        """The flat record ``--json`` prints and the telemetry's summary record holds."""
        out = asdict(self.schedule)
        for f in fields(self.runtime):
            if f.name not in _NOT_RUN_KEYS:
                out[f.name] = getattr(self.runtime, f.name)
        if out["finetune"] is None:  # the key is there with --finetune only
            del out["finetune"]
        out.update(env=self.env, shift=self.shift)
        return out


class RuntimeState(enum.Enum):
    """Where a ``Runtime`` is in its life; each call says which states it accepts."""

    CREATED = "created"
    """Options checked; nothing opened."""
    OPEN = "open"
    """Opened; no control thread yet (the first call of ``act``/``observe``/``tick``/``close`` claims it)."""
    SERVING = "serving"
    """The control thread is claimed; ``act`` serves."""
    STOPPED = "stopped"
    """``act`` refuses (``max_backend_errors`` failed inferences, or a call the watchdog gave up on)."""
    CLOSED = "closed"


@dataclass
class TransitionCounters:
    """What ``observe`` counted."""

    transitions: int = 0
    episodes: int = 0
    reward_invalid: int = 0


class BudgetTicker:
    """Once a second: the budgets read, the governor ticked, what it asks applied (the serving precision,
    the rate that sets the inference budget), one telemetry record. Owns which backend serves."""

    def __init__(
        self,
        parts: Composition,
        pipelines: tuple[StepPipeline, ...],
        inference_budget: float,
        rate_hz: float,
        emit: Emit,
        log: Log,
    ) -> None:
        self._parts, self._pipelines, self._emit, self._log = parts, pipelines, emit, log
        self._inference_budget = inference_budget
        self.rate_hz = rate_hz
        self.switches = 0
        self.events: list[dict[str, Any]] = []
        self.peak_rss_mb = float("nan")
        self.serve(parts.first)
        self.t0 = time.monotonic_ns()
        self.next_ns = self.t0 + TICK_NS
        latency = pipelines[0].stats.run_percentiles_us("latency")
        self.report = TickReport(0.0, rate_hz, self.precision, (), {}, None, latency)

    def serve(self, precision: str) -> None:
        """Serve ``precision`` from the next step (at open, and when the governor switches)."""
        self.precision = precision
        self.backend: Backend = self._parts.backends[precision]
        budget_ns = int(self._inference_budget * 1e9 / self.rate_hz)
        for pipeline in self._pipelines:
            pipeline.serve(self.backend.act, budget_ns)

    def tick(self, t_s: float, window: ScheduleWindow | None, steps: int) -> TickReport:
        """The reading at ``t_s``; ``window``: a scheduler's steps and misses for the second."""
        stats = self._pipelines[0].stats
        latency, jitter = stats.fold()
        record: dict[str, Any] = {"type": "second", "t_s": t_s}
        if window is None:
            record.update(steps_total=steps, latency_us=latency)
        else:
            record.update(steps=window.steps, latency_us=latency, jitter_us=jitter, misses=window.misses,
                          misses_total=window.misses_total, steps_total=window.steps_total)  # fmt: skip
        record.update(precision=self.precision, rate_hz=self.rate_hz)  # what served this second
        tick = self._parts.monitor.tick(t_s)
        self.note_memory(tick.memory)
        record.update(memory=tick.memory, power=tick.power, governor=tick.governor)
        for event in tick.events:
            self.events.append(event)
            self._emit({"type": "event", "t_s": t_s, **event})
            self._log(event_line(event))  # a budget never changes the run without a word on the terminal
        if tick.rate_hz is not None and not math.isclose(tick.rate_hz, self.rate_hz):
            self.rate_hz = float(tick.rate_hz)
            self.serve(self.precision)  # the budget is a fraction of the new period
        if tick.precision is not None and tick.precision != self.precision and tick.precision in self._parts.backends:
            self.serve(tick.precision)
            self.switches += 1
        self._emit(record)
        self.report = TickReport(
            t_s, self.rate_hz, self.precision, tuple(tick.events), dict(tick.memory), tick.power, latency
        )
        return self.report

    def note_memory(self, memory: dict[str, Any]) -> None:
        peak = memory.get("peak_rss_mb", memory.get("rss_mb"))
        if peak is not None and (np.isnan(self.peak_rss_mb) or peak > self.peak_rss_mb):
            self.peak_rss_mb = float(peak)


class HangPolicy(Protocol):
    """What happens when the inference watchdog gives up on a backend call (one that ran past
    ``inference_timeout``): the runtime composes one at construction (``LogHang`` unless given one)."""

    def hung(self, reason: str) -> None:
        """Called once, on the inference watchdog's thread, while the control thread is still inside the call
        (it may never return). The runtime has stopped serving already: ``act`` raises ``StoppedServing``
        if the call returns, and ``safe_action``, ``last_action``, ``stopped_by`` and ``summary`` answer from
        this thread.
        ``reason`` is that ``stopped_by`` line."""


class LogHang:
    """The hang policy of a runtime not given one: one line to its log; the caller finds ``act`` raising."""

    def __init__(self, log: Log, name: str) -> None:
        self._log, self._name = log, name

    def hung(self, reason: str) -> None:
        self._log(f"{self._name}: {reason}; act() raises if the call returns")


@dataclass(frozen=True)
class Caller:
    """Who drives the runtime, as its log lines and telemetry name it (``sac-edge run`` gives every field;
    a robot's own loop may give none)."""

    name: str = "sac-edge runtime"
    """Begins the lines the runtime logs."""
    config: dict[str, Any] | None = None
    """The caller's whole config, for the telemetry's ``config`` record (None: the runtime's options):
    ``sac-edge run`` saves its ``RunConfig`` there."""
    env: str | None = None
    """The plant (an env id or class), in the telemetry's config and summary records."""
    shift: dict[str, Any] | None = None
    """The plant's changed dynamics (tests, drills), in the same records."""


class Runtime:
    """A bundle's policy behind ``act``/``observe``/``tick`` for a loop the caller owns (module docstring)."""

    def __init__(
        self,
        options: RuntimeOptions,
        *,
        obs_low: Any = None,
        obs_high: Any = None,
        bundle: Bundle | None = None,
        log: Log | None = None,
        hang: HangPolicy | None = None,
        caller: Caller = Caller(),
    ) -> None:
        """Take ``options`` (checked when they were made) and nothing else; ``open`` does the work.

        ``obs_low``/``obs_high`` are the observation bounds the guard enforces (the training env's
        observation space); without them an observation need only be finite. ``bundle`` is the bundle
        already verified from ``options.bundle`` (``compose.verified_bundle``), else ``open`` verifies it.
        ``log`` takes the runtime's lines (default: stderr); ``hang`` is what happens when a backend call
        runs past ``inference_timeout`` (``HangPolicy``; default: ``LogHang``); ``caller`` names the run in
        the log lines and the telemetry."""
        if not isinstance(options, RuntimeOptions):
            raise SacEdgeError(f"Runtime takes RuntimeOptions, got {type(options).__name__}; pass RuntimeOptions(...)")
        self.options = options
        self._bounds = (obs_low, obs_high)
        self._history: InputHistory | None = None  # the observation contract's, made at open
        self._bundle = bundle
        self._log: Log = log if log is not None else _stderr
        self._caller = caller
        self._hang_policy: HangPolicy = hang if hang is not None else LogHang(self._log, caller.name)
        self._state = RuntimeState.CREATED
        self._owner = _NOBODY
        """The control thread's id while serving, else ``_NOBODY``: each call checks it in one comparison."""
        self._thread: int | None = None
        self._resources: contextlib.ExitStack | None = None
        self._final: RuntimeSummary | None = None
        self._hang: dict[str, Any] | None = None
        self._stopped_by: str | None = None
        self._transitions = TransitionCounters()

    @property
    def state(self) -> RuntimeState:
        return self._state

    # -- lifecycle -----------------------------------------------------------------------------------
    def open(self) -> Runtime:
        """Verify the bundle, take the fine-tuning lock, open and gate the backends (as ``sac-edge run``
        does), start the fine-tuner and the inference watchdog; returns ``self``."""
        if self._state is not RuntimeState.CREATED:
            raise SacEdgeError("Runtime.open(): the runtime was opened already; make a new Runtime")
        cfg = self.options
        resources = contextlib.ExitStack()
        try:
            bundle = verified_bundle(cfg) if self._bundle is None else checked_bundle(self._bundle, cfg)
            self._history = _input_history(bundle)
            low, high = (_bound(b, bundle.frame_dim, name, fill) for b, name, fill in zip(self._bounds, _NAMES, _FILLS))
            ordered_bounds(low, high)
            weights = resources.enter_context(last_good_weights(cfg))
            self._telemetry = resources.enter_context(TelemetryWriter(cfg.telemetry, overwrite=cfg.overwrite_telemetry))
            emit = locked(self._telemetry.write)
            parts = compose(cfg, bundle, weights, make_shield(cfg, bundle, emit), emit, self._log, self._caller.name)
            resources.callback(parts.monitor.close)
            if parts.tuner is not None:
                resources.callback(parts.tuner.stop)  # before the lock is released: the learner process goes first
            self._parts: Composition = parts
            self._watchdog = InferenceWatchdog(cfg.inference_timeout, self._tripped)
            history = self._history
            self._pipeline = step_pipeline(cfg, bundle, parts, low, high, self._watchdog.running, history=history)
            self._scratch = step_pipeline(
                cfg, bundle, parts, low, high, self._watchdog.running, scratch=True, history=history
            )
            if history is not None and parts.shield is not None:
                parts.shield.restarted.append(history.restart)
            self._ticker = BudgetTicker(
                parts, (self._pipeline, self._scratch), cfg.inference_budget, cfg.rate_hz, emit, self._log
            )
            emit(
                {
                    "type": "config",
                    "config": config_dict(cfg) if self._caller.config is None else self._caller.config,
                    "env": self._caller.env,
                    "shift": self._caller.shift,
                    "backend": self._ticker.backend.describe(),
                    "auto": parts.auto(),
                    "power_source": parts.sensor.source if parts.sensor else None,
                    "loaded_precisions": list(parts.backends),
                }
            )
            if parts.tuner is not None:
                parts.tuner.start()
            self._watchdog.start()
            resources.callback(self._watchdog.stop)  # first on close
        except BaseException:
            resources.close()
            raise
        self._resources = resources
        self._state = RuntimeState.OPEN  # the control thread is the first to call
        return self

    def close(self, schedule: ScheduleSummary | None = None) -> RuntimeSummary:
        """Stop the fine-tuner (the last good weights stay on disk), release the lock, close telemetry;
        the final summary (again on later calls). With ``schedule`` (``sac-edge run``'s loop) the
        telemetry's summary record is the run's (``RunSummary``)."""
        if self._final is not None:
            return self._final
        if self._state is RuntimeState.CREATED:
            raise SacEdgeError("Runtime.close() before open()")
        self._claim("close")
        assert self._resources is not None
        self._pipeline.stats.fold()
        self._ticker.note_memory(self._parts.monitor.read_memory())
        try:
            if self._parts.tuner is not None:
                self._parts.tuner.stop()
            self._parts.monitor.close()
            summary = self._summary(closed=True, summary_record=True)
            record = summary.to_dict()
            if schedule is not None:
                record = RunSummary(summary, schedule, self._caller.env or "", self._caller.shift).to_json()
            self._telemetry.write({"type": "summary", **record})
        finally:
            self._state, self._owner = RuntimeState.CLOSED, _NOBODY
            self._resources.close()
        if summary.finetune is not None and summary.finetune["error"]:
            self._log(f"{self._caller.name}: fine-tuning stopped early: {summary.finetune['error']}")
        self._final = summary
        return summary

    def __enter__(self) -> Runtime:
        return self.open() if self._state is RuntimeState.CREATED else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._final is None and self._state is not RuntimeState.CREATED:
            self.close()

    @property
    def shield(self) -> Shield | None:
        """The safety shield (None with the options' ``shield=None``). A caller that swaps weights itself calls its
        ``weights_swapped()`` so that the ramp runs; ``falling_back`` says whether the fallback serves now."""
        self._opened("shield", "there is no shield yet")
        return self._parts.shield

    @property
    def backend(self) -> Backend:
        """The backend serving now (the fine-tuner swaps weights into it; the governor may switch it)."""
        self._opened("backend", "there is no backend yet")
        return self._ticker.backend

    @property
    def stats(self) -> StepStats:
        """The per-step timings (``act`` adds each inference; a scheduler adds its own: ``control/loop.py``)."""
        self._opened("stats", "there are no steps yet")
        return self._pipeline.stats

    @property
    def stopped_by(self) -> str | None:
        """Why ``act`` refuses (``backend error xN: ...``, ``inference watchdog: ...``), else None."""
        return self._stopped_by

    # -- the control thread --------------------------------------------------------------------------
    def act(self, obs: np.ndarray) -> np.ndarray:
        """The action for ``obs``: finite and inside the bounds, the last safe one when the observation is
        held (``obs_fault="hold"``), the inference overran ``inference_budget`` of the period or raised.
        Any observation is taken: one of another real dtype is converted to the policy's, anything else is
        malformed (counted, answered with a safe action). The returned array is reused by the next call
        (copy it to keep it). After ``max_backend_errors`` failed inferences, or a call the watchdog gave up
        on, the runtime stops serving: that call raises a one-line ``StoppedServing`` (an ``InternalError``;
        its ``action`` is the configured safe action, ``safe_action()``), and so does every later one."""
        if _get_ident() != self._owner:
            self._claim("act")
        if type(obs) is not np.ndarray:
            obs = plain_array(obs)  # type: ignore[assignment]
        try:
            action = self._pipeline.act(obs)
            if self._history is not None:
                self._history.sent(action)
            return action
        except BackendFailed as failed:
            self._stopped_by, self._state, self._owner = failed.reason, RuntimeState.STOPPED, _NOBODY
            raise StoppedServing(failed.reason, self.safe_action(), False) from None
        except CallTaken:
            raise self._hung() from None

    def warm_up(self, obs: np.ndarray) -> bool:
        """The step run on ``obs`` against scratch state (its own guards, shield and counts; the serving
        backend), to bring the step's code and the weights into the caches just before a deadline: nothing
        ``act`` keeps changes. False once the inference watchdog has given up on a call (``act`` then
        raises)."""
        if _get_ident() != self._owner:
            self._claim("warm_up")
        if type(obs) is not np.ndarray:
            obs = plain_array(obs)  # type: ignore[assignment]
        try:
            self._scratch.act(obs)
        except BackendFailed:
            pass  # the scratch step's own count: ``act`` counts the real ones
        except CallTaken:
            return False
        return True

    def observe(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: SupportsFloat | None,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> None:
        """The transition that followed ``act(obs)``: counted, and with fine-tuning given to the learner
        (a malformed observation or a non-finite reward is not)."""
        if _get_ident() != self._owner:
            self._claim("observe")
        if terminated.__class__ is not bool or truncated.__class__ is not bool:  # plain bools skip the checks
            terminated, truncated = done_flag(terminated, "terminated"), done_flag(truncated, "truncated")
        counts = self._transitions
        counts.transitions += 1
        history, tuner = self._history, self._parts.tuner
        if tuner is not None:
            if type(obs) is not np.ndarray:
                obs = plain_array(obs)  # type: ignore[assignment]
            if type(next_obs) is not np.ndarray:
                next_obs = plain_array(next_obs)  # type: ignore[assignment]
            guard = self._pipeline.obs_guard
            if not (guard.well_formed(obs) and guard.well_formed(next_obs)):
                tuner = None
        inputs = None
        if history is not None:  # the action the caller applied is the last action the policy sees
            history.applied(action)
            if tuner is not None:  # the inputs the trainer would store, before an episode's end restarts it
                inputs = history.transition(next_obs)
                tuner = tuner if inputs is not None else None
        if terminated or truncated:
            counts.episodes += 1
            if self._parts.shield is not None:  # the caller resets its plant: a new start for the ramp
                self._parts.shield.restart()  # and for the observation history (its listener)
            elif history is not None:
                history.restart()
        if tuner is None:
            return
        value = finite_reward(reward)
        if value is None:
            counts.reward_invalid += 1
            return
        if inputs is not None:
            obs, next_obs = inputs
        tuner.observe(obs, np.asarray(action), value, next_obs, bool(terminated), bool(truncated))

    def tick(self, window: ScheduleWindow | None = None) -> TickReport:
        """Once a second (call it as often as you like; calls in between return the last report): memory
        and power read, the governor ticked (a precision switch and the fine-tuning knobs apply here), one
        telemetry record. The caller owns the schedule: run at the report's ``rate_hz``.

        A scheduler that keeps its own seconds (``control/loop.py``) passes each one's ``window``: the
        reading is then taken at once and the record carries the window's steps and misses."""
        if _get_ident() != self._owner:
            self._claim("tick")
        ticker = self._ticker
        if window is None:
            now = time.monotonic_ns()
            if now < ticker.next_ns:
                return ticker.report
            ticker.next_ns = now + TICK_NS
            t_s = round((now - ticker.t0) / 1e9, 3)
        else:
            t_s = window.t_s
        return ticker.tick(t_s, window, self._pipeline.counters.steps)

    def last_input(self) -> np.ndarray | None:
        """What the policy was given at the last inferred step: with an observation contract (``--last-action``,
        ``--obs-history``) the assembled input (a copy), None for a policy of the frame alone."""
        return None if self._history is None else self._history.last_input()

    def safe_action(self) -> np.ndarray:
        """The configured safe action (a new array): the shield's (``--safe-action``, else the bundle's
        envelope's, else 0, inside the action bounds), or without a shield 0 clipped to the bounds. What a
        caller sends when the run ends (stop, signal, error): a robot's controller holds the last command."""
        self._opened("safe_action()", "the action bounds are not known yet")
        shield = self._parts.shield
        if shield is not None:
            return np.array(shield.safe_action, dtype=np.float32)
        guard = self._pipeline.act_guard
        return np.clip(np.zeros_like(guard.low), guard.low, guard.high)

    def last_action(self) -> np.ndarray:
        """The last action the action guard let through (a reused buffer), as ``act`` holds it on an overrun."""
        return self._pipeline.act_guard.hold()

    def hold(self, obs: np.ndarray | None = None) -> np.ndarray:
        """The step for a loop whose input it cannot trust now (a stale or missing sensor message): nothing
        is inferred; the last safe action, through the shield's fallback where there is a shield (which
        then ramps back to the policy once ``act`` steps again), in a buffer the next step reuses, as ``act``'s.
        Counted as a step and in ``obs_held``, as ``act`` counts an observation its guard holds; the shield
        counts the fallback (cause ``not_inferred``). ``obs``: the last observation the caller has, for the
        shield's envelope and stuck-sensor checks (None: none)."""
        if _get_ident() != self._owner:
            self._claim("hold")
        observed = plain_array(obs) if obs is not None else None
        action = self._pipeline.hold(observed if type(observed) is np.ndarray else None)
        if self._history is not None:
            self._history.sent(action)
        return action

    # -- any thread ----------------------------------------------------------------------------------
    def summary(self) -> RuntimeSummary:
        """The counts and latencies so far (any thread; inference latency up to the last ``tick``), or the
        final ones after ``close``."""
        if self._final is not None:
            return self._final
        self._opened("summary()", "there is nothing to report yet")
        return self._summary(closed=False)

    # -- internals -----------------------------------------------------------------------------------
    def _opened(self, what: str, why: str) -> None:
        if self._state is RuntimeState.CREATED:
            raise SacEdgeError(f"Runtime.{what} before open(): {why}")

    def _claim(self, call: str) -> None:
        """The first call on the control thread takes it; anything else is misuse (one line)."""
        state = self._state
        if state is RuntimeState.CREATED:
            raise SacEdgeError(f"Runtime.{call}() before open(): call open() or use the runtime in a with block")
        if state is RuntimeState.CLOSED:
            raise SacEdgeError(f"Runtime.{call}() after close(): open a new Runtime")
        ident = _get_ident()
        if state is RuntimeState.OPEN:
            self._thread = self._owner = ident
            self._state = RuntimeState.SERVING
            return
        if ident != self._thread and not (call == "close" and self._hang is not None):  # a hung call: the
            # control thread is stuck in it, and the watchdog's thread closes
            raise SacEdgeError(
                f"Runtime.{call}() from thread {threading.current_thread().name!r}: act, warm_up, observe, tick "
                "and close belong to the thread that first called one of them; only summary() may come from another"
            )
        if call == "act" and state is RuntimeState.STOPPED:
            assert self._stopped_by is not None
            raise StoppedServing(self._stopped_by, self.safe_action(), self._hang is not None)

    def _tripped(self, ran_ns: int) -> None:
        """The watchdog's thread, once, while the control thread is inside a call that overran by far."""
        limit = self.options.inference_timeout
        name = self._ticker.backend.name
        precision = self._ticker.precision
        self._hang = {"backend": name, "precision": precision, "limit_s": limit, "call_s": round(ran_ns / 1e9, 3)}
        self._stopped_by = (
            f"inference watchdog: a {name} call ran {ran_ns / 1e9:.1f} s, past the {limit:g} s --inference-timeout"
        )
        self._state, self._owner = RuntimeState.STOPPED, _NOBODY
        self._hang_policy.hung(self._stopped_by)

    def _hung(self) -> StoppedServing:
        """After a call the watchdog took: its thread has handled the step (``done``), and ``act`` raises."""
        self._watchdog.done.wait()
        assert self._stopped_by is not None
        return StoppedServing(self._stopped_by, self.safe_action(), True)

    def _summary(self, closed: bool, summary_record: bool = False) -> RuntimeSummary:
        pipeline, ticker, parts, telemetry = self._pipeline, self._ticker, self._parts, self._telemetry
        obs, act, steps, seen = pipeline.obs_guard, pipeline.act_guard, pipeline.counters, self._transitions
        return RuntimeSummary(
            steps=steps.steps,
            transitions=seen.transitions,
            episodes=seen.episodes,
            rate_hz=self.options.rate_hz,
            final_rate_hz=ticker.rate_hz,
            latency_us=pipeline.stats.run_percentiles_us("latency"),
            inference_overruns=steps.overruns,
            obs_nonfinite=obs.nonfinite,
            obs_out_of_range=obs.out_of_range,
            obs_malformed=obs.malformed,
            obs_held=steps.obs_held,
            action_nonfinite=act.nonfinite,
            action_clipped=act.clipped,
            backend_errors=steps.backend_errors,
            backend_error=steps.backend_error,
            inference_hang=self._hang,
            reward_invalid=seen.reward_invalid,
            shield=guards_summary() if parts.shield is None else parts.shield.summary(),
            backend=ticker.backend.describe(),
            precision=ticker.precision,
            precision_switches=ticker.switches,
            auto=tuple(parts.auto(unavailable=False)),
            peak_rss_mb=ticker.peak_rss_mb,
            budget_events=len(ticker.events),
            events=tuple(ticker.events),
            resume=parts.resumed,
            finetune=parts.tuner.summary() if parts.tuner is not None else None,
            telemetry_records=telemetry.records + summary_record,
            telemetry_dropped=telemetry.dropped,
            stopped_by=self._stopped_by,
            torch_imported="torch" in sys.modules,
            closed=closed,
        )


def _input_history(bundle: Bundle) -> InputHistory | None:
    """The observation history a bundle's contract asks the runtime to keep (None: the frame alone)."""
    contract = bundle.observation
    if contract is None or contract.plain:
        return None
    return InputHistory(contract, bundle.spec.action_low, bundle.spec.action_high)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


_NOBODY = -1
"""``Runtime._owner`` when no thread may call without the full check (not serving)."""
_NAMES, _FILLS = ("obs_low", "obs_high"), (-np.inf, np.inf)


def _bound(value: Any, obs_dim: int, name: str, fill: float) -> np.ndarray:
    """An observation bound as a float64 array of the bundle's ``obs_dim`` (``fill`` when not given)."""
    if value is None:
        return np.full(obs_dim, fill)
    try:
        out = np.asarray(value, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise SacEdgeError(f"Runtime: {name} must be {obs_dim} numbers (the bundle's obs_dim)") from None
    if out.shape != (obs_dim,) or np.isnan(out).any():
        raise SacEdgeError(f"Runtime: {name} must be {obs_dim} numbers (the bundle's obs_dim), got shape {out.shape}")
    return out
