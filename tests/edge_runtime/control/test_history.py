"""``sac-train --last-action --obs-history 3`` through to the device: the runtime assembles the policy's
input from the current frame alone, bit for bit as the trainer did (replayed from the trainer's own replay
rows), and ``sac-edge run`` of the bundle returns what the trainer's evaluation returns on the same seed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sac_edge.common.envs import make_env
from sac_edge.common.obs_history import ObsAssembler, ObsContract
from sac_edge.edge_runtime.runtime import Runtime, RuntimeOptions

# The run is trained and exported here: the device suite (no torch) leaves these out.
pytestmark = pytest.mark.torch

BIN = Path(sys.executable).parent
EPISODE = 200  # Pendulum-v1's time limit: the trainer's episodes end every 200 steps (num_envs 1)


@pytest.fixture(scope="module")
def history_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("history")
    run, bundle = root / "run", root / "bundle"
    train = [str(BIN / "sac-train"), "--env", "Pendulum-v1", "--total-steps", "500",
             "--learning-starts", "100", "--hidden", "16,16", "--batch-size", "32", "--threads", "1",
             "--compile", "off", "--eval-every", "0", "--no-progress", "--last-action", "--obs-history", "3",
             "--out", str(run)]  # fmt: skip
    subprocess.run(train, check=True, capture_output=True)
    export = [str(BIN / "sac-export"), str(run), "--out", str(bundle), "--engine", "never"]
    subprocess.run(export, check=True, capture_output=True)
    return run, bundle


def test_a_layout_describes_the_frame_of_a_wider_input(history_run: tuple[Path, Path], tmp_path: Path):
    """The layout of the env's 3 values fits a policy of 13 inputs: the runtime assembles the other 10."""
    from sac_edge.common.bundle import open_bundle
    from sac_edge.common.io_layout import bundle_layout

    run, _ = history_run
    layout = Path(__file__).resolve().parents[3] / "docs" / "examples" / "pendulum.layout.json"
    out = tmp_path / "bundle"
    export = [str(BIN / "sac-export"), str(run), "--out", str(out), "--engine", "never", "--layout", str(layout)]
    subprocess.run(export, check=True, capture_output=True)
    loaded = bundle_layout(open_bundle(out))
    assert loaded is not None and loaded.obs_dim == 3


def test_the_contract_is_recorded_in_the_run_dir_and_the_bundle(history_run: tuple[Path, Path]):
    run, bundle = history_run
    config = json.loads((run / "config.json").read_text())
    manifest = json.loads((bundle / "manifest.json").read_text())
    expected = {"frame_dim": 3, "act_dim": 1, "last_actions": 1, "history": 3, "obs_dim": 13}
    for record in (config["observation"], manifest["observation"]):
        assert {k: record[k] for k in expected} == expected
    assert config["spec"]["obs_dim"] == manifest["spec"]["obs_dim"] == 13


def test_the_runtime_assembles_what_the_trainer_assembled(history_run: tuple[Path, Path]):
    """The trainer's replay rows (its assembled observations and its actions, in order) replayed through
    ``Runtime``: each frame to ``act``, each action the trainer sent to ``observe`` as the one applied."""
    run, bundle = history_run
    from safetensors.numpy import load_file

    tensors = load_file(run / "checkpoint.safetensors")
    rows = int(json.loads((run / "trainer_state.json").read_text())["step"])
    obs, actions = tensors["replay.obs"][:rows], tensors["replay.actions"][:rows]
    low, high = np.array([-2.0]), np.array([2.0])
    with Runtime(RuntimeOptions(str(bundle), rate_hz=50)) as runtime:
        for t in range(rows):
            frame = obs[t, :3]
            runtime.act(frame)
            assert np.array_equal(runtime.last_input(), obs[t]), f"step {t}"
            sent = low + 0.5 * (actions[t] + 1.0) * (high - low)  # the trainer's scaling to the bounds
            end = (t + 1) % EPISODE == 0
            runtime.observe(frame, sent, 0.0, frame, False, end)


