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
(it is stale by then). Episodes reset on termination or truncation. The environment is foreign code:
anything its ``reset()`` or ``step()`` raises (even ``SystemExit`` or ``KeyboardInterrupt``) ends the loop
as a stop, kept in ``env_error`` and named in the summary's ``stopped_by``, so the summary is still made.
``stop()`` (wired to SIGINT and SIGTERM by the CLI) ends the loop after the current step; the summary is
always produced.

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

from .safety import ActionGuard, ObservationGuard
from .step_stats import StepStats, miss_cause

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
    ) -> None:
        self.env, self.backends, self.precision, self.settings = env, dict(backends), precision, settings
        self.monitor, self.emit, self.status, self.experience = monitor, emit, status, experience
        obs_space, act_space = env.observation_space, env.action_space
        self.obs_guard = ObservationGuard(obs_space.low, obs_space.high, settings.obs_fault)  # type: ignore[attr-defined]
        self.act_guard = ActionGuard(act_space.low, act_space.high)  # type: ignore[attr-defined]
        self.rate_hz = settings.rate_hz
        self.stop_reason: str | None = None
        self.env_error: dict[str, str] | None = None
        """What the environment raised, if it ended the run: call, type, message (reported after the summary)."""
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
        """Ask the loop to end after the current step (safe from a signal handler)."""
        self.stop_reason = reason

    def run(self) -> dict[str, Any]:
        """Run until the duration ends or ``stop``; the cyclic GC is paused meanwhile (see ``_paused_gc``)."""
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
        env, experience = self.env, self.experience
        backend = self.backend

        def rehearse(obs: np.ndarray) -> None:
            """The step's guard and inference calls on the observation it is about to use, without their
            effects: the guard's state after ``check`` of a fine observation is what the step's own
            ``check`` leaves, the real inference overwrites the output, an unfit observation is skipped."""
            if obs_guard.fine(obs):
                safe = obs_guard.check(obs)
                assert safe is not None
                raw = backend.act(safe)
                act_guard.rehearse(raw)
                if experience is not None:
                    experience.rehearse(safe, raw)

        steps = misses = skipped = overruns = held = episodes = 0
        window_start_step = window_misses = 0
        start = clock()
        anchor, k = start, 0  # slot k starts at anchor + k * period (re-anchored when the rate changes)
        end = start + int(s.duration_s * 1e9) if s.duration_s > 0 else None
        next_second = start + 1_000_000_000
        self.stop_reason = None
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
            if slot - now > spin_ns + warm_ns:
                sleep((slot - now - spin_ns - warm_ns) / 1e9)
            if s.warm_cache and (not warm_ns or slot - clock() > warm_ns // WARM_LEAD):  # time for it
                while clock() < slot - warm_ns:  # rehearse the step but the env's part until the slot
                    pass
                t_warm = timer()
                rehearse(obs)
                first = timer() - t_warm  # cold; the ones after it run hot, as long as the last step's did
                shortest = hot_ns or first
                hot_ns = 0
                while clock() + shortest < slot:  # keep the caches warm until the slot
                    t_warm = timer()
                    rehearse(obs)
                    hot_ns = min(hot_ns or first, timer() - t_warm)
                    shortest = min(shortest, hot_ns)
                warm_ns = min(max(int(WARM_LEAD * first), warm_ns - (warm_ns >> 4)), period // 4)
            while (now := clock()) < slot:
                pass
            add_jitter(now - slot)
            took = 0
            safe_obs = obs_guard.check(obs)
            if safe_obs is None:
                action = act_guard.hold()
                held += 1
            else:
                t0 = timer()
                raw = backend.act(safe_obs)
                took = timer() - t0
                add_latency(took)
                if took > budget_ns:
                    overruns += 1
                    action = act_guard.hold()
                else:
                    action = act_guard.apply(raw if experience is None else experience.explore(raw))
            t_env = timer()
            try:
                next_obs, reward, terminated, truncated, _ = env.step(action)
            except BaseException as err:  # the env is foreign code: the summary is still made
                self._env_failed("step", err)
                break
            env_ns = timer() - t_env
            done = terminated or truncated
            if experience is not None and obs_guard.well_formed(obs) and obs_guard.well_formed(next_obs):
                experience.observe(obs, action, float(reward), next_obs, bool(terminated), bool(truncated))
            if done:
                episodes += 1
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
        elapsed = (clock() - start) / 1e9
        stats.fold()
        self._final_memory()
        summary = self._summary(steps, episodes, misses, skipped, overruns, held, elapsed)
        return {**summary, **stats.breakdown()}

    def _env_failed(self, call: str, err: BaseException) -> None:
        """The environment raised in ``call``: stop, and keep the error for the caller."""
        first = str(err).splitlines()[0][:200] if str(err) else ""
        self.env_error = {"call": call, "type": type(err).__name__, "message": first}
        self.stop_reason = f"environment error in {call}(): {type(err).__name__}" + (f": {first}" if first else "")

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
            "stopped_by": self.stop_reason,
            "env_error": self.env_error,
            "backend": self.backend.describe(),
        }


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
