"""The fixed-rate scheduler and the gymnasium adapter behind ``sac-edge run``: env -> runtime -> env, on a schedule.

Schedule: step ``k`` starts at ``start + k * period`` on the monotonic clock (absolute, so lateness
never accumulates as drift). The loop sleeps until shortly before the slot and spins the last
``spin_us``; the wake-up error is the jitter. A step that finishes after ``start + (k + 1) * period``
is a deadline miss; when the loop is so late that whole slots have passed, it resumes at the next
future slot and counts the skipped slots (a burst of catch-up steps would be worse for a plant).

The step is the runtime's (``runtime.Runtime``, reached through ``StepRuntime``: control imports no room
above it), the same calls a robot's own loop makes: ``act`` guards the observation (``safety.py``), infers
(timed: an overrun or a failed call is answered with the last safe action), explores for the fine-tuner,
guards the action and passes it through the shield (``shield.py``); ``observe`` gives the transition to the
fine-tuner and restarts the shield's ramp at each episode; ``tick`` reads the budgets; ``rehearse`` is
``act``'s work without its effects. What is left here is what only a scheduler has: the slots, the
warm-cache rehearsal before each one, the env, the per-step timings, the status line.

The environment is foreign code: anything its ``reset()`` or ``step()`` raises (even ``SystemExit`` or
``KeyboardInterrupt``), and a result the loop cannot read (not five values; ``terminated`` or ``truncated``
not one truth value), ends the loop as a stop, kept in ``env_error`` and named in the summary's
``stopped_by``, so the summary is still made. When ``act`` stops serving after ``max_backend_errors`` failed
calls (``StoppedServing``), the step still sends the last safe action it carries and the loop stops after
it. A call that does not return is the runtime's inference watchdog's: it calls ``hung`` on its own thread
(``run.py`` wires it), which sends the env the last safe action and hands the summary to this step to
``on_hang``, since the control thread is still inside the call.

``stop()`` (wired to SIGINT and SIGTERM by the CLI) ends the loop after the current step; the sleep to the
next slot is taken in slices of at most ``SLEEP_SLICE_S``, so at any rate a stop is seen that soon. The
summary is always produced.

Once a second, off the per-step path: the youngest GC generation, the runtime's ``tick`` with the second's
schedule figures (memory and power, the governor, which may switch precision or lower the rate: the
schedule re-anchors; one telemetry record), and a live status line on a terminal.
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

SLEEP_SLICE_S = 0.05
"""The longest single sleep between steps: a stop request waits at most this long for the loop to see it."""

WARM_LEAD = 2
"""With ``warm_cache``, the step is rehearsed from this many times the first rehearsal's duration before
the slot until the slot (the most recent duration, or a slowly decaying maximum of the earlier ones: the
first, cold, rehearsal's time varies step to step), and never for more than a quarter of the period. The
first rehearsal brings the code and the weights back into the caches (it is many times slower than a
hot step after a sleep: ``bench/edge_loop.py``); the ones after it run hot and keep them there."""


class StoppedServing(InternalError):
    """``act`` refused: the runtime stopped serving (``max_backend_errors`` failed calls, or a call the
    inference watchdog gave up on). ``action`` is the last safe action for this call; ``hung`` says the
    watchdog ended the run (its thread has handled the step already)."""

    def __init__(self, reason: str, action: np.ndarray, hung: bool) -> None:
        super().__init__(f"the runtime stopped serving: {reason}; the last safe action was held")
        self.reason, self.action, self.hung = reason, action, hung


class ScheduleWindow(NamedTuple):
    """One second of the schedule, for the runtime's per-second telemetry record."""

    t_s: float
    """Seconds since the loop started."""
    steps: int
    misses: int
    steps_total: int
    misses_total: int


class TickFigures(Protocol):
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

    def tick(self, window: ScheduleWindow | None = None) -> TickFigures: ...

    def safe_action(self) -> np.ndarray: ...


class LoopSettings(NamedTuple):
    rate_hz: float
    duration_s: float
    """0 runs until stopped."""
    spin_us: float = 100.0
    seed: int = 0
    warm_cache: bool = True
    """Rehearse the step on its observation just before each slot (see ``WARM_LEAD``): between steps
    the code and the weights leave the caches; the rehearsal brings them back before the step that counts."""


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


class ControlLoop:
    """Drives ``env`` through ``runtime`` on the schedule; ``run()`` returns the schedule's summary."""

    def __init__(
        self,
        env: gym.Env,
        runtime: StepRuntime,
        settings: LoopSettings,
        status: Callable[[str], None] | None = None,
        on_hang: Callable[[ScheduleSummary], None] | None = None,
    ) -> None:
        self.env, self.runtime, self.settings, self.status = env, runtime, settings, status
        self.on_hang = on_hang
        """Given the summary on the watchdog's thread when a backend call hangs (the caller ends the process
        there: the control thread may never return); without it ``run()`` returns that summary if the call
        ever returns."""
        self.stop_reason: str | None = None
        self.env_error: dict[str, str] | None = None
        """What the environment raised, if it ended the run: call, type, message (reported after the summary)."""
        self._trip: Callable[[], None] | None = None
        self._hung_summary: ScheduleSummary | None = None
        self._hang_handled = threading.Event()

    def stop(self, reason: str = "stopped") -> None:
        """Ask the loop to end after the current step (safe from a signal handler; a stop asked before
        ``run`` starts ends it at once)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def hung(self) -> None:
        """The runtime's inference watchdog, on its thread, once: a call ran far past its limit (see ``run``)."""
        if self._trip is not None:
            self._trip()
        else:
            self._hang_handled.set()

    def run(self) -> ScheduleSummary:
        """Run (once) until the duration ends or ``stop``; the cyclic GC is paused meanwhile (see
        ``paused_gc``)."""
        with paused_gc():
            return self._run()

    def _run(self) -> ScheduleSummary:
        s, runtime, env = self.settings, self.runtime, self.env
        clock = time.monotonic_ns
        timer = time.perf_counter_ns
        sleep = time.sleep
        spin_ns = int(s.spin_us * 1000)
        warm_ns = 0  # how long before the slot the rehearsal starts (from the first, cold, rehearsal's duration)
        hot_ns = 0  # the last step's shortest hot rehearsal: when the next one still fits before the slot
        stats = runtime.stats
        add_jitter, add_env, add_step = stats.jitter.append, stats.env.append, stats.step.append
        infer, causes = stats.infer, stats.causes
        act, observe, warm_up = runtime.act, runtime.observe, runtime.warm_up
        rate_hz = s.rate_hz
        period = round(1e9 / rate_hz)

        def hung() -> None:
            """The watchdog's thread, while the control thread is inside a call that overran by far: the env
            gets the last safe action, and the summary (to this step) goes to ``on_hang``."""
            self.stop_reason = runtime.stopped_by  # over any other reason: this is why the run ends
            try:
                try:
                    env.step(runtime.safe_action())
                except BaseException as err:  # the env is foreign code
                    self._env_failed("step", err, stop=False)
                self._hung_summary = self._finish(start, steps, misses, skipped)
                if self.on_hang is not None:
                    self.on_hang(self._hung_summary)
            finally:
                self._hang_handled.set()

        steps = misses = skipped = 0
        window_start_step = window_misses = 0
        start = clock()
        anchor, k = start, 0  # slot k starts at anchor + k * period (re-anchored when the rate changes)
        end = start + int(s.duration_s * 1e9) if s.duration_s > 0 else None
        next_second = start + 1_000_000_000
        self._trip = hung
        watchdog_run = False
        try:
            obs, _ = env.reset(seed=s.seed)
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
                warm = warm_up(obs)  # False once the watchdog has the run
                first = timer() - t_warm  # cold; the ones after it run hot, as long as the last step's did
                shortest = hot_ns or first
                hot_ns = 0
                while warm and clock() + shortest < slot:  # keep the caches warm until the slot
                    t_warm = timer()
                    warm = warm_up(obs)
                    hot_ns = min(hot_ns or first, timer() - t_warm)
                    shortest = min(shortest, hot_ns)
                if not warm:
                    watchdog_run = True
                    break
                warm_ns = min(max(int(WARM_LEAD * first), warm_ns - (warm_ns >> 4)), period // 4)
            while (now := clock()) < slot:
                pass
            add_jitter(now - slot)
            try:
                action = act(obs)
            except StoppedServing as stopped:
                if stopped.hung:  # the watchdog's thread has the env and the summary
                    watchdog_run = True
                    break
                action = stopped.action  # the last safe action for this step, then the loop ends
                self.stop(stopped.reason)
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
            observe(obs, action, reward, next_obs, terminated, truncated)
            if terminated or truncated:
                t_env = timer()
                try:
                    next_obs, _ = env.reset()
                except BaseException as err:  # as above
                    self._env_failed("reset", err)
                    break
                env_ns += timer() - t_env
            obs = next_obs
            steps += 1
            finished = clock()
            add_step(finished - now)
            add_env(env_ns)
            if finished > slot + period:
                misses += 1
                window_misses += 1
                took = infer[-1]  # this step's inference (0 when held), which ``act`` recorded
                causes[miss_cause(now - slot, took, env_ns, finished - now - took - env_ns)] += 1
            k += 1
            behind = (finished - anchor) // period - k  # slots whose deadline has already passed
            if behind > 0:
                skipped += behind
                k += behind
            if finished >= next_second:
                gc.collect(0)  # the youngest generation only: tens of microseconds, at a known point
                t_s = round((finished - start) / 1e9, 3)
                report = runtime.tick(ScheduleWindow(t_s, steps - window_start_step, window_misses, steps, misses))
                window_start_step, window_misses = steps, 0
                next_second += 1_000_000_000
                if self.status is not None:
                    self.status(status_line(report, steps, misses))
                if not math.isclose(report.rate_hz, rate_hz):  # the governor changed the rate
                    rate_hz = report.rate_hz
                    anchor, k, period = clock(), 0, round(1e9 / rate_hz)
        if watchdog_run:
            self._hang_handled.wait()  # the call came back after all: the run, and the summary, are the watchdog's
            assert self._hung_summary is not None
            return self._hung_summary
        return self._finish(start, steps, misses, skipped)

    def _finish(self, start: int, steps: int, misses: int, skipped: int) -> ScheduleSummary:
        """The schedule's summary (on the control thread, or on the watchdog's when a call hung)."""
        elapsed = (time.monotonic_ns() - start) / 1e9
        stats = self.runtime.stats
        stats.fold()
        run = stats.breakdown()
        return ScheduleSummary(
            steps=steps,
            duration_s=round(elapsed, 3),
            deadline_misses=misses,
            miss_rate=misses / steps if steps else 0.0,
            skipped_slots=skipped,
            jitter_us=stats.figures("jitter"),
            loop_work_us=run["loop_work_us"],
            env_step_us=run["env_step_us"],
            miss_causes=run["miss_causes"],
            histogram_us=run["histogram_us"],
            stopped_by=self.stop_reason,
            env_error=self.env_error,
        )

    def _env_failed(self, call: str, err: BaseException, stop: bool = True) -> None:
        """The environment raised in ``call``: stop, and keep the error for the caller."""
        first = error_line(err)
        self.env_error = {"call": call, "type": type(err).__name__, "message": first}
        if stop:
            self.stop_reason = f"environment error in {call}(): {type(err).__name__}" + (f": {first}" if first else "")


def status_line(report: TickFigures, steps: int, misses: int) -> str:
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