def test_sac_edge_run_returns_what_the_trainer_evaluates(history_run: tuple[Path, Path]):
    from sac_edge.common.rollout import policy_inputs
    from sac_edge.export.source import load_source
    from sac_edge.train.evaluate import evaluate

    run, bundle = history_run
    source = load_source(str(run))
    assert source.observation is not None
    env = policy_inputs(make_env("Pendulum-v1"), ObsContract.from_dict(source.observation, "run"))  # the trainer's
    for seed in (3, 4):
        (expected,) = evaluate(source.policy, env, 1, seed)
        # A whole 200-step episode at 50 Hz with the whole 20 ms period as the inference's budget: an overrun
        # (the shield then holds) needs a 20 ms stall, not a busy machine's 1 ms one at 1 kHz.
        cli = [str(BIN / "sac-edge"), "run", str(bundle), "--seed", str(seed),
               "--rate-hz", "50", "--inference-budget", "1", "--duration", "4.1", "--json"]  # fmt: skip
        done = subprocess.run(cli, check=True, capture_output=True, text=True)
        returns = json.loads(done.stdout.strip().splitlines()[-1])["episode_returns"]
        # ONNX float32 against torch: the same actions to ~1e-6, a return within a fraction of a percent.
        assert returns and returns[0] == pytest.approx(expected, rel=5e-3), (seed, returns, expected)


def test_a_malformed_applied_action_keeps_the_one_sent():
    from sac_edge.edge_runtime.control.history import InputHistory

    history = InputHistory(ObsContract(1, 1, 1, 0), [-2.0], [2.0])
    history.inputs(np.array([0.5], np.float32))
    history.sent(np.array([1.0]))
    for bad in (np.array([np.nan]), np.array([1.0, 2.0]), "x", None):
        history.applied(bad)
    assert history.peek(np.array([0.5], np.float32)).tolist() == [0.5, 0.5]  # 1.0 of [-2, 2] is 0.5
    history.applied(np.array([-2.0]))
    assert history.peek(np.array([0.5], np.float32)).tolist() == [0.5, -1.0]


def test_int8_rollouts_and_gate_episodes_assemble_the_input_as_the_trainer_did(history_run: tuple[Path, Path]):
    """The calibration rollouts and the gate's episodes see the input the trainer's evaluation assembled: the
    fp32 graph's gate return on a seed is the trainer's; each episode's first row repeats its first frame."""
    from sac_edge.calibration.gate import episode_returns
    from sac_edge.calibration.session import OnnxPolicy
    from sac_edge.calibration.states import rollout_states
    from sac_edge.common.rollout import EnvSetup
    from sac_edge.export.source import load_source
    from sac_edge.train.evaluate import evaluate

    run, bundle = history_run
    source = load_source(str(run))
    contract = ObsContract.from_dict(source.observation, "run")
    setup, policy = EnvSetup("Pendulum-v1", contract), OnnxPolicy(bundle / "policy.onnx")
    (expected,) = evaluate(source.policy, setup.make(), 1, 5)
    (gated,) = episode_returns(policy, setup, [5])
    assert gated == pytest.approx(expected, rel=5e-3), (gated, expected)
    rows = rollout_states(policy, setup, 2 * EPISODE, seed=5)  # every row of two whole episodes, in order
    assert rows.shape == (2 * EPISODE, 13)
    for first in (rows[0], rows[EPISODE]):  # [frame | last action 0 | the frame 3 times]
        assert first[3] == 0.0 and np.array_equal(first[4:], np.tile(first[:3], 3)), first
    later = rows[10]  # the history: the 3 frames before, oldest first; the last action: the one sent before
    assert np.array_equal(later[4:], rows[7:10, :3].reshape(-1))
    sent = policy(rows[9][None])[0]
    assert later[3] == pytest.approx(float(sent[0]) / 2.0, abs=1e-6)  # Pendulum's [-2, 2] in policy units


