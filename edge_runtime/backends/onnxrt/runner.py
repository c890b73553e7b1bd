"""onnxruntime backends: CPU, and the CUDA / TensorRT execution providers where the installed build has them.

The session is built once (graph optimisation level ALL, sequential execution, one intra-op thread by
default) and batch-1 runs go through an IOBinding bound to two OrtValues that wrap preallocated numpy
arrays, so the hot path copies the observation in and reads the action out of the same memory every
call. A weight swap publishes a new generation of the session with one assignment, built by one of three
strategies (``SwapStrategy``, selected by ``BackendOptions.swap``; ``SwapPath.AUTO`` picks as below):

- rebuilt (``FromFile``): a new session whose initializers are overridden with ``SessionOptions.add_initializer`` (the
  graph file is unchanged). onnxruntime holds the interpreter lock while it builds a session (another
  Python thread stalls for milliseconds: ``bench/weight_swap.py``), so this is the slow way;
- refilled in place (``InPlace``; fp32 on the CPU provider with ``BackendOptions.refit``, i.e. ``--finetune``): two
  generations are built at start, each over numpy arrays given by ``add_initializer`` with the session
  option ``session.disable_prepacking``, so the session reads the arrays where they are; a swap writes
  the new values into the retired generation's arrays and publishes it. No session is built during the
  run. The retired generation is refilled only once every ``act`` that may have read it has returned
  (``act`` counts calls in and out; ``act_batch`` holds a lock the refill takes); if one has not within
  ``RELEASE_TIMEOUT_S``, a fresh generation is built instead. At start the backend checks that this
  onnxruntime reads the arrays in place for this graph (a refilled generation must answer like a fresh
  session with the same values) and rebuilds on every swap if it does not.

Prepacking off costs the int8 graph its speed, so the int8 graphs (and the GPU providers, whose
sessions copy weights to the device and go through the parity gate) keep the rebuild. On the CPU
provider that rebuild (``FromPreOptimised``) starts from the graph onnxruntime has already optimised: at
start the backend saves it (``ORT_ENABLE_EXTENDED``, in onnxruntime's own format, in memory) and each
swap builds from it with optimisation off, overriding only the initializers that graph still has (the rest, such as an
int8 bias's scale, are folded into its fused nodes and follow from the others), which holds the
interpreter lock for a fraction of a build from the file (``bench/weight_swap.py``). At start the backend checks
that a session built that way with changed initializers answers like a full build with them, and rebuilds from the
file if it does not
(with onnxruntime's ConstantSharing off while saving, which would merge small initializers under new
names, the device pin and the newest onnxruntime both pass for the int8 graphs). Why fp32 refills in
place and int8 rebuilds: prepacking off costs fp32 about nothing at batch 1 and the int8 graph about
half its speed (``bench/weight_swap.py --sections prepack``, BENCHMARKS.md "Edge: weight swaps out of
the control process").

A swapped session never uses the TensorRT execution provider's engine cache: onnxruntime keys that cache by
the model file name, graph names and versions, not by weight values, so it would load the engine built
with the old weights. On the GPU providers the swapped session goes through the parity gate with the new
weights before it is published (the registry gates those kinds: ``Backend.swap_weights``).
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import FP32
from sac_edge.common.errors import SacEdgeError

from ..base import Backend, BackendOptions, PendingSwap, SwapPath, check_weights

INPUT, OUTPUT = "obs", "action"
#: Precisions whose CPU session is refilled in place when built for swaps (see the module docstring).
IN_PLACE_PRECISIONS = (FP32,)
RELEASE_TIMEOUT_S = 0.05
FATAL = 4  # onnxruntime's log severity levels: 0 verbose .. 3 error, 4 fatal
RELEASE_POLL_S = 1e-4
NO_PREPACKING = "session.disable_prepacking"
SAVE_FORMAT, LOAD_FORMAT = "session.save_model_format", "session.load_model_format"
#: Off while saving the pre-optimised graph: ConstantSharing merges equal small initializers (an int8 layer's
#: per-channel scales and zero points of a few outputs) under new names a swap cannot override.
KEEP_NAMES = ["ConstantSharing"]


class _PreOptimized(NamedTuple):
    """The graph as onnxruntime optimised it, in its own format, and the initializers it still has."""

    model: bytes
    names: frozenset[str]


class _Runner(NamedTuple):
    """One generation of the session, its binding, the OrtValues it must keep alive and, for an in-place
    generation, the initializer arrays the session reads (empty otherwise)."""

    session: Any
    binding: Any
    keep_alive: tuple[Any, ...]
    arrays: dict[str, np.ndarray]


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
        self,
        name: str,
        bundle: Bundle,
        precision: str,
        model: Path,
        providers: list[Any],
        options: BackendOptions,
        max_batch: int | None = None,
    ) -> None:
        """``max_batch``: the largest batch one run may take (the TensorRT provider's explicit profile);
        ``act_batch`` runs larger batches in chunks of it."""
        super().__init__(bundle.spec)
        self.name, self.precision, self.model, self.max_batch = name, precision, model, max_batch
        self._providers, self._threads, self._bundle = providers, options.threads, bundle
        self._model_bytes = bundle.read(model)  # the verified bytes: the file is never read again
        ort = import_ort()
        self._obs = np.zeros((1, bundle.spec.obs_dim), np.float32)
        self._action = np.zeros((1, bundle.spec.act_dim), np.float32)
        self._action_row = self._action[0]
        # the bound input's row: ``row[...] = obs`` stores an observation without a slice's view and its
        # broadcast set-up (cheaper cold); a (1, obs_dim) one is stored the same
        self._obs_row = self._obs[0]
        self._obs_value = ort.OrtValue.ortvalue_from_numpy(self._obs)
        self._action_value = ort.OrtValue.ortvalue_from_numpy(self._action)
        self._graph: dict[str, np.ndarray] | None = None
        self.entered = self.left = self._retired_at = 0  # act calls begun / returned; entered at the last flip
        self._batch_lock = threading.Lock()
        cpu_only = all((p if isinstance(p, str) else p[0]) == "CPUExecutionProvider" for p in providers)
        choices = strategies(options, cpu_only, precision, name)
        self._retired: _Runner | None = None
        self._runner = self._build({}, choices[0].in_place)
        wanted = self._providers[0] if isinstance(self._providers[0], str) else self._providers[0][0]
        active = self._runner.session.get_providers()
        if active[0] != wanted:
            raise SacEdgeError(
                f"backend {name!r}: onnxruntime fell back to {active[0]} (is {wanted} usable here?); "
                "use --backend onnxruntime"
            )
        for choice in choices:
            strategy = choice()
            if strategy.start(self):
                break
        else:  # only an explicit choice can end here: FromFile always starts
            raise SacEdgeError(
                f"backend {name!r}: swap strategy {options.swap.value!r} does not work with onnxruntime "
                f"{import_ort().__version__} on {model.name} (its start-up check failed); use SwapPath.AUTO"
            )
        self.swap_strategy: SwapStrategy = strategy
        """How this backend installs new weights (chosen at open; ``swap_strategy.path`` names it)."""

    @property
    def in_place(self) -> bool:
        """Whether swaps refill a retired generation in place."""
        return self.swap_strategy.in_place

    @property
    def serving(self) -> _Runner:
        """The generation ``act`` runs (read-only; tests and diagnostics)."""
        return self._runner

    @property
    def retired(self) -> _Runner | None:
        """The generation the last swap replaced, freed or refilled on the next swap (read-only)."""
        return self._retired

    def _options(self, level: str) -> Any:
        """Session options as every generation has them, at graph optimisation ``level``."""
        ort = import_ort()
        so = ort.SessionOptions()
        so.intra_op_num_threads = self._threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        so.log_severity_level = FATAL  # a failed run is the exception the caller reports, not coloured log lines
        return so

    def _build(
        self, initializers: Mapping[str, np.ndarray], in_place: bool = False, pre: _PreOptimized | None = None
    ) -> _Runner:
        """A session with ``initializers`` overriding the file's; ``in_place``: over copies of all the graph's
        swappable initializers (``initializers`` over the file's values), which it reads where they are;
        ``pre`` (with new initializers, not in place): built from that pre-optimised graph."""
        ort = import_ort()
        source: bytes = self._model_bytes
        if pre is not None and initializers and not in_place:
            so = self._options("ORT_DISABLE_ALL")
            so.add_session_config_entry(LOAD_FORMAT, "ORT")
            source = pre.model
            initializers = {k: v for k, v in initializers.items() if k in pre.names}
        else:
            so = self._options("ORT_ENABLE_ALL")
        arrays: dict[str, np.ndarray] = {}
        if in_place:
            so.add_session_config_entry(NO_PREPACKING, "1")
            arrays = {k: np.array(initializers.get(k, v), dtype=v.dtype) for k, v in self.swappable().items()}
            initializers = arrays
        values = []
        for key, arr in initializers.items():
            value = ort.OrtValue.ortvalue_from_numpy(arr)
            so.add_initializer(key, value)
            values.append(value)
        providers = swap_providers(self._providers) if initializers else self._providers
        try:
            session = ort.InferenceSession(source, so, providers=providers)
        except Exception as err:  # onnxruntime raises its own Fail/InvalidGraph types
            raise load_error(self.model, str(err), ort.__version__) from None
        binding = session.io_binding()
        binding.bind_ortvalue_input(INPUT, self._obs_value)
        binding.bind_ortvalue_output(OUTPUT, self._action_value)
        return _Runner(session, binding, (*values, *initializers.values()), arrays)

    def _pre_optimize(self) -> _PreOptimized | None:
        """The graph optimised once for the swaps' rebuilds, if a build from it with every swappable tensor
        changed (integers negated, floats doubled: each layer stays self-consistent, an int8 bias's scale
        doubling with its weight's) answers like a build from the file with them: an initializer the
        optimiser renamed, copied or folded in a way a swap cannot follow shows as a different action."""
        pre = self._save_optimised()
        if pre is None:
            return None
        changed = {
            k: -v if v.dtype.kind == "i" else v * np.asarray(2, v.dtype)
            for k, v in self.swappable().items()
            if v.ndim > 0
        }
        return pre if self._answers_like_the_file(self._build(changed, pre=pre), changed) else None

    def _save_optimised(self) -> _PreOptimized | None:
        """The graph at ``ORT_ENABLE_EXTENDED`` in onnxruntime's format, with its initializers' names."""
        ort = import_ort()
        try:
            with tempfile.TemporaryDirectory(prefix="sac-edge-ort.") as tmp:
                for fmt in ("ORT", "ONNX"):  # onnxruntime's format to load; ONNX to read the names with onnx
                    so = self._options("ORT_ENABLE_EXTENDED")
                    so.optimized_model_filepath = str(Path(tmp) / f"optimised.{fmt.lower()}")
                    so.add_session_config_entry(SAVE_FORMAT, fmt)
                    ort.InferenceSession(
                        self._model_bytes, so, providers=self._providers, disabled_optimizers=KEEP_NAMES
                    )
                import onnx

                names = frozenset(i.name for i in onnx.load(str(Path(tmp) / "optimised.onnx")).graph.initializer)
                return _PreOptimized((Path(tmp) / "optimised.ort").read_bytes(), names)
        except Exception:  # a build that cannot save its optimised graph: swaps rebuild from the file
            return None

    def _answers_like_the_file(self, runner: _Runner, changed: Mapping[str, np.ndarray]) -> bool:
        """Whether ``runner``, holding the ``changed`` initializers, answers like a session built from the file
        with them."""
        obs = np.linspace(-1.0, 1.0, 4 * self.spec.obs_dim, dtype=np.float32).reshape(4, self.spec.obs_dim)
        want = self._build(changed).session.run([OUTPUT], {INPUT: obs})[0]
        got = runner.session.run([OUTPUT], {INPUT: obs})[0]
        return bool(np.allclose(got, want, rtol=1e-5, atol=1e-6))

    def act(self, obs: np.ndarray) -> np.ndarray:
        # (obs_dim,) or (1, obs_dim), stored into the bound input in place: the control loop's path, measured
        # in BENCHMARKS.md, "Edge: the action in the control loop"
        self._obs_row[...] = obs
        self.entered += 1  # before reading the generation: a swap waits for this call to return
        runner = self._runner
        try:
            # No RunOptions: one per call cost more than the inference (docs/journal/benchmarks.md, "Stop 11")
            runner.session.run_with_iobinding(runner.binding)
        finally:
            self.left += 1
        return self._action_row

    def bare_call(self) -> Callable[[], object]:
        runner = self._runner
        return lambda: runner.session.run_with_iobinding(runner.binding)

    def act_batch(self, obs: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(obs, dtype=np.float32)
        step = self.max_batch or max(len(rows), 1)
        with self._batch_lock:
            session = self._runner.session  # one generation for the whole call
            if len(rows) <= step:
                return session.run([OUTPUT], {INPUT: rows})[0]
            return np.concatenate(
                [session.run([OUTPUT], {INPUT: rows[i : i + step]})[0] for i in range(0, len(rows), step)]
            )

    def swappable(self) -> dict[str, np.ndarray]:
        """The graph's swappable initializers as stored in the file: float, and the int8 weights / int32
        biases of an integer INT8 graph (onnx is imported only here, for swaps)."""
        if self._graph is None:
            try:
                import onnx
                from onnx import numpy_helper
            except ImportError:
                raise SacEdgeError("swap_weights with onnxruntime needs the Python package 'onnx'") from None
            kinds = (onnx.TensorProto.FLOAT, onnx.TensorProto.INT8, onnx.TensorProto.INT32)
            graph = onnx.load_from_string(self._model_bytes).graph
            self._graph = {i.name: numpy_helper.to_array(i) for i in graph.initializer if i.data_type in kinds}
        return self._graph

    def _reads_in_place(self) -> bool:
        """Whether the retired generation, refilled with other values, answers like a fresh session built
        with them (it does on the onnxruntime versions measured; an optimizer that copied a weight at load
        would make refills silently ineffective)."""
        assert self._retired is not None
        graph = self.swappable()
        other = {k: np.asarray(v * 0.5 + 0.125, v.dtype) for k, v in graph.items() if v.dtype == np.float32}
        self._refill(self._retired, other)
        try:
            return self._answers_like_the_file(self._retired, other)
        finally:
            self._refill(self._retired, {})

    def _refill(self, runner: _Runner, values: Mapping[str, np.ndarray]) -> None:
        """Write ``values`` (the file's for names it lacks) into an in-place generation's arrays."""
        with self._batch_lock:
            for name, arr in runner.arrays.items():
                np.copyto(arr, values.get(name, self.swappable()[name]), casting="unsafe")

    def _released(self) -> bool:
        """Whether every ``act`` that began before the last flip has returned (waits up to
        ``RELEASE_TIMEOUT_S``): only then may the retired generation be written."""
        deadline = time.monotonic() + RELEASE_TIMEOUT_S
        while self.left < self._retired_at:
            if time.monotonic() > deadline:
                return False
            time.sleep(RELEASE_POLL_S)
        return True

    def prepare_swap(self, weights: Mapping[str, np.ndarray]) -> PendingSwap:
        known = self.swappable()
        shapes = {k: tuple(v.shape) for k, v in known.items()}
        use, ignored = check_weights(weights, shapes, {k: v.dtype for k, v in known.items()})
        runner = self.swap_strategy.next_generation(self, use)

        def publish() -> None:
            # the old generation is refilled or freed on the next swap, here (never by the control thread)
            self._retired, self._runner = self._runner, runner
            self._retired_at = self.entered

        # the gate's reference gets every weight asked for: a generation that did not take one of them fails
        return PendingSwap(
            lambda obs: runner.session.run([OUTPUT], {INPUT: obs})[0], weights, "swap", len(use), ignored, publish
        )

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "file": self.model.name,
            "providers": self._runner.session.get_providers(),
            "threads": self._threads,
            "swap": self.swap_strategy.path.value,
            "onnxruntime": import_ort().__version__,
        }


class SwapStrategy:
    """How an ``OrtBackend`` builds the generation a swap publishes; ``start`` prepares it at open."""

    path: ClassVar[SwapPath]
    in_place: ClassVar[bool] = False
    """Whether generations are built over arrays the strategy refills (the serving one included)."""

    def start(self, backend: OrtBackend) -> bool:
        """Prepare at open, on the serving generation; False when this onnxruntime cannot do it for the graph."""
        return True

    def next_generation(self, backend: OrtBackend, use: Mapping[str, np.ndarray]) -> _Runner:
        """A generation holding ``use`` (checked weights), not yet published."""
        return backend._build(use)


class FromFile(SwapStrategy):
    """A new session from the graph file with the new initializers (works everywhere; the slowest)."""

    path = SwapPath.FROM_FILE


class FromPreOptimised(SwapStrategy):
    """A new session from the graph onnxruntime optimised at start, with optimisation off."""

    path = SwapPath.PRE_OPTIMISED

    def __init__(self) -> None:
        self.graph: _PreOptimized | None = None

    def start(self, backend: OrtBackend) -> bool:
        self.graph = backend._pre_optimize()
        return self.graph is not None

    def next_generation(self, backend: OrtBackend, use: Mapping[str, np.ndarray]) -> _Runner:
        return backend._build(use, pre=self.graph)


class InPlace(SwapStrategy):
    """Two generations over numpy arrays; a swap refills the retired one once no ``act`` can hold it."""

    path = SwapPath.IN_PLACE
    in_place = True

    def start(self, backend: OrtBackend) -> bool:
        backend._retired = backend._build({}, in_place=True)
        if backend._reads_in_place():
            return True
        backend._retired = None
        return False

    def next_generation(self, backend: OrtBackend, use: Mapping[str, np.ndarray]) -> _Runner:
        retired = backend._retired
        if retired is not None and retired.arrays and backend._released():
            backend._refill(retired, use)
            return retired
        return backend._build(use, in_place=True)  # an act still holds the retired one: a fresh generation


STRATEGIES: dict[SwapPath, type[SwapStrategy]] = {s.path: s for s in (InPlace, FromPreOptimised, FromFile)}


def strategies(options: BackendOptions, cpu_only: bool, precision: str, name: str) -> list[type[SwapStrategy]]:
    """The strategies to try at open, in order: ``options.swap`` alone, or for ``SwapPath.AUTO`` the fastest
    first where ``options.refit`` asks for swaps on the CPU provider."""
    if options.swap is SwapPath.AUTO:
        if not (options.refit and cpu_only):
            return [FromFile]
        return (
            [InPlace, FromPreOptimised, FromFile] if precision in IN_PLACE_PRECISIONS else [FromPreOptimised, FromFile]
        )
    if not cpu_only and options.swap is not SwapPath.FROM_FILE:
        raise SacEdgeError(
            f"backend {name!r}: swap strategy {options.swap.value!r} runs on the CPU provider only "
            "(a GPU session copies its weights to the device); use SwapPath.AUTO"
        )
    return [STRATEGIES[options.swap]]
