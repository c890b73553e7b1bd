"""SAC update throughput: sac-edge against Stable-Baselines3 SAC, side by side in one run.

Same hyperparameters (batch 256, 256x256 MLPs, twin critics, Adam 3e-4, autotuned alpha), same replay
contents size, same threads. Runs are interleaved (A B A B ...) and the median is reported, so load from
other processes hits both alike. The FLOPs of one update are counted with torch's FlopCounterMode and
divided by the matmul rate measured here now, which gives the floor the brief asks us to compare with.
"upd MB" is the working memory of one update above the allocated state (``train.memory.peak_bytes``: the
allocator's peak on CUDA, a profiled update on a CPU, none for compiled CPU rows); ``deep`` and
``deep+ckpt`` (8-layer critics) show what gradient checkpointing saves and costs.

    python bench/train_speed.py                     # Pendulum-v1 and HalfCheetah-v5 shapes, CPU
    python bench/train_speed.py --variants eager,compile   # also torch.compile (slow to build on CPU)
    python bench/train_speed.py --variants eager,autograd,compile,bf16,bf16+compile   # every CPU path
    python bench/train_speed.py --device cuda --batch 256,1024 --variants eager,bf16,compile,graphs,compile+graphs
    python bench/train_speed.py --envs Pendulum-v1 --batch 1024 --variants eager,deep,deep+ckpt
    python bench/train_speed.py --batch-table       # samples/s against batch 64..1024, per native precision

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from sac_edge.common.envs import make_env
from sac_edge.train.config import TrainConfig
from sac_edge.train.defaults import cpu_bf16_flags
from sac_edge.train.envs import policy_spec
from sac_edge.train.memory import peak_bytes
from sac_edge.train.precision import device_precision
from sac_edge.train.sac import SAC

FILL = 20_000
BATCH_TABLE = "64,128,256,512,1024"
# Named fast paths: TrainConfig overrides on top of the eager fp32 baseline.
VARIANTS: dict[str, dict[str, Any]] = {
    "eager": {},
    "autograd": {"backward": "autograd"},
    "manual": {"backward": "manual"},
    "bf16": {"amp": "bf16"},
    "fp16": {"amp": "fp16"},
    "bf16+compile": {"amp": "bf16", "compile": "on"},
    "compile": {"compile": "on"},
    "graphs": {"cuda_graphs": True},
    "compile+graphs": {"compile": "on", "cuda_graphs": True},
    "bf16+compile+graphs": {"amp": "bf16", "compile": "on", "cuda_graphs": True},
    # Deep critics (8 hidden layers), with and without gradient checkpointing (which needs autograd): the
    # time it costs and the activation memory it saves (the "upd MB" column).
    "ckpt": {"grad_checkpoint": True},  # at the default 2 critic layers
    "deep": {"critic_layers": 8, "backward": "autograd"},
    "deep+ckpt": {"critic_layers": 8, "grad_checkpoint": True},
}


def _filled_sac(env_id: str, cfg: TrainConfig) -> SAC:
    env = make_env(env_id)
    spec = policy_spec(env_id, env, cfg.hidden)
    sac = SAC(spec, cfg, torch.device(cfg.device))
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((FILL, spec.obs_dim)).astype(np.float32)
    act = rng.uniform(-1, 1, (FILL, spec.act_dim)).astype(np.float32)
    sac.buffer.add(obs, act, rng.standard_normal(FILL), obs + 0.01, np.zeros(FILL, np.float32))
    sac.obs_norm.update(torch.as_tensor(obs, device=sac.device))
    sac.prepare_fast_path()
    return sac


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_sac_edge(sac: SAC, n: int) -> float:
    """Seconds per update over ``n`` updates (after the caller's warm-up)."""
    _sync(sac.cfg.device)
    t0 = time.perf_counter()
    for _ in range(n):
        sac.step()
    _sync(sac.cfg.device)
    return (time.perf_counter() - t0) / n


def make_sb3(env_id: str, batch: int, device: str) -> Any:
    from stable_baselines3 import SAC as SB3SAC
    from stable_baselines3.common.logger import configure

    env = make_env(env_id)
    model = SB3SAC("MlpPolicy", env, batch_size=batch, buffer_size=FILL, learning_starts=0, device=device, seed=0)
    model.set_logger(configure(None, []))
    rng = np.random.default_rng(0)
    obs_shape, act_shape = env.observation_space.shape, env.action_space.shape
    assert obs_shape is not None and act_shape is not None
    obs_dim, act_dim = obs_shape[0], act_shape[0]
    buffer = model.replay_buffer
    assert buffer is not None
    for _ in range(FILL):
        o = rng.standard_normal((1, obs_dim)).astype(np.float32)
        buffer.add(o, o + 0.01, rng.uniform(-1, 1, (1, act_dim)), rng.standard_normal(1), np.zeros(1), [{}])
    return model


def time_sb3(model: Any, n: int) -> float:
    t0 = time.perf_counter()
    model.train(gradient_steps=n, batch_size=model.batch_size)
    return (time.perf_counter() - t0) / n


def update_flops(sac: SAC) -> int:
    """FLOPs of one eager update, counted by torch (matmuls dominate)."""
    with FlopCounterMode(display=False) as counter:
        sac.train_step()
    return int(counter.get_total_flops())


def matmul_rate(device: str, dtype: torch.dtype = torch.float32, size: int = 256, reps: int = 400) -> float:
    """GFLOP/s of a square matmul of the update's size in ``dtype``, measured now (the floor's denominator)."""
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    for _ in range(20):
        a @ b
    best = float("inf")
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        _sync(device)
        best = min(best, (time.perf_counter() - t0) / reps)
    return 2 * size**3 / best / 1e9


def native_precisions(device: str) -> list[str]:
    """The variants of the precisions ``device`` multiplies natively: eager fp32, and bf16 (fp16 on a CUDA
    device of compute capability 7.x) where it has the units."""
    if device == "cuda":  # the --amp auto choice of this GPU (train/precision.py)
        amp = device_precision(torch.device(device)).amp
        return ["eager"] if amp == "off" else ["eager", amp]
    return ["eager", "bf16"] if cpu_bf16_flags() else ["eager"]


def print_batch_table(rows: list[dict[str, Any]]) -> None:
    """Samples/s (batch x updates/s) per env, precision and batch, against batch 256 of the same precision."""
    print("throughput against batch size (samples/s = batch x updates/s; x256: against batch 256, same precision)")
    print(f"{'env':<16}{'precision':<26}{'batch':>6}{'ms/upd':>9}{'upd/s':>9}{'samples/s':>11}{'x256':>7}")
    for r in rows:
        ref = next((q for q in rows if q["env"] == r["env"] and q["impl"] == r["impl"] and q["batch"] == 256), None)
        samples = r["batch"] * r["updates_per_s"]
        r["samples_per_s"] = round(samples, 0)
        x256 = "" if ref is None else f"{samples / (256 * ref['updates_per_s']):.2f}"
        print(f"{r['env']:<16}{r['impl']:<26}{r['batch']:>6}{r['ms_per_update']:>9.2f}{r['updates_per_s']:>9.1f}"
              f"{samples:>11.0f}{x256:>7}")  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", default="Pendulum-v1,HalfCheetah-v5")
    parser.add_argument("--batch", default="256")
    parser.add_argument("--updates", type=int, default=50, help="timed updates per repeat")
    parser.add_argument("--repeats", type=int, default=11, help="interleaved repeats; the median is reported")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--variants",
        default="eager,autograd",
        help=f"comma list of {', '.join(VARIANTS)} (eager: the default path, which is --backward manual on a CPU)",
    )
    parser.add_argument("--no-sb3", action="store_true", help="skip the Stable-Baselines3 reference")
    parser.add_argument(
        "--batch-table",
        action="store_true",
        help=f"throughput against batch size: batches {BATCH_TABLE}, each precision this device multiplies "
        "natively (fp32; bf16 on CUDA or a CPU with bf16 units), no SB3; adds a samples/s table",
    )
    return parser


