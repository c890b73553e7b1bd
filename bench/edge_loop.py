"""The action in the control loop, against its references measured in the same run.

For Pendulum-v1 and HalfCheetah-v5 it writes a run dir from freshly initialised networks (latency does
not depend on training; the 256x256 actor sac-train makes) and exports it with ``sac-export --int8``.
Then, side by side:

1. hot path, in this process, interleaved: a bare ``session.run_with_iobinding(binding)`` on the same
   graph (the library call ``OrtBackend.act`` wraps) against ``act``; the eager torch module against
   ``TorchBackend.act``. Goal: ``act`` within 1.2x of the bare call. ``Runtime.act`` (the step ``sac-edge
   run``'s loop and a robot's own loop both call: guards, timing, watchdog stamp, overrun check, thread
   check) against the ``Backend.act`` it calls, and against the same step inlined with prebound locals, as
   a loop of its own would write it (``inline_step``; goal: within 1.1x, so that calling the library costs
   the loop nothing it would notice).
2. precision: INT8 against FP32 through the CPU backend at batch 1 (``act``), 8 and 64 (``act_batch``),
   with the file sizes, and the compute floor (the MLP's FLOPs at this core's measured one-thread fp32
   GEMM rate). Goals: INT8 at most 0.8x FP32 at batch 1, 0.5x at batch 64, the file 0.35x.
3. in the loop: ``sac-edge run`` at 100, 500 and 1000 Hz with and without ``--warm-cache``: p50/p99
   against ``act``'s hot p50 measured just before each run (goal: within 1.5x), deadline misses, the
   loop's own work per step (the summary's ``loop_work_us``: a step less its inference and env step;
   goal: under 15 us at 1 kHz); the torch backend at 1 kHz.
4. fine-tuning: ``sac-edge run --finetune`` at 1 kHz against the same run without learning (goal: the
   miss rate moves by less than 0.05 points); ``peak_rss_mb`` counts the learner process too,
   ``torch_imported`` is the control process's (the learner runs in a process of its own). The modes
   (``--modes``): ``off``; ``learner idle`` (the learner process, the coordinator thread and the loop's
   hooks, but no update: sac-edge's own machinery); ``no swaps`` (learning, no candidate: the learner's
   compute on top); ``swaps`` (a candidate every 50 updates judged over 2 episodes, so a run of a few
   seconds swaps weights several times; ``swaps`` is the summary's count, rollbacks included); ``busy
   neighbour`` (no learning, a Python busy loop on the CPUs the loop leaves to the learner: what any
   CPU-bound process there costs the loop). ``--repeats`` rounds of one run per mode,
   each round starting at another mode; each mode is compared with the same round's ``off`` run (and
   learning with the busy neighbour), and the mean difference gets a 95% t interval: a goal is met when
   that interval lies inside +-0.05 points (a shared machine's run-to-run spread can be wider than the goal,
   so one pair of runs cannot settle it).

``--seconds`` sets each loop run's length (default 5; BENCHMARKS.md's runs use 8). ``--realtime-priority``
and ``--core`` pin the loop. Prints one table per section, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.bundle import open_bundle
from sac_edge.common.envs import make_env
from sac_edge.common.latency import interleaved
from sac_edge.common.spec import PolicySpec
from sac_edge.common.table import format_table
from sac_edge.edge_runtime.backends.base import Backend
from sac_edge.edge_runtime.backends.registry import open_backend
from sac_edge.edge_runtime.compose import make_shield
from sac_edge.edge_runtime.control.safety import ActionGuard, ObservationGuard
from sac_edge.edge_runtime.control.shield import Shield
from sac_edge.edge_runtime.control.step_stats import MISS_CAUSES
from sac_edge.edge_runtime.control.watchdog import InferenceWatchdog
from sac_edge.edge_runtime.runtime import Runtime, RuntimeOptions
from sac_edge.train.checkpoint import save_tensors
from sac_edge.train.policies import Actor, CriticEnsemble, ObsNormalizer

ENVS = ("Pendulum-v1", "HalfCheetah-v5")
BIN = Path(sys.executable).parent
RATES = (100.0, 500.0, 1000.0)
LEARN = ("--finetune", "--learning-starts", "500")
#: name -> (``sac-edge run`` flags, whether a busy loop runs meanwhile on the CPUs the loop leaves to others)
FINETUNE_MODES: dict[str, tuple[tuple[str, ...], bool]] = {
    "off": ((), False),
    "learner idle": (("--finetune", "--learning-starts", "100000"), False),  # no update in a run under 100 s
    "no swaps": ((*LEARN, "--swap-every", str(10**9)), False),
    "swaps": ((*LEARN, "--swap-every", "50", "--promotion-window", "2"), False),
    "busy neighbour": ((), True),
}
#: (mode, reference) pairs the fine-tuning section compares, when both ran
COMPARED = [(m, "off") for m in FINETUNE_MODES if m != "off"] + [
    ("no swaps", "busy neighbour"),
    ("swaps", "busy neighbour"),
]


def write_run_dir(env_id: str, out: Path, seed: int = 0) -> Path:
    """A run dir as sac-train writes it (config.json + checkpoint.safetensors), untrained."""
    env = make_env(env_id)
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
    cmd = [str(BIN / "sac-export"), str(run), "--out", str(bundle), "--int8", "--engine", "never", "--force"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"edge_loop: {' '.join(cmd)} failed: {proc.stderr.strip()}")


def hot_path(bundle: Path) -> dict[str, float]:
    """``act`` against the bare library call it wraps, for onnxruntime and torch.

    The bare onnxruntime call runs the backend's own session and binding: a second session would hold a
    second copy of the weights, and which copy the caches favour would then decide the ratio, not the
    wrapper's work.
    """
    b = open_bundle(bundle)
    obs = np.random.default_rng(0).standard_normal(b.spec.obs_dim).astype(np.float32)
    ort_backend = open_backend(b, "onnxruntime", "fp32")
    torch_backend = open_backend(b, "torch", "fp32")
    p50 = interleaved(
        {
            "ort_bare": ort_backend.bare_call(),
            "ort_act": lambda: ort_backend.act(obs),
            "torch_bare": torch_backend.bare_call(),
            "torch_act": lambda: torch_backend.act(obs),
        },
        calls=400,
        rounds=25,  # short rounds, finely interleaved: a shared machine's noise comes in bursts of seconds
    )
    p50["ort_act_over_bare"] = round(p50["ort_act"] / p50["ort_bare"], 3)
    p50["torch_act_over_bare"] = round(p50["torch_act"] / p50["torch_bare"], 3)
    options = RuntimeOptions.of(str(bundle), backend="onnxruntime", precision="fp32")
    with Runtime(options) as runtime:
        backend = runtime.backend  # its own session: the ratio is against the backend it calls
        inline = inline_step(backend, b.spec, make_shield(options, b, lambda _: None))
        lib = interleaved(
            {
                "runtime_act": lambda: runtime.act(obs),
                "runtime_backend_act": lambda: backend.act(obs),
                "inline_step": lambda: inline(obs),
            },
            calls=400,
            rounds=25,
        )
    p50.update(
        lib,
        runtime_act_over_act=round(lib["runtime_act"] / lib["runtime_backend_act"], 3),
        runtime_act_over_inline=round(lib["runtime_act"] / lib["inline_step"], 3),
    )
    return p50


def inline_step(
    backend: Backend, spec: PolicySpec, shield: Shield | None, rate_hz: float = 100.0
) -> Callable[[np.ndarray], np.ndarray]:
    """The step a loop would inline with prebound locals: the observation guard, the timed inference with
    the watchdog's entry, the overrun test, the action guard and the shield (what ``Runtime.act``
    does, less its thread check and counters); ``Runtime.act`` is priced against it."""
    inner = shield.obs_bounds if shield is not None else None
    low, high = np.full(spec.obs_dim, -np.inf), np.full(spec.obs_dim, np.inf)
    obs_guard = ObservationGuard(low, high, "clip", inner, dtype=np.float32)
    act_guard = ActionGuard(np.array(spec.action_low), np.array(spec.action_high))
    check, hold, apply, take, infer = obs_guard.check, act_guard.hold, act_guard.apply, act_guard.take, backend.act
    running = InferenceWatchdog(2.0, lambda _: None).running  # not started: its entry per call, not its thread
    timer, budget_ns = time.perf_counter_ns, int(0.5e9 / rate_hz)
    latency: list[int] = []
    add = latency.append
    send = shield.filter_action if shield is not None else None

    def step(obs: np.ndarray) -> np.ndarray:
        observed, safe, inside = check(obs)
        if safe is not None:
            t0 = timer()
            running[t0] = True
            raw = infer(safe)
            took = timer() - t0
            running.pop(t0, None)
            add(took)
            if took <= budget_ns:
                if send is None:
                    return apply(raw)
                return send(observed, inside, take(raw), True)
        return hold() if send is None else send(observed, False, act_guard.safe, False)

    return step


def gemm_rate_flops() -> float:
    """This core's one-thread fp32 GEMM rate (FLOP/s) on a 64x256x256 product (torch, one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, w = torch.randn(64, 256), torch.randn(256, 256)
        us = interleaved({"mm": lambda: torch.mm(a, w)}, calls=500, rounds=3)["mm"]
    finally:
        torch.set_num_threads(threads)
    return 2 * 64 * 256 * 256 / (us * 1e-6)


