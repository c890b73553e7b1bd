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
``shift``, and of the loop ``duration``, ``spin_us``, ``warm_cache``, ``inference_timeout``; the realtime
section but ``cpus``) are the caller's business here and are not used; ``loop.rate_hz`` is the rate the
caller runs at (the period the inference budget is a fraction of, the learner's sizing, the governor's top
rung); ``realtime.cpus`` are the CPUs the caller's loop runs on (the learner process keeps off them).

Threads: ``act``, ``observe``, ``tick`` and ``close`` come from one thread, the control thread: the first one
that calls one of them after ``open``. ``summary`` may come from any thread. A call from another thread, or
before ``open`` or after ``close``, is refused with a one-line :class:`SacEdgeError`. The fine-tuner's
coordinator thread and learner process run beside it, as under ``sac-edge run``. torch is imported (in the
learner process only) only when ``finetune.enabled`` is set.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from types import TracebackType
from typing import Any

import numpy as np

from sac_edge.common.bundle import open_bundle
from sac_edge.common.config import config_dict
from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.edge_runtime.backends.base import Backend
from sac_edge.edge_runtime.control.loop import describe_error, finite_reward
from sac_edge.edge_runtime.control.safety import ActionGuard, ObservationGuard, plain_array
from sac_edge.edge_runtime.control.shield import Shield, ShieldSummary, guards_summary
from sac_edge.edge_runtime.control.step_stats import StepStats
from sac_edge.edge_runtime.control.telemetry import TelemetryWriter
from sac_edge.edge_runtime.finetune.finetuner import FinetuneSummary
from sac_edge.edge_runtime.finetune.settings import FinetuneSection

from .compose import Composition, Log, attach_shield, compose, last_good_weights, locked, make_shield, validate
from .config import BackendSection, BudgetSection, LoopSection, RealtimeSection, RunConfig, ShieldSection

__all__ = [
    "BackendSection",
    "BudgetSection",
    "FinetuneSection",
    "LoopSection",
    "RealtimeSection",
    "RunConfig",
    "Runtime",
    "RuntimeSummary",
    "ShieldSection",
    "TickReport",
]

TICK_NS = 1_000_000_000
"""``tick`` reads the budgets and ticks the governor at most once a second (its hysteresis counts samples
at that pace); calls in between return the last report."""


