"""The fixed-rate scheduler and the gymnasium adapter behind ``sac-edge run``: env -> runtime -> env, on a schedule.

Schedule: step ``k`` starts at ``start + k * period`` on the monotonic clock (absolute, so lateness
never accumulates as drift). The loop sleeps until shortly before the slot and spins the last
``spin_us``; the wake-up error is the jitter. A step that finishes after ``start + (k + 1) * period``
is a deadline miss; when the loop is so late that whole slots have passed, it resumes at the next
future slot and counts the skipped slots (a burst of catch-up steps would be worse for a plant).

The step is the runtime's (``runtime.Runtime``, reached through ``StepRuntime``: control imports nothing
above it), the same calls a robot's own loop makes: ``act`` runs the step's stages (``step.py``);
``observe`` gives the transition to the fine-tuner and restarts the shield's ramp at each episode; ``tick``
reads the budgets; ``warm_up`` runs the step on scratch state. What is left here is what only a scheduler
has: the slots (``Schedule``), the cache warm-up before each one (``CacheWarmer``), the env, the per-step
timings, the status line.

The environment is foreign code: anything its ``reset()`` or ``step()`` raises (even ``SystemExit`` or
``KeyboardInterrupt``), and a result the loop cannot read (not five values; ``terminated`` or ``truncated``
not one truth value), ends the loop as a stop, kept in ``env_error`` and named in the summary's
``stopped_by``, so the summary is still made. When ``act`` stops serving after ``max_backend_errors`` failed
calls (``StoppedServing``), the step sends the configured safe action it carries and the loop stops after
it. A call that does not return is the runtime's inference watchdog's: the runtime's hang policy (``run.py``'s
``Run``) calls ``hung`` on the watchdog's thread, which sends the env the configured safe action and returns the
summary to this step, since the control thread is still inside the call.

``stop()`` (wired to SIGINT and SIGTERM by the CLI) ends the loop after the current step; the sleep to the
next slot is taken in slices of at most ``SLEEP_SLICE_S``, so at any rate a stop is seen that soon. The
summary is always produced.

Every way the loop ends sends the env the configured safe action last (``Runtime.safe_action``): the
duration reached, a stop or signal, the env's error (tried once more, on the env that raised: a failed
sensor read leaves the actuators reachable), an exception of the loop's own (sent, then re-raised), the
runtime stopping serving (the step itself sends it), a hung call (the watchdog's thread sends it). The
summary's ``safe_action_sent`` says whether the env took it.

Once a second, off the per-step path: the youngest GC generation, the runtime's ``tick`` with the second's
steps and misses (it reads memory and power and ticks the governor, which may switch precision or lower the
rate: the schedule re-anchors; one telemetry record), and a live status line on a terminal.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, SupportsFloat

import gymnasium as gym
import numpy as np

from sac_edge.common.errors import InternalError

from .step_stats import StepStats, miss_cause

_ENV_FAILED = object()
"""What ``ControlLoop._reset`` answers when the env's ``reset()`` raised."""

SLEEP_SLICE_S = 0.05
"""The longest single sleep between steps: a stop request waits at most this long for the loop to see it."""

WARM_LEAD = 2
"""With ``warm_cache``, the step is warmed up from this many times the first warm-up's duration before
the slot until the slot (the most recent duration, or a slowly decaying maximum of the earlier ones: the
first, cold, call's time varies step to step), and never for more than a quarter of the period. The
first call brings the code and the weights back into the caches; the ones after it keep them there
(BENCHMARKS.md "Edge: the action in the control loop" measured the step with and without)."""


class StoppedServing(InternalError):
    """``act`` refused: the runtime stopped serving (``max_backend_errors`` failed calls, or a call the
    inference watchdog gave up on). ``action`` is the configured safe action (``Runtime.safe_action``), what
    to send as the run ends; ``hung`` says the
    watchdog ended the run (its thread has handled the step already)."""

    def __init__(self, reason: str, action: np.ndarray, hung: bool) -> None:
        super().__init__(f"the runtime stopped serving: {reason}; the safe action goes out")
        self.reason, self.action, self.hung = reason, action, hung


