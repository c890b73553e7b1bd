"""Memory readings the budget governor and the benchmarks use, read from ``root`` so fixtures work.

- Process: ``/proc/<pid>/status`` ``VmRSS`` (resident now) and ``VmHWM`` (peak resident, the high-water
  mark), in kB (proc(5)).
- System / Jetson unified memory: ``/proc/meminfo`` ``MemTotal``, ``MemAvailable``, and on Jetson
  ``NvMapMemUsed`` (kB), the part of the one CPU/GPU pool held by NvMap (jetson-stats jtop/core/memory.py).
- NvMap per process: ``/sys/kernel/debug/nvmap/iovmm/maps`` (debugfs, root only). Format from the L4T
  kernel's drivers/video/tegra/nvmap/nvmap_dev.c ``nvmap_debug_maps_show``: two header lines, then per
  client ``"%-18s %18s %8u %10lluK"`` (client name, process, pid, size), its handle and vma lines
  (indented), a blank line, and finally ``"total ... %10lluK"``. jetson-stats jtop/core/processes.py reads
  the same lines.
- CUDA allocator: where a caller has torch, it passes a callable returning (allocated, reserved) bytes,
  e.g. ``lambda: (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())``; nothing here imports torch.
"""

from __future__ import annotations

import os
import re
import time
import typing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .sensors.base import Clock, SensorError, read_sensor_text

NVMAP_MAPS = Path("sys/kernel/debug/nvmap/iovmm/maps")
CudaMemoryFn = typing.Callable[[], typing.Tuple[int, int]]
_KB_LINE = re.compile(r"^([A-Za-z0-9_()]+):\s+(\d+)(?:\s*kB)?\s*$")
_SIZE = re.compile(r"^(\d+)([KMG])$")
_UNIT_KB = {"K": 1, "M": 1024, "G": 1024 * 1024}


def _kb_fields(path: Path) -> dict[str, int]:
    """``Key: value kB`` lines of a proc file as {key: value}; other lines are ignored."""
    text = read_sensor_text(path)
    fields = {}
    for line in text.splitlines():
        match = _KB_LINE.match(line.strip())
        if match:
            fields[match.group(1)] = int(match.group(2))
    return fields


@dataclass(frozen=True)
class ProcessMemory:
    """Resident memory of one process now and at its peak, in MiB."""

    rss_mb: float
    peak_rss_mb: float


def read_process_memory(pid: int | None = None, root: Path = Path("/")) -> ProcessMemory:
    """VmRSS and VmHWM of ``pid`` (default: this process) from ``root/proc/<pid>/status``."""
    pid = os.getpid() if pid is None else pid
    status = root / "proc" / str(pid) / "status"
    fields = _kb_fields(status)
    if "VmRSS" not in fields:
        raise SensorError(f"{status} has no VmRSS line (a kernel thread, or not Linux?)")
    rss = fields["VmRSS"] / 1024.0
    return ProcessMemory(rss_mb=rss, peak_rss_mb=max(rss, fields.get("VmHWM", 0) / 1024.0))


@dataclass(frozen=True)
class SystemMemory:
    """Whole-machine memory in MiB; on Jetson this one pool serves CPU and GPU alike."""

    total_mb: float
    available_mb: float
    nvmap_used_mb: float | None  # Jetson only

    @property
    def used_mb(self) -> float:
        return self.total_mb - self.available_mb


def read_meminfo(root: Path = Path("/")) -> dict[str, int]:
    """``/proc/meminfo`` as {key: kB}."""
    return _kb_fields(root / "proc/meminfo")


def read_system_memory(root: Path = Path("/")) -> SystemMemory:
    """MemTotal, MemAvailable and (Jetson) NvMapMemUsed from ``root/proc/meminfo``."""
    info = read_meminfo(root)
    if "MemTotal" not in info:
        raise SensorError(f"{root / 'proc/meminfo'} has no MemTotal")
    available = info.get("MemAvailable", info.get("MemFree", 0))
    nvmap = info.get("NvMapMemUsed")
    return SystemMemory(info["MemTotal"] / 1024.0, available / 1024.0, nvmap / 1024.0 if nvmap is not None else None)


@dataclass(frozen=True)
class NvMapClient:
    """One NvMap client: a process can open several, so sum them per pid."""

    client: str
    process: str
    pid: int
    size_kb: int


@dataclass(frozen=True)
class NvMapTable:
    clients: tuple[NvMapClient, ...]
    total_kb: int | None

    def pid_kb(self, pid: int) -> int:
        """NvMap memory held by ``pid`` over all its clients."""
        return sum(c.size_kb for c in self.clients if c.pid == pid)


