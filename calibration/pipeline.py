"""The one call ``sac-export --int8`` makes: calibrate, insert Q/DQ, check, gate, write the INT8 artefacts."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from sac_edge.common.atomic import atomic_write_bytes
from sac_edge.common.bundle_format import CALIB_CACHE, INT8_CPU_ONNX, INT8_ONNX
from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.common.rollout import EnvSetup
from sac_edge.common.spec import PolicySpec
from sac_edge.common.trt.calib_cache import TRT_VERSION, write_cache

from .cache import cache_scales, cache_tensors
from .calibrators import compute_amax
from .check import check_qdq
from .gate import MAX_MEAN_ERROR_FRAC, Candidates, GateReport, GateSettings, action_errors, render_table, run_gate
from .graph import layer_name, linear_nodes
from .integer import integer_graph
from .qdq import quantizable_tensors, quantize_model
from .session import OnnxPolicy, collect_activations
from .states import StateSets, build_state_sets, validate_states


class Int8Result(NamedTuple):
    """The gate report, the files written (None when INT8 was rejected) and the calibration facts."""

    report: GateReport
    int8_onnx: Path | None
    calib_cache: Path | None
    calibration: dict[str, Any]  # for the manifest's ``calibration`` entry
    int8_cpu_onnx: Path | None = None  # the integer graph for onnxruntime's CPU provider (``integer.py``)

    def to_dict(self) -> dict[str, Any]:
        """``gate`` and ``calibration`` for the manifest, ``table`` for the terminal, ``files`` written."""
        files = [p.name for p in (self.int8_onnx, self.int8_cpu_onnx, self.calib_cache) if p is not None]
        return {
            "gate": self.report.to_dict(),
            "calibration": self.calibration,
            "table": render_table(self.report),
            "files": files,
        }


@dataclass(frozen=True)
class CalibrationOptions:
    """How the INT8 model is calibrated and gated (``sac-export --calib-method``, ``--calib-overrides``,
    ``--gate-episodes``, ``--seed``)."""

    method: str = "entropy"
    """minmax | percentile | entropy, for every tensor."""
    method_overrides: Mapping[str, str] | None = None
    """A method per tensor name, over ``method``."""
    percentile: float = 99.99
    """The percentile method's percentile."""
    gate_episodes: int = 10
    """Seeded episodes of the bundle's env the gate compares fp32 and INT8 on."""
    seed: int = 0
    """The gate's episodes' (and the rollout states') seed."""
    keep_float: Collection[str] = ()
    """MatMul/Gemm node names to leave in float from the start."""
    trt_version: int = TRT_VERSION
    """The TensorRT version ``calib.cache``'s header names."""
    calib_samples: int = 2048
    """Calibration states :func:`quantize_and_gate` builds (``sac-export --calib-samples``)."""
    holdout_samples: int = 2048
    """Held-out states :func:`quantize_and_gate` builds for the gate's action-error rule."""
    rollout: EnvSetup | None = None
    """The env as the policy is deployed in it: rollout states and gate episodes assemble its input (its
    observation contract) and apply its trained delay's median; None: the spec's env as is."""


def quantize_and_gate(
    fp32_onnx: Path,
    out_dir: Path,
    replay: np.ndarray | None,
    spec: PolicySpec,
    options: CalibrationOptions | None = None,
) -> Int8Result:
    """``sac-export --int8``: build the state sets (``replay`` = the run's ``calib_states.npy`` or None, plus
    rollouts of ``fp32_onnx``), then ``calibrate_and_gate`` with ``options``."""
    options = options or CalibrationOptions()
    states = build_state_sets(
        fp32_onnx,
        spec,
        calib_samples=options.calib_samples,
        holdout_samples=options.holdout_samples,
        replay=replay,
        seed=options.seed,
        rollout=options.rollout,
    )
    return calibrate_and_gate(fp32_onnx, out_dir, states, spec, options)


