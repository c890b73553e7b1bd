"""On-device fine-tuning benchmark: recover a nominal Pendulum policy on a heavier pole, within a memory budget.

1. ``sac-train`` on nominal Pendulum-v1 (or ``--run DIR`` to reuse a run), ``sac-export --int8``;
2. the exported policy's deterministic return on the shifted env (``--shift``, default pole mass 1.6) on
   ``--eval-episodes`` fixed seeds: *before*;
3. ``sac-edge run`` on the shifted env without learning (deadline misses without learning);
4. ``sac-edge run --finetune`` for ``--finetune-s`` seconds (misses during learning, swaps, rollbacks), then
   the last good weights' deterministic return on the same seeds: *after*;
5. the same under a tight ``--mem-budget-mb`` (default: the resident memory the first run measured before
   its learner, + 48 MiB): the sizing it chose and its peak RSS against the budget.

Prints a table, then (``--json``) one JSON line. Default run: about 8 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from sac_edge.calibration.rollout import run_episode
from sac_edge.common.envs import make_env
from sac_edge.common.summary import emit_json
from sac_edge.edge_runtime.backend import open_bundle
from sac_edge.edge_runtime.promotion import LastGoodStore
from sac_edge.edge_runtime.registry import open_backend
from sac_edge.edge_runtime.shift import parse_shift, shifted

BIN = Path(sys.executable).parent
EVAL_SEED = 50_000


def sh(args: list[str]) -> dict[str, Any]:
    """Run a sac-* command with --json and return its summary line."""
    out = subprocess.run([*args, "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def returns(bundle: Path, shift: dict[str, float], episodes: int, weights: dict[str, np.ndarray] | None) -> list[float]:
    """Deterministic returns of the bundle's fp32 graph (with ``weights`` swapped in) on fixed seeds."""
    b = open_bundle(bundle)
    backend = open_backend(b, "onnxruntime", "fp32")
    if weights is not None:
        backend.swap_weights(weights)
    env = shifted(make_env(b.spec.env_id), shift)
    return [run_episode(backend.act_batch, env, EVAL_SEED + k).total_return for k in range(episodes)]


