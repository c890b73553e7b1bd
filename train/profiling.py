"""``sac-train --profile [N]``: N updates after warm-up under ``torch.profiler``, a trace that Perfetto
(ui.perfetto.dev) and TensorBoard's profiler plugin open, and where the update's time goes by op category.

The phases of a step (collect, sample, critic, actor, alpha, target) are named ranges: ``record_function``
ranges in the trace, NVTX ranges on CUDA (for Nsight Systems, also outside ``--profile``). Off a GPU and
outside a profile they are a shared null context, and inside a compiled graph they are left out (dynamo
would break the graph at them).

The breakdown books each op's self time (its time minus its children's) to a category by its name; the
self time of the phase ranges themselves is Python between ops ("untraced"). Hand-written gradients
(``--backward manual``) and autograd both call aten ops, so one categoriser covers both paths.
"""

from __future__ import annotations

import contextlib
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from sac_edge.common.atomic import atomic_path, atomic_write_json
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.table import format_table

from . import compat
from .config import TrainConfig

#: Updates run (and compiled, under --compile) before the profiled ones, so the profile is of the steady state.
WARMUP_UPDATES = 50
PROFILE_DIR = "profile"
TRACE = "sac-train.pt.trace.json"  # the name TensorBoard's profiler plugin looks for (*.pt.trace.json)
BREAKDOWN = "breakdown.json"
PREFIX = "sac:"
PHASES = ("collect", "sample", "critic", "actor", "alpha", "target")
UPDATE = "update"

#: (category, pattern on the op name), first match wins; the name is lower-cased, ``aten::`` kept.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("host-device copies", r"memcpy|memset|_local_scalar_dense|pin_memory|cudastreamsynchronize|\bitem\b"),
    ("optimiser", r"adam|optimizer|_foreach_|\blerp|zero_grad|addcmul|addcdiv"),
    ("matmul", r"::(mm|addmm|bmm|baddbmm|matmul|linear|addmv|mv|dot|_addmm_activation)\b|gemm|mkldnn_|cutlass"),
    ("activations", r"relu|clamp_min|threshold|tanh|softplus|sigmoid|::(exp|log|exp_|log_)\b|gelu|silu|elu"),
    (
        "cat/copy/index",
        r"::(cat|copy_|_to_copy|to|clone|contiguous|index|index_select|gather|scatter_?|slice|select|narrow|"
        r"stack|expand|view|reshape|_reshape_alias|t|transpose|permute|unsqueeze|squeeze|split|chunk|"
        r"as_strided|detach|alias|unbind|flatten|lift_fresh|resolve_conj|resolve_neg|empty_like|repeat)\b",
    ),
    (
        "elementwise & reductions",
        r"::(add|add_|sub|sub_|mul|mul_|div|div_|neg|square|pow|sqrt|rsqrt|sum|mean|min|max|amin|amax|where|"
        r"isfinite|logical_and|bitwise_and|bitwise_and_|eq|ne|lt|gt|le|ge|abs|clamp|clamp_|rsub|reciprocal|"
        r"fill_|zero_|zeros|ones|zeros_like|ones_like|full|randn|normal_|uniform_|randint|random_|"
        r"uniform|floor|remainder|sign|minimum|maximum|var|std|lerp_)\b|cpp_fused|triton_",
    ),
)
OTHER = "other"
UNTRACED = "untraced (Python between phases)"
COLUMNS = [name for name, _ in CATEGORIES] + [OTHER]
_PATTERNS = [(name, re.compile(pattern)) for name, pattern in CATEGORIES]

_ranges_on = _nvtx_on = False
_NULL = contextlib.nullcontext()


def category(name: str) -> str:
    """The category of the op (or kernel) called ``name``."""
    lower = name.lower()
    if lower.startswith("autograd::engine"):  # the engine's own bookkeeping around a backward node
        return OTHER
    for cat, pattern in _PATTERNS:
        if pattern.search(lower):
            return cat
    return OTHER