def _call(backend: Backend, obs: np.ndarray) -> Callable[[], object]:
    """The bench's call for a batch: ``act`` for one row (the loop's path), ``act_batch`` for more."""
    if len(obs) == 1:
        return lambda: backend.act(obs[0])
    return lambda: backend.act_batch(obs)


def precision_rows(bundle: Path, rate: float) -> list[dict[str, Any]]:
    """INT8 against FP32 at batch 1, 8, 64 through the CPU backend, with the compute floor."""
    b = open_bundle(bundle)
    backends = {p: open_backend(b, "onnxruntime", p) for p in ("fp32", "int8")}
    rng = np.random.default_rng(0)
    obs_dim, act_dim, hidden = b.spec.obs_dim, b.spec.act_dim, b.spec.hidden
    widths = [obs_dim, *hidden, act_dim]
    flops_per_row = 2 * sum(widths[i] * widths[i + 1] for i in range(len(widths) - 1))
    rows = []
    for batch in (1, 8, 64):
        obs = rng.standard_normal((batch, obs_dim)).astype(np.float32)
        fns = {p: _call(be, obs) for p, be in backends.items()}
        p50 = interleaved(fns, calls=200 if batch < 64 else 60, rounds=25)  # short rounds, as in hot_path
        floor_us = flops_per_row * batch / rate * 1e6
        rows.append(
            {
                "batch": batch,
                "fp32_p50_us": p50["fp32"],
                "int8_p50_us": p50["int8"],
                "int8_over_fp32": round(p50["int8"] / p50["fp32"], 3),
                "floor_fp32_us": round(floor_us, 2),
                "fp32_over_floor": round(p50["fp32"] / floor_us, 1),
            }
        )
    return rows