def _size_kb(token: str) -> int | None:
    match = _SIZE.match(token)
    return int(match.group(1)) * _UNIT_KB[match.group(2)] if match else None


def parse_nvmap_maps(text: str) -> NvMapTable:
    """Client and total lines of ``iovmm/maps`` (or ``iovmm/clients``, which has the same two kinds)."""
    clients, total = [], None
    for line in text.splitlines():
        tokens = line.split()
        if not tokens or line[0].isspace() or tokens[0] == "CLIENT":
            continue  # indented handle/vma lines, blank separators, the header
        size = _size_kb(tokens[-1])
        if tokens[0] == "total" and size is not None:
            total = size
        elif len(tokens) >= 4 and size is not None and tokens[-2].isdigit():
            clients.append(NvMapClient(tokens[0], " ".join(tokens[1:-2]), int(tokens[-2]), size))
    return NvMapTable(tuple(clients), total)


def read_nvmap(root: Path = Path("/")) -> NvMapTable | None:
    """The NvMap table, or None where it is absent (not a Jetson) or unreadable (not root)."""
    try:
        return parse_nvmap_maps(read_sensor_text(root / NVMAP_MAPS))
    except SensorError:
        return None


@dataclass(frozen=True)
class MemorySample:
    """One reading of every memory value; ``budget_mb`` is what ``--mem-budget-mb`` is compared with."""

    timestamp: float
    rss_mb: float
    peak_rss_mb: float
    nvmap_process_mb: float | None
    cuda_allocated_mb: float | None
    cuda_reserved_mb: float | None
    system: SystemMemory | None

    @property
    def gpu_mb(self) -> float:
        """GPU-side memory of this process: NvMap where readable (Jetson, root), else the CUDA allocator."""
        if self.nvmap_process_mb is not None:
            return self.nvmap_process_mb
        return self.cuda_reserved_mb or 0.0

    @property
    def budget_mb(self) -> float:
        """Resident host memory plus GPU-side memory: the process's claim on the (Jetson: shared) pool."""
        return self.rss_mb + self.gpu_mb

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for telemetry records."""
        record: dict[str, Any] = {k: v for k, v in asdict(self).items() if k != "system"}
        record["budget_mb"] = self.budget_mb
        if self.system is not None:
            record["system"] = {**asdict(self.system), "used_mb": self.system.used_mb}
        return record


class MemoryProbe:
    """Reads a process's memory values in one call (a few small proc files)."""

    def __init__(
        self,
        root: Path = Path("/"),
        pid: int | None = None,
        cuda: CudaMemoryFn | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.root = root
        self.pid = os.getpid() if pid is None else pid
        self.followed: list[int] = []
        self._cuda = cuda
        self._clock = clock
        # debugfs is root-only; find out once rather than failing on every read
        self._nvmap = read_nvmap(root) is not None

    def follow(self, pid: int) -> None:
        """Count ``pid`` as part of this process (a helper it started: the fine-tuning learner process): its
        resident, peak and NvMap memory are added to this process's; once it has exited it counts as nothing."""
        self.followed.append(pid)

    def _processes(self) -> tuple[float, float]:
        """Resident and peak MiB of this process plus the followed ones still running (peaks summed: an upper
        bound on the joint peak)."""
        own = read_process_memory(self.pid, self.root)
        rss, peak = own.rss_mb, own.peak_rss_mb
        for pid in self.followed:
            try:
                other = read_process_memory(pid, self.root)
            except SensorError:  # it has exited
                continue
            rss, peak = rss + other.rss_mb, peak + other.peak_rss_mb
        return rss, peak

    def read(self) -> MemorySample:
        rss, peak = self._processes()
        table = read_nvmap(self.root) if self._nvmap else None
        allocated = reserved = None
        if self._cuda is not None:
            alloc_b, reserved_b = self._cuda()
            allocated, reserved = alloc_b / 2**20, reserved_b / 2**20
        try:
            system: SystemMemory | None = read_system_memory(self.root)
        except SensorError:
            system = None
        return MemorySample(
            timestamp=self._clock(),
            rss_mb=rss,
            peak_rss_mb=peak,
            nvmap_process_mb=sum(table.pid_kb(p) for p in [self.pid, *self.followed]) / 1024.0
            if table is not None
            else None,
            cuda_allocated_mb=allocated,
            cuda_reserved_mb=reserved,
            system=system,
        )
