"""The cost of a thread change under the compiled update (``--compile on``): what the thread watch pays when
a neighbour arrives (the count halves) and leaves (it doubles back).

torch's intra-op thread count is part of the compiled graph's guards, so the first update at a count not
run at before compiles again; a count seen before reuses its graph. This times, on the default networks
(256x256, batch 256, the default precision), the first compile, then the first update after each change
(2 -> 1 -> 2 -> 1) and the steady update at each count.

    python bench/thread_change.py                   # Pendulum-v1 shapes
    python bench/thread_change.py --env HalfCheetah-v5

Prints one line per change and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from sac_edge.common.config import parse_config
from sac_edge.train.config import TrainConfig
from sac_edge.train.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--steady", type=int, default=50, help="updates timed at each count after its first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        flags = ["--env", args.env, "--learning-starts", "300", "--total-steps", "1000", "--no-progress",
                 "--eval-every", "0", "--compile", "on", "--threads", "2", "--out", out, "--force"]  # fmt: skip
        trainer = Trainer(parse_config(TrainConfig, flags, "sac-train", ""))
        for _ in range(300):
            trainer.collect()
        sac = trainer.sac
        sac.prepare_fast_path()
        rows = []
        for threads in (2, 1, 2, 1):
            torch.set_num_threads(threads)
            t0 = time.perf_counter()
            float(sac.step().critic_loss)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(args.steady):
                metrics = sac.step()
            float(metrics.critic_loss)
            steady_ms = (time.perf_counter() - t0) / args.steady * 1e3
            rows.append({"threads": threads, "first_update_s": round(first, 3), "steady_ms": round(steady_ms, 2)})
            print(f"{threads} threads: first update {first:.3f} s, then {steady_ms:.2f} ms an update")
        trainer.envs.close()
    print(json.dumps({"env": args.env, "rows": rows}))


if __name__ == "__main__":
    main()
