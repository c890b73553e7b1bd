"""The runtime as a library: the README's own loop run as written, the guards, the thread rules, no torch."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.common.lockfile import pid_lock
from sac_edge.edge_runtime.config import RunConfig
from sac_edge.edge_runtime.finetune.promotion import LastGoodStore
from sac_edge.edge_runtime.runtime import (
    Caller,
    Runtime,
    RuntimeOptions,
    RuntimeState,
    RuntimeSummary,
    StoppedServing,
)

ROOT = Path(__file__).resolve().parents[2]


def readme_loop() -> str:
    """The Python block of the README's "Your own loop" section, as written."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Your own loop\n") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section has one Python example"
    return str(blocks[0])


@pytest.mark.torch
def test_the_readme_loop_fine_tunes_promotes_and_keeps_the_last_good_weights(
    finetune_bundle: Path, tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(finetune_bundle, bundle)  # its finetune/ is written: the session's bundle stays clean
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(readme_loop(), "README.md", "exec"), namespace)
    summary = namespace["run"](str(bundle))
    assert isinstance(summary, RuntimeSummary) and summary.closed
    assert summary.steps == summary.transitions == 2000 and summary.episodes == 10
    ft = summary.finetune
    assert ft is not None and ft["error"] is None, ft
    assert ft["promotions"] >= 1 and ft["updates"] > 0, ft
    assert ft["last_good"] == str(bundle / "finetune" / "last_good.safetensors")
    last = LastGoodStore(bundle / "finetune").load()  # on disk, its checksum and sidecar checked
    assert last.sha256 == ft["last_good_sha256"]
    with pid_lock(bundle / "finetune" / "lock", "the test"):  # released on close: taken again at once
        pass
    json.dumps(summary.to_dict(), default=str)  # a plain record, as telemetry writes it


def _runtime(bundle: Path, **flags: Any) -> Runtime:
    options = RuntimeOptions.of(str(bundle), backend="onnxruntime", **flags)
    return Runtime(options, obs_low=[-1, -1, -8], obs_high=[1, 1, 8])


def test_a_power_budget_not_enforced_is_said_by_the_caller(pendulum_bundle: Path, tmp_path: Path) -> None:
    """The line is the caller's (the ROS 2 node, a robot's own loop), not ``sac-edge run``'s: a root without
    a power sensor leaves only the estimate, and an estimate is not enforced unless asked."""
    (tmp_path / "no-sensors").mkdir()
    options = RuntimeOptions.of(
        str(pendulum_bundle), backend="onnxruntime", power_budget_w=5, sensor_root=str(tmp_path / "no-sensors")
    )
    said: list[str] = []
    with Runtime(options, log=said.append, caller=Caller("robot loop")):
        pass
    power = [line for line in said if "power" in line]
    assert len(power) == 1 and power[0].startswith("robot loop: --power-budget-w 5 is not enforced: "), said


def test_act_guards_the_observation_and_the_action(pendulum_bundle: Path, tmp_path: Path) -> None:
    telemetry = tmp_path / "t.jsonl"
    with _runtime(pendulum_bundle, telemetry=str(telemetry)) as runtime:
        good = runtime.act(np.array([1.0, 0.0, 0.5], np.float32)).copy()
        assert good.shape == (1,) and -2 <= good[0] <= 2
        for bad in (np.array([np.nan, 0.0, 0.5], np.float32), np.array([1.0, 0.0, 99.0], np.float32), np.zeros(5)):
            action = runtime.act(bad)
            assert np.isfinite(action).all() and -2 <= action[0] <= 2
        runtime.observe(np.zeros(3, np.float32), good, float("nan"), np.zeros(3, np.float32), False, True)
        report = runtime.tick()
        assert report.rate_hz == 100.0 and report.precision == "fp32"
        now = runtime.summary()
        assert (now.steps, now.obs_nonfinite, now.obs_out_of_range, now.obs_malformed) == (4, 1, 1, 1)
        assert now.episodes == 1 and now.reward_invalid == 0  # no fine-tuner: the reward is not read
        assert not now.closed and now.finetune is None
    final = runtime.summary()
    assert final.closed and final.steps == 4 and final.latency_us["p50"] > 0
    kinds = [json.loads(line)["type"] for line in telemetry.read_text().splitlines()]
    assert kinds[0] == "config" and kinds[-1] == "summary" and final.telemetry_records == len(kinds)
    assert dataclasses.is_dataclass(final) and final.backend["backend"] == "onnxruntime"


