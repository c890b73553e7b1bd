"""``sac-edge doctor [BUNDLE]``: what this device is and what will run on it.

Every row comes from a probe, a function of a :class:`Context` (the filesystem ``root`` the sensors read,
and the bundle when one is given) that yields :class:`Row` objects. Files are read under ``root``, so the
tests run the doctor against the Xavier NX fixture tree; Python packages and process permissions are
this interpreter's. A new row is a new probe appended to :data:`PROBES`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import sys
import typing
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sac_edge.common.bundle import Bundle, open_bundle
from sac_edge.common.bundle_format import ENGINES_DIR, INT8, PRECISIONS
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.signing import SIGNED, TRUSTED, UNSIGNED, signature_state
from sac_edge.common.table import format_table
from sac_edge.common.versions import installed_version
from sac_edge.edge_runtime.backends.registry import KINDS, candidates
from sac_edge.edge_runtime.backends.trt.plans import parity_records
from sac_edge.edge_runtime.budget.memory import read_nvmap, read_system_memory
from sac_edge.edge_runtime.budget.sensors.base import PowerSensor, SensorError, read_sensor_text, total_rail
from sac_edge.edge_runtime.budget.sensors.detect import detect_power_sensor
from sac_edge.edge_runtime.budget.sensors.estimate import find_jetson_gpu
from sac_edge.edge_runtime.budget.sensors.jetson import board_model, jetpack, l4t_release, power_mode

from .config import DoctorConfig

OK, WARN, NO, INFO = "ok", "warn", "no", "info"


@dataclass(frozen=True)
class Row:
    """One line of the report: ``status`` is ok, warn, no (cannot be used here) or info; ``fix`` is one command."""

    section: str
    item: str
    value: str
    status: str = INFO
    fix: str = ""


@dataclass(frozen=True)
class Context:
    """What the probes read: files under ``root``; ``bundle`` when the command was given one."""

    root: Path
    bundle: Bundle | None = None
    trusted_keys: str | None = None


Probe = typing.Callable[[Context], typing.Iterable[Row]]  # typing's: collections.abc's are not subscriptable on 3.8


def _text(path: Path) -> str:
    try:
        return read_sensor_text(path).replace("\x00", "").strip()
    except SensorError:
        return ""


def python_rows(ctx: Context) -> Iterable[Row]:
    import numpy as np

    yield Row("software", "python", f"{platform.python_version()} ({sys.executable})", OK)
    yield Row("software", "numpy", np.__version__, OK)
    try:
        import onnxruntime as ort
    except ImportError:
        yield Row("software", "onnxruntime", "not installed", NO, "pip install onnxruntime")
        return
    yield Row("software", "onnxruntime", f"{ort.__version__}: {', '.join(ort.get_available_providers())}", OK)


def tensorrt_row(version: str) -> Row:
    """The installed TensorRT and the code path its generation takes (``common/trt/generations.py``)."""
    from sac_edge.common.trt.generations import generation

    try:
        gen = generation(version)
    except SacEdgeError as err:
        return Row("software", "tensorrt", f"{version}: {err}", NO, "install TensorRT 8.5/8.6, 10.x or 11.x")
    how = (
        "implicit INT8 from calib.cache, FP16 flag"
        if gen.implicit_int8
        else "Q/DQ INT8, FP16 flag"
        if gen.precision_flags
        else "strongly typed: FP16 from policy.fp16.onnx, INT8 from Q/DQ"
    )
    return Row("software", "tensorrt", f"{version} (generation {gen.name}: {how})", OK)


def accelerator_rows(ctx: Context) -> Iterable[Row]:
    from sac_edge.common.trt.api import import_problem
    from sac_edge.common.trt.builder import cuda_device, cuda_problem

    problem = import_problem()
    if problem is not None and importlib.util.find_spec("tensorrt") is None:
        yield Row("software", "tensorrt", "not installed", WARN, "sudo apt install python3-libnvinfer (JetPack)")
    elif problem is not None:  # installed without its libraries: a row, not the end of the report
        yield Row("software", "tensorrt", problem, NO, "sudo apt install tensorrt (JetPack), or pip uninstall tensorrt")
    else:
        import tensorrt

        yield tensorrt_row(str(tensorrt.__version__))
    device = cuda_device()
    yield Row(
        "software",
        "cuda device",
        f"{device.name} (sm {device.compute_capability})" if device else str(cuda_problem()),
        OK if device else INFO,
    )
    cuda = ctx.root / "usr/local/cuda"
    version_json = _text(cuda / "version.json")
    if version_json:
        found = str(json.loads(version_json).get("cuda", {}).get("version", "?"))
    else:  # CUDA <= 11.0 writes version.txt ("CUDA Version 10.2.89")
        found = _text(cuda / "version.txt").replace("CUDA Version", "").strip()
    yield Row("software", "cuda", found or f"not found under {cuda}", OK if found else INFO)
    bindings = {name: installed_version(name) for name in ("cuda-python", "pycuda")}
    have = [f"{name} {v}" for name, v in bindings.items() if v]
    yield Row(
        "software",
        "cuda-python / pycuda",
        ", ".join(have) or "neither installed",
        OK if have else WARN,
        "" if have else "pip install pycuda (JetPack 5) or pip install 'cuda-python<13' (JetPack 6)",
    )
    torch = installed_version("torch")
    yield Row(
        "software",
        "torch (--finetune)",
        torch or "not installed",
        OK if torch else INFO,
        "" if torch else "pip install 'sac-edge[finetune]' (JetPack 5: NVIDIA's torch 2.1 wheel)",
    )


def ros2_rows(ctx: Context) -> Iterable[Row]:
    """Whether ``sac-edge ros2`` can run here: the system's rclpy (Humble or newer) and its middleware."""
    from sac_edge.edge_runtime.ros2.compat import ros2_status

    status, detail = ros2_status()
    fixes = {
        "missing": "source /opt/ros/humble/setup.bash (only for sac-edge ros2)",
        "old": "use ROS 2 Humble or newer",
        "broken": "source the ROS 2 setup in this shell",
    }
    yield Row(
        "software", "ros 2 (sac-edge ros2)", detail, {"ok": OK, "missing": INFO}.get(status, NO), fixes.get(status, "")
    )