def file_sizes(bundle: Path) -> dict[str, Any]:
    b = open_bundle(bundle)
    fp32, int8_cpu = b.onnx("fp32"), b.cpu_onnx("int8")
    assert fp32 is not None and int8_cpu is not None
    return {
        "fp32_bytes": fp32.stat().st_size,
        "int8_file": int8_cpu.name,
        "int8_bytes": int8_cpu.stat().st_size,
        "int8_over_fp32": round(int8_cpu.stat().st_size / fp32.stat().st_size, 3),
    }


def run_summary(bundle: Path, env_id: str, args: argparse.Namespace, rate_hz: float, *extra: str) -> dict[str, Any]:
    """``sac-edge run ... --json``'s summary."""
    cmd = [
        str(BIN / "sac-edge"),
        "run",
        str(bundle),
        "--env",
        env_id,
        "--precision",
        "fp32",
        "--rate-hz",
        str(rate_hz),
        "--duration",
        str(args.seconds),
        "--cpus",
        str(args.core),
        "--realtime-priority",
        str(args.realtime_priority),
        "--json",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"edge_loop: {' '.join(cmd)} failed: {proc.stderr.strip()}")
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary


def run_loop(bundle: Path, env_id: str, args: argparse.Namespace, rate_hz: float, *extra: str) -> dict[str, Any]:
    return loop_row(run_summary(bundle, env_id, args, rate_hz, *extra))


