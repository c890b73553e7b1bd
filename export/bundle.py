"""The deployment bundle, written into a hidden staging dir and moved into place only when complete.

Order: ONNX export -> parity (a failure aborts: nothing is written) -> learner tensors -> INT8 (calibration,
Q/DQ, cache, gate) -> TensorRT engines (here when possible, else deferred to the device) -> resolved config
-> manifest listing every file with its sha256. ``--force`` swaps an existing bundle out only after the new
one is complete (``common.atomic.atomic_dir``).
"""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx

from sac_edge.common.atomic import atomic_dir, atomic_write_json, check_output_path
from sac_edge.common.bundle_format import (
    ENVELOPE,
    EXPORT_CONFIG,
    FINETUNE_DIR,
    FP16,
    FP16_ONNX,
    INT8,
    LAYOUT,
    LEARNER,
    MANIFEST,
    PARITY_STATES,
    POLICY_ONNX,
    TIMING_CACHE,
    plan_name,
)
from sac_edge.common.config import save_config
from sac_edge.common.delay import DelayDistribution
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.io_layout import load_layout
from sac_edge.common.jsonfile import read_json
from sac_edge.common.manifest import MAX_MANIFEST_BYTES, files_table, is_sac_edge_manifest, write_manifest
from sac_edge.common.obs_history import ObsContract
from sac_edge.common.releases import RELEASE, new_release
from sac_edge.common.signing import Ed25519PrivateKey, sign_bundle
from sac_edge.common.tolerance import tolerance
from sac_edge.common.trt.builder import (
    BuildSettings,
    EngineSource,
    build_engine,
    engine_inputs,
    tensorrt_unavailable,
    tensorrt_version,
)
from sac_edge.common.versions import installed_version
from sac_edge.train.checkpoint import save_tensors

from .config import ExportConfig
from .delay_margin import delay_returns
from .envelope import envelope_for
from .fp16_onnx import write_fp16
from .onnx_export import INPUT, OUTPUT, OnnxInfo, check_tensorrt_ops, export_policy
from .parity import (
    GATE_STATES,
    Parity,
    derived_tolerance,
    held_out_states,
    measure_parity,
    onnx_actions,
    require_parity,
)
from .source import PolicySource

DEFERRED = "built on the device by sac-edge on first run"


class ExportResult(NamedTuple):
    bundle: Path
    manifest: dict[str, Any]
    parity: Parity
    parity_fp16: Parity | None  # policy.fp16.onnx vs policy.onnx (None without --fp16)
    int8: dict[str, Any] | None  # the calibration result and gate report (None without --int8)


def check_out(cfg: ExportConfig) -> None:
    """``--out`` must be new, or (with ``--force``) a bundle sac-export wrote whose fine-tuned weights may go.

    Checked before anything slow. ``--force`` never replaces a directory sac-export did not write (its
    manifest must have sac-edge's format fields), nor the last good fine-tuned weights in ``finetune/``
    unless ``--discard-finetuned`` says so: they exist nowhere else.
    """
    out = Path(cfg.out)
    if out.is_symlink() and not out.exists():  # exists() follows the link: the export would run, then fail
        raise SacEdgeError(f"--out {out} is a symlink to a missing path; remove it or choose another --out")
    check_output_path(out, "--out", directory=True)
    if out.exists() and not cfg.force:
        raise SacEdgeError(f"{out} already exists; pass --force to replace it (only once the new bundle is complete)")
    if not out.exists():
        return
    fix = "refusing to replace it, choose another --out"
    if out.is_symlink() or not out.is_dir() or not (out / MANIFEST).is_file():
        raise SacEdgeError(f"{out} exists and is not a bundle; {fix}")
    manifest = read_json(out / MANIFEST, "manifest", fix, max_bytes=MAX_MANIFEST_BYTES)
    if not is_sac_edge_manifest(manifest):
        raise SacEdgeError(f"{out}/{MANIFEST} was not written by sac-export; {fix}")
    finetuned = out / FINETUNE_DIR
    if finetuned.is_dir() and any(finetuned.glob("*.safetensors")) and not cfg.discard_finetuned:
        raise SacEdgeError(
            f"{finetuned} holds fine-tuned weights that --force would delete; move them away first, or pass "
            "--discard-finetuned to delete them"
        )


