"""What a training interval cost: its own rates, time per update, process memory and CPU, CUDA memory and
the GPU's utilisation and power (``--log-every``; the columns are in docs/CONTRACTS.md, "metrics.csv").

Every column is of the interval since the previous row, never cumulative, so the first row after
``--resume`` is the resumed process's own rate. Sensors are small readers: ``/proc/self/status`` (with a
``root`` to read another tree in tests), the CUDA caching allocator's peak counters, and NVML through
``nvidia-ml-py`` imported lazily (absent package, driver or GPU: those columns stay empty).
"""

from __future__ import annotations

import contextlib
import resource
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

MIB = 1024 * 1024


class ProcessMemory:
    """Resident set size and its peak (``VmRSS``, ``VmHWM``) of this process, in MiB."""

    def __init__(self, root: Path = Path("/proc/self")) -> None:
        self.status = root / "status"

    def read(self) -> tuple[float | None, float]:
        """(RSS, peak RSS); without ``/proc`` the peak comes from ``getrusage`` and the RSS is unknown."""
        fields: dict[str, float] = {}
        with contextlib.suppress(OSError):
            for line in self.status.read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM") and value.strip().endswith("kB"):
                    fields[key] = int(value.split()[0]) / 1024
        peak = fields.get("VmHWM", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)  # kB on Linux
        return fields.get("VmRSS"), peak


class GpuSensor:
    """GPU utilisation (%) and board power (W) of one CUDA device through NVML; ``None`` where absent."""

    def __init__(self, device: torch.device) -> None:
        self._nvml: ModuleType | None = None
        self._handle: Any = None
        if device.type != "cuda":
            return
        try:
            import pynvml
        except ImportError:  # the optional ``sac-edge[nvidia]`` extra
            return
        try:
            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except (pynvml.NVMLError, AttributeError, RuntimeError):
            return
        self._nvml, self._handle = pynvml, handle

    def read(self) -> tuple[float | None, float | None]:
        """(utilisation %, power W) sampled now."""
        nvml = self._nvml
        if nvml is None:
            return None, None
        try:
            util = float(nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        except nvml.NVMLError:
            util = None
        try:
            power = nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
        except nvml.NVMLError:
            power = None
        return util, power

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()
            self._nvml = None


class UpdateTimer:
    """The duration of each update: wall clock on a CPU, CUDA events on a GPU (no sync per update; the
    events are read when the interval closes)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._durations: list[float] = []
        self._events: list[tuple[Any, Any]] = []
        self._t0 = 0.0
        self._start: Any = None
        self.total_s = 0.0
        self.total_updates = 0

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((self._start, end))
        else:
            self._durations.append(time.perf_counter() - self._t0)

    def drain(self) -> np.ndarray:
        """The seconds of each update since the last drain (syncs the GPU once)."""
        if self._events:
            self._events[-1][1].synchronize()
            self._durations += [a.elapsed_time(b) / 1000.0 for a, b in self._events]
            self._events = []
        out = np.asarray(self._durations, dtype=np.float64)
        self._durations = []
        self.total_s += float(out.sum())
        self.total_updates += out.size
        return out


class IntervalMonitor:
    """The monitoring columns of one ``metrics.csv`` row, each over the interval since the previous row."""

    def __init__(self, device: torch.device, step: int, proc_root: Path = Path("/proc/self")) -> None:
        self.device = device
        self.timer = UpdateTimer(device)
        self.memory = ProcessMemory(proc_root)
        self.gpu = GpuSensor(device)
        self.cuda_peak_allocated = 0.0
        self._mark(step)

    def _mark(self, step: int) -> None:
        self._step, self._wall, self._cpu = step, time.perf_counter(), time.process_time()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def row(self, step: int) -> dict[str, Any]:
        """The interval's measurements (rates per second of the interval; ``""`` where not measured), then a new
        interval starts."""
        wall, cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu
        durations = self.timer.drain()
        rss, peak = self.memory.read()
        util, power = self.gpu.read()
        row: dict[str, Any] = {
            "steps_per_s": round((step - self._step) / wall, 1) if wall > 0 else "",
            "updates_per_s": round(durations.size / durations.sum(), 1) if durations.size else "",
            "update_ms_p50": _ms(durations, 50),
            "update_ms_p99": _ms(durations, 99),
            "rss_mb": "" if rss is None else round(rss, 1),
            "peak_rss_mb": round(peak, 1),
            "cpu_util_pct": round(100.0 * cpu / wall, 1) if wall > 0 else "",  # 100: one core busy
            "cuda_max_allocated_mb": "",
            "cuda_max_reserved_mb": "",
            "gpu_util_pct": "" if util is None else util,
            "gpu_power_w": "" if power is None else round(power, 1),
        }
        if self.device.type == "cuda":
            allocated = torch.cuda.max_memory_allocated(self.device) / MIB
            self.cuda_peak_allocated = max(self.cuda_peak_allocated, allocated)
            row["cuda_max_allocated_mb"] = round(allocated, 1)
            row["cuda_max_reserved_mb"] = round(torch.cuda.max_memory_reserved(self.device) / MIB, 1)
        self._mark(step)
        return row

    def close(self) -> None:
        self.gpu.close()


def _ms(durations: np.ndarray, q: float) -> float | str:
    return round(float(np.percentile(durations, q)) * 1000.0, 3) if durations.size else ""
