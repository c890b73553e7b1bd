"""The fixed-rate control loop behind ``sac-edge run``: env -> guard -> policy -> guard -> env, on a schedule.

Schedule: step ``k`` starts at ``start + k * period`` on the monotonic clock (absolute, so lateness
never accumulates as drift). The loop sleeps until shortly before the slot and spins the last
``spin_us``; the wake-up error is the jitter. A step that finishes after ``start + (k + 1) * period``
is a deadline miss; when the loop is so late that whole slots have passed, it resumes at the next
future slot and counts the skipped slots (a burst of catch-up steps would be worse for a plant).

Safety policy (see ``safety.py``): observations that are non-finite or outside the declared bounds are
counted and repaired (``--obs-fault clip``, default) or cause the last safe action to be held
(``--obs-fault hold``); actions are always finite and clipped to the bounds; an inference that takes
longer than ``inference_budget`` x period is counted and its action discarded for the last safe action
(it is stale by then). With a shield (``shield.py``) each guarded action goes through it last: the
envelope and stuck-sensor checks, the fallback, the ramp (restarted at each episode) and the slew limit.
Episodes reset on termination or truncation. The environment is foreign code:
anything its ``reset()`` or ``step()`` raises (even ``SystemExit`` or ``KeyboardInterrupt``), and a result
the loop cannot read (not five values; ``terminated`` or ``truncated`` not one truth value), ends the loop
as a stop, kept in ``env_error`` and named in the summary's ``stopped_by``, so the summary is still made.
An observation that is a numpy subclass is read as a plain array first (a masked array's masked entries
as NaN: a non-finite observation for the guard); a reward that is not a finite number is counted
(``reward_invalid``) and that transition is not given to the fine-tuner.

The backend is foreign code too: an exception from ``act`` holds the last safe action for the step and is
counted (``backend_errors``, the first one kept in ``backend_error``); at ``max_backend_errors`` the loop
stops. A call that does not return is the ``InferenceWatchdog``'s (``watchdog.py``): past
``inference_timeout_s`` it holds the last safe action and ends the run with the summary, handed to
``on_hang`` on the watchdog's thread since the control thread is still inside the call.

``stop()`` (wired to SIGINT and SIGTERM by the CLI) ends the loop after the current step; the sleep to the
next slot is taken in slices of at most ``SLEEP_SLICE_S``, so at any rate a stop is seen that soon. The
summary is always produced.

Once a second, off the per-step path: latency/jitter/miss figures for the second, memory and power via
the budget monitor (which ticks the governor and may switch precision or rate), one telemetry record
plus one per governor event, and a live status line on a terminal. ``Experience`` is the hook the
on-device fine-tuner plugs into: it sees every transition and swaps weights with
``Backend.swap_weights`` from its own thread.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, Protocol

import gymnasium as gym
import numpy as np

from sac_edge.edge_runtime.backends.base import Backend

from .safety import ActionGuard, ObservationGuard, plain_array
from .shield import Shield, guards_summary
from .step_stats import StepStats, miss_cause
from .watchdog import InferenceWatchdog

SLEEP_SLICE_S = 0.05
"""The longest single sleep between steps: a stop request waits at most this long for the loop to see it."""

WARM_LEAD = 2
"""With ``warm_cache``, the step is rehearsed from this many times the first rehearsal's duration before
the slot until the slot (the most recent duration, or a slowly decaying maximum of the earlier ones: the
first, cold, rehearsal's time varies step to step), and never for more than a quarter of the period. The
first rehearsal brings the code and the weights back into the caches (it is many times slower than a
hot step after a sleep: ``bench/edge_loop.py``); the ones after it run hot and keep them there."""


class Experience(Protocol):
    """The fine-tuner's hook: may perturb each inferred action (exploration) and sees every transition.

    Both run on the control thread and must return quickly; ``explore``'s result still goes through the
    action guard (finite, inside the bounds), and held actions (bad observation, overrun) are not explored.
    """

    def explore(self, action: np.ndarray) -> np.ndarray: ...

    def observe(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: float,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> None: ...

    def rehearse(self, obs: np.ndarray, action: np.ndarray) -> None:
        """``explore`` and ``observe``'s work without their effects (no noise drawn, nothing published):
        the loop runs it with its rehearsal of the step, before the slot."""


class BudgetReport(Protocol):
    """What the budget monitor reports once a second, and the knobs the governor wants applied.

    ``budget.monitor.BudgetTick`` is the implementation; the loop names only the fields it reads, so
    control does not import the budget room.
    """

    @property
    def memory(self) -> dict[str, Any]: ...
    @property
    def power(self) -> dict[str, Any] | None: ...
    @property
    def events(self) -> list[dict[str, Any]]: ...
    @property
    def governor(self) -> dict[str, Any] | None: ...
    @property
    def precision(self) -> str | None: ...
    @property
    def rate_hz(self) -> float | None: ...


class Monitor(Protocol):
    """Memory, power and governor behind one 1 Hz call (``budget/monitor.py``)."""

    def tick(self, now_s: float) -> BudgetReport: ...

    def read_memory(self) -> dict[str, Any]: ...


class LoopSettings(NamedTuple):
    rate_hz: float
    duration_s: float
    """0 runs until stopped."""
    obs_fault: str = "clip"
    inference_budget: float = 0.5
    """Fraction of the period an inference may take before its action is discarded."""
    spin_us: float = 100.0
    seed: int = 0
    warm_cache: bool = True
    """Rehearse the step on its observation just before each slot (see ``WARM_LEAD``): between steps
    the code and the weights leave the caches; the rehearsal brings them back before the step that counts."""
    inference_timeout_s: float = 2.0
    """How long one backend call may run before the watchdog ends the run (0: no watchdog)."""
    max_backend_errors: int = 10
    """Failed backend calls (each holds the last safe action) after which the loop stops."""


class ControlLoop:
    """Drives ``env`` with the backend for the current precision; ``run()`` returns the summary."""

    def __init__(
        self,
        env: gym.Env,
        backends: Mapping[str, Backend],
        precision: str,
        settings: LoopSettings,
        monitor: Monitor | None = None,
        emit: Callable[[dict[str, Any]], None] = lambda _: None,
        status: Callable[[str], None] | None = None,
        experience: Experience | None = None,
        on_hang: Callable[[dict[str, Any]], None] | None = None,
        shield: Shield | None = None,
    ) -> None:
        self.shield = shield
        """Shapes each guarded action (``shield.py``); None: the guards alone."""
        self.env, self.backends, self.precision, self.settings = env, dict(backends), precision, settings
        self.monitor, self.emit, self.status, self.experience = monitor, emit, status, experience
        self.on_hang = on_hang
        """Given the summary on the watchdog's thread when a backend call hangs (the caller ends the process
        there: the control thread may never return); without it ``run()`` returns that summary if the call
        ever returns."""
        obs_space, act_space = env.observation_space, env.action_space
        self.obs_guard = ObservationGuard(obs_space.low, obs_space.high, settings.obs_fault)  # type: ignore[attr-defined]
        self.act_guard = ActionGuard(act_space.low, act_space.high)  # type: ignore[attr-defined]
        self.rate_hz = settings.rate_hz
        self.stop_reason: str | None = None
        self.env_error: dict[str, str] | None = None
        """What the environment raised, if it ended the run: call, type, message (reported after the summary)."""
        self.backend_errors = 0
        self.backend_error: dict[str, str] | None = None
        """The first exception from the backend's ``act``: type and message."""
        self.reward_invalid = 0
        self.hang: dict[str, Any] | None = None
        """Set when the watchdog ended the run: the backend, the limit and how long the call had run."""
        self.events: list[dict[str, Any]] = []
        self.precision_switches = 0
        self.peak_rss_mb = float("nan")
        self.last_memory: dict[str, Any] = {}
        self.stats = StepStats()

    @property
    def backend(self) -> Backend:
        """The backend serving actions now (the fine-tuner swaps weights into it)."""
        return self.backends[self.precision]

    def stop(self, reason: str = "stopped") -> None:
        """Ask the loop to end after the current step (safe from a signal handler; a stop asked before
        ``run`` starts ends it at once)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def run(self) -> dict[str, Any]:
        """Run (once) until the duration ends or ``stop``; the cyclic GC is paused meanwhile (see
        ``_paused_gc``)."""
        with _paused_gc():
            return self._run()

    def _run(self) -> dict[str, Any]:
        s = self.settings
        clock = time.monotonic_ns
        timer = time.perf_counter_ns
        sleep = time.sleep
        spin_ns = int(s.spin_us * 1000)
        warm_ns = 0  # how long before the slot the rehearsal starts (from the first, cold, rehearsal's duration)
        hot_ns = 0  # the last step's shortest hot rehearsal: when the next one still fits before the slot
        stats = self.stats = StepStats()
        add_jitter, add_latency, add_infer = stats.jitter.append, stats.latency.append, stats.infer.append
        add_env, add_step, causes = stats.env.append, stats.step.append, stats.causes
        period = round(1e9 / self.rate_hz)
        budget_ns = int(s.inference_budget * period)
        obs_guard, act_guard = self.obs_guard, self.act_guard
        env, experience, shield = self.env, self.experience, self.shield
        backend = self.backend
        watchdog = InferenceWatchdog(s.inference_timeout_s, lambda ran_ns: hung(ran_ns))
        returned = watchdog.returned
        max_errors = s.max_backend_errors

        def rehearse(obs: np.ndarray) -> bool:
            """The step's guard and inference calls on the observation it is about to use, without their
            effects: the guard's state after ``check`` of a fine observation is what the step's own
            ``check`` leaves, the real inference overwrites the output, an unfit observation is skipped.
            False when the watchdog took the run meanwhile; a failing call is left to the step to count."""
            if obs_guard.fine(obs):
                safe = obs_guard.check(obs)
                assert safe is not None
                watchdog.started = timer()
                try:
                    raw = backend.act(safe)
                except Exception:
                    return not returned()
                if returned():
                    return False
                act_guard.rehearse(raw)
                if experience is not None:
                    experience.rehearse(safe, raw)
                if shield is not None:
                    shield.rehearse(obs, raw)
            return True

        def hung(ran_ns: int) -> None:
            """The watchdog's thread, once, while the control thread is inside a call that overran by far:
            the env gets the last safe action, and the summary (to this step) goes to ``on_hang``."""
            self.hang = {
                "backend": backend.name,
                "precision": self.precision,
                "limit_s": s.inference_timeout_s,
                "call_s": round(ran_ns / 1e9, 3),
            }
            self.stop_reason = (  # over any other reason: this is why the run ends
                f"inference watchdog: a {backend.name} call ran {ran_ns / 1e9:.1f} s, past the "
                f"{s.inference_timeout_s:g} s --inference-timeout"
            )
            try:
                env.step(act_guard.hold())
            except BaseException as err:  # the env is foreign code
                self._env_failed("step", err, stop=False)
            self._hung_summary = self._finish(start, steps, episodes, misses, skipped, overruns, held)
            if self.on_hang is not None:
                self.on_hang(self._hung_summary)

        steps = misses = skipped = overruns = held = episodes = 0
        window_start_step = window_misses = 0
        start = clock()
        anchor, k = start, 0  # slot k starts at anchor + k * period (re-anchored when the rate changes)
        end = start + int(s.duration_s * 1e9) if s.duration_s > 0 else None
        next_second = start + 1_000_000_000
        self._hung_summary: dict[str, Any] | None = None
        if s.inference_timeout_s > 0:
            watchdog.start()
        try:
            obs, _ = env.reset(seed=s.seed)
            obs = plain_array(obs)
        except BaseException as err:  # the env is foreign code: the summary is still made
            obs = None
            self._env_failed("reset", err)
        while self.stop_reason is None:
            slot = anchor + k * period
            if end is not None and slot >= end:
                self.stop_reason = "duration"
                break
            now = clock()
            if slot - now > spin_ns + warm_ns:  # in slices, so that a stop is seen soon at any rate
                wake = slot - spin_ns - warm_ns
                while (left := wake - clock()) > 0 and self.stop_reason is None:
                    sleep(min(left / 1e9, SLEEP_SLICE_S))
                if self.stop_reason is not None:
                    break
            if s.warm_cache and (not warm_ns or slot - clock() > warm_ns // WARM_LEAD):  # time for it
                while clock() < slot - warm_ns:  # rehearse the step but the env's part until the slot
                    pass
                t_warm = timer()
                if not rehearse(obs):
                    break
                first = timer() - t_warm  # cold; the ones after it run hot, as long as the last step's did
                shortest = hot_ns or first
                hot_ns = 0
                while clock() + shortest < slot:  # keep the caches warm until the slot
                    t_warm = timer()
                    if not rehearse(obs):
                        break
                    hot_ns = min(hot_ns or first, timer() - t_warm)
                    shortest = min(shortest, hot_ns)
                if watchdog.tripped:
                    break
                warm_ns = min(max(int(WARM_LEAD * first), warm_ns - (warm_ns >> 4)), period // 4)
            while (now := clock()) < slot:
                pass
            add_jitter(now - slot)
            took = 0
            inferred = False
            safe_obs = obs_guard.check(obs)
            if safe_obs is None:
                action = act_guard.hold()
                held += 1
            else:
                t0 = watchdog.started = timer()
                try:
                    raw = backend.act(safe_obs)
                except Exception as err:  # the backend is foreign code too: hold, count, maybe stop
                    raw = None
                    self._backend_failed(err)
                took = timer() - t0
                if returned():
                    break
                add_latency(took)
                if raw is None:
                    action = act_guard.hold()
                    if self.backend_errors >= max_errors:
                        self.stop(f"backend error x{self.backend_errors}: {self._backend_message()}")
                elif took > budget_ns:
                    overruns += 1
                    action = act_guard.hold()
                else:
                    action = act_guard.apply(raw if experience is None else experience.explore(raw))
                    inferred = True
            if shield is not None:
                action = shield.step(obs, action, inferred)
            t_env = timer()
            try:
                next_obs, reward, terminated, truncated, _ = env.step(action)
                if terminated is not True and terminated is not False:  # the common case without a call
                    terminated = _truth(terminated, "terminated")
                if truncated is not True and truncated is not False:
                    truncated = _truth(truncated, "truncated")
            except BaseException as err:  # the env is foreign code: the summary is still made
                self._env_failed("step", err)
                break
            env_ns = timer() - t_env
            if type(next_obs) is not np.ndarray:
                next_obs = plain_array(next_obs)
            if experience is not None and obs_guard.well_formed(obs) and obs_guard.well_formed(next_obs):
                value = finite_reward(reward)
                if value is None:
                    self.reward_invalid += 1
                else:
                    experience.observe(obs, action, value, next_obs, terminated, truncated)
            if terminated or truncated:
                episodes += 1
                t_env = timer()
                try:
                    next_obs, _ = env.reset()
                except BaseException as err:  # as above
                    self._env_failed("reset", err)
                    break
                next_obs = plain_array(next_obs)
                env_ns += timer() - t_env
                if shield is not None:
                    shield.restart()
            obs = next_obs
            steps += 1
            finished = clock()
            add_step(finished - now)
            add_infer(took)
            add_env(env_ns)
            if finished > slot + period:
                misses += 1
                window_misses += 1
                causes[miss_cause(now - slot, took, env_ns, finished - now - took - env_ns)] += 1
            k += 1
            behind = (finished - anchor) // period - k  # slots whose deadline has already passed
            if behind > 0:
                skipped += behind
                k += behind
            if finished >= next_second:
                record = self._second(finished - start, steps - window_start_step, window_misses, steps, misses)
                window_start_step, window_misses = steps, 0
                next_second += 1_000_000_000
                if record is not None:  # the governor changed the rate or the precision
                    backend = self.backend
                    if record != period:
                        anchor, k, period = clock(), 0, record
                        budget_ns = int(s.inference_budget * period)
        if watchdog.tripped:  # the call came back after all: the run is the watchdog's, and so is the summary
            watchdog.done.wait()
            assert self._hung_summary is not None
            return self._hung_summary
        watchdog.stop()
        if watchdog.tripped:  # it tripped on the last call, as the loop was ending
            watchdog.done.wait()
            assert self._hung_summary is not None
            return self._hung_summary
        return self._finish(start, steps, episodes, misses, skipped, overruns, held)

    def _finish(
        self, start: int, steps: int, episodes: int, misses: int, skipped: int, overruns: int, held: int
    ) -> dict[str, Any]:
        """The run's summary (on the control thread, or on the watchdog's when a call hung)."""
        elapsed = (time.monotonic_ns() - start) / 1e9
        self.stats.fold()
        self._final_memory()
        summary = self._summary(steps, episodes, misses, skipped, overruns, held, elapsed)
        return {**summary, **self.stats.breakdown()}

    def _env_failed(self, call: str, err: BaseException, stop: bool = True) -> None:
        """The environment raised in ``call``: stop, and keep the error for the caller."""
        text = describe_error(err)
        first = text.splitlines()[0][:200] if text else ""
        self.env_error = {"call": call, "type": type(err).__name__, "message": first}
        if stop:
            self.stop_reason = f"environment error in {call}(): {type(err).__name__}" + (f": {first}" if first else "")

    def _backend_failed(self, err: Exception) -> None:
        """The backend raised in ``act``: count it and keep the first one."""
        self.backend_errors += 1
        if self.backend_error is None:
            text = describe_error(err)
            self.backend_error = {"type": type(err).__name__, "message": text.splitlines()[0][:200] if text else ""}

    def _backend_message(self) -> str:
        error = self.backend_error or {}
        return f"{error.get('type')}" + (f": {error['message']}" if error.get("message") else "")

    def _second(
        self,
        elapsed_ns: int,
        window_steps: int,
        window_misses: int,
        steps: int,
        misses: int,
    ) -> int | None:
        """Per-second housekeeping; returns the new period (ns) if the governor changed a knob."""
        gc.collect(0)  # the youngest generation only: tens of microseconds, at a known point
        lat, jit = self.stats.fold()
        record: dict[str, Any] = {
            "type": "second",
            "t_s": round(elapsed_ns / 1e9, 3),
            "steps": window_steps,
            "latency_us": lat,
            "jitter_us": jit,
            "misses": window_misses,
            "misses_total": misses,
            "steps_total": steps,
            "precision": self.precision,
            "rate_hz": self.rate_hz,
        }
        changed = False
        if self.monitor is not None:
            tick = self.monitor.tick(elapsed_ns / 1e9)
            self._note_memory(tick.memory)
            record.update(memory=tick.memory, power=tick.power, governor=tick.governor)
            for event in tick.events:
                self.events.append(event)
                self.emit({"type": "event", "t_s": record["t_s"], **event})
            if tick.precision is not None and tick.precision != self.precision and tick.precision in self.backends:
                self.precision = tick.precision
                self.precision_switches += 1
                changed = True
            if tick.rate_hz is not None and not math.isclose(tick.rate_hz, self.rate_hz):
                self.rate_hz = float(tick.rate_hz)
                changed = True
        self.emit(record)
        if self.status is not None:
            power = record.get("power") or {}
            watts = f" {power['total_w']:.1f}W{'' if power.get('measured') else '(est)'}" if power else ""
            rss = record.get("memory", {}).get("rss_mb")
            self.status(
                f"t={record['t_s']:.0f}s steps={steps} misses={misses} p99={lat['p99']:.0f}us "
                f"{self.precision}@{self.rate_hz:g}Hz" + (f" rss={rss:.0f}MB" if rss else "") + watts
            )
        return round(1e9 / self.rate_hz) if changed else None

    def _note_memory(self, memory: Mapping[str, Any]) -> None:
        self.last_memory = dict(memory)
        peak = memory.get("peak_rss_mb", memory.get("rss_mb"))
        if peak is not None and (math.isnan(self.peak_rss_mb) or peak > self.peak_rss_mb):
            self.peak_rss_mb = float(peak)

    def _final_memory(self) -> None:
        if self.monitor is not None:
            self._note_memory(self.monitor.read_memory())

    def _summary(
        self,
        steps: int,
        episodes: int,
        misses: int,
        skipped: int,
        overruns: int,
        held: int,
        elapsed: float,
    ) -> dict[str, Any]:
        return {
            "steps": steps,
            "episodes": episodes,
            "duration_s": round(elapsed, 3),
            "rate_hz": self.settings.rate_hz,
            "final_rate_hz": self.rate_hz,
            "deadline_misses": misses,
            "miss_rate": misses / steps if steps else 0.0,
            "skipped_slots": skipped,
            "latency_us": self.stats.figures("latency"),
            "jitter_us": self.stats.figures("jitter"),
            "inference_overruns": overruns,
            "obs_nonfinite": self.obs_guard.nonfinite,
            "obs_out_of_range": self.obs_guard.out_of_range,
            "obs_held": held,
            "obs_malformed": self.obs_guard.malformed,
            "action_nonfinite": self.act_guard.nonfinite,
            "action_clipped": self.act_guard.clipped,
            "precision": self.precision,
            "precision_switches": self.precision_switches,
            "peak_rss_mb": self.peak_rss_mb,
            "budget_events": len(self.events),
            "events": self.events,
            "backend_errors": self.backend_errors,
            "backend_error": self.backend_error,
            "inference_hang": self.hang,
            "reward_invalid": self.reward_invalid,
            "shield": guards_summary() if self.shield is None else self.shield.summary(),
            "stopped_by": self.stop_reason,
            "env_error": self.env_error,
            "backend": self.backend.describe(),
        }


def _truth(value: Any, name: str) -> bool:
    """``terminated``/``truncated`` as one bool: a bool, a numpy bool or a one-element array of one; anything
    else that ``bool()`` takes. An array of more elements is a malformed result (``TypeError``), and whatever
    the value's ``__bool__`` raises propagates: the loop counts both as the env's error."""
    if value is True or value is False:
        return value
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise TypeError(f"step() returned {name} as an array of shape {value.shape}, not one truth value")
        value = value.reshape(-1)[0]
    return bool(value)


def finite_reward(reward: Any) -> float | None:
    """The reward as a finite float, or None (None, NaN, an object ``float()`` refuses or that raises)."""
    try:
        value = float(reward)
    except Exception:
        return None
    return value if math.isfinite(value) else None


def describe_error(err: BaseException) -> str:
    """``str(err)``, or a placeholder when the exception's own ``__str__`` raises (foreign code)."""
    try:
        return str(err)
    except Exception:
        return f"(a {type(err).__name__} whose message cannot be shown)"


@contextlib.contextmanager
def _paused_gc() -> Iterator[None]:
    """Keep Python's cyclic garbage collector out of the control loop.

    A full collection can stall for milliseconds, a missed deadline at 1 kHz. Everything alive at start-up
    is frozen (never scanned again), automatic collection is off while the loop runs, and the loop collects
    the youngest generation itself once a second; the previous GC state comes back afterwards.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()
