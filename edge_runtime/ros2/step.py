"""One step of the active node (``Stepper``): the inputs read and their age checked, the runtime's action
(``Runtime.act``, or ``Runtime.hold`` on a stale input: the shield's fallback), the transition fed to
``Runtime.observe`` where a reward topic is set, the command published and recorded (in shadow mode: made,
recorded and compared, never published)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sac_edge.edge_runtime.control.loop import StoppedServing
from sac_edge.edge_runtime.runtime import Runtime

from .inputs import NEVER, STATE, RobotInputs
from .outputs import CommandOutputs
from .recorder import Recorder
from .shadow import Shadow, ShadowOutputs
from .status import StepStats


class Transitions:
    """The reward and episode-end topics' latest values, and the transition that ended at each step."""

    def __init__(self) -> None:
        self.reward: float | None = None
        self.end: bool | None = None
        self._previous: tuple[np.ndarray, np.ndarray] | None = None

    def on_reward(self, msg: Any) -> None:
        self.reward = float(msg.data)

    def on_episode_end(self, msg: Any) -> None:
        self.end = bool(msg.data)

    def restart(self) -> None:
        self._previous = None

    def step(self, runtime: Runtime, obs: np.ndarray, action: np.ndarray) -> bool:
        """The transition that ended at this step's observation, to ``Runtime.observe``; whether it ended an
        episode."""
        previous = self._previous
        obs = obs.copy()
        end = self.end
        if previous is not None:
            runtime.observe(previous[0], previous[1], self.reward, obs, end is True, end is False)
        self.reward, self.end = None, None
        self._previous = (obs, np.array(action, copy=True))
        return previous is not None and end is not None