@dataclass(frozen=True)
class Measured:
    """One env x batch, measured. Per row name (``sac-edge <variant> (<backward>)`` or ``sb3``): the median
    seconds per update, the critic depth, the matmul rate of its precision (GFLOP/s; fp16 rows at the fp32
    one) and the working memory of one update (MiB, None where not measured); per critic depth, the FLOPs of
    one update."""

    env_id: str
    batch: int
    seconds: dict[str, float]
    depth: dict[str, int]
    rate: dict[str, float]
    update_mb: dict[str, float | None]
    flops: dict[int, int]
    base_depth: int


def measure(env_id: str, batch: int, args: argparse.Namespace, rates: dict[str, float]) -> Measured:
    """Build every variant (and SB3), count the FLOPs per critic depth, then time them interleaved."""
    base = TrainConfig(env=env_id, device=args.device, batch_size=batch, buffer_size=FILL, amp="off", compile="off")
    variants = {}
    for v in args.variants.split(","):
        sac = _filled_sac(env_id, replace(base, **VARIANTS[v]))
        variants[f"sac-edge {v} ({sac.backward})"] = sac
    rate = {name: rates.get(sac.cfg.amp, rates["off"]) for name, sac in variants.items()}
    # FLOPs per critic depth: deep rows have their own floor and no ratio against the 2-layer SB3.
    depth = {name: sac.cfg.critic_layers for name, sac in variants.items()}
    depths = set(depth.values()) | {base.critic_layers}
    flops = {d: update_flops(_filled_sac(env_id, replace(base, critic_layers=d))) for d in depths}
    sb3 = None if args.no_sb3 else make_sb3(env_id, batch, args.device)
    timers: dict[str, Callable[[int], float]] = {name: partial(time_sac_edge, sac) for name, sac in variants.items()}
    if sb3 is not None:
        timers["sb3"] = partial(time_sb3, sb3)
        rate["sb3"], depth["sb3"] = rates["off"], base.critic_layers
    for timer in timers.values():
        timer(10)  # warm-up (and compilation)
    update_mb = update_memory(variants, sb3, args.device)
    times: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(args.repeats):
        for name, timer in timers.items():
            times[name].append(timer(args.updates))
    seconds = {name: statistics.median(t) for name, t in times.items()}
    return Measured(env_id, batch, seconds, depth, rate, update_mb, flops, base.critic_layers)


