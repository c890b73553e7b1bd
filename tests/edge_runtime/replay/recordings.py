"""Robot recordings made with physics for the replay tests: MuJoCo's HalfCheetah-v5 as a 9-joint robot
(``rootx``, ``rootz``, ``rooty`` and the six leg joints) driven by a bundle's policy through ``Runtime`` plus
exploration noise, written as ROS 2 MCAP with the real message definitions (``sensor_msgs/JointState`` in,
``std_msgs/Float64MultiArray`` commands out) at the env's 20 Hz.

``Faults`` are injected on the robot's side, as a miswired robot would show them: two joints' values
exchanged in every ``JointState``, one joint's velocity reported in deg/s, one joint applying its command with
the opposite sign, one reported value frozen from a step on, and a gap in the state stream (no state, hence
no command, while the robot keeps applying the last command). ``halfcheetah_bundle`` writes a bundle whose
training states (``parity_states.npy``) and envelope come from clean noisy rollouts of its own policy, as
sac-export's would come from the replay buffer.

``python tests/edge_runtime/replay/recordings.py BUNDLE OUT.mcap STEPS [SEED] [FAULT=VALUE...]`` writes one
(a bundle made first when BUNDLE does not exist), for the measurements in BENCHMARKS.md.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bundles.py

from bundles import make_bundle
from sac_edge.common.bundle_format import ENVELOPE, LAYOUT, PARITY_STATES, POLICY_ONNX
from sac_edge.common.manifest import files_table, write_manifest

ENV_ID = "HalfCheetah-v5"
ROOT_JOINTS = ("rootx", "rootz", "rooty")
LEGS = ("bthigh", "bshin", "bfoot", "fthigh", "fshin", "ffoot")
JOINTS = ROOT_JOINTS + LEGS
"""The JointState's names, in MuJoCo's qpos/qvel order."""
#: HalfCheetah-v5's observation (qpos[1:], qvel) and action (the six leg torques) as a layout.
LAYOUT_DICT = {
    "observation": [
        {"source": "joint_states", "field": "position", "joints": list(JOINTS[1:])},
        {"source": "joint_states", "field": "velocity", "joints": list(JOINTS)},
    ],
    "action": {"interface": "effort", "joints": list(LEGS)},
}
STATE_TOPIC = "/joint_states"
COMMAND_TOPIC = "/forward_command_controller/commands"
NOISE = 0.2
"""Exploration noise (std, in action units) on the commands: it is what makes each channel's effect visible."""
TRAINING_STATES = 8000


@dataclass(frozen=True)
class Faults:
    """Robot-side faults of one recording (none by default: a clean robot)."""

    swap: tuple[str, str] | None = None
    """Two joints whose values (position, velocity, effort) the JointState exchanges."""
    deg_velocity: str | None = None
    """A joint whose velocity is reported in deg/s."""
    flip_command: str | None = None
    """A joint that applies its command with the opposite sign."""
    swap_commands: tuple[str, str] | None = None
    """Two joints that each apply the other's command (the command's joint order differs from the robot's)."""
    frozen: tuple[str, str, int] | None = None
    """(field, joint, step): that value stays at what it was at ``step``."""
    gap: tuple[int, int] | None = None
    """(step, steps): no state message for ``steps`` steps from ``step``."""
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def parse(items: list[str]) -> Faults:
        """``swap=a,b deg_velocity=j flip_command=j frozen=field,joint,step gap=step,steps``."""
        kw: dict[str, Any] = {}
        for item in items:
            key, value = item.split("=", 1)
            parts = value.split(",")
            if key in ("swap", "swap_commands"):
                kw[key] = (parts[0], parts[1])
            elif key == "frozen":
                kw[key] = (parts[0], parts[1], int(parts[2]))
            elif key == "gap":
                kw[key] = (int(parts[0]), int(parts[1]))
            else:
                kw[key] = value
        return Faults(**kw)


#: The tests' fault recordings: name -> (faults, what replay must name: kind, joints (None: every joint)).
FAULTS = {
    "swap": (Faults(swap=("bthigh", "fthigh")), ("swapped", {"bthigh", "fthigh"})),
    "deg_velocity": (Faults(deg_velocity="bshin"), ("scale", {"bshin"})),
    "flip_command": (Faults(flip_command="fshin"), ("sign", {"fshin"})),
    "frozen": (Faults(frozen=("position", "ffoot", 300)), ("frozen", {"ffoot"})),
    "gap": (Faults(gap=(500, 10)), ("stale", None)),
    "swap_commands": (Faults(swap_commands=("bshin", "fshin")), ("swapped", {"bshin", "fshin"})),
}


def halfcheetah_bundle(out: Path, seed: int = 0, training: bool = True) -> Path:
    """A HalfCheetah-v5 bundle with the 9-joint layout, its training states and its envelope (``training``;
    else the layout alone)."""
    from sac_edge.common.atomic import atomic_write_json
    from sac_edge.common.spec import PolicySpec
    from sac_edge.export.envelope import fit_envelope

    out.mkdir(parents=True)
    (out / LAYOUT).write_text(json.dumps(LAYOUT_DICT))
    make_bundle(out, ENV_ID, int8=None, seed=seed)
    if not training:
        return out
    manifest = json.loads((out / "manifest.json").read_text())
    states = _training_states(out / POLICY_ONNX, seed + 1000)
    np.save(out / PARITY_STATES, states.astype(np.float32))
    spec = PolicySpec.from_dict(manifest["spec"])
    envelope = fit_envelope(states, spec, margin=0.1, fpr=0.001, seed=seed)
    atomic_write_json(out / ENVELOPE, envelope.to_dict())
    write_manifest(out, {**manifest, "files": files_table(out)})
    return out


