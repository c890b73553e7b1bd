"""The fine-tuner's weight swap beside a control-like thread: the shipped swap path against the in-process one.

For Pendulum-v1 and HalfCheetah-v5 (untrained 256x256 actors exported with ``sac-export --int8``, as in
``edge_loop.py``), in one process:

1. prepacking: p50 of a session with onnxruntime's weight prepacking (the default) against one without it
   whose initializers are numpy arrays given by ``add_initializer`` (what an in-place swap needs), for the
   fp32 graph and ``policy.int8-cpu.onnx``, batch 1 (``run_with_iobinding``, the loop's call), 8 and 64,
   interleaved. It decides where ``OrtBackend`` swaps in place (backends/onnxrt/runner.py).
2. stall: a control-like thread (``act`` on the serving backend, then a 0.2 ms sleep, under the fine-tuner's
   0.1 ms GIL switch interval) while another thread swaps a new weight set in every ``--gap-ms``. Its
   worst gap between two iterations, its p99.9 and the number of gaps over 1 ms, over ``--rounds``
   rounds that take the paths in turn, for: no swaps (the machine's own noise); *before*, the reference
   path that does everything in the control process (re-quantise and re-check for int8, then rebuild
   every onnxruntime session); *after*, the shipped path (copy the candidate's sets out of shared memory,
   the learner having re-quantised them, and install them: fp32 refilled in place, int8 rebuilt from the
   graph onnxruntime optimised at start); with int8 loaded also *after, int8 from the file*, the int8
   rebuild from ``policy.int8-cpu.onnx`` instead of the pre-optimised graph. With ``fp32`` loaded alone
   (the default run) and with ``fp32,int8`` (budget runs).

Prints one table per section, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from edge_loop import ENVS, export, interleaved, write_run_dir
from onnx import numpy_helper

from sac_edge.common.bundle import Bundle, open_bundle
from sac_edge.common.bundle_format import INT8_CPU_ONNX, POLICY_ONNX
from sac_edge.common.table import format_table
from sac_edge.edge_runtime.backends.base import Backend, BackendOptions, SwapPath
from sac_edge.edge_runtime.backends.onnxrt.runner import NO_PREPACKING
from sac_edge.edge_runtime.backends.registry import open_backend
from sac_edge.edge_runtime.finetune.finetuner import GIL_SWITCH_S, read_learner_tensors
from sac_edge.edge_runtime.finetune.learner_process import INT8, SHADOW_STATES, read_candidate, weights_layout
from sac_edge.edge_runtime.finetune.shared import SharedArrays
from sac_edge.edge_runtime.finetune.weight_swap import WeightSets, WeightSwapper

TICK_S = 2e-4
LOADS = (("fp32",), ("fp32", "int8"))
FROM_FILE = "after, int8 from the file"
PATHS = ("none", "before", FROM_FILE, "after")


def _session(path: Path, prepack: bool) -> tuple[Any, list[Any]]:
    """A one-thread CPU session; without prepacking over numpy initializers (and what must stay alive)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    keep: list[Any] = []
    if not prepack:
        so.add_session_config_entry(NO_PREPACKING, "1")
        kinds = (onnx.TensorProto.FLOAT, onnx.TensorProto.INT8, onnx.TensorProto.INT32)
        for init in onnx.load(str(path)).graph.initializer:
            if init.data_type in kinds:
                value = ort.OrtValue.ortvalue_from_numpy(numpy_helper.to_array(init).copy())
                so.add_initializer(init.name, value)
                keep.append(value)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]), keep


def _bound(session: Any, obs: np.ndarray, act_dim: int) -> tuple[Any, list[Any]]:
    """``run_with_iobinding`` on preallocated input and output, as ``OrtBackend.act`` calls it."""
    action = np.zeros((1, act_dim), np.float32)
    values = [ort.OrtValue.ortvalue_from_numpy(obs), ort.OrtValue.ortvalue_from_numpy(action)]
    binding = session.io_binding()
    binding.bind_ortvalue_input("obs", values[0])
    binding.bind_ortvalue_output("action", values[1])
    return (lambda: session.run_with_iobinding(binding)), values


def prepack_rows(bundle: Bundle) -> list[dict[str, Any]]:
    rows = []
    rng = np.random.default_rng(0)
    for name in (POLICY_ONNX, INT8_CPU_ONNX):
        sessions = {p: _session(bundle.path / name, p) for p in (True, False)}
        for batch in (1, 8, 64):
            obs = rng.standard_normal((batch, bundle.spec.obs_dim)).astype(np.float32)
            fns, keep = {}, []
            for prepack, (session, _) in sessions.items():
                if batch == 1:
                    fns[prepack], values = _bound(session, obs, bundle.spec.act_dim)
                    keep.append(values)
                else:
                    fns[prepack] = lambda s=session, x=obs: s.run(["action"], {"obs": x})
            p50 = interleaved({"on": fns[True], "off": fns[False]}, calls=1000 if batch < 64 else 300)
            row = {"graph": name, "batch": batch, "prepacked_p50_us": p50["on"], "unpacked_p50_us": p50["off"]}
            rows.append({**row, "unpacked_over_prepacked": round(p50["off"] / p50["on"], 3)})
    return rows


