"""Learning check: sac-edge against Stable-Baselines3 SAC on the same budget, seeds and evaluation.

Both learn ``--env`` (Pendulum-v1) for ``--steps`` environment steps with the same hyperparameters
(CleanRL/SB3 defaults, learning_starts 5000; sac-train with no precision or compile flags unless
``--train-args``, so ``--amp auto --compile auto`` choose as for a user); every ``--eval-every`` steps each
is evaluated deterministically on the same ``--episodes`` seeded episodes. A faster SAC that learns worse is
a regression, so this is the companion of ``train_speed.py`` and ``default_speed.py``.

    python bench/learning.py                        # 3 seeds, 15k steps, both implementations (~10 min)
    python bench/learning.py --seeds 0 --no-sb3     # one quick sac-edge curve
    python bench/learning.py --no-sb3 --train-args="--amp off --compile off"   # the fp32 eager curve
    python bench/learning.py --env HalfCheetah-v5 --steps 20000 --eval-every 5000 --episodes 5 --seeds 0
                                                    # the defaults on MuJoCo beside SB3, same budget

Prints a table (median over seeds of the evaluation return at each point, and of each run's wall time)
and one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sac_edge.common.envs import make_env
from sac_edge.train.cli import main as sac_train

EVAL_SEED = 10_000


def sac_edge_curve(
    env_id: str, steps: int, every: int, episodes: int, seed: int, workdir: Path, extra: list[str]
) -> dict[int, float]:
    """Evaluation return at each ``every`` steps of one sac-train run (``extra``: more sac-train flags)."""
    out = workdir / f"sac_edge_{seed}"
    code = sac_train(
        ["--env", env_id, "--total-steps", str(steps), "--eval-every", str(every), "--eval-episodes", str(episodes),
         "--seed", str(seed), "--out", str(out), "--force", "--no-progress", *extra]
    )  # fmt: skip
    if code != 0:
        raise SystemExit(f"sac-train failed with exit code {code}")
    with open(out / "metrics.csv") as fh:
        return {int(r["step"]): float(r["eval_return"]) for r in csv.DictReader(fh) if r["eval_return"]}


def sb3_curve(env_id: str, steps: int, every: int, episodes: int, seed: int) -> dict[int, float]:
    """The same for Stable-Baselines3 SAC (defaults but learning_starts 5000, as sac-train)."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    eval_env = make_env(env_id)
    curve: dict[int, float] = {}

    def evaluate(model: Any) -> float:
        returns = []
        for i in range(episodes):
            obs, _ = eval_env.reset(seed=EVAL_SEED + seed + i)
            total, done = 0.0, False
            while not done:
                action, _ = model.predict(obs, deterministic=True)
                obs, reward, terminated, truncated, _ = eval_env.step(action)
                total += float(reward)
                done = bool(terminated or truncated)
            returns.append(total)
        return float(np.mean(returns))

    class Every(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % every == 0:
                curve[self.num_timesteps] = evaluate(self.model)
            return True

    model = SAC("MlpPolicy", make_env(env_id), learning_starts=5000, seed=seed, device="cpu")
    model.learn(total_timesteps=steps, callback=Every())
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--steps", type=int, default=15_000)
    parser.add_argument("--eval-every", type=int, default=2500)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--no-sb3", action="store_true")
    parser.add_argument("--train-args", default="", help="more sac-train flags, e.g. '--amp bf16 --compile'")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    torch.set_num_threads(2)

    curves: dict[str, list[dict[int, float]]] = {"sac-edge": [], "sb3": []}
    # Wall time of each whole run (training, evaluations and, for --compile, compiling), seconds.
    walls: dict[str, list[float]] = {"sac-edge": [], "sb3": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            t0 = time.perf_counter()
            curves["sac-edge"].append(
                sac_edge_curve(
                    args.env, args.steps, args.eval_every, args.episodes, seed, Path(tmp), shlex.split(args.train_args)
                )
            )
            walls["sac-edge"].append(time.perf_counter() - t0)
            if not args.no_sb3:
                t0 = time.perf_counter()
                curves["sb3"].append(sb3_curve(args.env, args.steps, args.eval_every, args.episodes, seed))
                walls["sb3"].append(time.perf_counter() - t0)

    points = list(range(args.eval_every, args.steps + 1, args.eval_every))
    table: dict[str, dict[int, float | None]] = {}
    for impl, runs in curves.items():
        if runs:
            table[impl] = {
                p: statistics.median(r[p] for r in runs) if all(p in r for r in runs) else None for p in points
            }
    print(f"{args.env}: median deterministic eval return over seeds {seeds} ({args.episodes} episodes each)")
    print(f"{'steps':>8}" + "".join(f"{impl:>12}" for impl in table))
    for p in points:
        cells = "".join(f"{'' if table[i][p] is None else round(table[i][p] or 0.0, 1):>12}" for i in table)
        print(f"{p:>8}{cells}")
    print(f"{'wall s':>8}" + "".join(f"{statistics.median(walls[i]):>12.1f}" for i in table))
    summary = {
        "bench": "learning",
        "env": args.env,
        "seeds": seeds,
        "median_eval_return": {impl: {str(p): v for p, v in t.items()} for impl, t in table.items()},
        "per_seed_final": {impl: [r[max(r)] for r in runs] for impl, runs in curves.items() if runs},
        "median_wall_s": {impl: round(statistics.median(w), 1) for impl, w in walls.items() if w},
        "train_args": args.train_args,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