def write_bundle(cfg: ExportConfig, source: PolicySource, sign_key: Ed25519PrivateKey | None = None) -> ExportResult:
    """Write the bundle for ``source`` into ``cfg.out`` (``check_out`` decides whether an existing one may be
    replaced), signing its manifest with ``sign_key`` when given."""
    out = Path(cfg.out)
    check_out(cfg)
    layout = load_layout(cfg.layout) if cfg.layout is not None else None
    contract = ObsContract.from_dict(source.observation, "observation") if source.observation else None
    if layout is not None:  # before the slow work: a layout that does not fit the policy is refused at once
        # The layout describes the env's frame, the first values of a wider policy input (obs_history.py).
        frame_dim = source.spec.obs_dim if contract is None else contract.frame_dim
        layout.check_dims(frame_dim, source.spec.act_dim, f"--layout {cfg.layout}")
        layout.check_commands(source.spec.action_low, source.spec.action_high, f"--layout {cfg.layout}")
    with atomic_dir(out, replace=cfg.force) as stage:
        if layout is not None:
            atomic_write_json(stage / LAYOUT, layout.to_dict())
        onnx_info = export_policy(source.policy, source.spec.obs_dim, stage / POLICY_ONNX)
        states, origin = held_out_states(
            source.replay_states, stage / POLICY_ONNX, source.spec, cfg.parity_states, cfg.seed, source.states_name
        )
        tol = cfg.parity_tol or derived_tolerance(source.policy, states)
        parity = measure_parity(stage / POLICY_ONNX, source.reference, source.reference_name, states, origin, tol)
        require_parity(parity)
        np.save(stage / PARITY_STATES, states[:GATE_STATES])
        envelope = _envelope(cfg, source, stage)
        parity_fp16 = _fp16(stage, source, states, origin) if cfg.fp16 else None
        save_tensors(
            stage / LEARNER, source.learner, metadata={"format": "sac-edge learner", "env": source.spec.env_id}
        )
        int8 = _int8(cfg, source, stage, contract) if cfg.int8 else None
        if (out / TIMING_CACHE).is_file():  # a re-export on the same machine reuses the tactic timings
            shutil.copyfile(out / TIMING_CACHE, stage / TIMING_CACHE)
        engines = _engines(cfg, stage, int8)
        save_config(cfg, stage / EXPORT_CONFIG, spec=source.spec.to_dict(), source_kind=source.kind)
        manifest = _manifest(cfg, source, stage, onnx_info, parity, int8, engines)
        manifest["parity_fp16"] = parity_fp16.to_dict() if parity_fp16 else None
        manifest["envelope"] = envelope
        write_manifest(stage, manifest)
        if sign_key is not None:
            sign_bundle(stage, sign_key)
    return ExportResult(out, manifest, parity, parity_fp16, int8)


def _envelope(cfg: ExportConfig, source: PolicySource, stage: Path) -> dict[str, Any] | None:
    """``envelope.json`` from the training states and rollouts (``envelope.py``); its threshold and facts
    for the manifest, or None with ``--no-envelope`` or nothing to fit it on."""
    if not cfg.envelope or source.observation is not None:  # the shield checks frames: an envelope of the
        # assembled input (frames, last actions, history) would not describe what it sees
        return None
    envelope = envelope_for(
        source.replay_states,
        source.states_name,
        stage / POLICY_ONNX,
        source.spec,
        margin=cfg.envelope_margin,
        fpr=cfg.envelope_fpr,
        episodes=cfg.envelope_episodes,
        seed=cfg.seed,
    )
    if envelope is None:
        return None
    atomic_write_json(stage / ENVELOPE, envelope.to_dict())
    return {"threshold": envelope.threshold, "slew": envelope.slew is not None, **envelope.facts}


def _fp16(stage: Path, source: PolicySource, states: np.ndarray, origin: str) -> Parity:
    """``policy.fp16.onnx`` (what TensorRT 11 builds fp16 from), checked on the CPU against the fp32 graph."""
    write_fp16(stage / POLICY_ONNX, stage / FP16_ONNX, INPUT, OUTPUT)
    fp32 = stage / POLICY_ONNX
    parity = measure_parity(
        stage / FP16_ONNX,
        lambda obs: onnx_actions(fp32, obs),
        POLICY_ONNX,
        states,
        origin,
        tolerance(FP16, source.spec.action_low, source.spec.action_high),
    )
    require_parity(parity)
    return parity


