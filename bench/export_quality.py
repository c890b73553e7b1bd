"""Export quality on real policies: parity, INT8 error and return, model sizes, batch-1 CPU latency.

For each env a short sac-train run (or a given run dir) is exported with ``--int8``; then, in the same
process and on the same held-out states, batch-1 latency is timed for PyTorch eager (``InferencePolicy``
under ``torch.inference_mode``, 1 thread) and onnxruntime CPU (1 intra-op thread, input and output bound
once with IOBinding to preallocated buffers) on the FP32 and INT8 graphs. Backends are timed in
interleaved rounds and the per-call percentiles pooled, so background load hits all alike.
Goal: onnxruntime FP32 batch-1 p50 <= 1/3 of PyTorch eager's.

    python bench/export_quality.py                                   # Pendulum-v1 + HalfCheetah-v5
    python bench/export_quality.py --runs runs/pendulum,runs/cheetah # existing run dirs

Prints a table, then one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from sac_edge.common.bundle_format import INT8_ONNX, POLICY_ONNX
from sac_edge.common.config import parse_config
from sac_edge.export.bundle import write_bundle
from sac_edge.export.config import ExportConfig
from sac_edge.export.source import load_source

GOAL_RATIO = 1 / 3


@dataclass(frozen=True)
class BenchConfig:
    envs: tuple[str, ...] = field(default=("Pendulum-v1", "HalfCheetah-v5"), metadata={"help": "envs to train"})
    runs: tuple[str, ...] = field(default=(), metadata={"help": "existing run dirs instead of training"})
    total_steps: int = field(default=1200, metadata={"help": "sac-train steps per env (short: 200 updates)"})
    learning_starts: int = field(default=1000, metadata={"help": "sac-train random-action steps"})
    gate_episodes: int = field(default=3, metadata={"help": "seeded episodes per precision in the gate"})
    calib_samples: int = field(default=1024, metadata={"help": "calibration states"})
    iters: int = field(default=3000, metadata={"help": "timed batch-1 calls per backend"})
    rounds: int = field(default=5, metadata={"help": "interleaved timing rounds"})
    out: str = field(default="", metadata={"help": "keep runs and bundles here (default: a temp dir)"})


def train(env_id: str, root: Path, cfg: BenchConfig) -> Path:
    run = root / f"run-{env_id}"
    cmd = [
        str(Path(sys.executable).parent / "sac-train"), "--env", env_id, "--total-steps", str(cfg.total_steps),
        "--learning-starts", str(cfg.learning_starts), "--eval-every", "0", "--no-progress", "--force",
        "--out", str(run),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return run


def ort_timer(path: Path, obs_dim: int, act_dim: int) -> Callable[[np.ndarray], int]:
    """One batch-1 call through onnxruntime with IOBinding on preallocated buffers; returns ns."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    x = np.zeros((1, obs_dim), np.float32)
    y = np.zeros((1, act_dim), np.float32)
    binding = sess.io_binding()
    binding.bind_input("obs", "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
    binding.bind_output("action", "cpu", 0, np.float32, list(y.shape), y.ctypes.data)

    def call(obs: np.ndarray) -> int:
        t0 = time.perf_counter_ns()
        x[0] = obs
        sess.run_with_iobinding(binding)
        return time.perf_counter_ns() - t0

    return call


def torch_timer(policy: torch.nn.Module, obs_dim: int) -> Callable[[np.ndarray], int]:
    """One batch-1 call of the eager InferencePolicy on a preallocated input; returns ns."""
    x = torch.zeros(1, obs_dim)

    def call(obs: np.ndarray) -> int:
        t0 = time.perf_counter_ns()
        with torch.inference_mode():
            x[0] = torch.from_numpy(obs)
            policy(x)
        return time.perf_counter_ns() - t0

    return call


def latency(timers: dict[str, Callable[[np.ndarray], int]], states: np.ndarray, cfg: BenchConfig) -> dict[str, Any]:
    samples: dict[str, list[int]] = {name: [] for name in timers}
    per_round = max(cfg.iters // cfg.rounds, 1)
    for call in timers.values():  # warm-up
        for i in range(200):
            call(states[i % len(states)])
    for r in range(cfg.rounds):
        for name, call in timers.items():
            for i in range(per_round):
                samples[name].append(call(states[(r * per_round + i) % len(states)]))
    return {
        name: {"p50_us": float(np.percentile(v, 50)) / 1e3, "p99_us": float(np.percentile(v, 99)) / 1e3}
        for name, v in samples.items()
    }


def bench_run(run: Path, root: Path, cfg: BenchConfig) -> dict[str, Any]:
    source = load_source(str(run))
    bundle = root / f"bundle-{source.spec.env_id}"
    export_cfg = replace(
        ExportConfig(),
        run=str(run),
        out=str(bundle),
        int8=True,
        calib_samples=cfg.calib_samples,
        gate_episodes=cfg.gate_episodes,
        force=True,
    )
    result = write_bundle(export_cfg, source)
    m, gate = result.manifest, result.manifest["gate"]
    spec = source.spec
    states = np.load(run / "calib_states.npy").astype(np.float32)
    timers = {"torch eager": torch_timer(source.policy, spec.obs_dim)}
    timers["ort fp32"] = ort_timer(bundle / POLICY_ONNX, spec.obs_dim, spec.act_dim)
    if INT8_ONNX in m["files"]:
        timers["ort int8"] = ort_timer(bundle / INT8_ONNX, spec.obs_dim, spec.act_dim)
    lat = latency(timers, states, cfg)
    return {
        "env": spec.env_id,
        "obs_dim": spec.obs_dim,
        "act_dim": spec.act_dim,
        "parity_max_abs": result.parity.max_abs,
        "parity_mean_abs": result.parity.mean_abs,
        "int8_verdict": gate["verdict"],
        "int8_max_action_error": gate["max_action_error"],
        "int8_mean_action_error": gate["mean_action_error"],
        "int8_mean_action_error_frac": gate["mean_action_error_frac"],
        "fp32_return": gate["fp32_mean_return"],
        "int8_return": gate["int8_mean_return"],
        "bytes": {name: entry["bytes"] for name, entry in m["files"].items() if name.endswith(".onnx")},
        "latency_us": lat,
        "ort_fp32_over_torch_p50": lat["ort fp32"]["p50_us"] / lat["torch eager"]["p50_us"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'env':<16}{'parity max':>12}{'int8 err mean':>15}{'err %range':>11}{'ret fp32':>10}{'ret int8':>10}"
        f"{'onnx KiB':>10}{'int8 KiB':>10}  verdict",
    ]
    for r in rows:
        b = r["bytes"]
        lines.append(
            f"{r['env']:<16}{r['parity_max_abs']:>12.2e}{r['int8_mean_action_error']:>15.4g}"
            f"{100 * r['int8_mean_action_error_frac']:>10.3f}%{r['fp32_return']:>10.1f}{r['int8_return']:>10.1f}"
            f"{b.get(POLICY_ONNX, 0) / 1024:>10.1f}{b.get(INT8_ONNX, 0) / 1024:>10.1f}  {r['int8_verdict']}"
        )
    lines.append("")
    lines.append(f"{'batch-1 latency (1 thread)':<28}{'p50 us':>10}{'p99 us':>10}{'p50 / torch':>13}")
    for r in rows:
        base = r["latency_us"]["torch eager"]["p50_us"]
        for name, lat in r["latency_us"].items():
            lines.append(
                f"{r['env'] + ' ' + name:<28}{lat['p50_us']:>10.1f}{lat['p99_us']:>10.1f}{lat['p50_us'] / base:>13.2f}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(BenchConfig, argv, "export_quality", __doc__ or "")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(cfg.out or tmp)
        root.mkdir(parents=True, exist_ok=True)
        runs = [Path(r) for r in cfg.runs] or [train(env, root, cfg) for env in cfg.envs]
        rows = [bench_run(run, root, cfg) for run in runs]
    print(table(rows))
    worst = max(r["ort_fp32_over_torch_p50"] for r in rows)
    print(
        json.dumps(
            {
                "bench": "export_quality",
                "rows": rows,
                "max_ort_fp32_over_torch_p50": worst,
                "goal_ratio": GOAL_RATIO,
                "goal_met": worst <= GOAL_RATIO,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