def calibrate_and_gate(
    fp32_onnx: Path, out_dir: Path, states: StateSets, spec: PolicySpec, options: CalibrationOptions | None = None
) -> Int8Result:
    """Calibrate ``fp32_onnx`` on ``states.calibration``, gate the Q/DQ model on ``states.holdout`` and
    ``options.gate_episodes`` seeded episodes of ``spec.env_id``, and write ``policy.int8.onnx`` and
    ``calib.cache`` into ``out_dir`` (atomically) only when the gate accepts it; then ``policy.int8-cpu.onnx``,
    the same model in integer storage for onnxruntime's CPU provider, when it passes the gate's action-error
    rule on the same held-out states.
    """
    options = options or CalibrationOptions()
    settings = GateSettings(
        options.gate_episodes, options.seed, rollout=options.rollout
    )  # its one-line check before any slow work
    model = _load_fp32(fp32_onnx)
    calibration = validate_states(states.calibration, spec.obs_dim, "calibration states")
    holdout = validate_states(states.holdout, spec.obs_dim, "held-out states")
    layers = [layer_name(n) for n in linear_nodes(model)]
    if not layers:
        raise SacEdgeError(f"{fp32_onnx}: no MatMul/Gemm layers to quantise")
    amax = _calibrate(model, calibration, options)

    def build(float_layers: frozenset[str]) -> onnx.ModelProto:
        candidate = quantize_model(model, amax, float_layers=float_layers)
        violations = check_qdq(candidate)
        if violations:
            raise InternalError(f"Q/DQ model breaks a TensorRT rule: {violations[0]}")
        return candidate

    report, accepted = run_gate(model, Candidates(build, layers, options.keep_float), holdout, spec, settings)
    facts: dict[str, Any] = {
        "method": options.method,
        "method_overrides": dict(options.method_overrides or {}),
        "percentile": options.percentile,
        "states": dict(states.counts),
        "amax": amax,
        "trt_cache_version": options.trt_version,
    }
    if accepted is None:
        return Int8Result(report, None, None, facts)
    int8_path, cache_path = out_dir / INT8_ONNX, out_dir / CALIB_CACHE
    atomic_write_bytes(int8_path, accepted.SerializeToString())
    write_cache(cache_path, cache_scales(model, amax, report.float_layers), options.trt_version)
    facts["cpu_graph"], cpu_path = _write_cpu_graph(model, accepted, holdout, spec, out_dir)
    return Int8Result(report, int8_path, cache_path, facts, cpu_path)


def _calibrate(model: onnx.ModelProto, calibration: np.ndarray, options: CalibrationOptions) -> dict[str, float]:
    """The amax of every tensor the Q/DQ model or ``calib.cache`` quantises, from the calibration states."""
    tensors = list(dict.fromkeys([*quantizable_tensors(model), *cache_tensors(model)]))
    return compute_amax(
        collect_activations(model, calibration, tensors),
        options.method,
        overrides=options.method_overrides,
        percentile=options.percentile,
    )


def _load_fp32(fp32_onnx: Path) -> onnx.ModelProto:
    """The fp32 graph, or one line saying why it cannot be read."""
    try:
        return onnx.load(str(fp32_onnx))
    except (OSError, DecodeError) as err:
        raise SacEdgeError(f"{fp32_onnx}: cannot read the fp32 ONNX model ({str(err).splitlines()[0]})") from None


def _write_cpu_graph(
    model: onnx.ModelProto, accepted: onnx.ModelProto, holdout: np.ndarray, spec: PolicySpec, out_dir: Path
) -> tuple[dict[str, Any], Path | None]:
    """``policy.int8-cpu.onnx`` (the accepted model in integer storage) when its actions on the held-out
    states pass the gate's mean action-error rule; its facts, and its path (None when it failed)."""
    cpu_graph = integer_graph(accepted)
    _, _, max_frac, mean_frac = action_errors(
        OnnxPolicy(model), OnnxPolicy(cpu_graph), holdout, spec.action_low, spec.action_high
    )
    cpu_passed = bool(np.isfinite(mean_frac) and mean_frac <= MAX_MEAN_ERROR_FRAC)
    facts = {
        "file": INT8_CPU_ONNX if cpu_passed else None,
        "mean_action_error_frac": mean_frac,
        "max_action_error_frac": max_frac,
        "passed": cpu_passed,
    }
    cpu_path = out_dir / INT8_CPU_ONNX if cpu_passed else None
    if cpu_path is not None:
        atomic_write_bytes(cpu_path, cpu_graph.SerializeToString())
    return facts, cpu_path
