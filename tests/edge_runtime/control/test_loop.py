"""The control loop on real gymnasium envs: counts, telemetry, safety policy, budgets, SIGTERM."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from sac_edge.edge_runtime.cli import main

HERE = Path(__file__).parent


def _json_line(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_pendulum_loop_with_telemetry(
    pendulum_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    telemetry = tmp_path / "run.jsonl"
    rc = main(
        [
            "run",
            str(pendulum_bundle),
            "--env",
            "Pendulum-v1",
            "--backend",
            "onnxruntime",
            "--rate-hz",
            "300",
            "--duration",
            "2.2",
            "--telemetry",
            str(telemetry),
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    summary = _json_line(out)
    assert "deadline misses" in out  # the table
    # the schedule is 660 slots: each was stepped or skipped (a busy machine skips some, by design); the last
    # step may end late and skip past the end
    slots = summary["steps"] + summary["skipped_slots"]
    assert summary["steps"] > 0 and 660 <= slots <= max(660, int(summary["duration_s"] * 300) + 1)
    assert summary["episodes"] == summary["steps"] // 200  # Pendulum truncates at 200 steps
    assert summary["miss_rate"] == summary["deadline_misses"] / summary["steps"]
    assert summary["latency_us"]["p50"] <= summary["latency_us"]["p99"] <= summary["latency_us"]["max"]
    assert summary["stopped_by"] == "duration" and summary["peak_rss_mb"] > 0
    assert summary["backend"]["backend"] == "onnxruntime"
    assert sum(summary["miss_causes"].values()) == summary["deadline_misses"]
    hist = summary["histogram_us"]
    assert sum(hist["late_wakeup"]) == sum(hist["step"]) == summary["steps"]
    assert 0 < summary["loop_work_us"]["p50"] < summary["loop_work_us"]["max"]
    assert summary["env_step_us"]["p50"] > 0
    records = [json.loads(line) for line in telemetry.read_text().splitlines()]
    assert records[0]["type"] == "config" and records[-1]["type"] == "summary"
    seconds = [r for r in records if r["type"] == "second"]
    # one record per second passed, each written at or after its second
    assert 1 <= len(seconds) <= int(summary["duration_s"]) and all(r["t_s"] >= i + 1 for i, r in enumerate(seconds))
    for r in seconds:
        assert {"p50", "p99", "max"} <= set(r["latency_us"]) and r["memory"]["rss_mb"] > 0
        assert r["power"]["label"] in ("measured", "estimated")
    assert sum(r["steps"] for r in seconds) <= summary["steps"]


@pytest.mark.parametrize("policy", ["clip", "hold"])
def test_bad_observations_are_counted_and_actions_stay_safe(
    pendulum_bundle: Path, capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    rc = main(
        [
            "run",
            str(pendulum_bundle),
            "--env",
            "faulty_env:FaultyPendulum",
            "--backend",
            "onnxruntime",
            "--rate-hz",
            "400",
            "--duration",
            "1",
            "--obs-fault",
            policy,
            "--json",
        ]
    )
    assert rc == 0
    s = _json_line(capsys.readouterr().out)
    steps = s["steps"]
    assert steps + s["skipped_slots"] >= 400  # every slot of the second stepped or skipped, however slow the host
    # the env's t runs 1..49 per episode: NaN at multiples of 5, inf at other multiples of 7, 100.0 at other
    # multiples of 11; counted over the steps there were (a slow or emulated host steps fewer)
    ts = [i % 49 + 1 for i in range(steps)]
    assert steps > 0 and s["obs_nonfinite"] == sum(t % 5 == 0 or t % 7 == 0 for t in ts), (steps, s)
    assert s["obs_out_of_range"] == sum(t % 11 == 0 and t % 5 != 0 and t % 7 != 0 for t in ts), (steps, s)
    assert s["action_nonfinite"] == 0
    if policy == "hold":
        assert s["obs_held"] == s["obs_nonfinite"] + s["obs_out_of_range"]
    else:
        assert s["obs_held"] == 0
    # the env asserts every action is finite and within its tighter [-1, 1] bounds


def test_governor_degrades_precision_under_a_tiny_memory_budget(
    pendulum_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    telemetry = tmp_path / "budget.jsonl"
    rc = main(
        [
            "run",
            str(pendulum_bundle),
            "--backend",
            "onnxruntime",
            "--rate-hz",
            "200",
            "--duration",
            "4.3",
            "--mem-budget-mb",
            "5",
            "--telemetry",
            str(telemetry),
            "--json",
        ]
    )
    assert rc == 0
    out, err = capsys.readouterr()
    s = _json_line(out)
    said = [line for line in err.splitlines() if "governor" in line]  # the why, on the terminal: one line
    assert said and said[0].startswith("governor lowered precision fp32 -> int8: memory over budget"), err
    assert "vs budget 5 MB" in said[0]
    # 3 samples over budget -> first rung of the ladder: fp32 -> int8 (the gate accepted it)
    assert s["budget_events"] >= 1 and s["precision"] == "int8" and s["precision_switches"] == 1
    events = [json.loads(line) for line in telemetry.read_text().splitlines()]
    events = [r for r in events if r["type"] == "event"]
    assert events[0]["kind"] == "degrade" and events[0]["knob"] == "precision"


@pytest.mark.parametrize("enforce", [False, True])
def test_an_estimated_power_reading_throttles_only_when_asked(
    pendulum_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], enforce: bool
) -> None:
    """``make demo`` ran at 50 Hz, not 200, on a machine without a power sensor: an estimate of the whole
    machine's CPU load (other processes included) passed its 15 W budget. An empty sensor root has no sensor,
    so the generic estimate (10 W idle) stands over a 5 W budget at every sample: enforced only on request."""
    telemetry, root = tmp_path / "power.jsonl", tmp_path / "no-sensors"
    root.mkdir()
    flags = ["--power-budget-w", "5", "--sensor-root", str(root)] + ["--enforce-estimated-power"] * enforce
    args = ["run", str(pendulum_bundle), "--backend", "onnxruntime", "--rate-hz", "100", "--duration", "4.3"]
    rc = main([*args, *flags, "--telemetry", str(telemetry), "--json"])
    assert rc == 0
    out, err = capsys.readouterr()
    s = _json_line(out)
    seconds = [r for r in map(json.loads, telemetry.read_text().splitlines()) if r["type"] == "second"]
    assert len(seconds) >= 3 and all(r["power"]["label"] == "estimated" for r in seconds)  # recorded either way
    said = [line for line in err.splitlines() if "power" in line]
    if enforce:
        assert s["budget_events"] >= 1 and s["precision_switches"] == 1, s
        assert said[0].startswith("governor lowered precision fp32 -> int8: power over budget"), err
        assert "ESTIMATED, estimate:generic-host" in said[0] and "--enforce-estimated-power is set" in said[0]
    else:
        assert s["budget_events"] == 0 and s["precision"] == "fp32" and s["final_rate_hz"] == 100, s
        assert said == [
            "sac-edge run: --power-budget-w 5 is not enforced: no power sensor is readable here, only an estimate "
            "(estimate:generic-host, from the whole machine's CPU load), recorded in telemetry; "
            "--enforce-estimated-power enforces it on the estimate"
        ], err


def test_sigterm_stops_cleanly_with_a_summary(pendulum_bundle: Path, tmp_path: Path) -> None:
    telemetry = tmp_path / "sig.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sac_edge.edge_runtime.cli",
            "run",
            str(pendulum_bundle),
            "--backend",
            "onnxruntime",
            "--rate-hz",
            "200",
            "--duration",
            "0",
            "--telemetry",
            str(telemetry),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180  # an emulated or loaded host takes long to import and open the bundle
    while time.monotonic() < deadline and '"second"' not in (telemetry.read_text() if telemetry.exists() else ""):
        time.sleep(0.1)
    assert telemetry.exists() and '"second"' in telemetry.read_text(), "no one-second record: the loop never ran"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    summary = _json_line(out)
    # signalled after the first one-second record: at least 200 slots at 200 Hz were stepped or skipped
    assert summary["stopped_by"] == "SIGTERM" and summary["steps"] > 0 and summary["safe_action_sent"] is True
    assert summary["steps"] + summary["skipped_slots"] >= 200
    assert json.loads(telemetry.read_text().splitlines()[-1])["type"] == "summary"


def test_onnxruntime_run_never_imports_torch(pendulum_bundle: Path) -> None:
    """The device path (run --backend auto, bench on onnxruntime, doctor) with torch installed but unused."""
    bundle = str(pendulum_bundle)
    code = (
        "import sys; from sac_edge.edge_runtime.cli import main; "
        f"assert main(['bench', {bundle!r}, '--backends', 'onnxruntime', '--calls', '5', '--batch', '1']) == 0; "
        f"assert main(['doctor', {bundle!r}]) == 0; "
        f"rc = main(['run', {bundle!r}, '--duration', '0.3', '--auto-calls', '20', '--json']); "
        "assert rc == 0; assert 'torch' not in sys.modules, 'torch was imported'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(HERE)},
    )
    assert proc.returncode == 0, proc.stderr
    assert _json_line(proc.stdout)["torch_imported"] is False


def test_cyclic_gc_is_paused_during_the_loop_and_restored() -> None:
    import gc

    from sac_edge.edge_runtime.control.loop import paused_gc

    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def _run_loop(
    bundle: Path,
    env: gym.Env,
    rate_hz: float,
    duration_s: float,
    telemetry: Path | None = None,
    watch: Callable[[Any, Any], None] | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """``ControlLoop`` on a ``Runtime``, as ``sac-edge run`` composes them; the schedule's summary as a dict.
    ``watch`` gets the open runtime and the loop before it runs."""
    from sac_edge.edge_runtime.control.loop import ControlLoop, LoopSettings
    from sac_edge.edge_runtime.runtime import Runtime, RuntimeOptions

    space = env.observation_space
    # the whole period for an inference: an overrun would hold an action and change the trajectory
    options = RuntimeOptions.of(
        str(bundle),
        backend="onnxruntime",
        rate_hz=rate_hz,
        inference_budget=1.0,
        telemetry=None if telemetry is None else str(telemetry),
        overwrite_telemetry=True,
    )
    with Runtime(options, obs_low=space.low, obs_high=space.high) as runtime:  # type: ignore[attr-defined]
        loop = ControlLoop(env, runtime, LoopSettings(rate_hz, duration_s, **settings))
        if watch is not None:
            watch(runtime, loop)
        summary = loop.run()
    return dataclasses.asdict(summary)


class _ActionLog(gym.Wrapper):
    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.actions: list[np.ndarray] = []

    def step(self, action: np.ndarray):  # type: ignore[no-untyped-def]
        self.actions.append(np.array(action))
        return self.env.step(action)


class _Ending(gym.Wrapper):
    """Records every action the env is sent, and ends the run at its ``at``-th step the way ``ending`` names:
    a stop (as a signal asks), the env's ``step`` or ``reset`` raising, or the loop's own call raising."""

    def __init__(self, ending: str, at: int = 20) -> None:
        super().__init__(gym.make("Pendulum-v1", max_episode_steps=at if ending == "reset error" else 200))
        self.ending, self.at = ending, at
        self.actions: list[np.ndarray] = []
        self.resets = 0
        self.loop: Any = None
        self.runtime: Any = None

    def watch(self, runtime: Any, loop: Any) -> None:
        self.runtime, self.loop = runtime, loop
        if self.ending == "loop error":
            observe = runtime.observe

            def failing(*args: Any) -> None:
                if len(self.actions) == self.at:
                    raise RuntimeError("a bug in the loop")
                observe(*args)

            runtime.observe = failing  # the loop binds its calls when it starts, after this

    def reset(self, **kwargs: Any):  # type: ignore[no-untyped-def]
        self.resets += 1
        if self.ending == "reset error" and self.resets == 2:
            raise OSError("the robot did not come back to its start pose")
        return self.env.reset(**kwargs)

    def step(self, action: np.ndarray):  # type: ignore[no-untyped-def]
        self.actions.append(np.array(action))
        if len(self.actions) == self.at:
            if self.ending == "stop":
                self.loop.stop("SIGTERM")
            elif self.ending == "step error":
                raise TimeoutError("a sensor read timed out")
        return self.env.step(action)


@pytest.mark.parametrize("ending", ["duration", "stop", "step error", "reset error", "loop error"])
def test_every_ending_sends_the_safe_action_last(pendulum_bundle: Path, ending: str) -> None:
    """The brief: every way a run ends ends in the configured safe command. A run that reached its duration
    or was stopped left the env with the policy's last action. Each ending here sends one more command, the
    runtime's ``safe_action()``, after the last step, and the summary says the env took it; the env's error
    stays the first one."""
    env = _Ending(ending)
    duration = 0.3 if ending == "duration" else 600.0  # the others end at step 20, however long that takes
    if ending == "loop error":
        with pytest.raises(RuntimeError, match="a bug in the loop"):
            _run_loop(pendulum_bundle, env, 100.0, duration, watch=env.watch)
        summary = None
    else:
        summary = _run_loop(pendulum_bundle, env, 100.0, duration, watch=env.watch)
    safe = env.runtime.safe_action()
    assert len(env.actions) >= 2 and not np.array_equal(env.actions[-2], safe)  # the policy's, then the safe one
    np.testing.assert_array_equal(env.actions[-1], safe)
    if summary is not None:
        assert summary["safe_action_sent"] is True
        # the step that failed, or whose episode's reset failed, is not counted; its action was sent
        assert len(env.actions) == summary["steps"] + 1 + ("error" in ending)
        stopped = {"duration": "duration", "stop": "SIGTERM"}.get(ending, "environment error")
        assert summary["stopped_by"].startswith(stopped), summary["stopped_by"]
        if "error" in ending:
            assert summary["env_error"]["call"] == ending.split()[0], summary["env_error"]


@pytest.mark.parametrize("warm", [True, False])
def test_warm_cache_warms_up_before_each_step_and_serves_the_same_actions(
    pendulum_bundle: Path, warm: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sac_edge.edge_runtime.backends.onnxrt.runner import OrtBackend

    calls = [0]
    act = OrtBackend.act

    def counting(self: OrtBackend, obs: np.ndarray) -> np.ndarray:
        calls[0] += 1
        return act(self, obs)

    monkeypatch.setattr(OrtBackend, "act", counting)  # the real backend, its batch-1 inferences counted

    telemetry = tmp_path / "run.jsonl"

    def run(warm_cache: bool) -> tuple[int, int, list[np.ndarray]]:
        """A run's steps, inferences and actions up to its first step not inferred in time: on a loaded
        machine (or under emulation) an inference can overrun even the whole period, and the shield then
        falls back, which changes the trajectory from there on (a second try before giving up on it)."""
        for _ in range(2):
            env = _ActionLog(gym.make("Pendulum-v1"))
            calls[0] = 0
            summary = _run_loop(pendulum_bundle, env, 50.0, 1.5, telemetry, warm_cache=warm_cache)
            events = [json.loads(line) for line in telemetry.read_text().splitlines()]
            late = [e["step"] for e in events if e.get("type") == "shield" and e.get("cause") == "not_inferred"]
            if not late:
                break
        return summary["steps"], calls[0], env.actions[: min(late) - 1] if late else env.actions

    steps, inferences, actions = run(warm)
    # a slot woken too late for a warm-up goes without; the others warm up at least once
    assert inferences > steps if warm else inferences == steps
    _, _, reference = run(not warm)
    n = min(len(actions), len(reference))
    assert n > 20
    np.testing.assert_array_equal(np.array(actions[:n]), np.array(reference[:n]))


class _Transcript(gym.Wrapper):
    """Records each step's observation (what the loop gave ``act``), action, outcome and whether the loop's
    inference overran its budget; stops the loop after ``steps`` steps."""

    def __init__(self, env: gym.Env, steps: int) -> None:
        super().__init__(env)
        self.steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool, bool, bool]] = []
        self._obs: np.ndarray | None = None
        self._wanted, self._overruns = steps, 0
        self._runtime: Any = None
        self._loop: Any = None

    def watch(self, runtime: Any, loop: Any) -> None:
        self._runtime, self._loop = runtime, loop

    def reset(self, **kwargs: Any):  # type: ignore[no-untyped-def]
        obs, info = self.env.reset(**kwargs)
        self._obs = np.array(obs)
        return obs, info

    def step(self, action: np.ndarray):  # type: ignore[no-untyped-def]
        next_obs, reward, terminated, truncated, info = self.env.step(action)
        assert self._obs is not None
        overruns = self._runtime.summary().inference_overruns
        overran, self._overruns = overruns > self._overruns, overruns
        self.steps.append((self._obs, np.array(action), np.array(next_obs), bool(terminated), bool(truncated), overran))
        self._obs = np.array(next_obs)
        if len(self.steps) == self._wanted:
            self._loop.stop("enough steps")
        return next_obs, reward, terminated, truncated, info


def test_the_loop_sends_what_the_library_returns(pendulum_bundle: Path) -> None:
    """``sac-edge run``'s loop is a client of ``Runtime``: a fresh runtime given the loop's observations and
    transitions returns the very actions the loop sent (guards, shield and its restarts included).

    Judged without a clock (under qemu on a busy host an inference overran the 20 ms of a 50 Hz period): the
    loop runs to 70 steps however long that takes, and a step whose inference overran is replayed as what the
    loop then did, the last safe action (``hold``); the replay's own budget is a second, reached only by a
    real fault."""
    from sac_edge.edge_runtime.runtime import Runtime, RuntimeOptions

    env = _Transcript(gym.make("Pendulum-v1", max_episode_steps=30), steps=70)  # episodes end: the shield restarts
    summary = _run_loop(pendulum_bundle, env, 50.0, 600.0, watch=env.watch)
    assert summary["steps"] == len(env.steps) - 1 == 70 and summary["stopped_by"] == "enough steps"
    space = env.observation_space
    options = RuntimeOptions.of(str(pendulum_bundle), backend="onnxruntime", rate_hz=1.0, inference_budget=1.0)
    with Runtime(options, obs_low=space.low, obs_high=space.high) as runtime:  # type: ignore[attr-defined]
        assert runtime.shield is not None  # the default: the shield shapes every action
        np.testing.assert_array_equal(env.steps[-1][1], runtime.safe_action())  # the run's last command
        for obs, sent, next_obs, terminated, truncated, overran in env.steps[:-1]:
            np.testing.assert_array_equal(runtime.hold(obs) if overran else runtime.act(obs), sent)
            runtime.observe(obs, sent, 0.0, next_obs, terminated, truncated)


class _SlowStep(gym.Wrapper):
    """An env whose every 10th step takes 6 ms (a slow sensor read, say)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.n = 0

    def step(self, action: np.ndarray):  # type: ignore[no-untyped-def]
        self.n += 1
        if self.n % 10 == 0:
            time.sleep(0.006)
        return self.env.step(action)