def loop_row(s: dict[str, Any]) -> dict[str, Any]:
    """A loop run's row: steps, miss rate, latency, misses by cause, peak RSS, whether torch was imported."""
    return {
        "steps": s["steps"],
        "miss_pct": round(100 * s["miss_rate"], 3),
        "p50_us": s["latency_us"]["p50"],
        "p99_us": s["latency_us"]["p99"],
        "work_p50_us": s["loop_work_us"]["p50"],
        "misses_wake/infer/env/loop": "/".join(str(s["miss_causes"][c]) for c in MISS_CAUSES),
        "peak_rss_mb": round(s["peak_rss_mb"], 1),
        "torch_imported": s["torch_imported"],
    }


def loop_rows(bundle: Path, env_id: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The loop at each rate with and without the cache warm-up; each ratio is against ``act``'s hot p50 measured
    just before that run (a shared machine's speed drifts over minutes, so a reference taken at the start of
    the section would set the ratio as much as the loop)."""
    backend = open_backend(open_bundle(bundle), "onnxruntime", "fp32")
    obs = np.random.default_rng(0).standard_normal(backend.spec.obs_dim).astype(np.float32)
    rows = []
    for rate in RATES:
        for warm in (True, False):
            flag = "--warm-cache" if warm else "--no-warm-cache"
            hot = interleaved({"act": lambda: backend.act(obs)}, calls=400, rounds=5)["act"]
            r = run_loop(bundle, env_id, args, rate, "--backend", "onnxruntime", flag)
            row = {"backend": "onnxruntime", "rate_hz": rate, "warm_cache": warm, "finetune": False, **r}
            rows.append({**row, "hot_p50_us": hot, "p50_over_hot": round(r["p50_us"] / hot, 2)})
    r = run_loop(bundle, env_id, args, 1000.0, "--backend", "torch")
    torch_row = {"backend": "torch", "rate_hz": 1000.0, "warm_cache": True, "finetune": False, **r}
    rows.append({**torch_row, "hot_p50_us": None, "p50_over_hot": None})
    return rows


def busy_neighbour(core: int) -> subprocess.Popen[bytes]:
    """A Python busy loop on the CPUs the loop's ``core`` leaves to others (where the learner process runs)."""
    others = os.sched_getaffinity(0) - {core}
    if not others:
        raise SystemExit("edge_loop: the busy neighbour needs a CPU besides --core")
    return subprocess.Popen(
        [sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, others)
    )


def finetune_run(bundle: Path, env_id: str, args: argparse.Namespace, mode: str, round_: int) -> dict[str, Any]:
    """One 1 kHz run in fine-tuning ``mode`` (a key of ``FINETUNE_MODES``)."""
    flags, busy = FINETUNE_MODES[mode]
    where = ("--finetune-dir", str(bundle.parent / f"{env_id}.{mode.replace(' ', '-')}.{round_}.ft")) if flags else ()
    neighbour = busy_neighbour(args.core) if busy else None
    try:
        s = run_summary(bundle, env_id, args, 1000.0, "--backend", "onnxruntime", *flags, *where)
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    ft = s.get("finetune") or {}
    swap = ft.get("swap_s", {}).get("fp32")
    return {
        "round": round_,
        "finetune": mode,
        **loop_row(s),
        "updates": ft.get("updates"),
        "swaps": ft.get("swaps"),
        "swap_p50_ms": round(swap["p50"] * 1e3, 3) if swap else None,
    }


def finetune_rows(bundle: Path, env_id: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--repeats`` rounds of one run per mode; round r starts at the r-th mode, so that no mode always
    follows another (a shared machine's speed drifts over minutes: only runs close in time compare)."""
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(FINETUNE_MODES))
    if unknown or "off" not in modes:
        raise SystemExit(f"edge_loop: --modes takes 'off' and any of {list(FINETUNE_MODES)[1:]} (got {unknown})")
    rows = []
    for r in range(args.repeats):
        for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
            rows.append(finetune_run(bundle, env_id, args, mode, r))
    return rows


def paired_effect(rows: list[dict[str, Any]], goal_points: float = 0.05) -> list[dict[str, Any]]:
    """For each ``COMPARED`` pair that ran, the mode's miss rate minus its reference's in the same round:
    mean and 95% t interval over rounds (points of percent), and whether the interval lies inside
    +-``goal_points``."""
    from scipy import stats

    by_mode: dict[str, dict[int, float]] = {}
    for r in rows:
        by_mode.setdefault(r["finetune"], {})[r["round"]] = r["miss_pct"]
    out = []
    for mode, reference in COMPARED:
        if mode not in by_mode or reference not in by_mode:
            continue
        rounds = sorted(by_mode[mode].keys() & by_mode[reference].keys())
        diffs = np.array([by_mode[mode][k] - by_mode[reference][k] for k in rounds])
        mean = float(diffs.mean())
        if len(diffs) > 1 and diffs.std() > 0:
            low, high = stats.t.interval(0.95, len(diffs) - 1, loc=mean, scale=stats.sem(diffs))
        else:
            low = high = mean
        if -goal_points < low and high < goal_points:
            verdict = f"within +-{goal_points}"
        elif low > goal_points:
            verdict = f"over +{goal_points}"
        else:
            verdict = "unsettled"
        out.append(
            {
                "mode": mode,
                "against": reference,
                "rounds": len(diffs),
                "mode_pct": round(float(np.mean([by_mode[mode][k] for k in rounds])), 3),
                "against_pct": round(float(np.mean([by_mode[reference][k] for k in rounds])), 3),
                "diff_points": round(mean, 3),
                "ci95_low": round(float(low), 3),
                "ci95_high": round(float(high), 3),
                "verdict": verdict,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each loop run (BENCHMARKS.md uses 8)")
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)), help="CPU core to pin to")
    parser.add_argument("--envs", default=",".join(ENVS))
    parser.add_argument(
        "--realtime-priority", type=int, default=0, help="SCHED_FIFO priority for the loop (needs root; 0: off)"
    )
    parser.add_argument("--sections", default="hot,precision,loop,finetune", help="which sections to run")
    parser.add_argument("--repeats", type=int, default=3, help="fine-tuning: rounds of one run per mode")
    parser.add_argument("--modes", default=",".join(FINETUNE_MODES), help="fine-tuning: the modes to run")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    rate = gemm_rate_flops()
    out: dict[str, Any] = {"gemm_gflops_1thread": round(rate / 1e9, 2), "seconds": args.seconds, "envs": {}}
    with tempfile.TemporaryDirectory(prefix="edge_loop.") as tmp:
        for env_id in args.envs.split(","):
            bundle = Path(tmp) / f"{env_id}.bundle"
            export(write_run_dir(env_id, Path(tmp) / f"{env_id}.run"), bundle)
            res: dict[str, Any] = {}
            if sections & {"hot", "loop"}:
                res["hot"] = hot_path(bundle)
                h = res["hot"]
                print(f"\n{env_id}: hot path p50 (us), interleaved in one process")
                print(
                    format_table(
                        [
                            ("onnxruntime", h["ort_bare"], h["ort_act"], h["ort_act_over_bare"]),
                            ("torch", h["torch_bare"], h["torch_act"], h["torch_act_over_bare"]),
                            ("Runtime.act", h["runtime_backend_act"], h["runtime_act"], h["runtime_act_over_act"]),
                            ("Runtime.act / inline", h["inline_step"], h["runtime_act"], h["runtime_act_over_inline"]),
                        ],
                        ("backend", "bare call (Runtime: act; inline step)", "act", "act / bare"),
                    )
                )
            if "precision" in sections:
                res["precision"] = precision_rows(bundle, rate)
                res["files"] = file_sizes(bundle)
                print(f"\n{env_id}: INT8 vs FP32 on the CPU backend (floor: FLOPs at {rate / 1e9:.1f} GFLOP/s)")
                print(format_table([tuple(r.values()) for r in res["precision"]], tuple(res["precision"][0])))
                print(f"files: {res['files']}")
            if "loop" in sections:
                res["loop"] = loop_rows(bundle, env_id, args)
                print(f"\n{env_id}: in the loop ({args.seconds} s a run; hot act p50 measured just before each)")
                print(format_table([tuple(r.values()) for r in res["loop"]], tuple(res["loop"][0])))
            if "finetune" in sections:
                res["finetune"] = finetune_rows(bundle, env_id, args)
                res["finetune_effect"] = effect = paired_effect(res["finetune"])
                print(f"\n{env_id}: 1 kHz, each fine-tuning mode (--repeats rounds)")
                print(format_table([tuple(r.values()) for r in res["finetune"]], tuple(res["finetune"][0])))
                print(f"\n{env_id}: effect on 1 kHz misses, paired by round (goal: within 0.05 points)")
                print(format_table([tuple(r.values()) for r in effect], tuple(effect[0])))
            out["envs"][env_id] = res
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
