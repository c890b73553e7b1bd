"""The deployment bundle, written into a hidden staging dir and moved into place only when complete.

Order: ONNX export -> parity (a failure aborts: nothing is written) -> learner tensors -> INT8 (calibration,
Q/DQ, cache, gate) -> TensorRT engines (here when possible, else deferred to the device) -> resolved config
-> manifest listing every file with its sha256. ``--force`` swaps an existing bundle out only after the new
one is complete (``common.atomic.atomic_dir``).
"""

from __future__ import annotations

import datetime
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple

import onnx

from sac_edge.common.atomic import atomic_dir
from sac_edge.common.config import save_config
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.manifest import file_entry, write_manifest
from sac_edge.train.checkpoint import save_tensors

from .config import ExportConfig
from .onnx_export import INPUT, OUTPUT, OnnxInfo, check_tensorrt_ops, export_policy
from .parity import Parity, held_out_states, measure_parity, require_parity
from .source import PolicySource
from .tensorrt import TIMING_CACHE, build_engine, engine_inputs, plan_name, tensorrt_major, tensorrt_unavailable

POLICY_ONNX = "policy.onnx"
INT8_ONNX = "policy.int8.onnx"
CALIB_CACHE = "calib.cache"
LEARNER = "learner.safetensors"
EXPORT_CONFIG = "export_config.json"

# name -> (kind, precision) for the manifest's files table
FILE_KINDS: dict[str, tuple[str, str | None]] = {
    POLICY_ONNX: ("onnx", "fp32"),
    INT8_ONNX: ("onnx", "int8"),
    CALIB_CACHE: ("calibration-cache", "int8"),
    LEARNER: ("learner", "fp32"),
    EXPORT_CONFIG: ("config", None),
    TIMING_CACHE: ("tensorrt-timing-cache", None),
    **{plan_name(p): ("tensorrt-engine", p) for p in ("fp32", "fp16", "int8")},
}
DEFERRED = "built on the device by sac-edge on first run"


class ExportResult(NamedTuple):
    bundle: Path
    manifest: dict[str, Any]
    parity: Parity
    int8: dict[str, Any] | None  # the calibration result and gate report (None without --int8)


def write_bundle(cfg: ExportConfig, source: PolicySource) -> ExportResult:
    """Write the bundle for ``source`` into ``cfg.out`` (refusing an existing one unless ``cfg.force``)."""
    out = Path(cfg.out)
    if out.exists() and not cfg.force:
        raise SacEdgeError(f"{out} already exists; pass --force to replace it (only once the new bundle is complete)")
    if out.exists() and not (out / "manifest.json").is_file():
        raise SacEdgeError(f"{out} exists and is not a bundle; refusing to replace it, choose another --out")
    with atomic_dir(out, replace=cfg.force) as stage:
        onnx_info = export_policy(source.policy, source.spec.obs_dim, stage / POLICY_ONNX)
        states, origin = held_out_states(
            source.replay_states, stage / POLICY_ONNX, source.spec, cfg.parity_states, cfg.seed, source.states_name
        )
        parity = measure_parity(
            stage / POLICY_ONNX, source.reference, source.reference_name, states, origin, cfg.parity_tol
        )
        require_parity(parity)
        save_tensors(
            stage / LEARNER, source.learner, metadata={"format": "sac-edge learner", "env": source.spec.env_id}
        )
        int8 = _int8(cfg, source, stage) if cfg.int8 else None
        if (out / TIMING_CACHE).is_file():  # a re-export on the same machine reuses the tactic timings
            shutil.copyfile(out / TIMING_CACHE, stage / TIMING_CACHE)
        engines = _engines(cfg, stage, int8)
        save_config(cfg, stage / EXPORT_CONFIG, spec=source.spec.to_dict(), source_kind=source.kind)
        manifest = _manifest(cfg, source, stage, onnx_info, parity, int8, engines)
        write_manifest(stage, manifest)
    return ExportResult(out, manifest, parity, int8)


