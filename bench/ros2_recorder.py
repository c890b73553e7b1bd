"""The flight recorder's cost per step (``edge_runtime/ros2/recorder.py``): one JointState and one command
written to an MCAP file, with the node's small chunks flushed at least every 0.25 s (what survives a SIGKILL)
against the mcap library's default (1 MiB chunks, flushed when full), interleaved in one run.

Run it with the ROS venv's Python (``make venv-ros2``)::

    .venv-ros2/bin/python bench/ros2_recorder.py --steps 20000 --repeats 5

Prints a table and one JSON line (microseconds per step, median over the repeats; the file size per step).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def one(variant: dict, steps: int, folder: Path) -> tuple[float, float]:
    """(us per step, bytes per step) of ``steps`` steps of a 6-joint state and command."""
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    from sac_edge.edge_runtime.ros2.recorder import Recorder

    path = folder / "bench.mcap"
    path.unlink(missing_ok=True)
    clock = time.time_ns
    recorder = Recorder(str(path), False, clock, **variant)
    state, command = JointState(), Float64MultiArray()
    state.name = [f"j{i}" for i in range(6)]
    rng = np.random.default_rng(0)
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        state.position = rng.standard_normal(6).tolist()
        state.velocity = state.position
        state.effort = state.position
        command.data = state.position
        recorder.write("/joint_states", "sensor_msgs/msg/JointState", state)
        recorder.write("/forward_command_controller/commands", "std_msgs/msg/Float64MultiArray", command)
    took = time.perf_counter_ns() - t0
    recorder.close()
    return took / steps / 1e3, os.path.getsize(path) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from sac_edge.edge_runtime.ros2.recorder import CHUNK_BYTES, FLUSH_NS

    variants = {
        f"node: {CHUNK_BYTES // 1024} KiB chunks, flush {FLUSH_NS / 1e9:g} s": {},
        "mcap default: 1 MiB chunks": {"chunk_bytes": 1 << 20, "flush_ns": 1 << 62},
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    sizes: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for name, variant in variants.items():
                us, size = one(variant, args.steps, Path(tmp))
                times[name].append(us)
                sizes[name] = size
    rows = [{"variant": k, "us_per_step": float(np.median(v)), "bytes_per_step": sizes[k]} for k, v in times.items()]
    for r in rows:
        print(f"{r['variant']:<40} {r['us_per_step']:>8.2f} us/step {r['bytes_per_step']:>8.1f} B/step")
    print(json.dumps({"bench": "ros2_recorder", "rows": rows, "loadavg": os.getloadavg()}))


if __name__ == "__main__":
    main()
