"""The precision of a CUDA device's training matmuls, from its compute capability (``--amp auto``).

``torch.cuda.is_bf16_supported()`` is true on Volta and Turing too (its default ``including_emulation``),
where bf16 runs without tensor cores; so the choice reads the capability itself:

- 7.x (V100 7.0, Xavier 7.2, T4 7.5): fp16 tensor cores, no bf16 ones -> fp16 with a gradient scaler;
- 8.0 and later (A100 8.0, Orin 8.7, H100 9.0): bf16 tensor cores -> bf16 (no scaler: fp32's exponent
  range), and fp32 matmuls outside autocast may use TF32 (``allow_tf32``);
- older: fp32.

``scripts/gpu_check.sh`` checks the choice on a real GPU.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

BF16_FROM = (8, 0)
FP16_FROM = (7, 0)


class CudaPrecision(NamedTuple):
    """``--amp`` for a device, whether fp32 matmuls use TF32 there, and the log line saying why."""

    amp: str
    tf32: bool
    reason: str
    record: dict[str, Any]


def cuda_precision(name: str, capability: tuple[int, int]) -> CudaPrecision:
    """The ``--amp auto`` choice for a CUDA device of ``name`` and compute ``capability``."""
    cc = f"{capability[0]}.{capability[1]}"
    tf32 = capability >= BF16_FROM
    if capability >= BF16_FROM:
        amp, why = "bf16", f"compute capability {cc} has bf16 tensor cores"
    elif capability >= FP16_FROM:
        amp, why = "fp16", f"compute capability {cc} has fp16 tensor cores but no bf16 ones (bf16 is emulated)"
    else:
        amp, why = "off", f"compute capability {cc} has no fp16 or bf16 tensor cores"
    shown = {"bf16": "bf16", "fp16": "fp16 with a gradient scaler", "off": "off (fp32)"}[amp]
    reason = f"--amp auto -> {shown} on {name}: {why}"
    if tf32:
        reason += "; fp32 matmuls use TF32"
    record = {"device": name, "capability": cc, "amp": amp, "tf32": tf32}
    return CudaPrecision(amp, tf32, reason, record)


def device_precision(device: torch.device) -> CudaPrecision:
    """``cuda_precision`` of the CUDA device ``device`` as torch reports it."""
    props = torch.cuda.get_device_properties(device)
    return cuda_precision(props.name, (props.major, props.minor))


def explicit_amp_warning(amp: str, choice: CudaPrecision) -> str | None:
    """A warning when ``--amp bf16`` is asked for on a device that only emulates it."""
    if amp == "bf16" and choice.amp != "bf16":
        return (
            f"warning: --amp bf16 on {choice.record['device']} (compute capability {choice.record['capability']}) "
            "runs emulated, without tensor cores; --amp fp16 (or auto) is the fast path there"
        )
    return None


def apply_tf32(enabled: bool) -> None:
    """Let fp32 matmuls (and cuDNN) use TF32 where the device has it."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