def test_an_overrun_returns_the_last_safe_action(pendulum_bundle: Path) -> None:
    # a period of 10 us with 1% of it for inference: no onnxruntime call is that fast
    with _runtime(pendulum_bundle, rate_hz=100_000, inference_budget=0.01) as runtime:
        action = runtime.act(np.array([1.0, 0.0, 0.5], np.float32))
        assert runtime.summary().inference_overruns == 1 and action[0] == 0.0  # the initial safe action


def test_misuse_is_refused_with_one_line(pendulum_bundle: Path) -> None:
    obs = np.array([1.0, 0.0, 0.5], np.float32)
    runtime = _runtime(pendulum_bundle)
    with pytest.raises(SacEdgeError, match=r"act\(\) before open\(\)"):
        runtime.act(obs)
    with runtime:
        runtime.act(obs)
        errors: list[BaseException] = []

        def other() -> None:
            try:
                runtime.act(obs)
            except SacEdgeError as err:
                errors.append(err)
            runtime.summary()  # any thread may read it

        thread = threading.Thread(target=other, name="ros-executor-2")
        thread.start()
        thread.join()
        assert len(errors) == 1 and "'ros-executor-2'" in str(errors[0]) and "\n" not in str(errors[0])
        with pytest.raises(SacEdgeError, match="opened already"):
            runtime.open()
    with pytest.raises(SacEdgeError, match=r"after close\(\)"):
        runtime.tick()
    with pytest.raises(SacEdgeError, match="obs_low must be 3 numbers"):
        Runtime(RuntimeOptions(bundle=str(pendulum_bundle)), obs_low=[0, 0]).open()
    with pytest.raises(SacEdgeError, match="--promotion-window"):  # the options are checked when made
        RuntimeOptions.of(str(pendulum_bundle), finetune=True, promotion_window=0)
    with pytest.raises(SacEdgeError, match="--promotion-window"):  # sac-edge run's config: its runtime options
        RunConfig.of(str(pendulum_bundle), finetune=True, promotion_window=0).runtime_options()
    with pytest.raises(SacEdgeError, match=r"^Runtime takes RuntimeOptions, got RunConfig; pass RuntimeOptions"):
        Runtime(RunConfig.of(str(pendulum_bundle)))  # type: ignore[arg-type]
    with pytest.raises(SacEdgeError, match=r"^Runtime takes RuntimeOptions, got dict; pass RuntimeOptions"):
        Runtime({"bundle": str(pendulum_bundle)})  # type: ignore[arg-type]


def test_backend_errors_stop_serving_at_the_limit(
    pendulum_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "security"))
    from hostile_graphs import failing_reshape, plant

    bundle = Path(shutil.copytree(pendulum_bundle, tmp_path / "bundle"))
    plant(bundle, failing_reshape())  # a graph whose every inference raises
    obs = np.array([1.0, 0.0, 0.5], np.float32)
    with _runtime(bundle, max_backend_errors=2) as runtime:
        assert runtime.act(obs)[0] == 0.0  # held: the initial safe action
        assert runtime.summary().backend_errors == 1
        with pytest.raises(InternalError, match="stopped serving: backend error x2: RuntimeError"):
            runtime.act(obs)
        with pytest.raises(InternalError, match="stopped serving"):
            runtime.act(obs)
        runtime.tick()  # the rest still works, and close reports
    final = runtime.summary()
    assert final.closed and final.backend_errors == 2 and str(final.stopped_by).startswith("backend error x2")