def _int8(cfg: ExportConfig, source: PolicySource, stage: Path, contract: ObsContract | None) -> dict[str, Any]:
    """Calibration, ``policy.int8.onnx``, ``calib.cache`` and the accuracy gate (calibration/): rollouts and
    gate episodes assemble the policy's input as ``Runtime`` does (``contract``) under the median of the delay
    it trained under."""
    from sac_edge.calibration.pipeline import CalibrationOptions, quantize_and_gate
    from sac_edge.common.rollout import EnvSetup

    delay = source.action_delay
    median = DelayDistribution.from_dict(delay, "action_delay").quantile(0.5) if delay else 0

    options = CalibrationOptions(
        method=cfg.calib_method,
        method_overrides=calib_overrides(cfg.calib_overrides),
        gate_episodes=cfg.gate_episodes,
        seed=cfg.seed,
        calib_samples=cfg.calib_samples,
        rollout=EnvSetup(source.spec.env_id, contract, median) if source.spec.env_id else None,
    )
    result = quantize_and_gate(stage / POLICY_ONNX, stage, source.replay_states, source.spec, options)
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
    wanted = ([FP16] if cfg.fp16 else []) + ([INT8] if cfg.int8 else [])
    if not wanted:
        return {}
    reason = None if cfg.engine != "never" else "--engine never"
    reason = reason or tensorrt_unavailable()
    engines: dict[str, Any] = {}
    for precision in wanted:
        if precision == INT8 and not _int8_accepted(int8):
            engines[precision] = {"status": "skipped", "reason": "INT8 rejected by the accuracy gate"}
        elif reason is not None:
            engines[precision] = {"status": "deferred", "reason": reason, "build": DEFERRED}
        else:
            onnx_path, cache = engine_inputs(stage, precision, tensorrt_version())
            info = build_engine(
                EngineSource(onnx_path, precision, calib_cache=cache),
                stage / plan_name(precision),
                BuildSettings(
                    batch=(1, 1, cfg.max_batch),
                    workspace_bytes=cfg.workspace_mb << 20,
                    timing_cache=stage / TIMING_CACHE,
                ),
            )
            engines[precision] = {"status": "built", **info.to_dict()}
    return engines


def _versions() -> dict[str, str]:
    packages = ("sac-edge", "torch", "onnx", "onnxruntime", "onnxslim", "stable-baselines3")
    return {package: version for package in packages if (version := installed_version(package))}


def _delay_record(cfg: ExportConfig, source: PolicySource, stage: Path) -> dict[str, Any] | None:
    """The delay the policy trained under and the graph's returns at its median, p99 and 2x p99
    (``delay_margin.py``; ``--gate-episodes`` episodes each), None without one."""
    if source.action_delay is None:
        return None
    returns = delay_returns(
        stage / POLICY_ONNX, source.spec, source.observation, source.action_delay, cfg.gate_episodes, cfg.seed
    )
    return {**source.action_delay, "returns": returns}


def _manifest(
    cfg: ExportConfig,
    source: PolicySource,
    stage: Path,
    onnx_info: OnnxInfo,
    parity: Parity,
    int8: dict[str, Any] | None,
    engines: dict[str, Any],
) -> dict[str, Any]:
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
        "observation": source.observation,
        "action_delay": _delay_record(cfg, source, stage),
        "onnx": {"opset": onnx_info.opset, "ops": list(onnx_info.ops), "initializers": list(onnx_info.initializers)},
        "source": {
            "kind": source.kind,
            "path": str(source.path.resolve()),
            "checkpoint_sha256": source.sha256,
            **source.provenance,
        },
        "files": files_table(stage),
        "parity": parity.to_dict(),
        "calibration": int8.get("calibration") if int8 else None,
        "gate": int8.get("gate") if int8 else None,
        "tensorrt": engines,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        RELEASE: new_release(),  # signed with the rest: the device refuses older releases of a key
        "versions": _versions(),
        "engine_mode": cfg.engine,
    }
