"""One control step as named stages, each handing its output to the next as a value:

    observation --ObservationGuard.check--> (observed, safe, inside)
        safe --Backend.act (timed, under the inference watchdog)--> raw action   (None: not inferred)
        raw --exploration (fine-tuning only)--> raw
        raw --ActionGuard.take--> guarded action (Python floats, inside the bounds)
        (observed, inside, guarded, inferred) --Shield.filter_action--> the action to send

A step that is not inferred (an observation held by ``--obs-fault hold``, an inference over its budget,
a backend error, or a step the caller holds because its input is stale: ``hold``) sends the last safe action,
through the shield where there is one. ``StepPipeline`` owns
the stages and the counts and timings the step keeps (``StepCounters``, the timings in ``StepStats``); the runtime
(``runtime.Runtime``) owns the lifecycle and the thread rules around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .safety import ActionGuard, ObservationGuard
from .shield import Shield
from .step_stats import StepStats

BOUND_EVERY = 4096
"""Every this many steps the pipeline asks ``StepStats.bound`` whether its window is full (a caller that
never calls ``tick`` never folds it otherwise)."""

_timer = time.perf_counter_ns


class BackendFailed(Exception):
    """``StepPipeline.act`` after ``max_backend_errors`` failed inferences: ``action`` is the last safe
    action for this step; the runtime stops serving."""

    def __init__(self, reason: str, action: np.ndarray) -> None:
        super().__init__(reason)
        self.reason, self.action = reason, action


class CallTaken(Exception):
    """A backend call came back after the inference watchdog took it: the watchdog's thread has the step."""


@dataclass
class StepCounters:
    """What the steps did, counted (the runtime's summary reads them)."""

    steps: int = 0
    """``act`` and ``hold`` calls."""
    obs_held: int = 0
    """Steps not inferred because of the observation: the guard held it (``--obs-fault hold``), or the caller
    did (``hold``: a stale or missing input)."""
    overruns: int = 0
    """Inferences over the budget (the last safe action was sent)."""
    backend_errors: int = 0
    backend_error: dict[str, str] | None = None
    """The first failed inference: its exception type and first line."""


class StepPipeline:
    """The stages of one step (module docstring); ``act`` runs them on the control thread."""

    def __init__(
        self,
        obs_guard: ObservationGuard,
        act_guard: ActionGuard,
        shield: Shield | None,
        explore: Callable[[np.ndarray], np.ndarray] | None,
        running: dict[int, bool],
        max_backend_errors: int,
        describe_error: Callable[[BaseException], str],
        inputs: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.obs_guard, self.act_guard, self.shield = obs_guard, act_guard, shield
        self.explore = explore
        """The fine-tuner's exploration noise on the inferred action (None without fine-tuning)."""
        self.running = running
        """The inference watchdog's entry for the call in progress (``watchdog.InferenceWatchdog.running``)."""
        self.max_backend_errors = max_backend_errors
        self.counters = StepCounters()
        self.stats = StepStats()
        self.budget_ns = 0
        """An inference slower than this is stale: the last safe action is sent (``serve``)."""
        self._infer: Callable[[np.ndarray], np.ndarray] | None = None
        self._inputs = inputs
        """The policy input from the checked frame (``InputHistory.inputs``; None: the frame itself)."""
        self._describe = describe_error
        # the stages' entry points, looked up once (the step runs at the control rate)
        self._check, self._take, self._apply = obs_guard.check, act_guard.take, act_guard.apply
        self._filter = shield.filter_action if shield is not None else None
        self._latency, self._infers = self.stats.latency.append, self.stats.infer.append

    def serve(self, infer: Callable[[np.ndarray], np.ndarray], budget_ns: int) -> None:
        """Infer with ``infer`` (a backend's ``act``) from the next step, within ``budget_ns``."""
        self._infer, self.budget_ns = infer, budget_ns

    def act(self, obs: np.ndarray) -> np.ndarray:
        """The action to send for ``obs`` (a buffer the next step reuses). Raises ``BackendFailed`` at the
        error limit and ``CallTaken`` when the watchdog took the call."""
        counters = self.counters
        steps = counters.steps = counters.steps + 1
        if not steps % BOUND_EVERY:
            self.stats.bound()
        observed, safe, inside = self._check(obs)
        if safe is None:
            return self._held(observed)
        running = self.running  # this call's entry, taken back after it (watchdog.py)
        t0 = _timer()
        running[t0] = True
        try:
            raw = self._infer(safe if self._inputs is None else self._inputs(safe))  # type: ignore[misc]
        except Exception as err:  # the backend is foreign code: hold, count, stop at the limit
            return self._failed(err, observed, t0)
        took = _timer() - t0
        if running.pop(t0, None) is None:
            raise CallTaken
        self._latency(took)
        self._infers(took)
        if took > self.budget_ns:
            counters.overruns += 1
            return self.last_safe(observed)
        if self.explore is not None:
            raw = self.explore(raw)
        if self._filter is None:
            return self._apply(raw)
        return self._filter(observed, inside, self._take(raw), True)

    def hold(self, observed: np.ndarray | None) -> np.ndarray:
        """The step on an observation the caller does not trust (a stale or missing input): not inferred,
        counted as a step and as held, the last safe action through the shield (its fallback, whose count
        is the shield's). ``observed``: the caller's last observation (None: none)."""
        counters = self.counters
        steps = counters.steps = counters.steps + 1
        if not steps % BOUND_EVERY:
            self.stats.bound()
        return self._held(observed)

    def _held(self, observed: np.ndarray | None) -> np.ndarray:
        """A step not inferred because of its observation (the guard's or the caller's hold): counted as held,
        no inference time, the last safe action."""
        self.counters.obs_held += 1
        self._infers(0)
        return self.last_safe(observed)

    def last_safe(self, observed: np.ndarray | None) -> np.ndarray:
        """The last safe action, through the shield where there is one (this step was not inferred)."""
        if self._filter is None:
            return self.act_guard.hold()
        return self._filter(observed, False, self.act_guard.safe, False)

    def _failed(self, err: Exception, observed: np.ndarray | None, t0: int) -> np.ndarray:
        """The backend call begun at ``t0`` raised: counted, the last safe action, ``BackendFailed`` at the
        limit."""
        took = _timer() - t0
        if self.running.pop(t0, None) is None:
            raise CallTaken
        self._latency(took)
        self._infers(took)
        counters = self.counters
        counters.backend_errors += 1
        if counters.backend_error is None:
            counters.backend_error = {"type": type(err).__name__, "message": self._describe(err)}
        action = self.last_safe(observed)
        if counters.backend_errors >= self.max_backend_errors:
            error = counters.backend_error
            message = error["type"] + (f": {error['message']}" if error["message"] else "")
            raise BackendFailed(f"backend error x{counters.backend_errors}: {message}", action)
        return action
