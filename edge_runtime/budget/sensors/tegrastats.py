"""``tegrastats`` lines: a parser, a reader that runs the tool, and a reader that follows its log file.

Field forms accepted (NVIDIA L4T Developer Guide, "tegrastats Utility"; jetson-stats
jtop/core/tegra_parse.py; DataDog datadog-agent pkg/collector/corechecks/nvidia/jetson/, whose
jetson_test.go holds real lines from TX1, TX2, Nano, AGX Xavier, Xavier NX and Orin)::

    [MM-DD-YYYY HH:MM:SS ]               date prefix printed by newer L4T releases
    RAM 4412/7772MB (lfb 237x4MB)        used/total MB
    SWAP 139/3886MB (cached 2MB)
    CPU [9%@1190,off,...]                per-core load % @ MHz, "off" for a parked core;
    cpu [17%,13%]@408 EMC 1%@408 GR3D 3%@76   the old (L4T 28) forms: one frequency for all cores, no _FREQ
    EMC_FREQ 10%@1600  GR3D_FREQ 62%@306 GR3D_FREQ 0%@[305,305] on Orin (one value per GPC)
    AO@41.5C CV0@-256C                   temperatures (-256C: sensor off)
    VDD_IN 4067/4067                     rail current/average mW (L4T 32)
    VDD_IN 5299mW/5299mW                 the same with units (L4T 34+); AGX Xavier rails are "GPU 0/0"
    VDD_IN 9761mW/9761mW/9761mW          three values (newer releases; the first two are cur/avg)
    VDD_SOC -12mW/-8mW                   a rail may read below zero: kept as it is, not dropped
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sac_edge.common.bounded import open_regular
from sac_edge.common.errors import SacEdgeError

from .base import Clock, PowerReading, PowerSensor, SensorError, read_sensor_text, total_from_rails

#: The largest tegrastats log read whole (a line a second for a day is ~30 MiB).
MAX_LOG_BYTES = 64 << 20

_STAMP = re.compile(r"^\s*(\d{2}-\d{2}-\d{4} \d{2}:\d{2}:\d{2})\s")
_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_SWAP = re.compile(r"\bSWAP (\d+)/(\d+)MB(?: ?\(cached (\d+)MB\))?")
_CPU = re.compile(r"\bCPU \[([^\]]*)\](?:@(\d+))?", re.IGNORECASE)
_CORE = re.compile(r"^(\d+)%(?:@(\d+))?$")
_GR3D = re.compile(r"\bGR3D(?:_FREQ)? (\d+)%(?:@\[?([\d,]+)\]?)?")
_EMC = re.compile(r"\bEMC(?:_FREQ)? (\d+)%(?:@(\d+))?")
_TEMP = re.compile(r"\b(\w+)@(-?\d+(?:\.\d+)?)C\b")
# "NAME cur/avg" with optional mW units, followed by a space or the end (so "RAM 1/2MB" is not a rail);
# the same pattern as DataDog's powerMetricsSender.go.
# A rail can read negative (a current sense offset on a lightly loaded rail) and newer releases print a third
# value (``VDD_IN 9761mW/9761mW/9761mW``); each value may carry "mW".
_MW = r"(-?\d+)(?:mW)?"
_RAIL = re.compile(rf"\b([A-Za-z][A-Za-z0-9_]*) {_MW}/{_MW}(?:/{_MW})?(?=\s|$)")


@dataclass(frozen=True)
class CpuCore:
    """One core: load in percent and MHz; both None when the core is parked ("off")."""

    load_pct: float | None
    freq_mhz: int | None

    @property
    def online(self) -> bool:
        return self.load_pct is not None


@dataclass(frozen=True)
class RailPower:
    """A rail's instantaneous and running-average power in mW."""

    cur_mw: int
    avg_mw: int