def finetune_run(bundle: Path, args: argparse.Namespace, tag: str, extra: list[str]) -> dict[str, Any]:
    work = Path(args.out) / tag
    cmd = [str(BIN / "sac-edge"), "run", str(bundle), "--backend", "onnxruntime", "--rate-hz", str(args.rate_hz)]
    cmd += ["--duration", str(args.finetune_s), "--finetune", "--shift", args.shift, "--finetune-dir", str(work)]
    cmd += ["--telemetry", str(work / "telemetry.jsonl"), *extra]
    return sh(cmd)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", help="reuse this sac-train run dir instead of training")
    p.add_argument("--out", default="runs/bench_finetune", help="work directory")
    p.add_argument("--train-steps", type=int, default=15_000)
    p.add_argument("--shift", default="m=1.6", help="dynamics change, as sac-edge run --shift")
    p.add_argument("--rate-hz", type=float, default=200.0)
    p.add_argument("--finetune-s", type=float, default=150.0, help="seconds of fine-tuning per run")
    p.add_argument("--baseline-s", type=float, default=20.0, help="seconds of the no-learning loop")
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--tight-mb", type=float, help="memory budget of the second run (default: baseline + 48 MiB)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    run = Path(args.run) if args.run else out / "run"
    if not args.run:
        sh([str(BIN / "sac-train"), "--env", "Pendulum-v1", "--total-steps", str(args.train_steps),
            "--learning-starts", "1000", "--threads", "1", "--no-progress", "--out", str(run), "--force"])  # fmt: skip
    bundle = out / "bundle"
    sh([str(BIN / "sac-export"), str(run), "--out", str(bundle), "--int8", "--force"])
    shift = parse_shift(tuple(args.shift.split(",")))
    nominal = returns(bundle, {}, args.eval_episodes, None)
    before = returns(bundle, shift, args.eval_episodes, None)
    base = sh([str(BIN / "sac-edge"), "run", str(bundle), "--backend", "onnxruntime", "--rate-hz", str(args.rate_hz),
               "--duration", str(args.baseline_s), "--shift", args.shift])  # fmt: skip
    ft = finetune_run(bundle, args, "ft", [])
    store = LastGoodStore(out / "ft")
    weights = store.load().actor() if store.exists() else None
    after = returns(bundle, shift, args.eval_episodes, weights)
    tight_mb = args.tight_mb or round(ft["finetune"]["sizing"]["baseline_mb"] + 48)
    tight = finetune_run(bundle, args, "ft_tight", ["--mem-budget-mb", str(tight_mb), "--finetune-buffer", "1000000"])
    tight_store = LastGoodStore(out / "ft_tight")
    tight_after = returns(
        bundle, shift, args.eval_episodes, tight_store.load().actor() if tight_store.exists() else None
    )
    f, tf = ft["finetune"], tight["finetune"]
    ts = tf["sizing"]
    summary = {
        "shift": args.shift,
        "rate_hz": args.rate_hz,
        "finetune_s": args.finetune_s,
        "return_nominal": float(np.mean(nominal)),
        "return_before": float(np.mean(before)),
        "return_after": float(np.mean(after)),
        "return_after_tight": float(np.mean(tight_after)),
        "rollbacks": f["rollbacks"],
        "promotions": f["promotions"],
        "candidates": f["candidates"],
        "updates": f["updates"],
        "swap_ms_p50": f["swap_s"].get("fp32", {}).get("p50", float("nan")) * 1e3,
        "miss_rate": ft["miss_rate"],
        "miss_rate_no_learning": base["miss_rate"],
        "latency_p99_us": ft["latency_us"]["p99"],
        "latency_p99_us_no_learning": base["latency_us"]["p99"],
        "peak_rss_mb": tight["peak_rss_mb"],
        "peak_rss_mb_unbudgeted": ft["peak_rss_mb"],
        "mem_budget_mb": tight_mb,
        "tight_sizing": {k: ts[k] for k in ("buffer_rows", "batch_size", "grad_checkpoint", "utd", "estimate_mb")},
        "tight_rollbacks": tf["rollbacks"],
        "tight_miss_rate": tight["miss_rate"],
        "tight_budget_events": tight["budget_events"],
        "wall_s": round(time.monotonic() - t0, 1),
    }
    rows = [
        ("return nominal / shifted before / after", f"{summary['return_nominal']:.1f} / {summary['return_before']:.1f}"
         f" / {summary['return_after']:.1f}  ({args.eval_episodes} fixed seeds, {args.shift})"),
        ("fine-tune", f"{f['updates']} updates, {f['candidates']} candidates: {f['promotions']} promoted, "
         f"{f['rollbacks']} rolled back, {f['shadow_rejections']} shadow-rejected; "
         f"swap p50 {summary['swap_ms_p50']:.2f} ms"),
        ("deadline misses", f"{100 * ft['miss_rate']:.3f}% learning vs {100 * base['miss_rate']:.3f}% not "
         f"(p99 latency {summary['latency_p99_us']:.0f} vs {summary['latency_p99_us_no_learning']:.0f} us)"),
        ("tight budget", f"{tight_mb} MB: {ts['buffer_rows']} rows, batch {ts['batch_size']}, checkpointing "
         f"{ts['grad_checkpoint']}, utd {ts['utd']:g}; peak RSS {tight['peak_rss_mb']:.1f} MB "
         f"(unbudgeted {ft['peak_rss_mb']:.1f}); after {summary['return_after_tight']:.1f}, "
         f"{tf['rollbacks']} rollbacks, misses {100 * tight['miss_rate']:.3f}%"),
        ("wall", f"{summary['wall_s']} s"),
    ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows), flush=True)
    if args.json:
        emit_json(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