def enable_ranges(on: bool, nvtx: bool = False) -> None:
    """Turn the phase ranges on (CUDA: always, for Nsight, with ``nvtx``; CPU: while profiling) or off."""
    global _ranges_on, _nvtx_on
    _ranges_on, _nvtx_on = on, on and nvtx


def phase(name: str) -> contextlib.AbstractContextManager[Any]:
    """A named range around one phase of a step: ``record_function`` and, on CUDA, NVTX."""
    if not _ranges_on or compat.is_compiling():
        return _NULL
    return _Range(name)


class Phases:
    """Consecutive phases of one function: each ``enter`` ends the range before it, ``end`` the last."""

    def __init__(self) -> None:
        self._current: contextlib.AbstractContextManager[Any] | None = None

    def enter(self, name: str) -> None:
        if not _ranges_on or compat.is_compiling():
            return
        self.end()
        self._current = phase(name)
        self._current.__enter__()

    def end(self) -> None:
        if _ranges_on and not compat.is_compiling() and self._current is not None:
            self._current.__exit__(None, None, None)
            self._current = None


class _Range:
    def __init__(self, name: str) -> None:
        self.name = name
        self.fn = torch.profiler.record_function(PREFIX + name)
        self.nvtx = _nvtx_on

    def __enter__(self) -> None:
        self.fn.__enter__()
        if self.nvtx:
            torch.cuda.nvtx.range_push(self.name)

    def __exit__(self, *exc: Any) -> None:
        if self.nvtx:
            torch.cuda.nvtx.range_pop()
        self.fn.__exit__(*exc)


def check_fits(cfg: TrainConfig, step: int) -> None:
    """One line before any slow work when ``--total-steps`` ends the run before the profile is taken."""
    if not cfg.profile:
        return
    per_step = cfg.num_envs * cfg.utd
    need = max(step, cfg.learning_starts) + cfg.num_envs * math.ceil((WARMUP_UPDATES + cfg.profile) / per_step)
    if cfg.total_steps < need:
        raise SacEdgeError(
            f"--profile {cfg.profile} needs {WARMUP_UPDATES} warm-up updates after --learning-starts and then "
            f"{cfg.profile} more: raise --total-steps to at least {need} or lower --learning-starts"
        )


class ProfileSession:
    """Profiles the steps taken inside it; ``add`` books each step's collection and update time."""

    def __init__(self, device: torch.device) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.device = device
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.prof = profile(activities=activities)
        self.collect_s = self.update_s = 0.0
        self.steps = self.updates = 0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        cuda = self.device.type == "cuda"
        enable_ranges(True, nvtx=cuda)
        try:
            with self.prof:
                yield
                if cuda:
                    torch.cuda.synchronize(self.device)
        finally:
            enable_ranges(cuda, nvtx=cuda)

    def add(self, collect_s: float, update_s: float, updates: int) -> None:
        self.collect_s += collect_s
        self.update_s += update_s
        self.steps += 1
        self.updates += updates

    def breakdown(self) -> dict[str, Any]:
        """Milliseconds per update by category over the update ranges: ``op_ms`` the ops' own time,
        ``host_ms`` that plus the Python call before each op (argument parsing, the binding), which ends
        where the op starts; what is left between phases is ``untraced_ms``. On CUDA ``device_ms`` adds the
        kernels' time by the category of the op that launched them."""
        ops = dict.fromkeys(COLUMNS, 0.0)
        calls = dict.fromkeys(COLUMNS, 0.0)
        device = dict.fromkeys(COLUMNS, 0.0)
        untraced = 0.0
        for event in self.prof.events():
            if not _inside_update(event):
                continue
            if event.name.startswith(PREFIX):
                untraced += _book_gaps(event, calls)
                continue
            cat = category(event.name)
            ops[cat] += event.self_cpu_time_total
            for kernel in getattr(event, "kernels", []):
                device[category(kernel.name) if "memcpy" in kernel.name.lower() else cat] += kernel.duration
        n = max(self.updates, 1)
        update_ms = self.update_s * 1000.0 / n
        per_update = 1000.0 * n  # microseconds in total -> milliseconds per update
        result: dict[str, Any] = {
            "updates": self.updates,
            "steps": self.steps,
            "collect_ms_per_step": self.collect_s * 1000.0 / max(self.steps, 1),
            "update_ms": update_ms,
            "collect_share": self.collect_s / max(self.collect_s + self.update_s, 1e-12),
            "host_ms": {k: (ops[k] + calls[k]) / per_update for k in COLUMNS},
            "op_ms": {k: ops[k] / per_update for k in COLUMNS},
            "untraced_ms": untraced / per_update,
        }
        if self.device.type == "cuda":
            result["device_ms"] = {k: v / per_update for k, v in device.items()}
        covered = sum(result["host_ms"].values())
        result["coverage"] = covered / update_ms if update_ms > 0 else 0.0
        result["op_coverage"] = sum(result["op_ms"].values()) / update_ms if update_ms > 0 else 0.0
        return result

    def write(self, run: Path, result: dict[str, Any]) -> Path:
        """``RUN/profile/``: the trace and ``breakdown.json`` (``result``); returns the directory."""
        out = run / PROFILE_DIR
        out.mkdir(exist_ok=True)
        with atomic_path(out / TRACE) as tmp:
            self.prof.export_chrome_trace(str(tmp))
        atomic_write_json(out / BREAKDOWN, result)
        return out