class Stepper:
    """The active node's step on its configured parts."""

    def __init__(
        self,
        runtime: Runtime,
        inputs: RobotInputs,
        outputs: CommandOutputs | ShadowOutputs,
        transitions: Transitions | None,
        age_ns: int,
        log: Any,
        state_topic: str,
    ) -> None:
        self.runtime, self.inputs, self.outputs, self.transitions = runtime, inputs, outputs, transitions
        self.recorder: Recorder | None = None
        self.age_ns = age_ns
        """``max_input_age_ms`` in ns (it may change while active)."""
        self.log = log
        self.state_topic = state_topic
        self.stats = StepStats()
        self.obs = np.zeros(inputs.layout.obs_dim, np.float32)
        self.safe = runtime.safe_action()
        self.stale_now: str | None = None
        self.last_step_ns = 0
        self.period_ns = outputs.period_ns
        self.message_mode = False
        self.ended_episode = False
        """Whether this step's transition ended an episode (the runtime restarted the shield)."""
        self.shadow: Shadow | None = None
        """Shadow mode's comparison, told of each step the policy ran on a fresh state."""
        self.record_drops = 0
        self.recording_stopped: str | None = None
        self._logged_problem: str | None = None
        self._fallbacks = 0
        self._causes: dict[str, int] = {}

    def restart(self, message_mode: bool) -> None:
        self.message_mode = message_mode
        self.last_step_ns = 0
        self.stale_now = None
        if self.transitions is not None:
            self.transitions.restart()

    def step(self, t0: int, clock_ns: Callable[[], int]) -> StoppedServing | None:
        """One step at ``t0`` (the node's clock); the runtime's ``StoppedServing`` when it stopped serving (the
        safe command already published)."""
        runtime, stats = self.runtime, self.stats
        stats.steps += 1
        since = t0 - self.last_step_ns if self.last_step_ns else 0
        self.last_step_ns = t0
        if not self.message_mode and since > self.period_ns * 3 // 2:
            stats.misses += 1
        stale = self.inputs.read(t0, self.age_ns, self.obs)
        if stale != self.stale_now:
            self._note_stale(stale, t0, since)
        self.ended_episode = False
        if not self.inputs.take_new() and runtime.shield is not None:
            runtime.shield.same_input()  # the timer re-steps a state (or holds one): no stuck sensor for that
        try:
            if stale is not None:
                stats.stale(stale)
                action = runtime.hold(self.obs)  # the shield's fallback, counted by the runtime
            else:
                self._record(self.state_topic, "sensor_msgs/msg/JointState", self.inputs.latest)
                action = runtime.act(self.obs)
                if self.shadow is not None:
                    self.shadow.acted(self.obs, action)
                if self.transitions is not None:
                    self.ended_episode = self.transitions.step(runtime, self.obs, action)
        except StoppedServing as err:
            self.record_command(self.outputs.publish(err.action, self.safe))
            return err
        self.record_command(self.outputs.publish(action, self.safe))
        shield = runtime.shield
        if shield is not None and shield.counts.fallbacks != self._fallbacks:
            self._fallback_began(shield.counts)
        stats.took(clock_ns() - t0)
        return None

    def _fallback_began(self, counts: Any) -> None:
        """The shield entered its fallback: its cause logged once (a stale input's is logged as stale)."""
        self._fallbacks = counts.fallbacks
        causes = dict(counts.causes)
        began = [c for c, n in causes.items() if n != self._causes.get(c, 0)]
        self._causes = causes
        for cause in began:
            if cause != "not_inferred":
                what = {"envelope": "the observation left the training envelope", "stuck": "a sensor repeats itself"}
                self.log.warning(f"shield fallback: {what.get(cause, cause)} ({cause}), until it clears; then the ramp")
                self.event({"type": "fallback", "cause": cause, "step": self.stats.steps})

    def on_state(self, problem: str | None) -> None:
        """A JointState came: an invalid one (dropped) is counted and named in the log, each problem once
        until a valid state comes (and every 1000th)."""
        if problem is None:
            self._logged_problem = None
            return
        self.stats.invalid_states += 1
        if problem != self._logged_problem or self.stats.invalid_states % 1000 == 0:
            self.log.error(f"{problem} (dropped; its joints age until a valid state comes)")
            self._logged_problem = problem

    def record_command(self, msg: Any) -> None:
        self._record(self.outputs.command_topic, "std_msgs/msg/Float64MultiArray", msg)

    def record(self, topic: str, datatype: str, msg: Any) -> None:
        """Another message to the recording (shadow mode's controller commands)."""
        self._record(topic, datatype, msg)

    def _record(self, topic: str, datatype: str, msg: Any) -> None:
        recorder = self.recorder
        if recorder is None:
            if self.recording_stopped is not None:
                self.record_drops += 1
            return
        try:
            recorder.write(topic, datatype, msg)
        except OSError as err:  # a full disk: recording is best effort, serving goes on
            self._stop_recording(err)

    def _stop_recording(self, err: OSError) -> None:
        self.record_drops += 1
        self.recording_stopped = f"{type(err).__name__}: {err}"
        self.log.error(f"recording stopped ({self.recording_stopped}); serving goes on, drops counted")
        self.close_recorder()

    def close_recorder(self) -> None:
        recorder, self.recorder = self.recorder, None
        if recorder is not None:
            try:
                recorder.close()
            except OSError as err:
                self.recording_stopped = self.recording_stopped or f"{type(err).__name__}: {err}"
                self.log.error(f"recording not finished ({err})")

    def _note_stale(self, stale: str | None, t0: int, since: int) -> None:
        """An input went stale (or came back): logged once, and an event in the recording."""
        self.stale_now = stale
        if stale is None:
            self.log.info("inputs fresh again: back to the policy through the ramp")
            self.event({"type": "fresh", "step": self.stats.steps})
            return
        seen = self.inputs.seen_ns(STATE if stale == "invalid_input" else stale)
        age_ms = (t0 - seen) / 1e6 if seen != NEVER else None
        why = f"; the latest JointState was invalid: {self.inputs.problem}" if self.inputs.problem else ""
        self.log.warning(
            f"input {stale} is stale ({'never received' if age_ms is None else f'{age_ms:.1f} ms old'}, limit "
            f"{self.age_ns / 1e6:g} ms{why}): the shield's fallback until it is fresh"
        )
        self.event(
            {"type": "stale", "input": stale, "step": self.stats.steps, "age_ms": age_ms,
             "since_previous_step_ms": since / 1e6, "limit_ms": self.age_ns / 1e6}
        )  # fmt: skip

    def event(self, record: dict[str, Any]) -> None:
        if self.recorder is not None:
            try:
                self.recorder.event(record)
            except OSError as err:
                self._stop_recording(err)