def test_no_torch_without_fine_tuning(pendulum_bundle: Path) -> None:
    code = (
        "import sys, numpy as np\n"
        "from sac_edge.edge_runtime.runtime import Runtime, RuntimeOptions\n"
        f"with Runtime(RuntimeOptions.of({str(pendulum_bundle)!r}, backend='auto', auto_calls=5)) as rt:\n"
        "    rt.act(np.zeros(3, np.float32)); rt.tick()\n"
        "print(rt.summary().torch_imported, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_the_summary_fields_are_the_documented_contract() -> None:
    from docs_tables import documented

    assert documented("Runtime summary") == {f.name for f in dataclasses.fields(RuntimeSummary)}


def test_the_lifecycle_states(pendulum_bundle: Path) -> None:
    obs = np.array([1.0, 0.0, 0.5], np.float32)
    runtime = _runtime(pendulum_bundle)
    assert runtime.state is RuntimeState.CREATED
    with runtime:
        assert runtime.state is RuntimeState.OPEN  # no control thread yet
        runtime.act(obs)
        assert runtime.state is RuntimeState.SERVING
    assert runtime.state is RuntimeState.CLOSED


def test_warming_up_before_each_step_changes_nothing_act_keeps(enveloped_bundle: Path) -> None:
    """``warm_up`` runs the real step on scratch state: a runtime warmed three times before every step sends
    the same actions and reports the same counts (the shield's included) as one never warmed, through faults,
    fallbacks, ramps and episode restarts."""
    rng = np.random.default_rng(8)
    # at 1 Hz the inference budget is half a second: no step overruns on a busy machine, which would make
    # the two runtimes' shields diverge for a reason of their own
    flags = dict(stuck_steps=3, ramp_steps=4, shield_window=2, rate_hz=1.0)
    runtimes = [_runtime(enveloped_bundle, **flags) for _ in range(2)]
    with runtimes[0] as plain, runtimes[1] as warmed:
        obs = np.array([1.0, 0.0, 0.5], np.float32)
        for t in range(600):
            if rng.random() > 0.1:  # else stuck
                obs = (rng.standard_normal(3) * rng.choice([0.3, 3.0])).astype(rng.choice([np.float32, np.float64]))
                if rng.random() < 0.05:
                    obs[rng.integers(3)] = np.nan
            for _ in range(3):
                assert warmed.warm_up(obs)
            assert warmed.act(obs).tolist() == plain.act(obs).tolist(), t
            if rng.random() < 0.02:
                for runtime in runtimes:
                    runtime.observe(obs, np.zeros(1, np.float32), 0.0, obs, True, False)
        summaries = [r.summary() for r in runtimes]
    keep = ("steps", "obs_nonfinite", "obs_out_of_range", "obs_held", "action_clipped", "shield", "episodes")
    assert summaries[0].inference_overruns == summaries[1].inference_overruns == 0
    assert [getattr(summaries[0], k) for k in keep] == [getattr(summaries[1], k) for k in keep]
    assert summaries[0].shield["fallbacks"] > 5 and summaries[0].shield["ramps"] > 0


@pytest.mark.parametrize("shield", ["on", "guards"])
def test_hold_steps_without_inferring_through_the_fallback_and_counts_it(pendulum_bundle: Path, shield: str) -> None:
    """``hold`` is the step of a loop whose input is stale: the last action held (the shield's ``hold``
    fallback, or the action guard's last safe action without a shield), counted as a step and as held, and
    with a shield one fallback that ramps back to the policy once ``act`` steps again."""
    obs = np.array([1.0, 0.0, 0.5], np.float32)
    flags = dict(shield=shield, ramp_steps=3, shield_window=2, stuck_steps=0, rate_hz=1.0)
    with _runtime(pendulum_bundle, **flags) as runtime:
        sent = [runtime.act(obs).tolist() for _ in range(5)]
        assert (sent[0] != sent[-1]) is (shield == "on")  # the shield's ramp from the safe action at the start
        errors: list[BaseException] = []
        worker = threading.Thread(target=lambda: errors.extend(_raised(runtime.hold, obs)), name="ros-timer")
        worker.start()
        worker.join()
        assert len(errors) == 1 and "'ros-timer'" in str(errors[0])  # the control thread's call, like act
        held = [runtime.hold(obs).tolist() for _ in range(4)] + [runtime.hold(None).tolist()]
        assert held == [sent[-1]] * 5, (sent, held)
        after = [runtime.act(obs).tolist() for _ in range(6)]
        now = runtime.summary()
    assert (now.steps, now.obs_held, now.obs_nonfinite, now.obs_malformed) == (16, 5, 0, 0)
    assert now.inference_overruns == 0 and now.backend_errors == 0
    assert after == [sent[-1]] * 6  # the fallback held the policy's action; back to it (a ramp from there)
    s = now.shield
    if shield == "guards":
        assert s["mode"] == "guards"
        return
    assert (s["fallbacks"], s["fallback_causes"]["not_inferred"], s["fallback_steps"]) == (1, 1, 6), s
    assert s["ramps"] == 1, s  # back to the policy through the ramp once the window of clear steps passed


def _raised(call: Any, *args: Any) -> list[BaseException]:
    try:
        call(*args)
    except SacEdgeError as err:
        return [err]
    return []


def test_hold_before_open_is_refused_in_one_line(pendulum_bundle: Path) -> None:
    with pytest.raises(SacEdgeError, match=r"^Runtime.hold\(\) before open\(\)"):
        _runtime(pendulum_bundle).hold(np.zeros(3, np.float32))


def test_warming_up_leaves_a_weight_swaps_ramp_to_act(enveloped_bundle: Path) -> None:
    """After a weight swap (``Shield.weights_swapped``, which the fine-tuner calls on each swap) the shield
    blends the new policy in over ``ramp_steps`` steps. ``warm_up`` before each step runs the step on the
    scratch shield: it neither starts nor advances that ramp, nor counts anything ``act`` counts, so the
    warmed runtime ramps exactly as one never warmed."""
    flags = dict(ramp_steps=4, rate_hz=1.0)  # at 1 Hz no step overruns on a busy machine
    runtimes = [_runtime(enveloped_bundle, **flags) for _ in range(2)]
    states = iter(np.array([0.1, 0.0, 0.05 + 0.001 * t], np.float32) for t in range(100))  # inside the envelope,
    # never repeated: neither a fallback nor a stuck sensor stops the ramp

    def step(warm_ups: int) -> None:
        obs = next(states)
        for _ in range(warm_ups):
            assert warmed.warm_up(obs)
        assert warmed.act(obs).tolist() == plain.act(obs).tolist()

    with runtimes[0] as plain, runtimes[1] as warmed:
        for _ in range(6):  # past the start's ramp
            step(3)
        shields = [r.shield for r in runtimes]
        assert all(s is not None and s.ramp.left == 0 and not s.falling_back for s in shields), shields
        keep = ("steps", "obs_nonfinite", "obs_out_of_range", "obs_held", "action_clipped", "inference_overruns")
        before = warmed.summary()
        obs = next(states)
        for _ in range(20):
            assert warmed.warm_up(obs)
        after = warmed.summary()  # nothing act keeps was counted
        assert [getattr(after, k) for k in keep] == [getattr(before, k) for k in keep] and after.shield == before.shield
        for runtime in runtimes:
            runtime.shield.weights_swapped()  # type: ignore[union-attr]
        for _ in range(20):  # before the next step, as the scheduler warms up: the swap is still act's
            assert warmed.warm_up(obs)
        swapped = warmed.summary()
        assert swapped.steps == before.steps and swapped.shield["swap_ramps"] == 0
        assert [s.ramp.left for s in shields] == [0, 0]  # type: ignore[union-attr]
        for n in range(6):
            step(3)
            assert [s.ramp.left for s in shields] == [max(4 - n - 1, 0)] * 2, n  # type: ignore[union-attr]
        summaries = [r.summary() for r in runtimes]
    assert summaries[0].shield == summaries[1].shield and summaries[0].shield["swap_ramps"] == 1
    assert summaries[0].steps == summaries[1].steps == 12 and summaries[1].inference_overruns == 0


def test_a_hung_inference_goes_to_the_hang_policy_on_the_watchdogs_thread(
    pendulum_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call past ``inference_timeout``: the runtime stops serving, then tells its ``HangPolicy`` once, on the
    inference watchdog's thread, while the control thread is still inside the call; when the call returns,
    ``act`` raises."""
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "security"))
    from hostile_graphs import long_chain, plant

    bundle = Path(shutil.copytree(pendulum_bundle, tmp_path / "bundle"))
    plant(bundle, long_chain(depth=200))  # about a second a call on one core: long past 50 ms
    told: list[tuple[str, str, RuntimeState]] = []

    class Recorded:
        def hung(self, reason: str) -> None:
            told.append((reason, threading.current_thread().name, runtime.state))

    options = RuntimeOptions.of(str(bundle), backend="onnxruntime", inference_timeout=0.05, rate_hz=1.0)
    runtime = Runtime(options, hang=Recorded())
    with runtime:
        with pytest.raises(StoppedServing, match="inference watchdog: a onnxruntime call ran") as raised:
            runtime.act(np.zeros(3, np.float32))
        assert raised.value.hung and runtime.state is RuntimeState.STOPPED
    assert told == [(runtime.stopped_by, "sac-edge-inference-watchdog", RuntimeState.STOPPED)]
    assert runtime.summary().inference_hang["limit_s"] == 0.05  # type: ignore[index]
