"""No-flag ``sac-train`` against Stable-Baselines3 SAC, each a whole process, interleaved in one run.

``sac-train`` runs with no precision or compile flags (``--amp auto --compile auto`` choose the path, as
for a new user); SB3 SAC runs ``learn`` with the same env, steps, learning_starts and seed. Each reports
the time inside its updates (sac-train: ``updates_per_s``, the compiling update included; SB3: its
``train`` calls) and the process's wall time (start-up, collection, compiling, everything; no evaluation).

    python bench/default_speed.py                                  # Pendulum-v1, 20k steps (15k updates)
    python bench/default_speed.py --envs Pendulum-v1,HalfCheetah-v5 --repeats 3

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sac_edge.common.table import format_table

LEARNING_STARTS = 5_000


def sac_edge_process(env_id: str, steps: int, seed: int, workdir: Path) -> dict[str, Any]:
    """One ``sac-train`` process with no speed flags: its --json summary and its wall time."""
    cmd = [sys.executable, "-m", "sac_edge.train.cli", "--env", env_id, "--total-steps", str(steps), "--seed",
           str(seed), "--learning-starts", str(LEARNING_STARTS), "--eval-every", "0", "--no-progress", "--json",
           "--out", str(workdir / "run"), "--force"]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    choices = [line for line in done.stderr.splitlines() if "auto ->" in line]
    return {
        "updates": summary["updates"],
        "update_s": summary["updates"] / summary["updates_per_s"],
        "compile_s": summary.get("compile_s"),
        "wall_s": wall,
        "choices": choices,
    }


def sb3_process(env_id: str, steps: int, seed: int) -> dict[str, Any]:
    """One SB3 process (this script with ``--sb3-child``)."""
    cmd = [sys.executable, __file__, "--sb3-child", env_id, str(steps), str(seed)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "wall_s": wall, "compile_s": None}


def sb3_child(env_id: str, steps: int, seed: int, learning_starts: int = LEARNING_STARTS) -> None:
    """SB3 SAC ``learn`` (defaults, learning_starts as sac-train), timing its ``train`` calls (also the SB3
    process of ``bench/train_threads.py``)."""
    from stable_baselines3 import SAC

    from sac_edge.common.envs import make_env

    timed = {"update_s": 0.0, "updates": 0}

    class TimedSAC(SAC):
        def train(self, gradient_steps: int, batch_size: int = 64) -> None:
            t0 = time.perf_counter()
            super().train(gradient_steps, batch_size)
            timed["update_s"] += time.perf_counter() - t0
            timed["updates"] += gradient_steps

    model = TimedSAC("MlpPolicy", make_env(env_id), learning_starts=learning_starts, seed=seed, device="cpu")
    model.learn(total_timesteps=steps)
    print(json.dumps(timed))


def main() -> None:
    if len(sys.argv) in (5, 6) and sys.argv[1] == "--sb3-child":  # env steps seed [learning_starts]
        sb3_child(sys.argv[2], *(int(a) for a in sys.argv[3:]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="Pendulum-v1")
    parser.add_argument("--steps", type=int, default=20_000, help="environment steps (updates: steps - 5000)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved pairs per env; medians reported")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rows = []
    for env_id in args.envs.split(","):
        runs: dict[str, list[dict[str, Any]]] = {"sac-train (no flags)": [], "sb3": []}
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                runs["sac-train (no flags)"].append(sac_edge_process(env_id, args.steps, args.seed, Path(tmp)))
            runs["sb3"].append(sb3_process(env_id, args.steps, args.seed))
        med: dict[str, dict[str, Any]] = {
            impl: {
                key: statistics.median(r[key] for r in rs) if rs[0][key] is not None else None
                for key in ("updates", "update_s", "compile_s", "wall_s")
            }
            for impl, rs in runs.items()
        }
        sb3 = med["sb3"]
        for impl, m in med.items():
            ms = m["update_s"] / m["updates"] * 1e3
            steady = None if m["compile_s"] is None else (m["update_s"] - m["compile_s"]) / (m["updates"] - 1) * 1e3
            rows.append(
                {
                    "env": env_id,
                    "impl": impl,
                    "updates": int(m["updates"]),
                    "ms_per_update": round(ms, 3),
                    "compile_s": None if m["compile_s"] is None else round(m["compile_s"], 1),
                    "ms_per_update_after_compile": None if steady is None else round(steady, 3),
                    "wall_s": round(m["wall_s"], 1),
                    "vs_sb3_update_rate": round(sb3["update_s"] / sb3["updates"] / (ms / 1e3), 2),
                    "vs_sb3_after_compile": None
                    if steady is None
                    else round(sb3["update_s"] / sb3["updates"] / (steady / 1e3), 2),
                    "vs_sb3_wall": round(sb3["wall_s"] / m["wall_s"], 2),
                    "choices": runs[impl][0].get("choices", []),
                }
            )

    header = ("env", "impl", "updates", "ms/upd", "x SB3", "compile s", "ms/upd after", "x SB3", "wall s", "x SB3")
    keys = ("env", "impl", "updates", "ms_per_update", "vs_sb3_update_rate", "compile_s",
            "ms_per_update_after_compile", "vs_sb3_after_compile", "wall_s", "vs_sb3_wall")  # fmt: skip
    print(format_table([[r[k] for k in keys] for r in rows], header))
    for r in rows:
        for line in r["choices"]:
            print(f"    {r['impl']}: {line}")
    print(json.dumps({"bench": "default_speed", "steps": args.steps, "repeats": args.repeats, "rows": rows}))


if __name__ == "__main__":
    main()
