"""Control-loop benchmark: ``sac-edge run`` at 1 kHz on one CPU core, onnxruntime vs eager PyTorch.

For Pendulum-v1 and HalfCheetah-v5 it writes a run dir from freshly initialised networks (latency does
not depend on training; 256x256 actor as sac-train makes), exports it with ``sac-export``, then runs
``sac-edge run --rate-hz 1000`` pinned to one core (``--cpus``; ``--realtime-priority`` for SCHED_FIFO),
once with the onnxruntime backend and once with the torch backend (the same loop driving the PyTorch
policy eagerly). Goals:
deadline misses < 0.1 %, and with onnxruntime a peak RSS < 200 MB with torch never imported.

Default run is short (10 s per case); the full figure from the issue is
``python bench/edge_loop.py --seconds 30``. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.spec import PolicySpec
from sac_edge.common.table import format_table
from sac_edge.train.checkpoint import save_tensors
from sac_edge.train.policies import Actor, CriticEnsemble, ObsNormalizer

ENVS = ("Pendulum-v1", "HalfCheetah-v5")
BIN = Path(sys.executable).parent


def write_run_dir(env_id: str, out: Path, seed: int = 0) -> Path:
    """A run dir as sac-train writes it (config.json + checkpoint.safetensors), untrained."""
    env = gym.make(env_id)
    obs_space, act_space = env.observation_space, env.action_space
    assert isinstance(obs_space, gym.spaces.Box) and isinstance(act_space, gym.spaces.Box)
    spec = PolicySpec(
        env_id,
        int(obs_space.shape[0]),
        int(act_space.shape[0]),
        tuple(float(x) for x in act_space.low),
        tuple(float(x) for x in act_space.high),
    )
    env.close()
    torch.manual_seed(seed)
    actor = Actor(spec.obs_dim, spec.act_dim, spec.hidden)
    critic = CriticEnsemble(spec.obs_dim, spec.act_dim, spec.hidden)
    tensors = {f"actor.{k}": v for k, v in actor.state_dict().items()}
    tensors.update({f"critic.{k}": v for k, v in critic.state_dict().items()})
    tensors.update({f"critic_target.{k}": v.clone() for k, v in critic.state_dict().items()})
    tensors.update({f"obs_norm.{k}": v for k, v in ObsNormalizer(spec.obs_dim).state_dict().items()})
    tensors["log_alpha"] = torch.zeros(1)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "config.json", {"spec": spec.to_dict(), "env_id": env_id, "seed": seed})
    save_tensors(out / "checkpoint.safetensors", tensors)
    return out


def export(run: Path, bundle: Path) -> None:
    subprocess.run(
        [str(BIN / "sac-export"), str(run), "--out", str(bundle), "--no-fp16", "--engine", "never", "--force"],
        check=True,
        capture_output=True,
        text=True,
    )


def run_loop(
    bundle: Path, env_id: str, backend: str, seconds: float, rate_hz: float, core: int, priority: int
) -> dict[str, Any]:
    cmd = [
        str(BIN / "sac-edge"),
        "run",
        str(bundle),
        "--env",
        env_id,
        "--backend",
        backend,
        "--precision",
        "fp32",
        "--rate-hz",
        str(rate_hz),
        "--duration",
        str(seconds),
        "--cpus",
        str(core),
        "--realtime-priority",
        str(priority),
        "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"edge_loop: {' '.join(cmd)} failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each run (the issue: 30)")
    parser.add_argument("--rate-hz", type=float, default=1000.0)
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)), help="CPU core to pin to")
    parser.add_argument("--envs", default=",".join(ENVS))
    parser.add_argument(
        "--realtime-priority", type=int, default=0, help="SCHED_FIFO priority for the loop (needs root; 0: off)"
    )
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="edge_loop.") as tmp:
        for env_id in args.envs.split(","):
            bundle = Path(tmp) / f"{env_id}.bundle"
            export(write_run_dir(env_id, Path(tmp) / f"{env_id}.run"), bundle)
            for backend in ("onnxruntime", "torch"):
                s = run_loop(bundle, env_id, backend, args.seconds, args.rate_hz, args.core, args.realtime_priority)
                results.append(
                    {
                        "env": env_id,
                        "backend": backend,
                        "steps": s["steps"],
                        "deadline_misses": s["deadline_misses"],
                        "miss_rate": s["miss_rate"],
                        "latency_p50_us": s["latency_us"]["p50"],
                        "latency_p99_us": s["latency_us"]["p99"],
                        "jitter_p99_us": s["jitter_us"]["p99"],
                        "peak_rss_mb": round(s["peak_rss_mb"], 1),
                        "torch_imported": s["torch_imported"],
                    }
                )
    header = ("env", "backend", "steps", "misses", "miss %", "p50 us", "p99 us", "jitter p99", "peak RSS MB", "torch")
    print(
        format_table(
            [
                (
                    r["env"],
                    r["backend"],
                    r["steps"],
                    r["deadline_misses"],
                    round(100 * r["miss_rate"], 3),
                    r["latency_p50_us"],
                    r["latency_p99_us"],
                    r["jitter_p99_us"],
                    r["peak_rss_mb"],
                    r["torch_imported"],
                )
                for r in results
            ],
            header,
        )
    )
    ort = [r for r in results if r["backend"] == "onnxruntime"]
    ref = {r["env"]: r for r in results if r["backend"] == "torch"}
    summary = {
        "seconds": args.seconds,
        "rate_hz": args.rate_hz,
        "core": args.core,
        "realtime_priority": args.realtime_priority,
        "rows": results,
        "p99_ratio_torch_over_ort": {
            r["env"]: round(ref[r["env"]]["latency_p99_us"] / r["latency_p99_us"], 2) for r in ort
        },
        "goal_miss_rate_below_0.1pct": all(r["miss_rate"] < 0.001 for r in ort),
        "goal_ort_rss_below_200mb_no_torch": all(r["peak_rss_mb"] < 200 and not r["torch_imported"] for r in ort),
    }
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