class ScheduleWindow(NamedTuple):
    """One second of the schedule, for the runtime's per-second telemetry record."""

    t_s: float
    """Seconds since the loop started."""
    steps: int
    misses: int
    steps_total: int
    misses_total: int


class PerSecondReport(Protocol):
    """What the loop reads from the runtime's per-second report (``runtime.TickReport``)."""

    @property
    def t_s(self) -> float: ...
    @property
    def rate_hz(self) -> float: ...
    @property
    def precision(self) -> str: ...
    @property
    def latency_us(self) -> dict[str, float]: ...
    @property
    def memory(self) -> dict[str, Any]: ...
    @property
    def power(self) -> dict[str, Any] | None: ...


class StepRuntime(Protocol):
    """The runtime calls the loop makes (``runtime.Runtime``; module docstring)."""

    @property
    def stats(self) -> StepStats:
        """The per-step timings: ``act`` adds inference, the loop adds wake-up, env and step times."""

    @property
    def stopped_by(self) -> str | None: ...

    def act(self, obs: np.ndarray) -> np.ndarray: ...

    def observe(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: SupportsFloat | None,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> None: ...

    def warm_up(self, obs: np.ndarray) -> bool: ...

    def tick(self, window: ScheduleWindow | None = None) -> PerSecondReport: ...

    def safe_action(self) -> np.ndarray: ...


class LoopSettings(NamedTuple):
    rate_hz: float
    duration_s: float
    """0 runs until stopped."""
    spin_us: float = 100.0
    seed: int = 0
    warm_cache: bool = True
    """Warm the step up on its observation just before each slot (see ``WARM_LEAD``): between steps
    the code and the weights leave the caches; the warm-up brings them back before the step that counts."""


@dataclass(frozen=True)
class ScheduleSummary:
    """What the schedule did (the keys of ``sac-edge run --json`` that only a scheduler has)."""

    steps: int
    """Steps completed (the env stepped)."""
    duration_s: float
    deadline_misses: int
    miss_rate: float
    skipped_slots: int
    jitter_us: dict[str, float]
    loop_work_us: dict[str, float]
    env_step_us: dict[str, float]
    miss_causes: dict[str, int]
    histogram_us: dict[str, Any]
    stopped_by: str | None
    env_error: dict[str, str] | None
    episode_returns: list[float]
    """The undiscounted return of each episode that ended (the first ``MAX_RETURNS``)."""
    safe_action_sent: bool
    """Whether the env took the configured safe action as the run's last command (False when its
    ``step`` raised then too: the error is in ``env_error``)."""


#: The most episode returns a summary keeps (a run of any length allocates no more).
MAX_RETURNS = 10_000


class Schedule:
    """The loop's clock: slot ``k`` starts at ``anchor + k * period`` (re-anchored when the rate changes),
    and what the schedule has counted."""

    def __init__(self, start: int, rate_hz: float, duration_s: float) -> None:
        self.start = start
        self.anchor, self.k, self.period = start, 0, round(1e9 / rate_hz)
        self.rate_hz = rate_hz
        self.end = start + int(duration_s * 1e9) if duration_s > 0 else None
        self.steps = self.misses = self.skipped = 0
        self.window_start_step = self.window_misses = 0
        self.next_second = start + 1_000_000_000

    def slot(self) -> int:
        return self.anchor + self.k * self.period

    def advance(self, finished: int, missed: bool) -> None:
        """After a step that finished at ``finished``: the next slot, skipping those whose deadline passed."""
        self.steps += 1
        if missed:
            self.misses += 1
            self.window_misses += 1
        self.k += 1
        behind = (finished - self.anchor) // self.period - self.k
        if behind > 0:
            self.skipped += behind
            self.k += behind

    def window(self, finished: int) -> ScheduleWindow:
        """The second that ends at ``finished``, and a new one begun."""
        t_s = round((finished - self.start) / 1e9, 3)
        window = ScheduleWindow(t_s, self.steps - self.window_start_step, self.window_misses, self.steps, self.misses)
        self.window_start_step, self.window_misses = self.steps, 0
        self.next_second += 1_000_000_000
        return window

    def rerate(self, rate_hz: float, now: int) -> None:
        """The governor changed the rate: slots from ``now`` at the new period."""
        self.rate_hz = rate_hz
        self.anchor, self.k, self.period = now, 0, round(1e9 / rate_hz)


class CacheWarmer:
    """Runs the runtime's ``warm_up`` on the step's observation until its slot (``WARM_LEAD``)."""

    def __init__(self, warm_up: Callable[[np.ndarray], bool]) -> None:
        self._warm_up = warm_up
        self.lead_ns = 0
        """How long before the slot the warm-up starts (from the first, cold, call's duration)."""
        self._hot_ns = 0  # the last step's shortest hot call: when the next one still fits before the slot

    def fits(self, slot: int, now: int) -> bool:
        """Whether there is time before ``slot`` (a slot woken too late goes without)."""
        return not self.lead_ns or slot - now > self.lead_ns // WARM_LEAD

    def run(self, obs: np.ndarray, slot: int, period: int) -> bool:
        """Warm up until ``slot``; False once the inference watchdog has the run."""
        clock, timer = time.monotonic_ns, time.perf_counter_ns
        while clock() < slot - self.lead_ns:
            pass
        started = timer()
        warm = self._warm_up(obs)
        first = timer() - started  # cold; the ones after it run hot, as long as the last step's did
        shortest = self._hot_ns or first
        self._hot_ns = 0
        while warm and clock() + shortest < slot:  # keep the caches warm until the slot
            started = timer()
            warm = self._warm_up(obs)
            self._hot_ns = min(self._hot_ns or first, timer() - started)
            shortest = min(shortest, self._hot_ns)
        self.lead_ns = min(max(int(WARM_LEAD * first), self.lead_ns - (self.lead_ns >> 4)), period // 4)
        return warm


class ControlLoop:
    """Drives ``env`` through ``runtime`` on the schedule; ``run()`` returns the schedule's summary."""

    def __init__(
        self,
        env: gym.Env,
        runtime: StepRuntime,
        settings: LoopSettings,
        status: Callable[[str], None] | None = None,
    ) -> None:
        self.env, self.runtime, self.settings, self.status = env, runtime, settings, status
        self.stop_reason: str | None = None
        self.env_error: dict[str, str] | None = None
        self.episode_returns: list[float] = []
        """What the environment raised, if it ended the run: call, type, message (reported after the summary)."""
        self._schedule: Schedule | None = None
        self._hung_summary: ScheduleSummary | None = None
        self._hang_handled = threading.Event()
        self._safe_sent = False
        """Whether the last command the env took was the configured safe action."""

    def stop(self, reason: str = "stopped") -> None:
        """Ask the loop to end after the current step (safe from a signal handler; a stop asked before
        ``run`` starts ends it at once)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def hung(self) -> ScheduleSummary | None:
        """For the runtime's hang policy, on the inference watchdog's thread, once, while the control thread is
        inside a call that overran by far: the env gets the configured safe action, and the schedule's summary (to
        this step) is returned, which ``run()`` also returns should the call come back; None before the loop
        runs (nothing to hand over)."""
        schedule = self._schedule
        try:
            if schedule is None:
                return None
            self.stop_reason = self.runtime.stopped_by  # over any other reason: this is why the run ends
            self._send_safe()
            self._hung_summary = self._finish(schedule)
            return self._hung_summary
        finally:
            self._hang_handled.set()

    def run(self) -> ScheduleSummary:
        """Run (once) until the duration ends or ``stop``, then send the safe action (module docstring); the
        cyclic GC is paused meanwhile (see ``paused_gc``)."""
        with paused_gc():
            try:
                return self._run()
            except BaseException:
                if self._schedule is not None and not self._hang_handled.is_set():
                    with contextlib.suppress(BaseException):  # the loop's own error is the one to report
                        self._send_safe()
                raise

    def _run(self) -> ScheduleSummary:
        """Each slot: wait (warming the caches), the step (act, env, observe), its timings, once a second the
        runtime's tick. The step's own part is inline: its work is what the loop's timings measure."""
        s, runtime = self.settings, self.runtime
        clock, timer = time.monotonic_ns, time.perf_counter_ns
        stats = runtime.stats
        add_jitter, add_env, add_step = stats.jitter.append, stats.env.append, stats.step.append
        infer, causes = stats.infer, stats.causes
        act, observe = runtime.act, runtime.observe
        episode_return = 0.0
        warmer = CacheWarmer(runtime.warm_up) if s.warm_cache else None
        obs = self._reset(s.seed)  # on failure the run has stopped already
        schedule = self._schedule = Schedule(clock(), s.rate_hz, s.duration_s)
        taken = False  # whether the inference watchdog took the run
        ending = False  # whether this step sends the safe action because the runtime stopped serving
        while self.stop_reason is None:
            slot = schedule.slot()
            if schedule.end is not None and slot >= schedule.end:
                self.stop_reason = "duration"
                break
            if not self._sleep_until(slot - int(s.spin_us * 1000) - (warmer.lead_ns if warmer else 0)):
                break
            if warmer is not None and warmer.fits(slot, clock()) and not warmer.run(obs, slot, schedule.period):
                taken = True
                break
            while (now := clock()) < slot:
                pass
            add_jitter(now - slot)
            try:
                action = act(obs)
            except StoppedServing as stopped:
                if stopped.hung:  # the watchdog's thread has the env and the summary
                    taken = True
                    break
                action = stopped.action  # the configured safe action for this step, then the loop ends
                self.stop(stopped.reason)
                ending = True
            t_env = timer()
            outcome = self._env_step(action)
            env_ns = timer() - t_env
            if outcome is None:
                break
            if ending:
                self._safe_sent = True  # the env took the safe action as this last step's
            next_obs, reward, terminated, truncated = outcome
            observe(obs, action, reward, next_obs, terminated, truncated)
            episode_return += finite_reward(reward) or 0.0
            if terminated or truncated:
                if len(self.episode_returns) < MAX_RETURNS:
                    self.episode_returns.append(round(episode_return, 6))
                episode_return = 0.0
                t_env = timer()
                next_obs = self._reset()
                if next_obs is _ENV_FAILED:
                    break
                env_ns += timer() - t_env
            obs = next_obs
            finished = clock()
            add_step(finished - now)
            add_env(env_ns)
            missed = finished > slot + schedule.period
            if missed:
                took = infer[-1]  # this step's inference (0 when held), which ``act`` recorded
                causes[miss_cause(now - slot, took, env_ns, finished - now - took - env_ns)] += 1
            schedule.advance(finished, missed)
            if finished >= schedule.next_second:
                self._second(schedule, finished)
        if taken:
            self._hang_handled.wait()  # the call came back after all: the run, and the summary, are the watchdog's
            assert self._hung_summary is not None
            return self._hung_summary
        if not self._safe_sent:
            self._send_safe()
        return self._finish(schedule)

    def _send_safe(self) -> None:
        """The configured safe action to the env as the run's last command (outside the schedule: not a
        step); what the env raises is kept unless it raised before."""
        action = self.runtime.safe_action()
        try:
            self.env.step(action)
        except BaseException as err:  # the env is foreign code
            self._safe_sent = False
            if self.env_error is None:
                self._env_failed("step", err, stop=False)
            return
        self._safe_sent = True

    def _sleep_until(self, wake: int) -> bool:
        """Sleep until ``wake`` in slices, so that a stop is seen soon at any rate; False on a stop."""
        clock = time.monotonic_ns
        while (left := wake - clock()) > 0 and self.stop_reason is None:
            time.sleep(min(left / 1e9, SLEEP_SLICE_S))
        return self.stop_reason is None

    def _reset(self, seed: int | None = None) -> Any:
        """``env.reset()``'s observation; ``_ENV_FAILED`` when it raised (the run stops, the summary is still
        made)."""
        try:
            obs, _ = self.env.reset() if seed is None else self.env.reset(seed=seed)
        except BaseException as err:  # the env is foreign code
            self._env_failed("reset", err)
            return _ENV_FAILED
        return obs

    def _env_step(self, action: np.ndarray) -> tuple[Any, Any, bool, bool] | None:
        """``env.step(action)`` as (next_obs, reward, terminated, truncated); None when it raised or
        answered what the loop cannot read (the run stops)."""
        try:
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            if terminated is not True and terminated is not False:  # the common case without a call
                terminated = _truth(terminated, "terminated")
            if truncated is not True and truncated is not False:
                truncated = _truth(truncated, "truncated")
        except BaseException as err:  # the env is foreign code: the summary is still made
            self._env_failed("step", err)
            return None
        return next_obs, reward, terminated, truncated

    def _second(self, schedule: Schedule, finished: int) -> None:
        """Once a second, off the per-step path: the youngest GC generation, the runtime's tick with the
        second's steps and misses, the status line, and the schedule re-anchored when the governor changed the rate."""
        gc.collect(0)  # the youngest generation only: tens of microseconds, at a known point
        report = self.runtime.tick(schedule.window(finished))
        if self.status is not None:
            self.status(status_line(report, schedule.steps, schedule.misses))
        if not math.isclose(report.rate_hz, schedule.rate_hz):
            schedule.rerate(report.rate_hz, time.monotonic_ns())

    def _finish(self, schedule: Schedule) -> ScheduleSummary:
        """The schedule's summary (on the control thread, or on the watchdog's when a call hung)."""
        elapsed = (time.monotonic_ns() - schedule.start) / 1e9
        steps, misses = schedule.steps, schedule.misses
        stats = self.runtime.stats
        stats.fold()
        run = stats.breakdown()
        return ScheduleSummary(
            steps=steps,
            duration_s=round(elapsed, 3),
            deadline_misses=misses,
            miss_rate=misses / steps if steps else 0.0,
            skipped_slots=schedule.skipped,
            jitter_us=stats.run_percentiles_us("jitter"),
            loop_work_us=run["loop_work_us"],
            env_step_us=run["env_step_us"],
            miss_causes=run["miss_causes"],
            histogram_us=run["histogram_us"],
            stopped_by=self.stop_reason,
            env_error=self.env_error,
            episode_returns=list(self.episode_returns),
            safe_action_sent=self._safe_sent,
        )

    def _env_failed(self, call: str, err: BaseException, stop: bool = True) -> None:
        """The environment raised in ``call``: stop, and keep the error for the caller."""
        first = error_line(err)
        self.env_error = {"call": call, "type": type(err).__name__, "message": first}
        if stop:
            self.stop_reason = f"environment error in {call}(): {type(err).__name__}" + (f": {first}" if first else "")


def status_line(report: PerSecondReport, steps: int, misses: int) -> str:
    """The live line on a terminal, once a second."""
    power = report.power or {}
    watts = f" {power['total_w']:.1f}W{'' if power.get('measured') else '(est)'}" if power else ""
    rss = report.memory.get("rss_mb")
    return (
        f"t={report.t_s:.0f}s steps={steps} misses={misses} p99={report.latency_us['p99']:.0f}us "
        f"{report.precision}@{report.rate_hz:g}Hz" + (f" rss={rss:.0f}MB" if rss else "") + watts
    )


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


def error_line(err: BaseException) -> str:
    """The first line of ``describe_error``, at most 200 characters (what a summary keeps of an error)."""
    text = describe_error(err)
    return text.splitlines()[0][:200] if text else ""


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
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