def _int8(cfg: ExportConfig, source: PolicySource, stage: Path) -> dict[str, Any]:
    """Calibration, ``policy.int8.onnx``, ``calib.cache`` and the accuracy gate (calibration/)."""
    from sac_edge.calibration.pipeline import quantize_and_gate

    result = quantize_and_gate(
        stage / POLICY_ONNX,
        stage,
        source.replay_states,
        source.spec,
        calib_samples=cfg.calib_samples,
        method=cfg.calib_method,
        method_overrides=calib_overrides(cfg.calib_overrides),
        gate_episodes=cfg.gate_episodes,
        seed=cfg.seed,
    )
    if result.int8_onnx is not None:
        check_tensorrt_ops(onnx.load(str(result.int8_onnx)))
    return result.to_dict()


def calib_overrides(items: tuple[str, ...]) -> dict[str, str]:
    """``("tensor=method", ...)`` -> ``{tensor: method}``."""
    out = {}
    for item in items:
        name, sep, method = item.rpartition("=")
        if not sep or not name:
            raise SacEdgeError(f"--calib-overrides entry {item!r} is not TENSOR=METHOD")
        out[name] = method
    return out


def _int8_accepted(int8: dict[str, Any] | None) -> bool:
    return int8 is not None and int8["gate"]["verdict"] == "accepted"


def _engines(cfg: ExportConfig, stage: Path, int8: dict[str, Any] | None) -> dict[str, Any]:
    """Build the engines asked for when TensorRT and a GPU are here; otherwise record them as deferred."""
    wanted = (["fp16"] if cfg.fp16 else []) + (["int8"] if cfg.int8 else [])
    if not wanted:
        return {}
    reason = None if cfg.engine != "never" else "--engine never"
    reason = reason or tensorrt_unavailable()
    engines: dict[str, Any] = {}
    for precision in wanted:
        if precision == "int8" and not _int8_accepted(int8):
            engines[precision] = {"status": "skipped", "reason": "INT8 rejected by the accuracy gate"}
        elif reason is not None:
            engines[precision] = {"status": "deferred", "reason": reason, "build": DEFERRED}
        else:
            onnx_path, cache = engine_inputs(stage, precision, tensorrt_major())
            info = build_engine(
                onnx_path,
                stage / plan_name(precision),
                precision,
                calib_cache=cache,
                batch=(1, 1, cfg.max_batch),
                workspace_bytes=cfg.workspace_mb << 20,
                timing_cache=stage / TIMING_CACHE,
            )
            engines[precision] = {"status": "built", **info.to_dict()}
    return engines


def _versions() -> dict[str, str]:
    out = {}
    for package in ("sac-edge", "torch", "onnx", "onnxruntime", "onnxslim", "stable-baselines3"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return out


def _manifest(
    cfg: ExportConfig,
    source: PolicySource,
    stage: Path,
    onnx_info: OnnxInfo,
    parity: Parity,
    int8: dict[str, Any] | None,
    engines: dict[str, Any],
) -> dict[str, Any]:
    files = {}
    for child in sorted(stage.iterdir()):
        if child.is_file() and child.name in FILE_KINDS:
            kind, precision = FILE_KINDS[child.name]
            files[child.name] = file_entry(stage, child.name, kind=kind, precision=precision)
    spec = source.spec
    return {
        "spec": spec.to_dict(),
        "action_low": list(spec.action_low),
        "action_high": list(spec.action_high),
        "io": {
            "input": INPUT,
            "output": OUTPUT,
            "input_shape": ["batch", spec.obs_dim],
            "output_shape": ["batch", spec.act_dim],
        },
        "onnx": {"opset": onnx_info.opset, "ops": list(onnx_info.ops), "initializers": list(onnx_info.initializers)},
        "source": {
            "kind": source.kind,
            "path": str(source.path.resolve()),
            "checkpoint_sha256": source.sha256,
            **source.provenance,
        },
        "files": files,
        "parity": parity.to_dict(),
        "calibration": int8.get("calibration") if int8 else None,
        "gate": int8.get("gate") if int8 else None,
        "tensorrt": engines,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "engine_mode": cfg.engine,
    }