def _training_states(onnx: Path, seed: int) -> np.ndarray:
    """States of clean noisy rollouts of the policy (what training saw), ``TRAINING_STATES`` rows."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    env = gym.make(ENV_ID).unwrapped  # as long runs as the recordings (the cheetah may flip over in both)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    states = []
    while len(states) < TRAINING_STATES:
        states.append(obs)
        action = session.run(None, {"obs": obs[None].astype(np.float32)})[0][0]
        obs, *_ = env.step(np.clip(action + rng.normal(0, NOISE, action.shape), -1, 1))
    env.close()
    return np.asarray(states, dtype=np.float64)


def _stamp(t_ns: int) -> dict[str, int]:
    return {"sec": t_ns // 1_000_000_000, "nanosec": t_ns % 1_000_000_000}


def record(
    bundle: Path, path: Path, steps: int, seed: int = 0, faults: Faults | None = None, noise: float = NOISE
) -> dict[str, Any]:
    """Drive HalfCheetah with ``bundle``'s policy plus ``noise`` (exploration, action units) for ``steps`` env
    steps and write what the robot's topics carried to ``path`` (MCAP). Returns the facts of the run (the
    faults, the steps, the states sent)."""
    from mcap_ros2.writer import Writer

    from sac_edge.common.bundle import open_bundle
    from sac_edge.common.io_layout import bundle_layout
    from sac_edge.edge_runtime.config import RuntimeOptions
    from sac_edge.edge_runtime.ros2.recorder import SCHEMAS
    from sac_edge.edge_runtime.runtime import Runtime

    faults = faults or Faults()
    layout = bundle_layout(open_bundle(bundle))
    assert layout is not None
    env = gym.make(ENV_ID).unwrapped  # no time limit: the robot runs for as long as it records
    data = env.data  # type: ignore[attr-defined]
    dt_ns = round(env.dt * 1e9)  # type: ignore[attr-defined]
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    index = {name: i for i, name in enumerate(JOINTS)}
    flip = np.ones(len(LEGS))
    if faults.flip_command:
        flip[LEGS.index(faults.flip_command)] = -1.0
    wiring = np.arange(len(LEGS))  # the robot applies command[wiring[i]] on leg i
    if faults.swap_commands:
        a, b = (LEGS.index(j) for j in faults.swap_commands)
        wiring[[a, b]] = wiring[[b, a]]
    frozen_value: float | None = None
    obs = np.empty(layout.obs_dim, np.float32)
    command = np.zeros(len(LEGS))
    sent = 0
    with open(path, "wb") as f, Runtime(RuntimeOptions.of(str(bundle), rate_hz=20.0, backend="onnxruntime")) as runtime:
        writer = Writer(f)
        schemas = {name: writer.register_msgdef(name, text) for name, text in SCHEMAS.items()}
        t0 = 1_700_000_000_000_000_000 + seed * 1_000_000_000
        for step in range(steps):
            t = t0 + step * dt_ns
            position, velocity = data.qpos.copy(), data.qvel.copy()
            applied = command[wiring] * flip
            effort = np.concatenate([np.zeros(3), applied])
            values = {"position": position, "velocity": velocity, "effort": effort}
            if faults.swap:
                a, b = index[faults.swap[0]], index[faults.swap[1]]
                for v in values.values():
                    v[[a, b]] = v[[b, a]]
            if faults.deg_velocity:
                velocity[index[faults.deg_velocity]] *= 180.0 / math.pi
            if faults.frozen and step >= faults.frozen[2]:
                held = values[faults.frozen[0]]
                i = index[faults.frozen[1]]
                frozen_value = float(held[i]) if frozen_value is None else frozen_value
                held[i] = frozen_value
            in_gap = faults.gap is not None and faults.gap[0] <= step < faults.gap[0] + faults.gap[1]
            if not in_gap:
                msg = {
                    "header": {"stamp": _stamp(t), "frame_id": ""},
                    "name": list(JOINTS),
                    **{k: v.tolist() for k, v in values.items()},
                }
                writer.write_message(STATE_TOPIC, schemas["sensor_msgs/msg/JointState"], msg, t, t)
                sent += 1
                layout.gather(obs, layout.joint_map(JOINTS), values, {})
                action = runtime.act(obs).copy()
                runtime.tick()
                noisy = np.clip(action + rng.normal(0.0, noise, action.shape), -1.0, 1.0)
                command = layout.command_vector(noisy)
                t_cmd = t + 2_000_000  # the policy's 2 ms
                out = {"layout": {"dim": [], "data_offset": 0}, "data": command.tolist()}
                writer.write_message(COMMAND_TOPIC, schemas["std_msgs/msg/Float64MultiArray"], out, t_cmd, t_cmd)
            env.step(command[wiring] * flip)  # the robot applies the latest command, through its wiring
        writer.finish()
    env.close()
    return {"steps": steps, "states": sent, "seed": seed, "faults": faults}


if __name__ == "__main__":
    bundle_dir, out_path, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    if not bundle_dir.exists():
        halfcheetah_bundle(bundle_dir)
    extra = sys.argv[4:]
    run_seed = int(extra.pop(0)) if extra and "=" not in extra[0] else 0
    print(record(bundle_dir, out_path, n, run_seed, Faults.parse(extra)))
