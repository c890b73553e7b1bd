"""TensorRT engine backend: plans built on the target from the bundle's ONNX, cached, proven before they serve.

A plan is loaded only when its record matches this machine (``plans.py``); anything else is rebuilt
from the ONNX the TensorRT generation takes (``common.trt.generations``) with
``sac_edge.common.trt.builder.build_engine`` and cached as ``BUNDLE/engines/policy.<precision>.<tag>.plan``
(+ ``.json``). Every engine, built or cached, then goes through the parity gate (``parity_gate.py``; the
registry runs it, since the kind declares every precision gated); one that disagrees with the fp32 ONNX is
not served, a cached plan is deleted and the gate's result stays in its sidecar (``parity_checked``).

Inference follows the TensorRT 8.5+/10/11 tensor API (``num_io_tensors``, ``set_input_shape``,
``set_tensor_address``, ``execute_async_v3``): device buffers and pinned host buffers are allocated once.
The engine has two optimisation profiles: ``act`` (batch 1, the control loop) runs on a context with
profile 0 on its own stream; ``act_batch`` (the gate, benchmarks, any thread) on a second context with
profile 1, its own stream and device buffers, under a lock. On 8.5 a second context on a one-profile
engine has no profile and its enqueues fail (NvInferRuntime.h; NVIDIA/TensorRT#1590), so profiles are
selected explicitly and every bool result (``set_optimization_profile_async``, ``set_input_shape``,
``set_tensor_address``, ``execute_async_v3``, refits) is checked: a failure is one ``SacEdgeError`` line,
never uninitialised output. CUDA goes through ``cuda.py`` (the primary context, current for each call on its thread).

A weight swap (only on a plan built refittable, ``BackendOptions.refit``, which ``--finetune`` sets)
deserialises a fresh engine from the plan, refits it, checks it with the parity gate against the fp32 ONNX
with the same weights, and publishes it with one assignment. An INT8 swap whose set the refitter cannot
take completely (per-channel scales it does not know, weights it reports missing) is rebuilt from the
graph with the new initializers instead, never half-applied. From TensorRT 11.3 (a REFIT build can drop a
matrix-multiply bias, ``generations.refit_is_safe``) plans are built without REFIT and every swap is such
a rebuild.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import ENGINES_DIR, INT8, SWAP_BUILDS, TIMING_CACHE, plan_name
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.manifest import sha256_bytes

from ..base import Backend, BackendOptions, PendingSwap
from .cuda import open_cuda
from .plans import PlanKey, cached_plan_paths, find_plan, record_parity, write_sidecar

if TYPE_CHECKING:
    from sac_edge.common.trt.builder import CudaDevice

INPUT, OUTPUT = "obs", "action"
MAX_BATCH = 64


class _Engine(NamedTuple):
    """One generation: an engine with its batch-1 (profile 0) and batch-n (profile 1) execution contexts."""

    engine: Any
    context: Any
    batch_context: Any


def _ok(result: Any, what: str) -> None:
    """A TensorRT call's bool (or None) result as a one-line error."""
    if not result:
        raise SacEdgeError(f"TensorRT could not {what}; delete BUNDLE/engines to rebuild, or use --backend onnxruntime")