@dataclass(frozen=True)
class TickReport:
    """The budgets as last read, and the knobs the caller applies (precision and fine-tuning apply
    themselves)."""

    t_s: float
    """Seconds since ``open`` when these readings were taken."""
    rate_hz: float
    """The control rate the governor asks for (``rate_hz`` of the options unless a budget lowered it)."""
    precision: str
    """The precision serving now."""
    events: tuple[dict[str, Any], ...]
    """The governor's actions at this reading (``degrade``, ``recover``, ``unmeetable``)."""
    memory: dict[str, Any]
    power: dict[str, Any] | None


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
    telemetry_dropped: int
    stopped_by: str | None
    """Why the runtime refuses further actions (``backend error xN: ...``), else None."""
    torch_imported: bool
    """Whether this process imported torch (the learner process is another)."""
    closed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Runtime:
    """A bundle's policy behind ``act``/``observe``/``tick`` for a loop the caller owns (module docstring)."""

    def __init__(
        self,
        options: RunConfig,
        *,
        obs_low: Any = None,
        obs_high: Any = None,
        log: Log | None = None,
    ) -> None:
        """Check ``options`` (every flag, one line each) and nothing else; ``open`` does the work.

        ``obs_low``/``obs_high`` are the observation bounds the guard enforces (the training env's
        observation space); without them an observation need only be finite."""
        validate(options)
        self.options = options
        self._bounds = (obs_low, obs_high)
        self._log: Log = log if log is not None else (lambda message: print(message, file=sys.stderr, flush=True))
        self._owner: int | None = _NOT_OPEN
        """The control thread's id, None before its first call, or a state below 0 (checked in one
        comparison per call)."""
        self._thread: int | None = None
        self._held: contextlib.ExitStack | None = None
        self._final: RuntimeSummary | None = None

    # -- lifecycle -----------------------------------------------------------------------------------
    def open(self) -> Runtime:
        """Verify the bundle, take the fine-tuning lock, open and gate the backends (as ``sac-edge run``
        does), start the fine-tuner; returns ``self``."""
        if self._owner != _NOT_OPEN or self._final is not None:
            raise SacEdgeError("Runtime.open(): the runtime was opened already; make a new Runtime")
        cfg = self.options
        held = contextlib.ExitStack()
        try:
            bundle = open_bundle(cfg.bundle, cfg.trusted_keys, allow_downgrade=cfg.allow_downgrade)
            spec = bundle.spec
            low, high = (_bound(b, spec.obs_dim, name, fill) for b, name, fill in zip(self._bounds, _NAMES, _FILLS))
            last = held.enter_context(last_good_weights(cfg))
            self._telemetry = held.enter_context(TelemetryWriter(cfg.telemetry, overwrite=cfg.overwrite_telemetry))
            self._emit = locked(self._telemetry.write)
            self._shield = make_shield(cfg, bundle, self._emit)
            parts = compose(cfg, bundle, last, self._emit, self._log)
            attach_shield(parts, self._shield)
            held.callback(parts.monitor.close)
            if parts.tuner is not None:
                held.callback(parts.tuner.stop)  # first on close: the learner process goes before the lock
            self._parts: Composition = parts
            self._tuner = parts.tuner
            self._precision = parts.first
            self._backend: Backend = parts.backends[parts.first]
            self._obs_guard = ObservationGuard(low, high, cfg.loop.obs_fault)
            self._act_guard = ActionGuard(np.array(spec.action_low), np.array(spec.action_high))
            self._stats = StepStats()
            self._latency = self._stats.latency.append
            self._rate_hz = cfg.loop.rate_hz
            self._budget_ns = int(cfg.loop.inference_budget * 1e9 / cfg.loop.rate_hz)
            self._steps = self._transitions = self._episodes = self._held_obs = self._overruns = 0
            self._backend_errors = self._reward_invalid = self._switches = 0
            self._backend_error: dict[str, str] | None = None
            self._stopped_by: str | None = None
            self._events: list[dict[str, Any]] = []
            self._peak_rss_mb = float("nan")
            self._emit(
                {
                    "type": "config",
                    "config": config_dict(cfg),
                    "env": None,
                    "shift": None,
                    "backend": self._backend.describe(),
                    "auto": parts.auto(),
                    "power_source": parts.sensor.source if parts.sensor else None,
                    "loaded_precisions": list(parts.backends),
                }
            )
            if parts.tuner is not None:
                parts.tuner.start()
        except BaseException:
            held.close()
            raise
        self._held = held
        self._t0 = time.monotonic_ns()
        self._next_tick = self._t0 + TICK_NS
        self._report = TickReport(0.0, self._rate_hz, self._precision, (), {}, None)
        self._owner = None  # the control thread is the first to call
        return self

    def close(self) -> RuntimeSummary:
        """Stop the fine-tuner (the last good weights stay on disk), release the lock, close telemetry;
        the final summary (again on later calls)."""
        if self._final is not None:
            return self._final
        if self._owner == _NOT_OPEN:
            raise SacEdgeError("Runtime.close() before open()")
        self._claim("close")
        assert self._held is not None
        self._stats.fold()
        self._read_memory()
        try:
            if self._tuner is not None:
                self._tuner.stop()
            self._parts.monitor.close()
            summary = self._summary(closed=True)
            self._telemetry.write({"type": "summary", **summary.to_dict()})
            summary = _replace_telemetry(summary, self._telemetry)
        finally:
            self._owner = _CLOSED
            self._held.close()
        if summary.finetune is not None and summary.finetune["error"]:
            self._log(f"sac-edge runtime: fine-tuning stopped early: {summary.finetune['error']}")
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

    # -- the control thread --------------------------------------------------------------------------
    def act(self, obs: np.ndarray) -> np.ndarray:
        """The action for ``obs``: finite and inside the bounds, the last safe one when the observation is
        held (``obs_fault="hold"``), the inference overran ``inference_budget`` of the period or raised.
        The returned array is reused by the next call (copy it to keep it). After ``max_backend_errors``
        failed inferences the runtime stops serving: that call raises a one-line ``InternalError``."""
        if threading.get_ident() != self._owner:
            self._claim("act")
        if type(obs) is not np.ndarray:
            obs = plain_array(obs)  # type: ignore[assignment]
        self._steps += 1
        act_guard, shield = self._act_guard, self._shield
        safe = self._obs_guard.check(obs)
        if safe is None:
            self._held_obs += 1
            action = act_guard.hold()
            return action if shield is None else shield.step(obs, action, False)
        timer = time.perf_counter_ns
        t0 = timer()
        try:
            raw = self._backend.act(safe)
        except Exception as err:  # the backend is foreign code: hold, count, stop at the limit
            took = timer() - t0
            self._latency(took)
            action = self._backend_failed(err)
            return action if shield is None else shield.step(obs, action, False)
        took = timer() - t0
        self._latency(took)
        if took > self._budget_ns:
            self._overruns += 1
            action = act_guard.hold()
            return action if shield is None else shield.step(obs, action, False)
        tuner = self._tuner
        action = act_guard.apply(raw if tuner is None else tuner.explore(raw))
        return action if shield is None else shield.step(obs, action, True)

    def observe(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: float,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> None:
        """The transition that followed ``act(obs)``: counted, and with fine-tuning given to the learner
        (a malformed observation or a non-finite reward is not)."""
        if threading.get_ident() != self._owner:
            self._claim("observe")
        self._transitions += 1
        done = bool(terminated) or bool(truncated)
        if done:
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

    def tick(self) -> TickReport:
        """Once a second (call it as often as you like; calls in between return the last report): memory
        and power read, the governor ticked (a precision switch and the fine-tuning knobs apply here), one
        telemetry record. The caller owns the schedule: run at the report's ``rate_hz``."""
        if threading.get_ident() != self._owner:
            self._claim("tick")
        now = time.monotonic_ns()
        if now < self._next_tick:
            return self._report
        self._next_tick = now + TICK_NS
        t_s = (now - self._t0) / 1e9
        latency, _ = self._stats.fold()
        tick = self._parts.monitor.tick(t_s)
        self._note_memory(tick.memory)
        for event in tick.events:
            self._events.append(event)
            self._emit({"type": "event", "t_s": round(t_s, 3), **event})
        backends = self._parts.backends
        if tick.precision is not None and tick.precision != self._precision and tick.precision in backends:
            self._precision = tick.precision
            self._backend = backends[tick.precision]
            self._switches += 1
        if tick.rate_hz is not None and tick.rate_hz != self._rate_hz:
            self._rate_hz = float(tick.rate_hz)
            self._budget_ns = int(self.options.loop.inference_budget * 1e9 / self._rate_hz)
        self._emit(
            {
                "type": "second",
                "t_s": round(t_s, 3),
                "steps_total": self._steps,
                "latency_us": latency,
                "precision": self._precision,
                "rate_hz": self._rate_hz,
                "memory": tick.memory,
                "power": tick.power,
                "governor": tick.governor,
            }
        )
        self._report = TickReport(
            round(t_s, 3), self._rate_hz, self._precision, tuple(tick.events), dict(tick.memory), tick.power
        )
        return self._report

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
    def _claim(self, call: str) -> None:
        """The first call on the control thread takes it; anything else is misuse (one line)."""
        owner = self._owner
        if owner == _NOT_OPEN:
            raise SacEdgeError(f"Runtime.{call}() before open(): call open() or use the runtime in a with block")
        if owner == _CLOSED:
            raise SacEdgeError(f"Runtime.{call}() after close(): open a new Runtime")
        ident = threading.get_ident()
        if owner is None:
            self._owner = self._thread = ident
            return
        if ident != self._thread:
            raise SacEdgeError(
                f"Runtime.{call}() from thread {threading.current_thread().name!r}: act, observe, tick and close "
                "belong to the thread that first called one of them; only summary() may come from another"
            )
        if call == "act" and self._stopped_by is not None:
            raise InternalError(f"the runtime stopped serving: {self._stopped_by}")

    def _backend_failed(self, err: Exception) -> np.ndarray:
        self._backend_errors += 1
        if self._backend_error is None:
            text = describe_error(err)
            self._backend_error = {"type": type(err).__name__, "message": text.splitlines()[0][:200] if text else ""}
        if self._backend_errors >= self.options.loop.max_backend_errors:
            error = self._backend_error
            message = error["type"] + (f": {error['message']}" if error["message"] else "")
            self._stopped_by = f"backend error x{self._backend_errors}: {message}"
            self._owner = _STOPPED
            raise InternalError(f"the runtime stopped serving: {self._stopped_by}; the last safe action was held")
        return self._act_guard.hold()

    def _read_memory(self) -> None:
        self._note_memory(self._parts.monitor.read_memory())

    def _note_memory(self, memory: dict[str, Any]) -> None:
        peak = memory.get("peak_rss_mb", memory.get("rss_mb"))
        if peak is not None and (np.isnan(self._peak_rss_mb) or peak > self._peak_rss_mb):
            self._peak_rss_mb = float(peak)

    def _summary(self, closed: bool) -> RuntimeSummary:
        obs, act, tuner = self._obs_guard, self._act_guard, self._tuner
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
            telemetry_records=self._telemetry.records,
            telemetry_dropped=self._telemetry.dropped,
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


def _replace_telemetry(summary: RuntimeSummary, telemetry: TelemetryWriter) -> RuntimeSummary:
    """The summary with the telemetry counts after its own record was written."""
    return replace(summary, telemetry_records=telemetry.records, telemetry_dropped=telemetry.dropped)
