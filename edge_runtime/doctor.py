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
import sys
import typing
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.signing import SIGNED, TRUSTED, UNSIGNED, signature_state
from sac_edge.common.table import format_table
from sac_edge.common.versions import installed_version

from .backends.base import PRECISIONS, Bundle, open_bundle
from .backends.registry import KINDS, candidates
from .backends.trt.plans import parity_records
from .budget.memory import read_nvmap, read_system_memory
from .budget.sensors.base import SensorError, read_sensor_text
from .budget.sensors.detect import detect_power_sensor
from .budget.sensors.estimate import nvpmodel_mode
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
    """The installed TensorRT and the code path its generation takes (``export/trt_generations.py``)."""
    from sac_edge.export.trt_generations import generation

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
    if importlib.util.find_spec("tensorrt") is None:
        yield Row("software", "tensorrt", "not installed", WARN, "sudo apt install python3-libnvinfer (JetPack)")
    else:
        import tensorrt

        yield tensorrt_row(str(tensorrt.__version__))
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


_TEGRA_RELEASE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)")
# L4T -> JetPack, from NVIDIA's JetPack release pages.
JETPACK = {
    "35.1.0": "5.0.2",
    "35.2.1": "5.1",
    "35.3.1": "5.1.1",
    "35.4.1": "5.1.2",
    "35.5.0": "5.1.3",
    "35.6.0": "5.1.4",
    "36.3.0": "6.0",
    "36.4.0": "6.1",
    "36.4.3": "6.2",
}
_NVPMODEL_CONF = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+)\s*>")


def l4t_release(root: Path) -> str | None:
    """``35.2.1`` from ``root/etc/nv_tegra_release`` (``# R35 (release), REVISION: 2.1, ...``), None off Jetson."""
    match = _TEGRA_RELEASE.search(_text(root / "etc/nv_tegra_release"))
    if not match:
        return None
    revision = match.group(2) if match.group(2).count(".") else match.group(2) + ".0"
    return f"{match.group(1)}.{revision}"


def jetson_rows(ctx: Context) -> Iterable[Row]:
    model = _text(ctx.root / "proc/device-tree/model")
    yield Row("device", "model", model or platform.machine())
    release = l4t_release(ctx.root)
    if release is None:
        yield Row("device", "jetson release", "not a Jetson (no etc/nv_tegra_release)")
        return
    yield Row("device", "jetson release", f"L4T {release} (JetPack {JETPACK.get(release, 'unknown')})", OK)
    mode = nvpmodel_mode(ctx.root)
    names = dict(_NVPMODEL_CONF.findall(_text(ctx.root / "etc/nvpmodel.conf")))
    value = "unknown (no var/lib/nvpmodel/status)" if mode is None else f"{mode} {names.get(str(mode), '')}".strip()
    yield Row("device", "nvpmodel mode", value, INFO if mode is not None else WARN)
    yield _clocks_row(ctx.root)


GPU_DEVFREQ = ("gv11b", "ga10b")  # Xavier's Volta, Orin's Ampere


def _clocks_row(root: Path) -> Row:
    """jetson_clocks pins every CPU's and the GPU's minimum frequency to its maximum."""
    pairs = [
        (d / "scaling_min_freq", d / "scaling_max_freq")
        for d in sorted(root.glob("sys/devices/system/cpu/cpu*/cpufreq"))
    ]
    for gpu in GPU_DEVFREQ:
        pairs += [(d / "min_freq", d / "max_freq") for d in sorted(root.glob(f"sys/class/devfreq/*.{gpu}"))]
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


# Which sensor layout the tests pin each power source to (tests/fixtures/).
SENSOR_FIXTURES = {
    "ina3221-hwmon": "JetPack 5 INA3221 hwmon (fixture xavier_nx_jp5)",
    "ina3221-iio": "JetPack 4 INA3221 iio (fixture xavier_nx_jp4)",
    "tegrastats": "tegrastats lines (fixture tegrastats)",
    "rapl": "RAPL powercap (fixture rapl)",
}


def sensor_rows(ctx: Context) -> Iterable[Row]:
    sensor = detect_power_sensor(ctx.root)
    try:
        reading = sensor.read()
        rails = ", ".join(f"{name} {watts:.2f} W" for name, watts in reading.rails_w.items())
    except SensorError as err:
        rails = f"read failed: {err}"
    finally:
        sensor.close()
    base = sensor.source.split(":")[0]
    layout = SENSOR_FIXTURES.get(base, "no fixture: " + ("NVML library" if base == "nvml" else "not measured"))
    yield Row(
        "budget",
        "power sensor",
        f"{sensor.source} [{layout}]: {rails}",
        OK if sensor.measured else WARN,
        "" if sensor.measured else "run as root (sudo): INA3221 rails, tegrastats and RAPL may be root-only",
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
        "" if "int8" in graphs else "sac-export RUN --out BUNDLE --force --int8",
    )
    sig = signature_state(ctx.bundle.path, ctx.trusted_keys)
    yield Row(
        "bundle",
        "signature",
        f"{sig.state}" + (f" (key {sig.key_id})" if sig.key_id else "") + f": {sig.detail}",
        {TRUSTED: OK, SIGNED: INFO, UNSIGNED: INFO}.get(sig.state, NO),
        "" if sig.state in (TRUSTED, SIGNED) else "sac-export RUN --out BUNDLE --force --sign-key KEY",
    )
    for record in parity_records(ctx.bundle.path / "engines"):
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


PROBES: list[Probe] = [python_rows, accelerator_rows, jetson_rows, sensor_rows, permission_rows, bundle_rows]


def doctor_command(cfg: DoctorConfig) -> list[Row]:
    """Every probe's rows for the device under ``cfg.sensor_root`` (and ``cfg.bundle`` when given)."""
    bundle = open_bundle(cfg.bundle) if cfg.bundle else None
    ctx = Context(Path(cfg.sensor_root), bundle, cfg.trusted_keys)
    if not ctx.root.is_dir():
        raise SacEdgeError(f"--sensor-root {ctx.root} is not a directory; pass / or a copied device tree")
    return [row for probe in PROBES for row in probe(ctx)]


def doctor_table(rows: list[Row]) -> str:
    """The report as a table (stdout)."""
    return format_table(
        [(r.section, r.item, r.status, r.value, r.fix) for r in rows], ("section", "item", "status", "value", "fix")
    )


def doctor_json(rows: list[Row]) -> dict[str, Any]:
    """The report as one JSON object (``--json``)."""
    return {"rows": [asdict(r) for r in rows], "problems": sum(r.status == NO for r in rows)}