def test_misses_from_a_slow_env_are_blamed_on_the_env(pendulum_bundle: Path) -> None:
    summary = _run_loop(pendulum_bundle, _SlowStep(gym.make("Pendulum-v1")), 250.0, 1.0)
    causes = summary["miss_causes"]
    # Judged by the schedule's own accounting: a slow or emulated host steps fewer of the 250 slots.
    assert summary["steps"] + summary["skipped_slots"] >= 250
    slow = summary["steps"] // 10  # the steps whose env took 6 ms, past their 4 ms slot
    assert slow >= 5
    assert sum(causes.values()) == summary["deadline_misses"] >= 0.8 * slow  # each slow step past its deadline
    assert causes["env"] >= 0.6 * slow  # most of them (a loaded host adds late wake-ups, blamed on the wake-up)
    hist = summary["histogram_us"]  # bin i counts [edges[i], edges[i + 1]) microseconds
    assert sum(hist["step"][hist["edges"].index(5000) :]) >= 0.8 * slow


def test_miss_cause_is_the_largest_part() -> None:
    from sac_edge.edge_runtime.control.step_stats import miss_cause

    assert miss_cause(900_000, 10_000, 20_000, 5_000) == "late_wakeup"
    assert miss_cause(1_000, 900_000, 20_000, 5_000) == "inference"
    assert miss_cause(1_000, 10_000, 900_000, 5_000) == "env"
    assert miss_cause(1_000, 10_000, 20_000, 900_000) == "loop"


def test_idle_latency_is_held_while_the_loop_runs_and_a_bad_value_is_one_line(
    pendulum_bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["run", str(pendulum_bundle), "--backend", "onnxruntime", "--rate-hz", "200", "--duration", "0.3"]
    assert main([*base, "--idle-latency-us", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "negative" in err
    if not os.access("/dev/cpu_dma_latency", os.W_OK):
        pytest.skip("/dev/cpu_dma_latency is not writable here (needs root)")
    assert main([*base, "--idle-latency-us", "0", "--json"]) == 0
    assert "CPU idle states limited to 0 us" in capsys.readouterr().err
