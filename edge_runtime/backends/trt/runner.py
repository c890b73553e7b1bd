"""TensorRT engine backend: plans built on the target from the bundle's ONNX, cached, never loaded stale.

A plan is loaded only when its record matches this machine (``plans.py``); anything else is rebuilt
from the ONNX with ``sac_edge.export.tensorrt.build_engine`` and cached as
``BUNDLE/engines/policy.<precision>.<trtX-device-smNN>.plan`` (+ ``.json``).

Inference follows the TensorRT 8.5+/10 tensor API (``num_io_tensors``, ``set_input_shape``,
``set_tensor_address``, ``execute_async_v3``; edge-facts.md, TensorRT Python API docs): device buffers
and pinned host buffers are allocated once, and batch 1 runs copy in, execute, copy out, synchronise on
its own stream; ``act_batch`` uses a second stream, context and device buffers (an execution context must
not be used from two threads at once), so it may run beside the loop's ``act``. CUDA memory goes
through ``cuda.py``.
A weight swap deserialises a fresh engine from the plan, refits it (the plan must be refittable), and
publishes it with one assignment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.manifest import sha256_file

from ..base import Backend, BackendOptions, Bundle, SwapReport, missing_package
from .cuda import open_cuda
from .plans import PlanKey, cached_plan_paths, find_plan, write_sidecar

INPUT, OUTPUT = "obs", "action"
MAX_BATCH = 64


class _Engine(NamedTuple):
    """One generation: an engine with its batch-1 and batch-n execution contexts."""

    engine: Any
    context: Any
    batch_context: Any


class TensorRTBackend(Backend):
    """A TensorRT engine with preallocated pinned host and device buffers on one stream."""

    name = "tensorrt"

    def __init__(self, bundle: Bundle, precision: str, options: BackendOptions) -> None:
        super().__init__(bundle.spec)
        try:
            import tensorrt as trt
        except ImportError:
            raise missing_package("tensorrt", "tensorrt", "install TensorRT's Python bindings") from None
        self.trt, self.precision = trt, precision
        self.cuda = open_cuda()
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        from sac_edge.export.tensorrt import cuda_device, engine_inputs

        device = cuda_device()
        if device is None:
            raise SacEdgeError("backend 'tensorrt' needs a CUDA device (libcuda reports none)")
        onnx, calib = engine_inputs(bundle.path, precision, int(trt.__version__.split(".")[0]))
        if not onnx.is_file():
            raise SacEdgeError(f"{bundle.path}: {onnx.name} is missing; cannot build a TensorRT {precision} engine")
        key = PlanKey(trt.__version__, device.name, device.compute_capability, sha256_file(onnx), precision)
        engine_dir = options.engine_dir or bundle.path / "engines"
        plan, self.skipped = find_plan(bundle, key, engine_dir)
        self.device = f"{device.name} (sm {device.compute_capability})"
        self.built = plan is None
        if plan is None:
            plan = self._build(onnx, calib, key, engine_dir)
        self.plan = plan
        self._plan_bytes = plan.read_bytes()
        self._runner = self._load(None)
        self._retired: _Engine | None = None
        dims = bundle.spec.obs_dim, bundle.spec.act_dim
        self._in_dtype = trt.nptype(self._runner.engine.get_tensor_dtype(INPUT))
        self._out_dtype = trt.nptype(self._runner.engine.get_tensor_dtype(OUTPUT))
        self._host_in = self.cuda.pinned((1, dims[0]), self._in_dtype)
        self._host_out = self.cuda.pinned((1, dims[1]), self._out_dtype)
        self._dev_in = self.cuda.device_alloc(self._host_in.nbytes)
        self._dev_out = self.cuda.device_alloc(self._host_out.nbytes)
        # act_batch (the gate, benchmarks, another thread while the loop calls act) has its own stream and
        # device buffers, so it never overwrites act's; its callers share them under a lock.
        self._batch_cuda = open_cuda()
        self._batch_in = self._batch_cuda.device_alloc(self._host_in.nbytes * MAX_BATCH)
        self._batch_out = self._batch_cuda.device_alloc(self._host_out.nbytes * MAX_BATCH)
        self._batch_lock = threading.Lock()
        self._action = np.zeros(dims[1], np.float32)
        self._bind(self._runner)
        self._weights: dict[str, np.ndarray] = {}

    def _build(self, onnx: Path, calib: Path | None, key: PlanKey, engine_dir: Path) -> Path:
        """Build with export's builder (refittable, batch 1..MAX_BATCH) into the cache, then the sidecar."""
        from sac_edge.export.tensorrt import build_engine

        plan, _ = cached_plan_paths(engine_dir, key)
        engine_dir.mkdir(parents=True, exist_ok=True)
        info = build_engine(
            onnx,
            plan,
            key.precision,
            calib_cache=calib,
            batch=(1, 1, MAX_BATCH),
            timing_cache=engine_dir / "timing.cache",
        )
        write_sidecar(plan, key, info.to_dict())
        return plan

    def _load(self, weights: Mapping[str, np.ndarray] | None) -> _Engine:
        engine = self.runtime.deserialize_cuda_engine(self._plan_bytes)
        if engine is None:
            raise SacEdgeError(f"{self.plan}: TensorRT could not deserialise the plan (delete it to rebuild)")
        if weights:
            refitter = self.trt.Refitter(engine, self.logger)
            for name, arr in weights.items():
                if not refitter.set_named_weights(name, self.trt.Weights(arr)):
                    raise SacEdgeError(f"swap_weights: TensorRT refused weights {name!r} (wrong name or size)")
            if not refitter.refit_cuda_engine():
                raise SacEdgeError(f"swap_weights: refit failed (missing: {refitter.get_missing_weights()})")
        return _Engine(engine, engine.create_execution_context(), engine.create_execution_context())

    def _bind(self, runner: _Engine) -> None:
        runner.context.set_input_shape(INPUT, (1, self.spec.obs_dim))
        runner.context.set_tensor_address(INPUT, self._dev_in)
        runner.context.set_tensor_address(OUTPUT, self._dev_out)

    def act(self, obs: np.ndarray) -> np.ndarray:
        np.copyto(self._host_in[0], obs.reshape(-1), casting="unsafe")
        runner = self._runner
        self.cuda.htod(self._dev_in, self._host_in)
        runner.context.execute_async_v3(self.cuda.stream)
        self.cuda.dtoh(self._host_out, self._dev_out)
        self.cuda.sync()
        np.copyto(self._action, self._host_out[0], casting="unsafe")
        return self._action

    def act_batch(self, obs: np.ndarray) -> np.ndarray:
        out = []
        cuda = self._batch_cuda
        with self._batch_lock:
            runner = self._runner  # one generation for the whole call, kept alive across a concurrent swap
            ctx = runner.batch_context
            ctx.set_tensor_address(INPUT, self._batch_in)
            ctx.set_tensor_address(OUTPUT, self._batch_out)
            for start in range(0, len(obs), MAX_BATCH):  # the engine's profile stops at MAX_BATCH
                chunk = np.ascontiguousarray(obs[start : start + MAX_BATCH], dtype=self._in_dtype)
                result = np.empty((len(chunk), self.spec.act_dim), self._out_dtype)
                ctx.set_input_shape(INPUT, chunk.shape)
                cuda.htod(self._batch_in, chunk)
                ctx.execute_async_v3(cuda.stream)
                cuda.dtoh(result, self._batch_out)
                cuda.sync()
                out.append(result.astype(np.float32))
        return np.concatenate(out) if out else np.empty((0, self.spec.act_dim), np.float32)

    def swap_weights(self, weights: Mapping[str, np.ndarray]) -> SwapReport:
        start = time.perf_counter()
        if not self._runner.engine.refittable:
            raise SacEdgeError(f"{self.plan.name}: engine is not refittable ({self.precision}); rebuild to swap")
        refitter = self.trt.Refitter(self._runner.engine, self.logger)
        known = set(refitter.get_all_weights())
        use = {k: np.asarray(v, dtype=np.float32, order="C") for k, v in weights.items() if k in known}
        ignored = tuple(sorted(set(weights) - known))
        merged = {**self._weights, **use}
        runner = self._load(merged)
        self._bind(runner)
        self._retired, self._runner, self._weights = self._runner, runner, merged
        self.swaps += 1
        return SwapReport(len(use), ignored, time.perf_counter() - start)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "file": self.plan.name,
            "built": self.built,
            "skipped_plans": self.skipped,
            "tensorrt": self.trt.__version__,
            "device": self.device,
        }

    def close(self) -> None:
        with self._batch_lock:
            self._runner = self._retired = None  # type: ignore[assignment]
            self._batch_cuda.close()
        self.cuda.close()