def jetson_rows(ctx: Context) -> Iterable[Row]:
    yield Row("device", "model", board_model(ctx.root) or platform.machine())
    release = l4t_release(ctx.root)
    if release is None:
        yield Row("device", "jetson release", "not a Jetson (no etc/nv_tegra_release)")
        return
    yield Row("device", "jetson release", f"L4T {release} (JetPack {jetpack(release) or 'unknown'})", OK)
    mode = power_mode(ctx.root)
    if mode is None:
        why = "unknown (no var/lib/nvpmodel/status, no default in etc/nvpmodel.conf)"
        yield Row("device", "nvpmodel mode", why, WARN)
    else:
        yield Row("device", "nvpmodel mode", mode.describe(), INFO)
    yield _clocks_row(ctx.root)


def _clocks_row(root: Path) -> Row:
    """jetson_clocks pins every CPU's and the GPU's minimum frequency to its maximum."""
    pairs = [
        (d / "scaling_min_freq", d / "scaling_max_freq")
        for d in sorted(root.glob("sys/devices/system/cpu/cpu*/cpufreq"))
    ]
    gpu = find_jetson_gpu(root)  # 17000000.gv11b (Xavier), .ga10b (Orin, JetPack 5), .gpu (JetPack 6)
    if gpu is not None:
        pairs.append((gpu / "min_freq", gpu / "max_freq"))
    read = [(_text(lo), _text(hi)) for lo, hi in pairs]
    read = [(lo, hi) for lo, hi in read if lo and hi]
    if not read:
        return Row("device", "clocks locked", "unknown (no cpufreq/devfreq files)")
    unlocked = sum(lo != hi for lo, hi in read)
    if unlocked:
        return Row(
            "device", "clocks locked", f"no ({unlocked} of {len(read)} clocks scale)", WARN, "sudo jetson_clocks"
        )
    return Row("device", "clocks locked", f"yes ({len(read)} clocks at their maximum)", OK)


