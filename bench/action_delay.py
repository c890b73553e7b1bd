"""Delay-aware training against plain training, each evaluated under an action delay and at delay 0.

For each seed: one plain ``sac-train`` run (no delay, the frame alone) and one ``sac-train --action-delay K``
run per delay K (the last K actions in the policy's input, recorded in the run dir); every run is then
evaluated deterministically on the same ``--episodes`` seeded episodes with each action applied K steps
late (``common/delay.py``'s wrapper, the one training used) and on time. Runs already finished in
``--out`` with the same ``sac-train`` arguments are reused, so the trainings can run first (in the
background, ``--train-only``, one seed or delay at a time) and the table later; ``--jobs N`` runs N
trainings at once, one ``sac-train`` process each (one per core: each takes one thread beside the others).

    nice -n 5 python bench/action_delay.py --out runs/delay                     # Pendulum, delays 1-3, 3 seeds
    python bench/action_delay.py --out runs/pend --seeds 0,1,2,3,4 --jobs 2 --train-args=--learning-starts=1000
    python bench/action_delay.py --env HalfCheetah-v5 --steps 50000 --jobs 2 \
        --out runs/hc50 --train-args=--learning-starts=1000

Prints a markdown table (per delay and seed: plain at delay K, delay-aware at delay K, both at delay 0) and
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sac_edge.common.obs_history import ObsContract
from sac_edge.common.rollout import EnvSetup
from sac_edge.export.source import load_source
from sac_edge.train.cli import main as sac_train
from sac_edge.train.evaluate import evaluate

EVAL_SEED = 20_000


def train_args(out: Path, env_id: str, steps: int, seed: int, delay: int, extra: list[str]) -> tuple[Path, list[str]]:
    """The run dir of one training and its ``sac-train`` arguments (plain at delay 0)."""
    run = out / (f"aware_d{delay}_s{seed}" if delay else f"plain_s{seed}")
    args = ["--env", env_id, "--total-steps", str(steps), "--seed", str(seed), "--out", str(run), "--force",
            "--no-progress", "--eval-every", "0", *extra]  # fmt: skip
    if delay:
        args += ["--action-delay", str(delay)]
    return run, args


def finished(run: Path, args: list[str]) -> bool:
    """Whether ``run`` finished before with the same budget and flags (then it is reused)."""
    done = run / "bench_args.json"  # written once the run finished
    return done.is_file() and json.loads(done.read_text()) == args


def train_all(todo: list[tuple[Path, list[str]]], jobs: int) -> None:
    """Each unfinished training of ``todo``: in this process with ``jobs`` 1, else ``jobs`` ``sac-train``
    processes at once (each its own log beside its run dir; the trainings are independent of each other)."""
    pending = [(run, args) for run, args in todo if not finished(run, args)]
    if jobs == 1:
        for run, args in pending:
            if sac_train(args) != 0:
                raise SystemExit(f"sac-train failed: {shlex.join(args)}")
            (run / "bench_args.json").write_text(json.dumps(args))
        return
    running: list[tuple[Path, list[str], subprocess.Popen[bytes], float]] = []
    while pending or running:
        while pending and len(running) < jobs:
            run, args = pending.pop(0)
            run.parent.mkdir(parents=True, exist_ok=True)
            with open(run.parent / f"{run.name}.log", "wb") as log:
                proc = subprocess.Popen([sys.executable, "-m", "sac_edge.train.cli", *args], stdout=log, stderr=log)
            running.append((run, args, proc, time.monotonic()))
        time.sleep(1)
        for item in [r for r in running if r[2].poll() is not None]:
            run, args, proc, t0 = item
            running.remove(item)
            if proc.returncode != 0:
                for _, _, other, _ in running:
                    other.terminate()
                raise SystemExit(f"sac-train failed ({run.parent / run.name}.log): {shlex.join(args)}")
            (run / "bench_args.json").write_text(json.dumps(args))
            print(f"trained {run} in {time.monotonic() - t0:.0f} s", file=sys.stderr)


def returns(run: Path, env_id: str, delay: int, episodes: int) -> list[float]:
    """Deterministic returns of ``run``'s policy on ``episodes`` seeded episodes, actions ``delay`` steps late."""
    source = load_source(str(run))
    contract = None if source.observation is None else ObsContract.from_dict(source.observation, str(run))
    return evaluate(source.policy, EnvSetup(env_id, contract, delay).make(), episodes, EVAL_SEED)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--steps", type=int, default=15_000)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--delays", default="1,2,3")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--out", default="runs/action-delay")
    parser.add_argument("--train-args", default="", help="more sac-train flags for every run")
    parser.add_argument("--train-only", action="store_true", help="train, print nothing")
    parser.add_argument("--jobs", type=int, default=1, help="trainings at once (one sac-train process each)")
    args = parser.parse_args()
    out, extra = Path(args.out), shlex.split(args.train_args)
    seeds = [int(s) for s in args.seeds.split(",")]
    delays = [int(d) for d in args.delays.split(",")]
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: pass 1 or more")
    keys = [(0, s) for s in seeds] + [(d, s) for d in delays for s in seeds if d]
    todo = {key: train_args(out, args.env, args.steps, key[1], key[0], extra) for key in keys}
    train_all(list(todo.values()), args.jobs)
    runs = {key: run for key, (run, _) in todo.items()}
    if args.train_only:
        return
    torch.set_num_threads(1)  # batch-1 acting: more threads only wait at barriers (worse beside neighbours)
    rows: list[dict[str, Any]] = []
    print(f"{args.env}, {args.steps} steps, mean return over {args.episodes} seeded episodes (seeds {EVAL_SEED}+)")
    print("| delay | seed | plain at delay | delay-aware at delay | gain | plain at 0 | delay-aware at 0 |")
    print("|---|---|---|---|---|---|---|")
    for d in delays:
        for s in seeds:
            plain, aware = runs[(0, s)], runs[(d, s)]
            row = {
                "delay": d,
                "seed": s,
                "plain_at_delay": float(np.mean(returns(plain, args.env, d, args.episodes))),
                "aware_at_delay": float(np.mean(returns(aware, args.env, d, args.episodes))),
                "plain_at_0": float(np.mean(returns(plain, args.env, 0, args.episodes))),
                "aware_at_0": float(np.mean(returns(aware, args.env, 0, args.episodes))),
            }
            rows.append(row)
            gain = row["aware_at_delay"] - row["plain_at_delay"]
            print(f"| {d} | {s} | {row['plain_at_delay']:.1f} | {row['aware_at_delay']:.1f} | {gain:+.1f} | "
                  f"{row['plain_at_0']:.1f} | {row['aware_at_0']:.1f} |")  # fmt: skip
    medians = {
        d: statistics.median(r["aware_at_delay"] - r["plain_at_delay"] for r in rows if r["delay"] == d) for d in delays
    }
    print(json.dumps({"env": args.env, "steps": args.steps, "rows": rows, "median_gain": medians}))


if __name__ == "__main__":
    main()
