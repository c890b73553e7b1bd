"""The CPUs this process may run on, and the thread counts that fit them."""

from __future__ import annotations

import os

from .errors import SacEdgeError


def usable_cpus() -> int:
    """CPUs this process may use (its affinity mask: a container's or ``taskset``'s limit, not the machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # macOS and Windows have no affinity mask


def check_threads(value: int, flag: str = "--threads") -> None:
    """Refuse a thread count under 1 or above the usable CPUs: each thread past them only waits for a core, and a
    huge count makes the backend start thousands of threads (minutes of start-up, or a crash under a memory limit)."""
    most = usable_cpus()
    if not 1 <= value <= most:
        raise SacEdgeError(f"{flag} must be from 1 to {most} (the CPUs this process may use), got {value}")


def check_cpus(cpus: tuple[int, ...], flag: str = "--cpus") -> None:
    """Refuse CPUs this process may not run on (found before the bundle is opened, not when the loop pins)."""
    if not cpus or not hasattr(os, "sched_getaffinity"):
        return
    allowed = os.sched_getaffinity(0)
    outside = sorted(set(cpus) - allowed)
    if outside:
        raise SacEdgeError(
            f"{flag} names CPU {outside[0]}, which this process may not use; choose from {_ranges(sorted(allowed))}"
        )


def _ranges(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``."""
    out: list[str] = []
    for cpu in cpus:
        if out and out[-1].split("-")[-1] == str(cpu - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)
