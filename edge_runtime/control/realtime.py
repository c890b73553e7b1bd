"""Real-time scheduling for the control thread: CPU pinning, SCHED_FIFO priority, locked memory, idle states.

On a shared or busy CPU the loop's sleeps can wake milliseconds late; a SCHED_FIFO thread preempts
ordinary work, and ``mlockall`` (opt-in) keeps pages resident so a page fault never stalls a step. Linux
applies the policy per thread: call this from the control thread after starting the fine-tuner's threads
and process, so they stay at normal priority. Needs root or CAP_SYS_NICE (and CAP_IPC_LOCK for large locks).

Between steps the core idles, and waking from a deep idle state takes time: a Jetson's cores can be
power-gated, a virtual machine's vCPU halts and waits for the host to run it again (the miss rates at
1 kHz with and without the hold: BENCHMARKS.md "Edge: the action in the control loop"). ``hold_idle_latency``
caps the exit latency the kernel may choose through PM QoS (``/dev/cpu_dma_latency``: the request holds
while the file is open, for every CPU), as cyclictest does.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path

from sac_edge.common.errors import SacEdgeError

MCL_CURRENT, MCL_FUTURE = 1, 2  # <sys/mman.h>


def enter_realtime(priority: int, cpus: Sequence[int] = (), lock_memory: bool = False) -> list[str]:
    """Pin to ``cpus`` (if given), with ``priority`` 1..99 switch to SCHED_FIFO, and with ``lock_memory``
    lock every mapped page (``mlockall``). Locking makes reserved-but-untouched memory (thread stacks,
    allocator arenas) resident too, so RSS grows: measured here, 74 -> 229 MB for the onnxruntime loop.

    Returns what was applied, for the log; raises a one-line SacEdgeError when the OS refuses.
    """
    applied: list[str] = []
    if cpus:
        try:
            os.sched_setaffinity(0, set(cpus))
        except (OSError, ValueError) as err:
            raise SacEdgeError(
                f"cannot pin the control loop to CPUs {list(cpus)} ({err}); name CPUs that exist"
            ) from None
        applied.append(f"pinned to CPUs {sorted(cpus)}")
    if priority > 0:
        applied.append(_fifo(priority))
    if lock_memory:
        applied.append(_lock_memory())
    return applied


def _fifo(priority: int) -> str:
    """SCHED_FIFO for the calling thread only (Linux applies scheduling policy per thread)."""
    if not 1 <= priority <= os.sched_get_priority_max(os.SCHED_FIFO):
        raise SacEdgeError(f"--realtime-priority {priority} is out of range; use 1..99 (0 turns it off)")
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except PermissionError:
        raise SacEdgeError(
            "--realtime-priority needs root or CAP_SYS_NICE; run with sudo, grant the capability, or pass 0"
        ) from None
    return f"SCHED_FIFO priority {priority}"


def _lock_memory() -> str:
    """Lock current and future pages of the whole process."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.mlockall(MCL_CURRENT | MCL_FUTURE) != 0:
        errno = ctypes.get_errno()
        raise SacEdgeError(
            f"mlockall failed ({os.strerror(errno)}); raise the memlock limit (ulimit -l) or drop --lock-memory"
        )
    return "memory locked (mlockall)"


PM_QOS_DEVICE = Path("/dev/cpu_dma_latency")
#: The request is a signed 32-bit count of microseconds.
PM_QOS_MAX_US = 2**31 - 1


def check_idle_latency(latency_us: int) -> None:
    """A one-line error for a cap PM QoS cannot take (``sac-edge run`` checks it before any work)."""
    if latency_us < 0:
        raise SacEdgeError(f"--idle-latency-us {latency_us} is negative; use 0 or more microseconds")
    if latency_us > PM_QOS_MAX_US:
        raise SacEdgeError(f"--idle-latency-us {latency_us} is more than PM QoS takes; use 0 to {PM_QOS_MAX_US}")


@contextlib.contextmanager
def hold_idle_latency(latency_us: int, device: Path = PM_QOS_DEVICE) -> Iterator[str]:
    """Keep every CPU out of idle states whose exit latency exceeds ``latency_us`` while the block runs
    (0: no sleep state at all; the cores poll when idle, which costs idle power). Yields the log line."""
    check_idle_latency(latency_us)
    try:
        handle = open(device, "r+b", buffering=0)  # noqa: SIM115 (held open for the block: that is the request)
    except FileNotFoundError:
        raise SacEdgeError(
            f"{device} does not exist (not Linux, or not visible here); drop --idle-latency-us"
        ) from None
    except PermissionError:
        raise SacEdgeError(f"--idle-latency-us needs root to open {device}; run with sudo or drop it") from None
    with handle:
        handle.write(struct.pack("i", latency_us))
        yield f"CPU idle states limited to {latency_us} us exit latency (PM QoS, {device})"