def test_sac_export_int8_and_sac_edge_run_int8_of_a_contract_run(history_run: tuple[Path, Path], tmp_path: Path):
    run, _ = history_run
    bundle = tmp_path / "int8"
    export = [str(BIN / "sac-export"), str(run), "--out", str(bundle), "--engine", "never", "--int8",
              "--calib-samples", "512", "--gate-episodes", "2"]  # fmt: skip
    done = subprocess.run(export, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((bundle / "manifest.json").read_text())
    states = manifest["calibration"]["states"]
    assert states["calibration_replay"] > 0 and states["calibration_rollout"] > 0, states
    assert manifest["gate"]["verdict"] == "accepted", manifest["gate"]
    cli = [str(BIN / "sac-edge"), "run", str(bundle), "--backend", "onnxruntime", "--precision", "int8",
           "--seed", "3", "--rate-hz", "1000", "--duration", "5", "--json"]  # fmt: skip
    summary = json.loads(subprocess.run(cli, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
    assert summary["precision"] == "int8" and len(summary["episode_returns"]) >= 1, summary


def test_fine_tuning_stores_the_inputs_the_runtime_assembled(history_run: tuple[Path, Path], tmp_path: Path):
    """``--finetune`` on a contract bundle: each replay row the learner gets holds the input the policy acted
    on and the next one (the action applied in it, taken before an episode's end restarts the history), as
    the trainer stores them; rows in order (a row the busy learner's lock made the control thread drop is
    counted, never half-written)."""
    _, bundle = history_run
    options = RuntimeOptions.of(str(bundle), rate_hz=1000, backend="onnxruntime", finetune=True,
                                finetune_dir=str(tmp_path / "ft"), learning_starts=10_000)  # fmt: skip
    env, expected = make_env("Pendulum-v1"), []
    assembler = ObsAssembler(ObsContract(3, 1, 1, 3), [-2.0], [2.0])
    with Runtime(options) as runtime:
        obs, _ = env.reset(seed=11)
        for _ in range(EPISODE + 30):  # one episode's end on the way
            frame = np.asarray(obs, np.float32)
            acted_on = assembler.assemble(frame[None])[0].copy()
            action = runtime.act(frame)
            assembler.advance(frame[None], action[None])
            obs, reward, terminated, truncated, _ = env.step(action)
            expected.append((acted_on, assembler.assemble(np.asarray(obs, np.float32)[None])[0].copy()))
            runtime.observe(frame, action, reward, np.asarray(obs, np.float32), terminated, truncated)
            if terminated or truncated:
                assembler.reset()
                obs, _ = env.reset(seed=12)
        ring = runtime._parts.tuner.ring  # type: ignore[union-attr]
        written, dropped = ring.written, ring.dropped
        rows = [(ring.obs[k].copy(), ring.next_obs[k].copy()) for k in range(written)]
    assert written + dropped == len(expected) and written > len(expected) // 2, (written, dropped)
    at = iter(expected)
    for k, (got_obs, got_next) in enumerate(rows):
        assert any(np.array_equal(got_obs, e[0]) and np.array_equal(got_next, e[1]) for e in at), f"row {k}"
    assert np.array_equal(rows[0][0][4:], np.tile(rows[0][0][:3], 3))  # an episode's first input


def test_sac_edge_run_finetune_of_a_contract_bundle_learns_and_swaps(history_run: tuple[Path, Path], tmp_path: Path):
    _, bundle = history_run
    cli = [str(BIN / "sac-edge"), "run", str(bundle), "--finetune", "--backend", "onnxruntime", "--rate-hz", "1000",
           "--duration", "4", "--learning-starts", "200", "--swap-every", "20", "--finetune-buffer", "2000",
           "--finetune-batch", "32", "--finetune-dir", str(tmp_path / "ft"), "--json"]  # fmt: skip
    done = subprocess.run(cli, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    tuned = json.loads(done.stdout.strip().splitlines()[-1])["finetune"]
    assert tuned["error"] is None and tuned["updates"] > 0 and tuned["steps_collected"] > 200, tuned