@dataclass(frozen=True)
class TegrastatsSample:
    """Everything one tegrastats line says that sac-edge uses; absent fields are None or empty."""

    stamp: str | None = None
    ram_used_mb: int | None = None
    ram_total_mb: int | None = None
    swap_used_mb: int | None = None
    swap_total_mb: int | None = None
    swap_cached_mb: int | None = None
    cpus: tuple[CpuCore, ...] = ()
    gr3d_pct: float | None = None
    gr3d_freq_mhz: tuple[int, ...] = ()
    emc_pct: float | None = None
    emc_freq_mhz: int | None = None
    temps_c: Mapping[str, float] = field(default_factory=dict)
    rails: Mapping[str, RailPower] = field(default_factory=dict)

    @property
    def cpu_load_pct(self) -> float | None:
        """Mean load over online cores."""
        loads = [c.load_pct for c in self.cpus if c.load_pct is not None]
        return sum(loads) / len(loads) if loads else None

    def power_reading(self, timestamp: float, source: str = "tegrastats") -> PowerReading:
        """The rails as a :class:`PowerReading` (instantaneous values; VDD_IN/POM_5V_IN is the total)."""
        if not self.rails:
            raise SensorError("this tegrastats line has no power rails (run tegrastats as root on some boards)")
        rails_w = {name: rail.cur_mw / 1000.0 for name, rail in self.rails.items()}
        return PowerReading(total_from_rails(rails_w), rails_w, True, source, timestamp)


def _cores(body: str, shared_freq: str | None) -> tuple[CpuCore, ...]:
    cores = []
    for token in (t.strip() for t in body.split(",")):
        match = _CORE.match(token)
        if token == "off" or not match:
            cores.append(CpuCore(None, None))
            continue
        freq = match.group(2) or shared_freq
        cores.append(CpuCore(float(match.group(1)), int(freq) if freq else None))
    return tuple(cores)


def parse_tegrastats_line(line: str) -> TegrastatsSample:
    """Parse one line; ValueError when it carries neither RAM nor a power rail (not a tegrastats line)."""
    ram, swap, cpu = _RAM.search(line), _SWAP.search(line), _CPU.search(line)
    gr3d, emc, stamp = _GR3D.search(line), _EMC.search(line), _STAMP.match(line)
    rails = {m.group(1): RailPower(int(m.group(2)), int(m.group(3))) for m in _RAIL.finditer(line)}
    if ram is None and not rails:
        raise ValueError(f"not a tegrastats line: {line.strip()[:80]!r}")
    return TegrastatsSample(
        stamp=stamp.group(1) if stamp else None,
        ram_used_mb=int(ram.group(1)) if ram else None,
        ram_total_mb=int(ram.group(2)) if ram else None,
        swap_used_mb=int(swap.group(1)) if swap else None,
        swap_total_mb=int(swap.group(2)) if swap else None,
        swap_cached_mb=int(swap.group(3)) if swap and swap.group(3) else None,
        cpus=_cores(cpu.group(1), cpu.group(2)) if cpu else (),
        gr3d_pct=float(gr3d.group(1)) if gr3d else None,
        gr3d_freq_mhz=tuple(int(f) for f in gr3d.group(2).split(",") if f) if gr3d and gr3d.group(2) else (),
        emc_pct=float(emc.group(1)) if emc else None,
        emc_freq_mhz=int(emc.group(2)) if emc and emc.group(2) else None,
        temps_c={m.group(1): float(m.group(2)) for m in _TEMP.finditer(line)},
        rails=rails,
    )


def parse_tegrastats_lines(lines: Iterable[str]) -> list[TegrastatsSample]:
    """Every parseable line, in order; blank and foreign lines (a shell prompt, a banner) are skipped."""
    samples = []
    for line in lines:
        if not line.strip():
            continue
        try:
            samples.append(parse_tegrastats_line(line))
        except ValueError:
            continue
    return samples


