"""TensorRT plan cache: what a plan is valid for, where it lives, and its JSON sidecar.

Engines are specific to the TensorRT version and the GPU, so a plan is only loaded when its record
(a JSON sidecar beside a cached plan, or the manifest's ``tensorrt`` section for a plan shipped in the
bundle) matches this TensorRT version, device name and compute capability, the ONNX it came from and
the precision. Pure Python: testable without TensorRT.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import PLAN_KIND, plan_name
from sac_edge.common.jsonfile import read_json_or_none
from sac_edge.common.manifest import sha256_file


class PlanKey(NamedTuple):
    """What a TensorRT plan is valid for."""

    tensorrt: str
    device: str
    compute_capability: str
    onnx_sha256: str
    precision: str
    calib_sha256: str = ""  # the calib.cache an implicit-INT8 (8.x) plan was built with, "" for none
    refit: bool = False  # built with BuilderFlag.REFIT (only when fine-tuning asks for it)
    profiles: int = 2  # optimisation profiles: one per execution context (common.trt.builder.PROFILES)

    def tag(self) -> str:
        """File-name key: ``trt10.8.0-nvidia-h200-sm90`` (``-refit`` for a refittable plan)."""
        device = re.sub(r"[^a-z0-9]+", "-", self.device.lower()).strip("-")
        refit = "-refit" if self.refit else ""
        return f"trt{self.tensorrt}-{device}-sm{self.compute_capability.replace('.', '')}{refit}"


def plan_mismatch(recorded: Mapping[str, Any], key: PlanKey) -> str | None:
    """Why a plan recorded as ``recorded`` must not be loaded here (None when it matches ``key``).

    ``recorded`` uses the sidecar keys (``tensorrt``, ``device``, ``compute_capability``, ``onnx_sha256``,
    ``precision``, ``calib_sha256``, ``refit``, ``profiles``); the manifest's per-engine ``tensorrt_version``
    (export's EngineInfo) is read as ``tensorrt``. A record without the ONNX or cache hash (a plan shipped
    in the bundle, built from the bundle's own files) is judged on the rest; one without ``refit`` or
    ``profiles`` (an older plan) is rebuilt.
    """
    got = dict(recorded)
    if "tensorrt" not in got and "tensorrt_version" in got:
        got["tensorrt"] = got["tensorrt_version"]
    for field in PlanKey._fields:
        want = getattr(key, field)
        have = got.get(field)
        if field in ("onnx_sha256", "calib_sha256") and have is None:
            continue
        if have is None or str(have) != str(want):
            return f"built for {field}={have!r}, this is {want!r}"
    return None


def cached_plan_paths(engine_dir: Path, key: PlanKey) -> tuple[Path, Path]:
    """The cache's plan file and its sidecar for ``key``."""
    plan = engine_dir / plan_name(key.precision, key.tag())
    return plan, plan.with_suffix(".json")


def find_plan(bundle: Bundle, key: PlanKey, engine_dir: Path) -> tuple[Path | None, list[str]]:
    """A loadable plan for ``key`` (shipped in the bundle or cached), and why others were passed over."""
    skipped: list[str] = []
    engines = bundle.manifest.get("tensorrt") or {}
    for name in bundle.files(PLAN_KIND, key.precision):
        recorded = engines.get(key.precision) or {}
        reason = plan_mismatch({"precision": key.precision, **recorded}, key)
        if reason is None:
            return bundle.path / name, skipped
        skipped.append(f"{name}: {reason}")
    plan, sidecar = cached_plan_paths(engine_dir, key)
    if plan.is_file():
        recorded = read_json_or_none(sidecar)  # unreadable: the plan is rebuilt
        if recorded is None:
            skipped.append(f"{plan.name}: no readable sidecar")
        elif recorded.get("plan_sha256") != sha256_file(plan):
            skipped.append(f"{plan.name}: plan does not match its sidecar's sha256")
        elif (reason := plan_mismatch(recorded, key)) is not None:
            skipped.append(f"{plan.name}: {reason}")
        else:
            return plan, skipped
    return None, skipped


def write_sidecar(plan: Path, key: PlanKey, build: Mapping[str, Any]) -> None:
    """Record what ``plan`` was built for, after the plan itself is in place (a plan without one is rebuilt)."""
    atomic_write_json(
        plan.with_suffix(".json"), {**key._asdict(), "plan_sha256": sha256_file(plan), "build": dict(build)}
    )


def record_parity(plan: Path, parity: Mapping[str, Any], delete_plan: bool) -> None:
    """Add the parity gate's result to ``plan``'s sidecar; ``delete_plan`` removes a plan that failed, so
    it is rebuilt next time while the sidecar keeps why (for ``sac-edge doctor``)."""
    sidecar = plan.with_suffix(".json")
    record = read_json_or_none(sidecar) or {}
    atomic_write_json(sidecar, {**record, "parity": dict(parity), "plan_deleted": delete_plan})
    if delete_plan:
        plan.unlink(missing_ok=True)


def parity_records(engine_dir: Path) -> list[dict[str, Any]]:
    """Every cached plan's last parity-gate result (for ``sac-edge doctor``), sorted by file name."""
    out = []
    for sidecar in sorted(engine_dir.glob("policy.*.json")) if engine_dir.is_dir() else []:
        record = read_json_or_none(sidecar)
        if record and "parity" in record:
            out.append(
                {
                    "plan": sidecar.with_suffix(".plan").name,
                    **record["parity"],
                    "plan_deleted": record.get("plan_deleted"),
                }
            )
    return out