def _power_value(sensor: PowerSensor) -> str:
    """Where the power readings come from, the board total and each rail (or why the read failed)."""
    where = getattr(sensor, "where", None)
    source = sensor.source + (f" ({', '.join(where)})" if where else "")
    try:
        reading = sensor.read()
    except SensorError as err:
        return f"{source}: read failed: {err}"
    rails = ", ".join(f"{name} {watts:.2f} W" for name, watts in reading.rails_w.items())
    total = total_rail(reading.rails_w) if sensor.measured else None
    how = f"= {total}" if total else "sum of the rails" if sensor.measured else "estimated"
    skipped = getattr(sensor, "skipped", {})
    unread = f"; unreadable, left out: {', '.join(skipped)}" if skipped else ""
    return f"{source}: total {reading.total_w:.2f} W ({how}); {rails}{unread}"


def sensor_rows(ctx: Context) -> Iterable[Row]:
    with detect_power_sensor(ctx.root) as sensor:
        value = _power_value(sensor)
    yield Row(
        "budget",
        "power sensor",
        value,
        OK if sensor.measured else WARN,
        ""
        if sensor.measured
        else "run as root (sudo): INA3221 rails, tegrastats and RAPL may be root-only; on an estimate "
        "--power-budget-w is enforced only with --enforce-estimated-power",
    )
    try:
        system = read_system_memory(ctx.root)
    except SensorError as err:
        yield Row("budget", "memory", str(err), WARN)
        return
    unified = "" if system.nvmap_used_mb is None else f", NvMapMemUsed {system.nvmap_used_mb:.0f} MiB (Jetson layout)"
    yield Row("budget", "memory", f"proc/meminfo: {system.total_mb:.0f} MiB{unified}", OK)
    nvmap = read_nvmap(ctx.root)
    yield Row(
        "budget",
        "per-process GPU memory",
        "debugfs nvmap iovmm maps" if nvmap is not None else "unreadable (debugfs nvmap needs root on a Jetson)",
        OK if nvmap is not None else INFO,
    )


def _capability(bit: int) -> bool:
    """Whether this process holds capability ``bit`` (CapEff in /proc/self/status)."""
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", _text(Path("/proc/self/status")), re.M)
    return match is not None and bool(int(match.group(1), 16) >> bit & 1)


CAP_IPC_LOCK, CAP_SYS_NICE = 14, 23


def permission_rows(ctx: Context) -> Iterable[Row]:
    rtprio = resource.getrlimit(resource.RLIMIT_RTPRIO)[0]
    realtime = _capability(CAP_SYS_NICE) or rtprio == resource.RLIM_INFINITY or rtprio > 0
    yield Row(
        "permissions",
        "real-time scheduling (--realtime-priority)",
        "permitted" if realtime else f"not permitted (no CAP_SYS_NICE, RLIMIT_RTPRIO {rtprio})",
        OK if realtime else WARN,
        "" if realtime else f"sudo setcap cap_sys_nice+ep {os.path.realpath(sys.executable)}",
    )
    memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    locking = _capability(CAP_IPC_LOCK) or memlock == resource.RLIM_INFINITY
    limit = "unlimited" if memlock == resource.RLIM_INFINITY else f"{memlock // 1024} KiB"
    yield Row(
        "permissions",
        "memory locking (--lock-memory)",
        "permitted" if locking else f"limited (RLIMIT_MEMLOCK {limit})",
        OK if locking else WARN,
        "" if locking else "ulimit -l unlimited (or memlock in /etc/security/limits.conf)",
    )


def _fix(refusal: str) -> str:
    """The one command that makes a refused backend x precision usable, where one exists."""
    if "'onnxruntime' is not installed" in refusal:
        return "pip install onnxruntime"
    if "ExecutionProvider" in refusal:
        return "pip install onnxruntime-gpu (JetPack: the Jetson AI Lab wheel for your JetPack)"
    if "'tensorrt' is not installed" in refusal:
        return "sudo apt install python3-libnvinfer (JetPack)"
    if "does not import" in refusal:
        return "sudo apt install tensorrt (JetPack), or pip uninstall tensorrt"
    if "no CUDA device usable" in refusal:
        return "check the GPU with nvidia-smi or tegrastats; --backend onnxruntime meanwhile"
    if "cuda-python" in refusal:
        return "pip install pycuda (JetPack 5) or pip install 'cuda-python<13' (JetPack 6)"
    if "'torch' is not installed" in refusal:
        return "pip install 'sac-edge[finetune]'"
    if "no accuracy-gate verdict" in refusal:
        return "sac-export RUN --out BUNDLE --force --int8"
    return ""  # the accuracy gate refused it: serve another precision