def read_tegrastats_log(path: Path) -> list[TegrastatsSample]:
    """All samples of a ``tegrastats --logfile`` file (or a captured stdout): a regular file of at most
    MAX_LOG_BYTES."""
    text = read_sensor_text(path, MAX_LOG_BYTES)
    return parse_tegrastats_lines(text.splitlines())


class TegrastatsSensor(PowerSensor):
    """Runs ``tegrastats --interval N`` and serves the latest line's rails.

    A daemon thread reads the tool's stdout; each line is stamped with the clock when it arrives, so
    ``read()`` at a higher rate than the interval returns the same reading again.
    """

    source = "tegrastats"

    def __init__(
        self,
        binary: str | os.PathLike[str] = "tegrastats",
        interval_ms: int = 1000,
        clock: Clock = time.monotonic,
        first_line_timeout_s: float | None = None,
    ) -> None:
        self._clock = clock
        self._timeout_s = first_line_timeout_s if first_line_timeout_s is not None else max(2.0, 3 * interval_ms / 1e3)
        self._latest: tuple[TegrastatsSample, float] | None = None
        self._cond = threading.Condition()
        try:
            self._proc = subprocess.Popen(
                [os.fspath(binary), "--interval", str(int(interval_ms))],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
        except OSError as err:
            raise SensorError(f"cannot run {os.fspath(binary)}: {err.strerror or err}") from err
        self._thread = threading.Thread(target=self._pump, name="tegrastats", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                sample = parse_tegrastats_line(line)
            except ValueError:
                continue
            with self._cond:
                self._latest = (sample, self._clock())
                self._cond.notify_all()
        self._proc.wait()  # stdout closed: reap the process so read() sees why it ended
        with self._cond:
            self._cond.notify_all()

    def latest_sample(self) -> TegrastatsSample | None:
        """The most recent parsed line (RAM, CPU, GR3D, temperatures too), None before the first."""
        with self._cond:
            return self._latest[0] if self._latest else None

    def read(self) -> PowerReading:
        with self._cond:
            self._cond.wait_for(lambda: self._latest is not None or self._proc.poll() is not None, self._timeout_s)
            latest = self._latest
        if latest is None:
            raise SensorError(f"tegrastats gave no line within {self._timeout_s:.1f} s{self._stderr_tail()}")
        if self._proc.poll() is not None:
            raise SensorError(f"tegrastats exited with code {self._proc.returncode}{self._stderr_tail()}")
        sample, stamp = latest
        return sample.power_reading(stamp, self.source)

    def _stderr_tail(self) -> str:
        if self._proc.poll() is None or self._proc.stderr is None:
            return ""
        text = self._proc.stderr.read().strip()
        return f": {text.splitlines()[-1]}" if text else ""

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._thread.join(timeout=2.0)
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


class TegrastatsLogSensor(PowerSensor):
    """Follows a log that a root ``tegrastats --logfile FILE`` writes: each read parses its last line."""

    source = "tegrastats-log"

    def __init__(self, path: Path, clock: Clock = time.monotonic, tail_bytes: int = 8192) -> None:
        self.path = path
        self._clock = clock
        self._tail_bytes = tail_bytes
        if not path.is_file():
            raise SensorError(f"no tegrastats log at {path}")

    def latest_sample(self) -> TegrastatsSample:
        try:  # a regular file only (a FIFO would block the read), and only its tail
            fd = open_regular(self.path, "the tegrastats log", "point it at the file tegrastats --logfile writes")
            with os.fdopen(fd, "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - self._tail_bytes))
                text = fh.read(self._tail_bytes).decode(errors="replace")
        except SacEdgeError as err:
            raise SensorError(str(err)) from None
        except OSError as err:
            raise SensorError(f"cannot read tegrastats log {self.path}: {err.strerror or err}") from err
        samples = parse_tegrastats_lines(text.splitlines())
        if not samples:
            raise SensorError(f"no tegrastats line at the end of {self.path}")
        return samples[-1]

    def read(self) -> PowerReading:
        return self.latest_sample().power_reading(self._clock(), self.source)