def _book_gaps(phase_event: Any, calls: dict[str, float]) -> float:
    """Charge each gap inside a phase range to the op that ends it (its Python call) in ``calls``; return
    the microseconds before the phase's nested ranges and after its last child (Python between phases)."""
    rest, previous = 0.0, phase_event.time_range.start
    for child in sorted(phase_event.cpu_children, key=lambda e: e.time_range.start):
        gap = max(child.time_range.start - previous, 0)
        if child.name.startswith(PREFIX):
            rest += gap
        else:
            calls[category(child.name)] += gap
        previous = max(previous, child.time_range.end)
    return rest + max(phase_event.time_range.end - previous, 0)


def _inside_update(event: Any) -> bool:
    parent = event
    while parent is not None:
        if parent.name == PREFIX + UPDATE:
            return True
        parent = parent.cpu_parent
    return False


def table(result: dict[str, Any]) -> str:
    """The breakdown as printed: one row per category (ms per update and % of the update's wall time)."""
    total = result["update_ms"] or 1.0
    cuda = "device_ms" in result
    rows = []
    for cat in COLUMNS:
        ms = result["host_ms"][cat]
        row: list[Any] = [cat, round(ms, 4), f"{100 * ms / total:.1f}%", round(result["op_ms"][cat], 4)]
        if cuda:
            row.append(round(result["device_ms"][cat], 4))
        rows.append(row)
    untraced = result["untraced_ms"]
    rows.append([UNTRACED, round(untraced, 4), f"{100 * untraced / total:.1f}%", "-"] + (["-"] if cuda else []))
    header = ["category", "ms/update", "% of update", "in the op"] + (["GPU ms/update"] if cuda else [])
    share = result["collect_share"]
    return "\n".join(
        [
            format_table(rows, header),
            f"categories cover {100 * result['coverage']:.1f}% of the update's wall time, the ops alone "
            f"{100 * result['op_coverage']:.1f}% (the rest of a row is its Python call) "
            f"({result['update_ms']:.3f} ms per update over {result['updates']} updates)",
            f"collection {result['collect_ms_per_step']:.3f} ms per env step ({100 * share:.1f}% of the profiled "
            f"time), updates {100 * (1 - share):.1f}%",
        ]
    )


def report(session: ProfileSession, run: Path, to_stderr: bool) -> None:
    """Write the trace and the breakdown under ``RUN/profile`` and print the table."""
    result = session.breakdown()
    out = session.write(run, result)
    print(table(result), file=sys.stderr if to_stderr else sys.stdout)
    print(
        f"sac-train: profile in {out / TRACE} (open in ui.perfetto.dev, or `tensorboard --logdir {out}` with "
        "torch-tb-profiler); the run stops here and continues with --resume",
        file=sys.stderr if to_stderr else sys.stdout,
    )
