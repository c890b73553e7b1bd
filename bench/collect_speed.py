"""Data collection throughput: what ``--num-envs K`` and ``--vector-mode`` buy, against Stable-Baselines3.

Times the trainer's own collection step (``Trainer.collect``: the actor samples an action for every env
at once, the vector env steps, the transitions go into the replay buffer, the observation statistics are
updated), with the policy acting from the first step, in environment steps per second. The reference is
SB3 SAC's collection loop with the same number of envs (``DummyVecEnv``, ``learn`` with
``gradient_steps=0``), measured in the same run; configurations are interleaved over the repeats and the
median is reported, so load from other processes hits all alike. No updates run: ``train_speed.py``
measures those.

    python bench/collect_speed.py                          # Pendulum-v1 and HalfCheetah-v5, K = 1, 4, 8
    python bench/collect_speed.py --envs HalfCheetah-v5 --num-envs 1,16 --modes sync

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from sac_edge.common.envs import make_env
from sac_edge.train.config import TrainConfig
from sac_edge.train.trainer import Trainer


def make_trainer(env_id: str, num_envs: int, mode: str, workdir: Path) -> Trainer:
    cfg = TrainConfig(
        env=env_id,
        num_envs=num_envs,
        vector_mode=mode,
        learning_starts=0,
        buffer_size=200_000,
        out=str(workdir / f"{env_id}_{mode}_{num_envs}"),
        progress=False,
    )
    return Trainer(cfg)


def time_trainer(trainer: Trainer, env_steps: int) -> float:
    """Environment steps per second over about ``env_steps`` steps."""
    calls = max(1, env_steps // trainer.cfg.num_envs)
    t0 = time.perf_counter()
    for _ in range(calls):
        trainer.collect()
    return calls * trainer.cfg.num_envs / (time.perf_counter() - t0)


def make_sb3(env_id: str, num_envs: int) -> Any:
    from stable_baselines3 import SAC as SB3SAC
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = DummyVecEnv([lambda: make_env(env_id) for _ in range(num_envs)])
    model = SB3SAC("MlpPolicy", venv, learning_starts=0, gradient_steps=0, buffer_size=200_000, seed=0, device="cpu")
    model.set_logger(configure(None, []))
    return model


def time_sb3(model: Any, env_steps: int) -> float:
    t0 = time.perf_counter()
    model.learn(total_timesteps=env_steps, reset_num_timesteps=False)
    return env_steps / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="Pendulum-v1,HalfCheetah-v5")
    parser.add_argument("--num-envs", default="1,4,8", help="comma list of K")
    parser.add_argument("--modes", default="sync,async", help="vector env backends (async only for K > 1)")
    parser.add_argument("--steps", type=int, default=2000, help="environment steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-sb3", action="store_true", help="skip the Stable-Baselines3 reference")
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for env_id in args.envs.split(","):
            for k in (int(v) for v in args.num_envs.split(",")):
                runs: dict[str, Any] = {}
                for mode in args.modes.split(","):
                    if mode == "sync" or k > 1:
                        runs[f"sac-edge {mode}"] = make_trainer(env_id, k, mode, Path(tmp))
                if not args.no_sb3:
                    runs["sb3 DummyVecEnv"] = make_sb3(env_id, k)
                rates: dict[str, list[float]] = {name: [] for name in runs}
                for rep in range(args.repeats + 1):  # the first round warms up
                    for name, run in runs.items():
                        rate = time_sb3(run, args.steps) if name.startswith("sb3") else time_trainer(run, args.steps)
                        if rep:
                            rates[name].append(rate)
                for run in runs.values():
                    if isinstance(run, Trainer):
                        run.envs.close()
                med = {name: statistics.median(r) for name, r in rates.items()}
                ref = med.get("sb3 DummyVecEnv")
                for name, rate in med.items():
                    rows.append(
                        {
                            "env": env_id,
                            "num_envs": k,
                            "impl": name,
                            "env_steps_per_s": round(rate, 1),
                            "vs_sb3": None if ref is None else round(rate / ref, 2),
                        }
                    )
        one = {(r["env"], r["impl"]): r["env_steps_per_s"] for r in rows if r["num_envs"] == 1}
        for r in rows:
            base = one.get((r["env"], "sac-edge sync"))
            r["vs_k1_sync"] = None if base is None else round(r["env_steps_per_s"] / base, 2)

    print(f"collection only (no updates), {torch.get_num_threads()} torch threads")
    print(f"{'env':<16}{'K':>4}  {'impl':<20}{'env steps/s':>12}{'x SB3':>7}{'x K=1 sync':>11}")
    for r in rows:
        sb3 = "" if r["vs_sb3"] is None else f"{r['vs_sb3']:.2f}"
        k1 = "" if r["vs_k1_sync"] is None else f"{r['vs_k1_sync']:.2f}"
        print(f"{r['env']:<16}{r['num_envs']:>4}  {r['impl']:<20}{r['env_steps_per_s']:>12.0f}{sb3:>7}{k1:>11}")
    print(json.dumps({"bench": "collect_speed", "device": "cpu", "rows": rows}))


if __name__ == "__main__":
    main()
