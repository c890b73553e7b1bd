"""The memory one call allocates at its peak, beyond what was allocated before it, on CPU or CUDA.

CUDA has the caching allocator's peak counter. CPU has no such counter, so the call runs once under
``torch.profiler`` with ``profile_memory=True`` and the allocations and frees it records are replayed in
time order: what the benchmarks report as a CPU update's working memory, and what checks that gradient
checkpointing saves any. The profiler books each op's net allocation, so a peak inside one opaque call
(a whole inductor graph) is invisible to it: measure eager code on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def peak_bytes(fn: Callable[[], Any], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated during ``fn()`` above the level before it (tensors it frees count until freed)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    level = peak = 0
    # Each op's own allocations (positive) and the allocator's frees ("[memory]", negative), in time order.
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        level += event.self_cpu_memory_usage
        peak = max(peak, level)
    return int(peak)
