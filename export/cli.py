"""``sac-export RUN --out BUNDLE``: a run dir or SB3 zip -> verified ONNX / INT8 / TensorRT bundle."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sac_edge.common.config import parse_config
from sac_edge.common.errors import SacEdgeError, require_extra, run_cli
from sac_edge.common.io_layout import load_layout
from sac_edge.common.signing import load_private_key
from sac_edge.common.summary import emit_json
from sac_edge.common.trt.builder import tensorrt_unavailable

from .config import ExportConfig

if TYPE_CHECKING:
    from .bundle import ExportResult

NEEDS = ("torch", "onnxslim")
"""What exporting imports beyond the device install: pyproject's ``train`` extra."""

PROG = "sac-export"
GATE_SUMMARY = (
    "verdict",
    "max_action_error",
    "mean_action_error",
    "max_action_error_frac",
    "mean_action_error_frac",
    "fp32_mean_return",
    "int8_mean_return",
    "return_drop",
    "allowed_return_drop",
    "float_layers",
)
DESCRIPTION = "Export a trained SAC actor (sac-edge run dir or Stable-Baselines3 .zip) to a deployment bundle."


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(PROG, _main, argv)


def _main(argv: Sequence[str] | None) -> int:
    cfg = parse_config(ExportConfig, argv, PROG, DESCRIPTION, positional=["run"])
    _check_flags(cfg)
    require_extra(PROG, "train", NEEDS)
    from .bundle import check_out, write_bundle  # torch loads here, after the flags and the extra are checked
    from .source import load_source

    if cfg.engine == "always":
        reason = tensorrt_unavailable()
        if reason is not None:
            raise SacEdgeError(f"--engine always: {reason}; use --engine auto to defer engines to the device")
    check_out(cfg)  # before the slow work: a refused --out is known at once
    if cfg.layout is not None:
        load_layout(cfg.layout)  # its syntax before the source is read; its sizes are checked against the policy
    key = load_private_key(cfg.sign_key) if cfg.sign_key else None
    source = load_source(cfg.run, cfg.env, cfg.vecnormalize)
    result = write_bundle(cfg, source, key)
    print(report(result))
    if cfg.json:
        emit_json(summary(result))
    return 0


#: Each count's largest value: about 100 times the default, where the export still ends in minutes (a larger
#: one ran for hours or until the allocator failed); ``--workspace-mb`` 1 TiB (more is a size in bytes).
MOST = {
    "parity_states": 1_000_000,
    "calib_samples": 1_000_000,
    "gate_episodes": 1_000,
    "envelope_episodes": 1_000,
    "max_batch": 65_536,
    "workspace_mb": 1_048_576,
}


def _check_flags(cfg: ExportConfig) -> None:
    for name in ("parity_states", "calib_samples", "max_batch", "workspace_mb"):
        if getattr(cfg, name) < 1:
            raise SacEdgeError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(cfg, name)})")
    if cfg.gate_episodes < 1:
        raise SacEdgeError(f"--gate-episodes must be >= 1 (got {cfg.gate_episodes})")
    for name, most in MOST.items():
        if getattr(cfg, name) > most:
            raise SacEdgeError(f"--{name.replace('_', '-')} must be at most {most} (got {getattr(cfg, name)})")
    if cfg.discard_finetuned and not cfg.force:
        raise SacEdgeError("--discard-finetuned only makes sense with --force")
    if not 0 <= cfg.envelope_margin <= 10:
        raise SacEdgeError(
            f"--envelope-margin must be from 0 to 10 (a fraction of the span), got {cfg.envelope_margin}"
        )
    if not 0 < cfg.envelope_fpr < 0.5:
        raise SacEdgeError(f"--envelope-fpr must be a rate in (0, 0.5), got {cfg.envelope_fpr}")
    if cfg.envelope_episodes < 0:
        raise SacEdgeError(f"--envelope-episodes must be >= 0 (got {cfg.envelope_episodes})")
    if not cfg.parity_tol >= 0:
        raise SacEdgeError(f"--parity-tol must be 0 (derived) or more (got {cfg.parity_tol})")


def report(result: ExportResult) -> str:
    """The terminal report: parity, file sizes, engines and (with --int8) the gate table."""
    m, p = result.manifest, result.parity
    lines = [
        f"bundle {result.bundle}  ({m['spec']['env_id'] or 'no --env'}, obs {m['spec']['obs_dim']} -> "
        f"act {m['spec']['act_dim']}, from {m['source']['kind']})",
        f"parity vs {p.reference}: max abs {p.max_abs:.2e}, mean abs {p.mean_abs:.2e} on {p.states} held-out states "
        f"({p.state_source}; tol {p.tol:g}) {'ok' if p.passed else 'FAILED'}",
        "files:",
    ]
    for name, entry in m["files"].items():
        lines.append(f"  {name:<24} {entry['bytes'] / 1024:9.1f} KiB  {entry['kind']:<22} {entry['precision'] or ''}")
    for precision, engine in m["tensorrt"].items():
        status = engine["status"]
        detail = (
            f"TensorRT {engine['tensorrt_version']} on {engine['device']} (sm {engine['compute_capability']}), "
            f"{engine['build_s']:.1f} s"
            if status == "built"
            else engine["reason"] + (f"; {engine['build']}" if "build" in engine else "")
        )
        lines.append(f"engine {precision}: {status} ({detail})")
    delay = m.get("action_delay")
    if delay:
        shown = ", ".join(f"{k} {v['steps']} steps: {v['mean_return']:.1f}" for k, v in delay["returns"].items())
        lines.append(f"return under the trained action delay ({delay['source']}): {shown}")
    if result.int8 is not None:
        lines.append(result.int8.get("table", ""))
    return "\n".join(lines)


def summary(result: ExportResult) -> dict[str, Any]:
    """The --json line: bundle, parity, INT8 gate errors and verdict, engines."""
    m = result.manifest
    out: dict[str, Any] = {
        "bundle": str(result.bundle),
        "parity_max_abs": result.parity.max_abs,
        "parity_mean_abs": result.parity.mean_abs,
        "parity_states": result.parity.states,
        "files": {name: entry["bytes"] for name, entry in m["files"].items()},
        "engines": {p: e["status"] for p, e in m["tensorrt"].items()},
    }
    delay = m.get("action_delay")  # the return at the trained delay's median, p99 and 2x p99 (delay_margin.py)
    out["delay_returns"] = delay["returns"] if delay else None
    gate = m.get("gate")
    if gate:
        out["int8"] = {k: gate.get(k) for k in GATE_SUMMARY}
        out["int8_verdict"] = gate.get("verdict")
    return out
