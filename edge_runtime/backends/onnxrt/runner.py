"""onnxruntime backends: CPU, and the CUDA / TensorRT execution providers where the installed build has them.

The session is built once (graph optimisation level ALL, sequential execution, one intra-op thread by
default) and batch-1 runs go through an IOBinding bound to two OrtValues that wrap preallocated numpy
arrays, so the hot path copies the observation in and reads the action out of the same memory every
call. A weight swap builds a second session whose initializers are overridden with
``SessionOptions.add_initializer`` (the graph file is unchanged) and publishes it with one assignment.

A swapped session never uses the TensorRT execution provider's engine cache: onnxruntime keys that cache by
the model file name, graph names and versions, not by weight values, so it would load the engine built
with the old weights. On the GPU providers the swapped session goes through the parity gate with the new
weights before it is published.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from sac_edge.common.errors import SacEdgeError

from ..base import Backend, BackendOptions, Bundle, SwapReport, check_weights
from ..parity_gate import GATED_BACKENDS, require, verify

INPUT, OUTPUT = "obs", "action"


class _Runner(NamedTuple):
    """One immutable generation of the session, its binding and the OrtValues it must keep alive."""

    session: Any
    binding: Any
    keep_alive: tuple[Any, ...]


_TOO_NEW = (
    (re.compile(r"Opset (\d+) is under development.*till opset (\d+)", re.S), "ai.onnx opset"),
    (re.compile(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)"), "ONNX IR version"),
)


def load_error(model: Path, message: str, ort_version: str) -> SacEdgeError:
    """One line for a graph onnxruntime cannot load; a graph newer than it supports names both versions."""
    for pattern, what in _TOO_NEW:
        match = pattern.search(message)
        if match:
            return SacEdgeError(
                f"{model} needs {what} {match.group(1)}, onnxruntime {ort_version} supports up to {match.group(2)}: "
                "pip install -U onnxruntime (onnxruntime-gpu on a Jetson), or export with an older sac-export"
            )
    return SacEdgeError(f"{model}: onnxruntime cannot load it ({message.splitlines()[0]})")


def import_ort() -> Any:
    import onnxruntime

    return onnxruntime


def swap_providers(providers: list[Any]) -> list[Any]:
    """``providers`` with the TensorRT execution provider's engine cache off (for sessions with new weights)."""
    out: list[Any] = []
    for entry in providers:
        if isinstance(entry, tuple) and entry[0] == "TensorrtExecutionProvider":
            entry = (entry[0], {**entry[1], "trt_engine_cache_enable": False})
        out.append(entry)
    return out


class OrtBackend(Backend):
    """One precision of the bundle on one onnxruntime execution-provider list."""

    def __init__(
        self, name: str, bundle: Bundle, precision: str, model: Path, providers: list[Any], options: BackendOptions
    ) -> None:
        super().__init__(bundle.spec)
        self.name, self.precision, self.model = name, precision, model
        self._providers, self._threads, self._bundle = providers, options.threads, bundle
        ort = import_ort()
        self._obs = np.zeros((1, bundle.spec.obs_dim), np.float32)
        self._action = np.zeros((1, bundle.spec.act_dim), np.float32)
        self._obs_row, self._action_row = self._obs[0], self._action[0]
        self._obs_value = ort.OrtValue.ortvalue_from_numpy(self._obs)
        self._action_value = ort.OrtValue.ortvalue_from_numpy(self._action)
        self._runner = self._build({})
        self._retired: _Runner | None = None
        self._known: dict[str, tuple[tuple[int, ...], Any]] | None = None
        wanted = self._providers[0] if isinstance(self._providers[0], str) else self._providers[0][0]
        active = self._runner.session.get_providers()
        if active[0] != wanted:
            raise SacEdgeError(
                f"backend {name!r}: onnxruntime fell back to {active[0]} (is {wanted} usable here?); "
                "use --backend onnxruntime"
            )

    def _build(self, initializers: Mapping[str, np.ndarray]) -> _Runner:
        ort = import_ort()
        so = ort.SessionOptions()
        so.intra_op_num_threads = self._threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        values = []
        for key, arr in initializers.items():
            value = ort.OrtValue.ortvalue_from_numpy(arr)
            so.add_initializer(key, value)
            values.append(value)
        providers = swap_providers(self._providers) if initializers else self._providers
        try:
            session = ort.InferenceSession(str(self.model), so, providers=providers)
        except Exception as err:  # onnxruntime raises its own Fail/InvalidGraph types
            raise load_error(self.model, str(err), ort.__version__) from None
        binding = session.io_binding()
        binding.bind_ortvalue_input(INPUT, self._obs_value)
        binding.bind_ortvalue_output(OUTPUT, self._action_value)
        return _Runner(session, binding, (*values, *initializers.values()))

    def act(self, obs: np.ndarray) -> np.ndarray:
        np.copyto(self._obs_row, obs.reshape(-1), casting="unsafe")
        runner = self._runner
        runner.session.run_with_iobinding(runner.binding)  # no RunOptions: passing one costs ~30 us a call
        return self._action_row

    def act_batch(self, obs: np.ndarray) -> np.ndarray:
        feed = {INPUT: np.ascontiguousarray(obs, dtype=np.float32)}
        return self._runner.session.run([OUTPUT], feed)[0]

    def _initializers(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Shape and dtype of the graph's swappable initializers: float, and the int8 weights / int32 biases
        of an integer INT8 graph (onnx is imported only here, for swaps)."""
        if self._known is None:
            try:
                import onnx
            except ImportError:
                raise SacEdgeError("swap_weights with onnxruntime needs the Python package 'onnx'") from None
            dtypes = {
                onnx.TensorProto.FLOAT: np.float32,
                onnx.TensorProto.INT8: np.int8,
                onnx.TensorProto.INT32: np.int32,
            }
            graph = onnx.load(str(self.model), load_external_data=False).graph
            self._known = {
                init.name: (tuple(int(d) for d in init.dims), dtypes[init.data_type])
                for init in graph.initializer
                if init.data_type in dtypes
            }
        return self._known

    def swap_weights(self, weights: Mapping[str, np.ndarray]) -> SwapReport:
        start = time.perf_counter()
        known = self._initializers()
        use, ignored = check_weights(
            weights, {k: s for k, (s, _) in known.items()}, {k: d for k, (_, d) in known.items()}
        )
        runner = self._build(use)
        if self.name in GATED_BACKENDS:
            parity = verify(
                lambda obs: runner.session.run([OUTPUT], {INPUT: obs})[0],
                None,
                self._bundle,
                self.name,
                self.precision,
                "swap",
                use,
            )
            self.parity = require(parity, "the swap was not applied").to_dict()
        self._retired, self._runner = self._runner, runner  # the old one is freed on the next swap, here
        self.swaps += 1
        return SwapReport(len(use), ignored, time.perf_counter() - start)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "file": self.model.name,
            "providers": self._runner.session.get_providers(),
            "threads": self._threads,
            "onnxruntime": import_ort().__version__,
        }
