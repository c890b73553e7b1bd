"""``--amp auto`` and ``--compile auto``: the fastest training path that learns the same, chosen per machine
and run, and saved resolved in ``config.json`` (so ``--resume`` continues on exactly the same path).

- ``--amp auto``: on CUDA by compute capability (``train/precision.py``: fp16 with a scaler on 7.x, bf16
  from 8.0, with TF32 for fp32 matmuls); on a CPU bf16 where it multiplies bf16 natively (AVX512-BF16 or
  AMX), fp32 elsewhere: without those units oneDNN emulates bf16 GEMMs in fp32, slower.
  bf16 GEMM operands learn the same curves as fp32 (BENCHMARKS.md, learning
  curves).
- ``--backward auto``: resolved too, so ``config.json`` says which backward ran.
- ``--compile auto``: on when the run has enough updates to repay compiling them: from
  ``COMPILE_S / SAVED_S`` updates (the saving scaled linearly with the batch size). The two constants are
  defaults measured on the reference CPU (``bench/train_speed.py``; the measurements and the resulting
  break-even are in BENCHMARKS.md's training section); a machine that compiles faster or slower moves
  the break-even, and ``--compile on`` / ``--compile off`` decide it outright. Off on CUDA (its gain
  there is measured by ``scripts/gpu_check.sh``, not assumed) and with ``--backward autograd`` on a CPU
  (slower than eager there).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

import torch

from . import compat, precision
from .config import TrainConfig

#: Default seconds to compile the hand-written update (the reference CPU's measurement, BENCHMARKS.md).
COMPILE_S = 35.0
#: Default seconds a compiled update saves over the eager one, per --amp (batch 256, 256x256 networks).
SAVED_S = {"off": 1.7e-3, "bf16": 2.4e-3}
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")


class Resolved(NamedTuple):
    """The config with ``auto`` replaced by the choice, one log line per ``auto`` resolved (or warning), saying
    why, and the choices for ``config.json``."""

    cfg: TrainConfig
    reasons: tuple[str, ...]
    choices: dict[str, Any]


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, ...]:
    """The bf16 matrix-instruction flags of this CPU: torch's CPU capability probes, or the flags in
    ``/proc/cpuinfo`` where this torch has no such probes."""
    probes = (("avx512_bf16", "_is_avx512_bf16_supported"), ("amx_tile", "_is_amx_tile_supported"))
    if all(hasattr(torch.cpu, attr) for _, attr in probes):
        return tuple(name for name, attr in probes if getattr(torch.cpu, attr)())
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return ()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return tuple(f for f in BF16_CPU_FLAGS if f in flags)


def resolve_amp(amp: str, device: torch.device) -> tuple[str, str]:
    """``--amp`` as given (no reason), or for ``auto`` bf16 where the device has bf16 matrix units, and why."""
    if amp != "auto":
        return amp, ""
    if device.type == "cuda":
        choice = precision.device_precision(device)
        return choice.amp, choice.reason
    flags = cpu_bf16_flags()
    if flags:
        return "bf16", f"--amp auto -> bf16: this CPU has bf16 matrix instructions ({', '.join(flags)})"
    return "off", "--amp auto -> off (fp32): this CPU has no AVX512-BF16 or AMX, where bf16 would be slower"


def planned_updates(cfg: TrainConfig, step: int = 0) -> int:
    """Updates still to run from ``step`` (one per env step per env after ``learning_starts``, times UTD)."""
    return max(0, cfg.total_steps - max(cfg.learning_starts, step)) * cfg.utd


def compile_break_even(amp: str, batch_size: int) -> int:
    """Updates after which a compiled update has repaid its compile time (CPU, 256x256 networks)."""
    saved_s = SAVED_S.get(amp, SAVED_S["off"]) * max(batch_size, 1) / 256
    return int(COMPILE_S / saved_s)


def resolve_compile(cfg: TrainConfig, device: torch.device, manual: bool, step: int = 0) -> tuple[str, str]:
    """``--compile`` as given (no reason), or for ``auto`` on when the run is long enough to repay compiling,
    and why.

    ``manual``: whether the hand-written update is in use (the one compiling is measured on).
    """
    if cfg.compile != "auto":
        return cfg.compile, ""
    if not compat.COMPILE:
        return "off", f"--compile auto -> off: torch {torch.__version__} has no set_stance (needs >= 2.6)"
    if device.type != "cpu":
        return "off", "--compile auto -> off: its gain on CUDA is not measured yet; pass --compile to try it"
    if not manual:
        return "off", "--compile auto -> off: the compiled autograd update was slower than eager on a CPU"
    updates, need = planned_updates(cfg, step), compile_break_even(cfg.amp, cfg.batch_size)
    verdict = "on" if updates >= need else "off"
    return verdict, (
        f"--compile auto -> {verdict}: {updates:,} updates to run, compiling (about {COMPILE_S:.0f} s cold) "
        f"pays from about {need:,} updates"
    )


def resolve_backward(cfg: TrainConfig, device: torch.device) -> tuple[str, str]:
    """``--backward`` resolved to the path that runs, and why when ``auto`` leaves the CPU's fast manual path
    for a flag that needs autograd (empty otherwise)."""
    from .sac import use_manual_backward  # the one rule for the gradient path

    backward = "manual" if use_manual_backward(cfg, device) else "autograd"
    if cfg.backward != "auto" or backward == "manual" or device.type != "cpu":
        return backward, ""
    why = "--grad-checkpoint" if cfg.grad_checkpoint else "--amp fp16"
    return backward, f"--backward auto -> autograd: {why} needs it, slower than the manual backward on a CPU"


#: Fewer critic layers than this: checkpointing saves less than from here on (BENCHMARKS.md, gradient
#: checkpointing: 10-21% of an update's working memory at 2 layers, 23-33% at 8, against autograd alone).
CHECKPOINT_PAYS_FROM = 4


def checkpoint_warning(cfg: TrainConfig) -> str:
    """One warning line when ``--grad-checkpoint`` is asked for critics too shallow for it to pay well."""
    if not cfg.grad_checkpoint or cfg.critic_layers >= CHECKPOINT_PAYS_FROM:
        return ""
    return (
        f"warning: --grad-checkpoint at --critic-layers {cfg.critic_layers} saves little: measured at 2 layers "
        "10-21% less working memory than --backward autograd alone, at 0.86-0.99x its speed; most of the "
        "saving over the manual backward comes from autograd itself (BENCHMARKS.md, gradient checkpointing)"
    )


def resolve_speed(cfg: TrainConfig, device: torch.device, step: int = 0) -> Resolved:
    """Resolve ``--amp``, ``--backward`` then ``--compile`` (which depends on the precision and the gradient
    path); the CUDA device's precision record goes into ``choices``."""
    amp, amp_reason = resolve_amp(cfg.amp, device)
    reasons = [amp_reason]
    choices: dict[str, Any] = {}
    if device.type == "cuda":
        cuda = precision.device_precision(device)
        choices["precision"] = {**cuda.record, "amp": amp}
        reasons.append(precision.explicit_amp_warning(cfg.amp, cuda) or "")
    cfg = dataclasses.replace(cfg, amp=amp)
    backward, backward_reason = resolve_backward(cfg, device)
    cfg = dataclasses.replace(cfg, backward=backward)
    compile_, compile_reason = resolve_compile(cfg, device, backward == "manual", step)
    reasons += [backward_reason, checkpoint_warning(cfg), compile_reason]
    choices["backward"] = backward
    return Resolved(dataclasses.replace(cfg, compile=compile_), tuple(r for r in reasons if r), choices)
