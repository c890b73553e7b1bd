"""The runtime as a library: a robot's own control loop asks it for actions.

``sac-edge run`` owns the schedule and drives a gymnasium env; robot software usually owns its loop (a ROS 2
timer callback, a robot SDK's callback, a hand-written loop). :class:`Runtime` gives that loop the same
guarantees, composed by the same builder as ``sac-edge run`` (``compose.py``): a verified bundle, a
parity-gated backend (``--backend auto`` timed at open), the observation and action guards, the last safe
action on an overrun, memory and power budgets with the governor, fine-tuning with promotion and rollback
(the last good weights kept on disk), and telemetry::

    from sac_edge.edge_runtime.runtime import FinetuneSection, LoopSection, RunConfig, Runtime

    options = RunConfig(bundle="bundles/pend", loop=LoopSection(rate_hz=100), finetune=FinetuneSection(enabled=True))
    with Runtime(options) as runtime:
        obs = robot.read()
        while robot.ok():
            action = runtime.act(obs)
            next_obs, reward, terminated, truncated = robot.apply(action)
            runtime.observe(obs, action, reward, next_obs, terminated, truncated)
            obs = robot.reset() if terminated or truncated else next_obs
            runtime.tick()  # budgets once a second; its rate_hz is the rate the governor asks for
    print(runtime.summary())

Options are ``sac-edge run``'s ``RunConfig``: its sections (``BackendSection``, ``LoopSection``,
``ShieldSection``, ``RealtimeSection``, ``BudgetSection``, ``FinetuneSection``) hold the flags under their
names, checked in the same place before anything is opened; ``RunConfig.of(bundle, rate_hz=100,
finetune=True)`` takes the flags' names flat. The settings about the env and the schedule (``env``,
``shift``, ``seed``, and of the loop ``duration``, ``spin_us``, ``warm_cache``; the realtime section but
``cpus``) are the caller's business here and are not used; ``loop.inference_timeout`` is the inference
watchdog's limit (a call that runs past it stops the runtime: ``act`` raises once it returns);
``loop.rate_hz`` is the rate the caller runs at (the period the inference budget is a fraction of, the
learner's sizing, the governor's top rung); ``realtime.cpus`` are the CPUs the caller's loop runs on (the
learner process keeps off them).

``sac-edge run`` is a client of this class too: its scheduler (``control/loop.py``) calls ``act``,
``observe``, ``rehearse`` (the warm-cache rehearsal before each slot) and ``tick`` with each second's
schedule figures, so the step cannot differ between the two. ``act`` is written for that: what it touches
is bound once at ``open`` and the thread check is one comparison.

Threads: ``act``, ``rehearse``, ``observe``, ``tick`` and ``close`` come from one thread, the control thread:
the first one that calls one of them after ``open``. ``summary`` may come from any thread. A call from
another thread, or before ``open`` or after ``close``, is refused with a one-line :class:`SacEdgeError`. The
fine-tuner's coordinator thread, the inference watchdog's thread and the learner process run beside it, as
under ``sac-edge run``. torch is imported (in the learner process only) only when ``finetune.enabled`` is set.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from types import TracebackType
from typing import Any, SupportsFloat

import numpy as np

from sac_edge.common.bundle import Bundle
from sac_edge.common.config import config_dict
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.inputs import done_flag, ordered_bounds
from sac_edge.edge_runtime.backends.base import Backend
from sac_edge.edge_runtime.control.loop import (
    ScheduleSummary,
    ScheduleWindow,
    StoppedServing,
    error_line,
    finite_reward,
)
from sac_edge.edge_runtime.control.safety import ActionGuard, ObservationGuard, plain_array
from sac_edge.edge_runtime.control.shield import Shield, ShieldSummary, guards_summary
from sac_edge.edge_runtime.control.step_stats import StepStats
from sac_edge.edge_runtime.control.telemetry import TelemetryWriter
from sac_edge.edge_runtime.control.watchdog import InferenceWatchdog
from sac_edge.edge_runtime.finetune.finetuner import FinetuneSummary
from sac_edge.edge_runtime.finetune.settings import FinetuneSection

from .compose import Composition, Log, compose, last_good_weights, locked, make_shield, validate, verified_bundle
from .config import BackendSection, BudgetSection, LoopSection, RealtimeSection, RunConfig, ShieldSection

__all__ = [
    "BackendSection",
    "BudgetSection",
    "FinetuneSection",
    "LoopSection",
    "RealtimeSection",
    "RunConfig",
    "RunSummary",
    "Runtime",
    "RuntimeSummary",
    "ShieldSection",
    "StoppedServing",
    "TickReport",
]

TICK_NS = 1_000_000_000
"""``tick`` reads the budgets and ticks the governor at most once a second (its hysteresis counts samples
at that pace); calls in between return the last report."""

#: Bound once: ``act`` runs at the control rate, and a module global is one lookup, not two.
_get_ident = threading.get_ident
_timer = time.perf_counter_ns


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
    """``act`` calls."""
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
    """The shield's settings and counts (``mode`` alone with ``shield="guards"``)."""
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
    """``sac-edge run``'s summary: the runtime's figures, the schedule's and the env's (``to_json`` gives the
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


class Runtime:
    """A bundle's policy behind ``act``/``observe``/``tick`` for a loop the caller owns (module docstring)."""

    def __init__(
        self,
        options: RunConfig,
        *,
        obs_low: Any = None,
        obs_high: Any = None,
        log: Log | None = None,
        bundle: Bundle | None = None,
        env: str | None = None,
        shift: dict[str, Any] | None = None,
        on_hang: Callable[[], None] | None = None,
        name: str = "sac-edge runtime",
    ) -> None:
        """Check ``options`` (every flag, one line each) and nothing else; ``open`` does the work.

        ``obs_low``/``obs_high`` are the observation bounds the guard enforces (the training env's
        observation space); without them an observation need only be finite. ``bundle`` is the bundle
        already verified from ``options.bundle`` (``compose.verified_bundle``), else ``open`` verifies it;
        ``env`` and ``shift`` name the plant in the telemetry. ``on_hang`` is called on the inference
        watchdog's thread when a call runs past ``inference_timeout`` (the control thread is still inside it;
        ``act`` raises ``StoppedServing`` if it returns); without it the runtime logs one line. ``name``
        begins the lines it logs."""
        validate(options)
        self.options = options
        self._bounds = (obs_low, obs_high)
        self._log: Log = log if log is not None else (lambda message: print(message, file=sys.stderr, flush=True))
        self._given_bundle, self._env, self._shift, self._on_hang, self._name = bundle, env, shift, on_hang, name
        self._owner: int | None = _NOT_OPEN
        """The control thread's id, None before its first call, or a state below 0 (checked in one
        comparison per call)."""
        self._thread: int | None = None
        self._held: contextlib.ExitStack | None = None
        self._final: RuntimeSummary | None = None
        self._hang: dict[str, Any] | None = None
        self._stopped_by: str | None = None

    # -- lifecycle -----------------------------------------------------------------------------------
    def open(self) -> Runtime:
        """Verify the bundle, take the fine-tuning lock, open and gate the backends (as ``sac-edge run``
        does), start the fine-tuner and the inference watchdog; returns ``self``."""
        if self._owner != _NOT_OPEN or self._final is not None:
            raise SacEdgeError("Runtime.open(): the runtime was opened already; make a new Runtime")
        cfg = self.options
        held = contextlib.ExitStack()
        try:
            bundle = self._given_bundle or verified_bundle(cfg)
            spec = bundle.spec
            low, high = (_bound(b, spec.obs_dim, name, fill) for b, name, fill in zip(self._bounds, _NAMES, _FILLS))
            ordered_bounds(low, high)
            weights = held.enter_context(last_good_weights(cfg))
            self._telemetry = held.enter_context(TelemetryWriter(cfg.telemetry, overwrite=cfg.overwrite_telemetry))
            self._emit = locked(self._telemetry.write)
            parts = compose(cfg, bundle, weights, make_shield(cfg, bundle, self._emit), self._emit, self._log)
            held.callback(parts.monitor.close)
            if parts.tuner is not None:
                held.callback(parts.tuner.stop)  # before the lock is released: the learner process goes first
            self._parts: Composition = parts
            self._tuner, self._shield = parts.tuner, parts.shield
            inner = parts.shield.obs_bounds if parts.shield is not None else None
            self._obs_guard = ObservationGuard(low, high, cfg.loop.obs_fault, inner)
            self._act_guard = ActionGuard(np.array(spec.action_low), np.array(spec.action_high))
            self._stats = StepStats()
            self._steps = self._transitions = self._episodes = self._held_obs = self._overruns = 0
            self._backend_errors = self._reward_invalid = self._switches = 0
            self._backend_error: dict[str, str] | None = None
            self._events: list[dict[str, Any]] = []
            self._peak_rss_mb = float("nan")
            self._rate_hz = cfg.loop.rate_hz
            self._budget_ns = int(cfg.loop.inference_budget * 1e9 / cfg.loop.rate_hz)
            self._serve(parts.first)
            # What ``act`` touches at the control rate, bound once (attribute chains cost at 1 kHz).
            self._check, self._hold, self._apply = self._obs_guard.check, self._act_guard.hold, self._act_guard.apply
            self._latency, self._infer = self._stats.latency.append, self._stats.infer.append
            self._explore = parts.tuner.explore if parts.tuner is not None else None
            self._shape = parts.shield.shape if parts.shield is not None else None
            self._take = self._act_guard.take
            self._watchdog = InferenceWatchdog(cfg.loop.inference_timeout, self._tripped)
            self._running = self._watchdog.running
            self._emit(
                {
                    "type": "config",
                    "config": config_dict(cfg),
                    "env": self._env,
                    "shift": self._shift,
                    "backend": self._backend.describe(),
                    "auto": parts.auto(),
                    "power_source": parts.sensor.source if parts.sensor else None,
                    "loaded_precisions": list(parts.backends),
                }
            )
            if parts.tuner is not None:
                parts.tuner.start()
            self._watchdog.start()
            held.callback(self._watchdog.stop)  # first on close
        except BaseException:
            held.close()
            raise
        self._held = held
        self._t0 = time.monotonic_ns()
        self._next_tick = self._t0 + TICK_NS
        self._report = TickReport(0.0, self._rate_hz, self._precision, (), {}, None, self._stats.figures("latency"))
        self._owner = None  # the control thread is the first to call
        return self

    def close(self, schedule: ScheduleSummary | None = None) -> RuntimeSummary:
        """Stop the fine-tuner (the last good weights stay on disk), release the lock, close telemetry;
        the final summary (again on later calls). With ``schedule`` (``sac-edge run``'s loop) the
        telemetry's summary record is the run's (``RunSummary``)."""
        if self._final is not None:
            return self._final
        if self._owner == _NOT_OPEN:
            raise SacEdgeError("Runtime.close() before open()")
        self._claim("close")
        assert self._held is not None
        self._stats.fold()
        self._note_memory(self._parts.monitor.read_memory())
        try:
            if self._tuner is not None:
                self._tuner.stop()
            self._parts.monitor.close()
            summary = self._summary(closed=True, summary_record=True)
            record = summary.to_dict()
            if schedule is not None:
                record = RunSummary(summary, schedule, self._env or "", self._shift).to_json()
            self._telemetry.write({"type": "summary", **record})
        finally:
            self._owner = _CLOSED
            self._held.close()
        if summary.finetune is not None and summary.finetune["error"]:
            self._log(f"{self._name}: fine-tuning stopped early: {summary.finetune['error']}")
        self._final = summary
        return summary

    def __enter__(self) -> Runtime:
        return self.open() if self._owner == _NOT_OPEN and self._final is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._final is None and self._owner != _NOT_OPEN:
            self.close()

    @property
    def shield(self) -> Shield | None:
        """The safety shield (None with ``shield="guards"``). A caller that swaps weights itself calls its
        ``weights_swapped()`` so that the ramp runs; ``falling_back`` says whether the fallback serves now."""
        if self._owner == _NOT_OPEN:
            raise SacEdgeError("Runtime.shield before open(): there is no shield yet")
        return self._shield

    @property
    def backend(self) -> Backend:
        """The backend serving now (the fine-tuner swaps weights into it; the governor may switch it)."""
        if self._owner == _NOT_OPEN:
            raise SacEdgeError("Runtime.backend before open(): there is no backend yet")
        return self._backend

    @property
    def stats(self) -> StepStats:
        """The per-step timings (``act`` adds each inference; a scheduler adds its own: ``control/loop.py``)."""
        return self._stats

    @property
    def stopped_by(self) -> str | None:
        """Why ``act`` refuses (``backend error xN: ...``, ``inference watchdog: ...``), else None."""
        return self._stopped_by

    # -- the control thread --------------------------------------------------------------------------
    def act(self, obs: np.ndarray) -> np.ndarray:
        """The action for ``obs``: finite and inside the bounds, the last safe one when the observation is
        held (``obs_fault="hold"``), the inference overran ``inference_budget`` of the period or raised.
        The returned array is reused by the next call (copy it to keep it). After ``max_backend_errors``
        failed inferences, or a call the watchdog gave up on, the runtime stops serving: that call raises a
        one-line ``StoppedServing`` (an ``InternalError``; its ``action`` is the last safe action), and so
        does every later one."""
        if _get_ident() != self._owner:
            self._claim("act")
        if type(obs) is not np.ndarray:
            obs = plain_array(obs)  # type: ignore[assignment]
        self._steps += 1
        safe = self._check(obs)
        if safe is None:
            self._held_obs += 1
            self._infer(0)
            return self._last_safe(obs)
        running = self._running  # the watchdog's: this call's entry, taken back after it (watchdog.py)
        t0 = _timer()
        running[t0] = True
        try:
            raw = self._call(safe)
        except Exception as err:  # the backend is foreign code: hold, count, stop at the limit
            return self._failed(err, obs, t0)
        took = _timer() - t0
        if running.pop(t0, None) is None:  # the watchdog took the call: the run is its
            raise self._hung()
        self._latency(took)
        self._infer(took)
        if took > self._budget_ns:  # stale by now: the last safe action
            self._overruns += 1
            return self._last_safe(obs)
        explore = self._explore
        if explore is not None:
            raw = explore(raw)
        shape = self._shape
        if shape is None:
            return self._apply(raw)
        # The shield takes the guards' Python floats: the observation's and the guarded action's
        return shape(obs, self._obs_guard.values, self._take(raw), True)

    def _last_safe(self, obs: np.ndarray) -> np.ndarray:
        """The last safe action, through the shield where there is one (its step was not inferred)."""
        shape = self._shape
        if shape is None:
            return self._hold()
        return shape(obs, None, self._act_guard.safe, False)

    def rehearse(self, obs: np.ndarray) -> bool:
        """``act``'s work on ``obs`` without its effects, to bring its code and weights into the caches just
        before a deadline: the guard's state after checking a fine observation is what ``act``'s own check
        leaves, the inference's output is overwritten by the next, and an unfit observation is skipped.
        False once the inference watchdog has given up on a call (``act`` then raises); a failing call is
        left to ``act`` to count."""
        if _get_ident() != self._owner:
            self._claim("rehearse")
        if type(obs) is not np.ndarray:
            obs = plain_array(obs)  # type: ignore[assignment]
        # What ``act`` reads that the work below does not (a load brings its object into the cache; between
        # slots an env's step can evict it all): without these, the step after the rehearsal starts cold.
        _warm = (self._steps, self._hold, self._apply, self._take, self._shape, self._latency, self._infer,
                 self._budget_ns, self._explore)  # fmt: skip
        if self._obs_guard.fine(obs):
            safe = self._check(obs)
            assert safe is not None
            running = self._running
            t0 = _timer()
            running[t0] = True
            try:
                raw = self._call(safe)
            except Exception:
                return running.pop(t0, None) is not None
            if running.pop(t0, None) is None:
                return False
            if self._tuner is not None:
                self._tuner.rehearse(safe, raw)
            if self._shield is None:
                self._act_guard.rehearse(raw)
            else:
                checked = self._act_guard.clip(raw)
                if checked is not None:
                    self._shield.rehearse(obs, self._obs_guard.values, checked[0])
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
        if terminated.__class__ is not bool or truncated.__class__ is not bool:  # the common case costs two compares
            terminated, truncated = done_flag(terminated, "terminated"), done_flag(truncated, "truncated")
        self._transitions += 1
        if terminated or truncated:
            self._episodes += 1
            if self._shield is not None:  # the caller resets its plant: a new start for the ramp
                self._shield.restart()
        tuner = self._tuner
        if tuner is None:
            return
        if type(obs) is not np.ndarray:
            obs = plain_array(obs)  # type: ignore[assignment]
        if type(next_obs) is not np.ndarray:
            next_obs = plain_array(next_obs)  # type: ignore[assignment]
        guard = self._obs_guard
        if not (guard.well_formed(obs) and guard.well_formed(next_obs)):
            return
        value = finite_reward(reward)
        if value is None:
            self._reward_invalid += 1
            return
        tuner.observe(obs, np.asarray(action), value, next_obs, bool(terminated), bool(truncated))

    def tick(self, window: ScheduleWindow | None = None) -> TickReport:
        """Once a second (call it as often as you like; calls in between return the last report): memory
        and power read, the governor ticked (a precision switch and the fine-tuning knobs apply here), one
        telemetry record. The caller owns the schedule: run at the report's ``rate_hz``.

        A scheduler that keeps its own seconds (``control/loop.py``) passes each one's ``window``: the
        reading is then taken at once and the record carries the window's figures."""
        if _get_ident() != self._owner:
            self._claim("tick")
        if window is None:
            now = time.monotonic_ns()
            if now < self._next_tick:
                return self._report
            self._next_tick = now + TICK_NS
            t_s = round((now - self._t0) / 1e9, 3)
        else:
            t_s = window.t_s
        latency, jitter = self._stats.fold()
        record: dict[str, Any] = {"type": "second", "t_s": t_s}
        if window is None:
            record.update(steps_total=self._steps, latency_us=latency)
        else:
            record.update(
                steps=window.steps,
                latency_us=latency,
                jitter_us=jitter,
                misses=window.misses,
                misses_total=window.misses_total,
                steps_total=window.steps_total,
            )
        record.update(precision=self._precision, rate_hz=self._rate_hz)  # what served this second
        tick = self._parts.monitor.tick(t_s)
        self._note_memory(tick.memory)
        record.update(memory=tick.memory, power=tick.power, governor=tick.governor)
        for event in tick.events:
            self._events.append(event)
            self._emit({"type": "event", "t_s": t_s, **event})
        if tick.precision is not None and tick.precision != self._precision and tick.precision in self._parts.backends:
            self._serve(tick.precision)
            self._switches += 1
        if tick.rate_hz is not None and not math.isclose(tick.rate_hz, self._rate_hz):
            self._rate_hz = float(tick.rate_hz)
            self._budget_ns = int(self.options.loop.inference_budget * 1e9 / self._rate_hz)
        self._emit(record)
        self._report = TickReport(
            t_s, self._rate_hz, self._precision, tuple(tick.events), dict(tick.memory), tick.power, latency
        )
        return self._report

    def safe_action(self) -> np.ndarray:
        """The last safe action (a reused buffer), as ``act`` holds it."""
        return self._hold()

    # -- any thread ----------------------------------------------------------------------------------
    def summary(self) -> RuntimeSummary:
        """The figures so far (any thread; inference latency up to the last ``tick``), or the final ones
        after ``close``."""
        if self._final is not None:
            return self._final
        if self._owner == _NOT_OPEN:
            raise SacEdgeError("Runtime.summary() before open(): there is nothing to report yet")
        return self._summary(closed=False)

    # -- internals -----------------------------------------------------------------------------------
    def _serve(self, precision: str) -> None:
        """Serve ``precision`` from now (at open, and when the governor switches)."""
        self._precision = precision
        self._backend = self._parts.backends[precision]
        self._call = self._backend.act

    def _claim(self, call: str) -> None:
        """The first call on the control thread takes it; anything else is misuse (one line)."""
        owner = self._owner
        if owner == _NOT_OPEN:
            raise SacEdgeError(f"Runtime.{call}() before open(): call open() or use the runtime in a with block")
        if owner == _CLOSED:
            raise SacEdgeError(f"Runtime.{call}() after close(): open a new Runtime")
        ident = _get_ident()
        if owner is None:
            self._owner = self._thread = ident
            return
        if ident != self._thread and not (call == "close" and self._hang is not None):  # a hung call: the
            # control thread is stuck in it, and the watchdog's thread closes
            raise SacEdgeError(
                f"Runtime.{call}() from thread {threading.current_thread().name!r}: act, rehearse, observe, tick and "
                "close belong to the thread that first called one of them; only summary() may come from another"
            )
        if call == "act" and self._stopped_by is not None:
            raise StoppedServing(self._stopped_by, self._hold(), self._hang is not None)

    def _failed(self, err: Exception, obs: np.ndarray, t0: int) -> np.ndarray:
        """``act`` after the backend call begun at ``t0`` raised: counted, the last safe action (through the
        shield), and at ``max_backend_errors`` the runtime stops serving."""
        took = _timer() - t0
        if self._running.pop(t0, None) is None:
            raise self._hung()
        self._latency(took)
        self._infer(took)
        self._backend_errors += 1
        if self._backend_error is None:
            self._backend_error = {"type": type(err).__name__, "message": error_line(err)}
        action = self._last_safe(obs)
        if self._backend_errors >= self.options.loop.max_backend_errors:
            error = self._backend_error
            message = error["type"] + (f": {error['message']}" if error["message"] else "")
            self._stopped_by = f"backend error x{self._backend_errors}: {message}"
            self._owner = _STOPPED
            raise StoppedServing(self._stopped_by, action, False)
        return action

    def _tripped(self, ran_ns: int) -> None:
        """The watchdog's thread, once, while the control thread is inside a call that overran by far."""
        limit = self.options.loop.inference_timeout
        name = self._backend.name
        self._hang = {"backend": name, "precision": self._precision, "limit_s": limit, "call_s": round(ran_ns / 1e9, 3)}
        self._stopped_by = (
            f"inference watchdog: a {name} call ran {ran_ns / 1e9:.1f} s, past the {limit:g} s --inference-timeout"
        )
        self._owner = _STOPPED
        if self._on_hang is not None:
            self._on_hang()
        else:
            self._log(f"{self._name}: {self._stopped_by}; act() raises if the call returns")

    def _hung(self) -> StoppedServing:
        """After a call the watchdog took: its thread has handled the step (``done``), and ``act`` raises."""
        self._watchdog.done.wait()
        assert self._stopped_by is not None
        return StoppedServing(self._stopped_by, self._hold(), True)

    def _note_memory(self, memory: dict[str, Any]) -> None:
        peak = memory.get("peak_rss_mb", memory.get("rss_mb"))
        if peak is not None and (np.isnan(self._peak_rss_mb) or peak > self._peak_rss_mb):
            self._peak_rss_mb = float(peak)

    def _summary(self, closed: bool, summary_record: bool = False) -> RuntimeSummary:
        obs, act, tuner, telemetry = self._obs_guard, self._act_guard, self._tuner, self._telemetry
        return RuntimeSummary(
            steps=self._steps,
            transitions=self._transitions,
            episodes=self._episodes,
            rate_hz=self.options.loop.rate_hz,
            final_rate_hz=self._rate_hz,
            latency_us=self._stats.figures("latency"),
            inference_overruns=self._overruns,
            obs_nonfinite=obs.nonfinite,
            obs_out_of_range=obs.out_of_range,
            obs_malformed=obs.malformed,
            obs_held=self._held_obs,
            action_nonfinite=act.nonfinite,
            action_clipped=act.clipped,
            backend_errors=self._backend_errors,
            backend_error=self._backend_error,
            inference_hang=self._hang,
            reward_invalid=self._reward_invalid,
            shield=guards_summary() if self._shield is None else self._shield.summary(),
            backend=self._backend.describe(),
            precision=self._precision,
            precision_switches=self._switches,
            auto=tuple(self._parts.auto(unavailable=False)),
            peak_rss_mb=self._peak_rss_mb,
            budget_events=len(self._events),
            events=tuple(self._events),
            resume=self._parts.resumed,
            finetune=tuner.summary() if tuner is not None else None,
            telemetry_records=telemetry.records + summary_record,
            telemetry_dropped=telemetry.dropped,
            stopped_by=self._stopped_by,
            torch_imported="torch" in sys.modules,
            closed=closed,
        )


#: ``Runtime._owner`` other than a thread id or None (open, no control thread yet).
_NOT_OPEN, _CLOSED, _STOPPED = -1, -2, -3
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
