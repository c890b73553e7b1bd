"""What ``train/`` uses from torch newer than 2.1 (NVIDIA's wheel for JetPack 5, Python 3.8), and what runs
on an older torch instead. The on-device fine-tuner reuses ``train/``, so this is what lets
``sac-edge run --finetune`` run on a Xavier NX.

- Fused Adam on a CPU (torch 2.4): below it the same Adam arithmetic is written out in tensor ops on the
  optimiser's own state (the autograd path uses the foreach Adam), so checkpoints hold the same tensors.
- ``torch.amp.GradScaler(device)`` (2.3): ``torch.cuda.amp.GradScaler`` (only ``--amp fp16`` on CUDA scales).
- ``torch.compiler.is_compiling`` (2.3) and ``set_stance`` (2.6): ``--compile`` needs torch 2.6.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from sac_edge.common.errors import SacEdgeError

TORCH = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])
FUSED_CPU_ADAM = TORCH >= (2, 4)
COMPILE = TORCH >= (2, 6)


def fused_adam(device: torch.device) -> bool:
    """Whether Adam's fused kernel runs on ``device`` with this torch."""
    return device.type != "cpu" or FUSED_CPU_ADAM


def is_compiling() -> bool:
    """``torch.compiler.is_compiling()``; always False where ``--compile`` is refused."""
    return COMPILE and torch.compiler.is_compiling()


def grad_scaler(device: torch.device, enabled: bool) -> Any:
    """The fp16 loss scaler for ``device``."""
    if TORCH >= (2, 3):
        return torch.amp.GradScaler(device.type, enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled and device.type == "cuda")


def check_compile() -> None:
    """``--compile`` on a torch without ``set_stance`` is a one-line error."""
    if not COMPILE:
        raise SacEdgeError(f"--compile needs torch >= 2.6 (set_stance), this is torch {torch.__version__}: drop it")


def notes() -> list[str]:
    """One line per feature switched off on this torch (empty on torch >= 2.6)."""
    out = []
    if not FUSED_CPU_ADAM:
        out.append(f"torch {torch.__version__}: no fused CPU Adam (torch >= 2.4), Adam runs as written-out tensor ops")
    if TORCH < (2, 3):
        out.append(f"torch {torch.__version__}: torch.cuda.amp.GradScaler in place of torch.amp.GradScaler")
    if not COMPILE:
        out.append(f"torch {torch.__version__}: --compile off (set_stance needs torch >= 2.6)")
    return out