def update_memory(variants: dict[str, SAC], sb3: Any, device: str) -> dict[str, float | None]:
    """Working memory of one update above the allocated state, MiB (a profiled update on a CPU, where the
    profiler cannot see inside a compiled graph: None for those rows)."""
    out: dict[str, float | None] = {
        name: None if device == "cpu" and sac.cfg.compile == "on" else peak_bytes(sac.step, device) / 2**20
        for name, sac in variants.items()
    }
    if sb3 is not None:
        out["sb3"] = peak_bytes(partial(time_sb3, sb3, 1), device) / 2**20
    return out


def rows_of(m: Measured) -> list[dict[str, Any]]:
    """One row per implementation; "x eager" is against the first row of its critic depth (the eager one at
    the default depth), "x SB3" only at SB3's depth."""
    eager = next((name for name in m.seconds if name.startswith("sac-edge eager")), None)
    ref = {d: eager if d == m.base_depth else next(n for n in m.seconds if m.depth[n] == d) for d in m.flops}
    rows = []
    for name, sec in m.seconds.items():
        floor_ms = m.flops[m.depth[name]] / (m.rate[name] * 1e9) * 1e3
        same_as_sb3 = "sb3" in m.seconds and m.depth[name] == m.base_depth
        reference = ref[m.depth[name]]
        rows.append(
            {
                "env": m.env_id,
                "batch": m.batch,
                "impl": name,
                "ms_per_update": round(sec * 1e3, 3),
                "updates_per_s": round(1.0 / sec, 1),
                "critic_layers": m.depth[name],
                "vs_sb3": round(m.seconds["sb3"] / sec, 2) if same_as_sb3 else None,
                "floor_ms": round(floor_ms, 3),
                "floor_fraction": round(floor_ms / (sec * 1e3), 2),
                "gflop_per_update": round(m.flops[m.depth[name]] / 1e9, 3),
                "update_peak_mb": None if (mb := m.update_mb[name]) is None else round(mb, 1),
                "vs_eager": None if reference is None else round(m.seconds[reference] / sec, 2),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]], rates: dict[str, float]) -> None:
    print(
        f"matmul rate here now (256^3, {torch.get_num_threads()} threads): fp32 {rates['off']:.1f} GFLOP/s, "
        f"bf16 {rates['bf16']:.1f} GFLOP/s; each row's floor is at its own precision's rate"
    )
    print(
        f"{'env':<16}{'batch':>6}  {'impl':<32}{'ms/upd':>8}{'upd/s':>9}{'x SB3':>7}{'x eager':>8}"
        f"{'floor ms':>10}{'of floor':>9}{'upd MB':>8}"
    )
    for r in rows:
        ratio = "" if r["vs_sb3"] is None else f"{r['vs_sb3']:.2f}"
        eager = "" if r["vs_eager"] is None else f"{r['vs_eager']:.2f}"
        mem = "" if r["update_peak_mb"] is None else f"{r['update_peak_mb']:.1f}"
        print(
            f"{r['env']:<16}{r['batch']:>6}  {r['impl']:<32}{r['ms_per_update']:>8.2f}{r['updates_per_s']:>9.1f}"
            f"{ratio:>7}{eager:>8}{r['floor_ms']:>10.2f}{r['floor_fraction']:>9.2f}{mem:>8}"
        )


def main() -> None:
    args = _parser().parse_args()
    if args.batch_table:
        args.batch, args.no_sb3, args.variants = BATCH_TABLE, True, ",".join(native_precisions(args.device))
    rates = {"off": matmul_rate(args.device), "bf16": matmul_rate(args.device, torch.bfloat16)}
    rows = []
    for env_id in args.envs.split(","):
        for batch in (int(b) for b in args.batch.split(",")):
            rows += rows_of(measure(env_id, batch, args, rates))
    print_table(rows, rates)
    if args.batch_table:
        print_batch_table(rows)
    summary = {
        "bench": "train_speed",
        "device": args.device,
        "matmul_gflops": round(rates["off"], 1),
        "matmul_gflops_bf16": round(rates["bf16"], 1),
        "rows": rows,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