class TensorRTBackend(Backend):
    """A TensorRT engine with preallocated pinned host and device buffers, two contexts on two streams."""

    name = "tensorrt"

    def __init__(self, bundle: Bundle, precision: str, options: BackendOptions) -> None:
        super().__init__(bundle.spec)
        from sac_edge.common.trt.api import create, import_tensorrt, make_logger, numpy_type
        from sac_edge.common.trt.builder import cuda_device, cuda_problem, engine_inputs
        from sac_edge.common.trt.generations import generation, refit_is_safe

        trt = import_tensorrt()
        self.trt, self.precision, self.bundle = trt, precision, bundle
        self.generation = generation(trt.__version__)
        self.refittable = options.refit
        # swaps refit a REFIT plan where TensorRT builds one safely, else rebuild the engine from the graph
        self.rebuild_swaps = options.refit and not refit_is_safe(trt.__version__)
        device = cuda_device()
        if device is None:  # before any CUDA or TensorRT object: each would fail with a less clear reason
            raise SacEdgeError(f"backend 'tensorrt': {cuda_problem()}; use --backend onnxruntime")
        self.logger = make_logger(trt)
        self.runtime = create(trt.Runtime, self.logger, logger=self.logger, what="create a runtime")
        self.cuda = open_cuda()
        self._batch_cuda = open_cuda()
        with self.cuda.current():  # every CUDA and TensorRT object of the backend is made on it
            self.onnx, self.calib = engine_inputs(bundle.path, precision, trt.__version__)
            if not self.onnx.is_file():
                raise SacEdgeError(
                    f"{bundle.path}: {self.onnx.name} is missing; TensorRT {self.generation.name} builds {precision} "
                    "from it (re-export the bundle with this sac-export)"
                )
            key = self._plan_key(device, options.refit and not self.rebuild_swaps)
            self.key, self.engine_dir = key, options.engine_dir or bundle.path / ENGINES_DIR
            plan, self.skipped = find_plan(bundle, key, self.engine_dir)
            self.device = f"{device.name} (sm {device.compute_capability})"
            self.built = plan is None
            self.plan = self._build(self.onnx, key) if plan is None else plan
            self._plan_bytes = self.plan.read_bytes()
            self._batch_lock = threading.Lock()
            self._weights: dict[str, np.ndarray] = {}
            self._runner = self._load(None)
            self._retired: _Engine | None = None
            dims = bundle.spec.obs_dim, bundle.spec.act_dim
            self._in_dtype = numpy_type(self._runner.engine.get_tensor_dtype(INPUT))
            self._out_dtype = numpy_type(self._runner.engine.get_tensor_dtype(OUTPUT))
            self._host_in = self.cuda.pinned((1, dims[0]), self._in_dtype)
            self._host_out = self.cuda.pinned((1, dims[1]), self._out_dtype)
            self._dev_in = self.cuda.device_alloc(self._host_in.nbytes)
            self._dev_out = self.cuda.device_alloc(self._host_out.nbytes)
            self._batch_in = self._batch_cuda.device_alloc(self._host_in.nbytes * MAX_BATCH)
            self._batch_out = self._batch_cuda.device_alloc(self._host_out.nbytes * MAX_BATCH)
            # pinned, so the batch copies are asynchronous (from pageable memory they silently are not)
            self._batch_host_in = self._batch_cuda.pinned((MAX_BATCH, dims[0]), self._in_dtype)
            self._batch_host_out = self._batch_cuda.pinned((MAX_BATCH, dims[1]), self._out_dtype)
            self._action = np.zeros(dims[1], np.float32)
            self._bind(self._runner)
            self.opened_as = "build" if self.built else "cached plan"  # the registry gates it before it serves

    def _plan_key(self, device: CudaDevice, refit: bool) -> PlanKey:
        """What a cached plan must have been built from and for: hashes of the verified bytes, so the files are
        never reopened by path (the build included)."""
        from sac_edge.common.trt.builder import PROFILES

        calib_sha = sha256_bytes(self.bundle.read(self.calib)) if self.calib is not None else ""
        onnx_sha = sha256_bytes(self.bundle.read(self.onnx))
        version = self.trt.__version__
        return PlanKey(
            version, device.name, device.compute_capability, onnx_sha, self.precision, calib_sha, refit, PROFILES
        )

    def parity_checked(self, passed: bool, result: Mapping[str, Any]) -> str:
        """The gate's result goes into a cached plan's sidecar; a failing cached plan is deleted (sidecar kept)."""
        cached = self.plan.parent == self.engine_dir
        if cached:
            record_parity(self.plan, result, delete_plan=not passed)
        return "plan deleted, not served" if cached else "not served"

    def _build(self, onnx: Path, key: PlanKey) -> Path:
        """Build into the cache, then the sidecar."""
        plan, _ = cached_plan_paths(self.engine_dir, key)
        self.engine_dir.mkdir(parents=True, exist_ok=True)
        info = self._build_plan(onnx, plan, key.refit, self.bundle.read(onnx))
        write_sidecar(plan, key, info.to_dict())
        return plan

    def _build_plan(self, onnx: Path, plan: Path, refit: bool, source: bytes) -> Any:
        """Export's builder on this thread's CUDA context from ``source`` (``onnx``'s verified bytes, or a
        graph made in memory): batch 1..MAX_BATCH, REFIT only if asked."""
        from sac_edge.common.trt.builder import BuildSettings, EngineSource, build_engine

        with self.cuda.current():
            calib_bytes = None if self.calib is None else self.bundle.read(self.calib)
            return build_engine(
                EngineSource(onnx, self.precision, self.calib, onnx_bytes=source, calib_bytes=calib_bytes),
                plan,
                BuildSettings(batch=(1, 1, MAX_BATCH), timing_cache=self.engine_dir / TIMING_CACHE, refit=refit),
            )

    def _load(self, weights: Mapping[str, np.ndarray] | None) -> _Engine:
        """A fresh engine from the plan (refitted with ``weights``), its two contexts on their profiles."""
        with self.cuda.current():
            engine = self.runtime.deserialize_cuda_engine(self._plan_bytes)
            if engine is None:
                raise SacEdgeError(f"{self.plan}: TensorRT could not deserialise the plan (delete it to rebuild)")
            if engine.num_optimization_profiles < 2:
                raise SacEdgeError(f"{self.plan}: the plan has one optimisation profile; delete it to rebuild")
            if weights:
                self._refit(engine, weights)
            contexts = []
            for profile, cuda in enumerate((self.cuda, self._batch_cuda)):
                context = engine.create_execution_context()
                if context is None:
                    raise SacEdgeError(f"{self.plan}: TensorRT could not create an execution context (out of memory?)")
                selected = context.set_optimization_profile_async(profile, cuda.stream)
                _ok(selected, f"select optimisation profile {profile}")
                cuda.sync()
                contexts.append(context)
            return _Engine(engine, contexts[0], contexts[1])

    def _refit(self, engine: Any, weights: Mapping[str, np.ndarray]) -> None:
        refitter = self._refitter(engine)
        for name, arr in weights.items():
            if not refitter.set_named_weights(name, self.trt.Weights(arr)):
                raise SacEdgeError(f"swap_weights: TensorRT refused weights {name!r} (wrong name, size or type)")
        missing = list(refitter.get_missing_weights())
        if missing:
            raise SacEdgeError(f"swap_weights: the refit lacks weights {', '.join(missing[:5])}")
        _ok(refitter.refit_cuda_engine(), "refit the engine")

    def _refitter(self, engine: Any) -> Any:
        from sac_edge.common.trt.api import create

        return create(self.trt.Refitter, engine, self.logger, logger=self.logger, what="create a refitter")

    def _bind(self, runner: _Engine) -> None:
        with self.cuda.current():
            _ok(runner.context.set_input_shape(INPUT, (1, self.spec.obs_dim)), "set the input shape")
            _ok(runner.context.set_tensor_address(INPUT, self._dev_in), "bind the input")
            _ok(runner.context.set_tensor_address(OUTPUT, self._dev_out), "bind the output")

    def act(self, obs: np.ndarray) -> np.ndarray:
        with self.cuda.current():
            self._host_in[:] = obs  # (obs_dim,) or (1, obs_dim), cast to the engine's input type
            runner = self._runner
            self.cuda.htod(self._dev_in, self._host_in)
            if not runner.context.execute_async_v3(self.cuda.stream):
                raise SacEdgeError("TensorRT could not enqueue the engine (act); use --backend onnxruntime")
            self.cuda.dtoh(self._host_out, self._dev_out)
            self.cuda.sync()
            np.copyto(self._action, self._host_out[0], casting="unsafe")
            return self._action

    def act_batch(self, obs: np.ndarray) -> np.ndarray:
        with self._batch_lock:
            return self._run_batch(self._runner, obs)  # one generation for the whole call

    def _run_batch(self, runner: _Engine, obs: np.ndarray) -> np.ndarray:
        """``obs`` through ``runner``'s profile-1 context in chunks of MAX_BATCH (caller holds the lock)."""
        cuda, ctx, out = self._batch_cuda, runner.batch_context, []
        with cuda.current():
            _ok(ctx.set_tensor_address(INPUT, self._batch_in), "bind the batch input")
            _ok(ctx.set_tensor_address(OUTPUT, self._batch_out), "bind the batch output")
            for start in range(0, len(obs), MAX_BATCH):  # the engine's profile stops at MAX_BATCH
                rows = len(obs[start : start + MAX_BATCH])
                host_in, host_out = self._batch_host_in[:rows], self._batch_host_out[:rows]
                host_in[:] = obs[start : start + rows]  # cast to the engine's input type
                _ok(ctx.set_input_shape(INPUT, host_in.shape), f"set the batch shape {host_in.shape}")
                cuda.htod(self._batch_in, host_in)
                _ok(ctx.execute_async_v3(cuda.stream), "enqueue the engine (act_batch)")
                cuda.dtoh(host_out, self._batch_out)
                cuda.sync()
                out.append(host_out.astype(np.float32))
            return np.concatenate(out) if out else np.empty((0, self.spec.act_dim), np.float32)

    def prepare_swap(self, weights: Mapping[str, np.ndarray]) -> PendingSwap:
        if not self.refittable:
            raise SacEdgeError(f"{self.plan.name}: engine was built without REFIT; swaps need sac-edge run --finetune")
        merged: dict[str, np.ndarray] = {}
        with self.cuda.current():
            if self.rebuild_swaps:  # REFIT builds are not trusted on this TensorRT: rebuilt with the new weights
                known = set(self._initializer_dtypes())
                runner, when = self._rebuild(weights), "rebuild"
                ignored = tuple(sorted(set(weights) - known))
                applied = len(weights) - len(ignored)
            else:
                refitter = self._refitter(self._runner.engine)
                known = set(refitter.get_all_weights())
                dtypes = self._initializer_dtypes()
                use = {
                    k: np.asarray(v, dtype=dtypes.get(k, np.float32), order="C")
                    for k, v in weights.items()
                    if k in known
                }
                ignored = tuple(sorted(set(weights) - known))
                when, applied = "refit", len(use)
                if self.precision == INT8 and ignored:
                    runner, when = self._rebuild(weights), "rebuild"
                    applied, ignored = len(weights), ()
                else:
                    merged = {**self._weights, **use}
                    runner = self._load(merged)

        def run_batch(obs: np.ndarray) -> np.ndarray:
            with self._batch_lock:  # the batch buffers are shared with act_batch
                return self._run_batch(runner, obs)

        def publish() -> None:
            self._bind(runner)
            self._retired, self._runner, self._weights = self._runner, runner, merged

        return PendingSwap(run_batch, weights, when, applied, ignored, publish)

    def _rebuild(self, weights: Mapping[str, np.ndarray]) -> _Engine:
        """A new engine built from the source graph with ``weights`` as its initializers (INT8 swaps the
        refitter cannot take completely); it replaces the plan bytes later refits start from."""
        import onnx
        from onnx import numpy_helper

        model = onnx.load_from_string(self.bundle.read(self.onnx))
        for init in model.graph.initializer:
            if init.name in weights:
                dtype = numpy_helper.to_array(init).dtype
                init.CopyFrom(numpy_helper.from_array(np.asarray(weights[init.name], dtype), init.name))
        work = self.engine_dir / SWAP_BUILDS
        work.mkdir(parents=True, exist_ok=True)
        plan = work / plan_name(self.precision)
        self._build_plan(self.onnx, plan, not self.rebuild_swaps, model.SerializeToString())
        self._plan_bytes = plan.read_bytes()
        return self._load(None)

    def _initializer_dtypes(self) -> dict[str, Any]:
        """The source graph's float initializer dtypes (fp16 in policy.fp16.onnx): refit weights match them."""
        if not hasattr(self, "_dtypes"):
            import onnx
            from onnx import numpy_helper

            graph = onnx.load_from_string(self.bundle.read(self.onnx)).graph
            self._dtypes = {i.name: numpy_helper.to_array(i).dtype for i in graph.initializer}
        return self._dtypes

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "file": self.plan.name,
            "built": self.built,
            "skipped_plans": self.skipped,
            "tensorrt": self.trt.__version__,
            "generation": self.generation.name,
            "refit": self.refittable,
            "swaps": "rebuild" if self.rebuild_swaps else "refit",
            "device": self.device,
        }

    def close(self) -> None:
        with self._batch_lock, self.cuda.current():
            self._runner = self._retired = None  # type: ignore[assignment]
            self._batch_cuda.close()
        self.cuda.close()
