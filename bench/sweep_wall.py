"""Sweep wall time: ``sac-sweep`` on a local Ray against the same trials run one after another.

Runs ``sac-sweep --env Pendulum-v1 --grid actor_lr=... --seeds N --threads 1`` (one CPU per trial, as many
trials at once as this machine has cores), then every trial of that sweep again with ``sac-train --threads 1``
in sequence, in the same session. Both use one torch thread per trial, so each sequential run repeats its
sweep trial bit for bit on a CPU (the final returns are compared). Prints a table, then one JSON line.

The BENCHMARKS.md measurement: ``python bench/sweep_wall.py`` (3 actor_lr x 5 seeds, 5000 steps each).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from sac_edge.common.table import format_table
from sac_edge.sweep.report import table

BIN = Path(sys.executable).parent
TRAIN = ["--env", "Pendulum-v1", "--learning-starts", "1000", "--eval-every", "1000", "--eval-episodes", "5"]
TRAIN += ["--hidden", "64,64", "--batch-size", "128", "--threads", "1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actor-lr", default="1e-4,3e-4,1e-3")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--total-steps", type=int, default=5000)
    parser.add_argument("--out", default="runs/bench-sweep")
    args = parser.parse_args()
    out = Path(args.out)
    train = [*TRAIN, "--total-steps", str(args.total_steps)]

    sweep_cmd = [str(BIN / "sac-sweep"), "--out", str(out / "sweep"), "--force", "--json", "--seeds", str(args.seeds)]
    sweep_cmd += ["--grid", f"actor_lr={args.actor_lr}", *train]
    start = time.perf_counter()
    done = subprocess.run(sweep_cmd, check=True, capture_output=True, text=True)
    sweep_s = time.perf_counter() - start
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    print(table(summary))

    start = time.perf_counter()
    same = 0
    finals = {}
    for lr in args.actor_lr.split(","):
        for seed in range(args.seeds):
            run = out / "sequential" / f"actor_lr={lr}-seed{seed}"
            cmd = [str(BIN / "sac-train"), *train, "--actor-lr", lr, "--seed", str(seed), "--out", str(run)]
            cmd += ["--checkpoint-every", "1000", "--force", "--json", "--no-progress"]
            result = subprocess.run(cmd, check=True, capture_output=True, text=True)
            finals[(lr, seed)] = json.loads(result.stdout.strip().splitlines()[-1])["final_eval_return"]
    sequential_s = time.perf_counter() - start
    for config in summary["configs"]:
        lr = config["config"].split("=", 1)[1]
        same += sum(finals[(lr, int(s))] == v for s, v in config["per_seed"].items())

    trials = summary["trials"]
    rows = [
        ["sac-sweep (local Ray)", trials, round(sweep_s, 1), round(sequential_s / sweep_s, 2)],
        ["sac-train, one after another", trials, round(sequential_s, 1), 1.0],
    ]
    print(format_table(rows, ["how", "trials", "wall s", "speed-up"]))
    print(f"identical final returns: {same}/{trials}")
    print(json.dumps({"trials": trials, "sweep_s": sweep_s, "sequential_s": sequential_s, "identical": same,
                      "configs": summary["configs"], "best": summary["best"]}))  # fmt: skip


if __name__ == "__main__":
    main()