def bundle_rows(ctx: Context) -> Iterable[Row]:
    """The bundle's graphs, then every backend x precision it has: usable, or why not and the fix."""
    if ctx.bundle is None:
        return
    graphs = [p for p in PRECISIONS if ctx.bundle.onnx(p) is not None]
    yield Row(
        "bundle",
        "graphs",
        f"{ctx.bundle.path}: {', '.join(graphs)} (format_version {ctx.bundle.manifest.get('format_version')})",
        OK,
        "" if INT8 in graphs else "sac-export RUN --out BUNDLE --force --int8",
    )
    sig = signature_state(ctx.bundle.path, ctx.trusted_keys)
    yield Row(
        "bundle",
        "signature",
        f"{sig.state}" + (f" (key {sig.key_id})" if sig.key_id else "") + f": {sig.detail}",
        {TRUSTED: OK, SIGNED: INFO, UNSIGNED: INFO}.get(sig.state, NO),
        "" if sig.state in (TRUSTED, SIGNED) else "sac-export RUN --out BUNDLE --force --sign-key KEY",
    )
    for record in parity_records(ctx.bundle.path / ENGINES_DIR):
        passed = bool(record.get("passed"))
        yield Row(
            "bundle",
            f"engine {record['plan']}",
            f"parity gate {'passed' if passed else 'failed, plan deleted'} ({record.get('when')}): "
            f"{record.get('rule')} {record.get('value')} vs limit {record.get('limit')}",
            OK if passed else NO,
            "" if passed else "sac-edge run BUNDLE --backend auto (rebuilds it; the onnxruntime path serves meanwhile)",
        )
    for backend in KINDS:
        unavailable = KINDS[backend].unavailable()
        if unavailable is not None:  # one row for the backend, not one per precision
            yield Row("bundle", f"{backend} (any precision)", unavailable, NO, _fix(unavailable))
            continue
        for cand in candidates(ctx.bundle, [backend]):
            item = f"{cand.backend} {cand.precision}"
            if cand.refusal is None:
                yield Row("bundle", item, "usable", OK)
            elif "not in the bundle" not in cand.refusal:  # a precision the backend never runs is no problem
                yield Row("bundle", item, cand.refusal, NO, _fix(cand.refusal))


PROBES: list[Probe] = [python_rows, accelerator_rows, ros2_rows, jetson_rows, sensor_rows, permission_rows, bundle_rows]


def doctor_command(cfg: DoctorConfig) -> list[Row]:
    """Every probe's rows for the device under ``cfg.sensor_root`` (and ``cfg.bundle`` when given)."""
    bundle = open_bundle(cfg.bundle) if cfg.bundle else None
    ctx = Context(Path(cfg.sensor_root), bundle, cfg.trusted_keys)
    if not ctx.root.is_dir():
        raise SacEdgeError(f"--sensor-root {ctx.root} is not a directory; pass / or a copied device tree")
    return [row for probe in PROBES for row in probe(ctx)]


def doctor_table(rows: list[Row], width: int | None = None) -> str:
    """The report as a table (stdout) within ``width`` columns (default: the terminal's, else 120): the value
    wrapped, the fix on a line of its own below it."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    return format_table(
        [(r.section, r.item, r.status, r.value + (f"\nfix: {r.fix}" if r.fix else "")) for r in rows],
        ("section", "item", "status", "value / fix"),
        width=max(width, 80),
    )


def doctor_json(rows: list[Row]) -> dict[str, Any]:
    """The report as one JSON object (``--json``)."""
    return {"rows": [asdict(r) for r in rows], "problems": sum(r.status == NO for r in rows)}