class Ticker:
    """A control-like thread: ``act``, sleep ``TICK_S``, again; records the gaps between iterations."""

    def __init__(self, backend: Backend, obs: np.ndarray) -> None:
        self.backend, self.obs = backend, obs
        self.stop = threading.Event()
        self.gaps: list[int] = []
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        clock = time.perf_counter_ns
        last = clock()
        while not self.stop.is_set():
            self.backend.act(self.obs)
            time.sleep(TICK_S)
            now = clock()
            self.gaps.append(now - last)
            last = now


def _actor_sets(bundle: Bundle) -> list[dict[str, np.ndarray]]:
    actor = {k: v for k, v in read_learner_tensors(bundle).items() if k.startswith("actor.")}
    return [actor, {k: (v * 0.9).astype(np.float32) for k, v in actor.items()}]


def stall(bundle: Bundle, load: tuple[str, ...], path: str, swaps: int, gap_s: float) -> tuple[list[int], list[float]]:
    """The ticker's gaps (ns) while ``path`` (none / before / after) swaps ``swaps`` times, ``gap_s`` apart,
    and the swaps' seconds."""
    after = path.startswith("after")
    options = BackendOptions(refit=after)
    from_file = BackendOptions(refit=True, swap=SwapPath.FROM_FILE)  # the int8 rebuild from the graph file
    backends = {
        p: open_backend(bundle, "onnxruntime", p, from_file if path == FROM_FILE and p == "int8" else options)
        for p in load
    }
    swapper = WeightSwapper(backends, bundle)
    actors = _actor_sets(bundle)
    states = np.random.default_rng(0).standard_normal((SHADOW_STATES, bundle.spec.obs_dim)).astype(np.float32)
    tensors = read_learner_tensors(bundle)
    prepared = [swapper.prepare(a, states) for a in actors]  # after: what the learner process made...
    blocks = [SharedArrays(weights_layout(bundle.spec, tensors, sets.int8)) for sets in prepared]
    for block, sets in zip(blocks, prepared):  # ...and wrote into shared memory
        block.write({**tensors, **sets.actor, **{INT8 + k: v for k, v in sets.int8.items()}})
    names = (list(tensors), [INT8 + k for k in prepared[0].int8])
    swapper.install(prepared[0])
    ticker = Ticker(backends[load[0]], states[0])
    previous = sys.getswitchinterval()
    sys.setswitchinterval(GIL_SWITCH_S)
    ticker.thread.start()
    seconds = []
    try:
        for i in range(1, swaps + 1):
            time.sleep(gap_s)
            if path == "none":
                continue
            start = time.perf_counter()
            if path == "before":
                swapper.install(swapper.prepare(actors[i % 2], states))
            else:
                state, int8, _ = read_candidate(blocks[i % 2], *names)
                actor = {k: v for k, v in state.items() if k.startswith("actor.")}
                swapper.install(WeightSets(actor, int8, prepared[i % 2].int8_facts))
            seconds.append(time.perf_counter() - start)
        time.sleep(gap_s)
    finally:
        ticker.stop.set()
        ticker.thread.join()
        sys.setswitchinterval(previous)
        for block in blocks:
            block.unlink()
    return ticker.gaps[10:], seconds


def stall_rows(bundle: Bundle, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each load and path's timings over ``args.rounds`` rounds, the paths taking turns within a round."""
    rows = []
    for load in LOADS:
        paths = [p for p in PATHS if p != FROM_FILE or "int8" in load]
        gaps: dict[str, list[int]] = {p: [] for p in paths}
        seconds: dict[str, list[float]] = {p: [] for p in paths}
        for _ in range(args.rounds):
            for path in paths:
                g, s = stall(bundle, load, path, args.swaps, args.gap_ms / 1e3)
                gaps[path] += g
                seconds[path] += s
        for path in paths:
            ms = np.array(gaps[path]) / 1e6
            rows.append(
                {
                    "loaded": ",".join(load),
                    "path": path,
                    "swaps": len(seconds[path]),
                    "worst_gap_ms": round(float(ms.max()), 3),
                    "p999_gap_ms": round(float(np.quantile(ms, 0.999)), 3),
                    "gaps_over_1ms": int((ms > 1.0).sum()),
                    "swap_p50_ms": round(float(np.median(seconds[path])) * 1e3, 3) if seconds[path] else None,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default=",".join(ENVS))
    parser.add_argument("--sections", default="prepack,stall")
    parser.add_argument("--swaps", type=int, default=40, help="swaps per stall row")
    parser.add_argument("--gap-ms", type=float, default=25.0, help="time between two swaps")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the paths, taken in turn")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="weight_swap.") as tmp:
        for env_id in args.envs.split(","):
            path = Path(tmp) / f"{env_id}.bundle"
            export(write_run_dir(env_id, Path(tmp) / f"{env_id}.run"), path)
            bundle = open_bundle(path)
            res: dict[str, Any] = {}
            if "prepack" in sections:
                res["prepack"] = prepack_rows(bundle)
                print(f"\n{env_id}: p50 (us) with and without onnxruntime's weight prepacking, interleaved")
                print(format_table([tuple(r.values()) for r in res["prepack"]], tuple(res["prepack"][0])))
            if "stall" in sections:
                res["stall"] = stall_rows(bundle, args)
                what = f"{args.rounds} x {args.swaps} swaps happen, {args.gap_ms} ms apart"
                print(f"\n{env_id}: a control-like thread's gaps (ms) while {what}")
                print(format_table([tuple(r.values()) for r in res["stall"]], tuple(res["stall"][0])))
            out[env_id] = res
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
