"""``--amp auto`` on CUDA by compute capability, with the device properties of each GPU the project meets
standing in for the device (none here): fp16 with a scaler on 7.x, bf16 from 8.0 with TF32 for fp32
matmuls, fp32 below 7.0; logged with the device's name and saved in ``config.json``'s choices. The same
choice on a real GPU: the ``gpu`` test below and ``scripts/gpu_check.sh``."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from sac_edge.train import defaults, precision
from sac_edge.train.config import TrainConfig

CUDA = torch.device("cuda")
#: name, compute capability, the expected --amp auto, TF32 for fp32 matmuls
DEVICES = [
    ("Tesla V100-SXM2-16GB", (7, 0), "fp16", False),
    ("Tesla T4", (7, 5), "fp16", False),
    ("Xavier", (7, 2), "fp16", False),
    ("NVIDIA A100-SXM4-40GB", (8, 0), "bf16", True),
    ("Orin", (8, 7), "bf16", True),
    ("NVIDIA H100 80GB HBM3", (9, 0), "bf16", True),
    ("Tesla P100-PCIE-16GB", (6, 0), "off", False),
]


def _device(monkeypatch: pytest.MonkeyPatch, name: str, capability: tuple[int, int]) -> None:
    props = SimpleNamespace(name=name, major=capability[0], minor=capability[1])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    # The bug this replaces: torch reports bf16 "supported" on Volta and Turing through emulation.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)


@pytest.mark.parametrize(("name", "capability", "amp", "tf32"), DEVICES)
def test_amp_auto_follows_the_compute_capability(monkeypatch, name, capability, amp, tf32):
    _device(monkeypatch, name, capability)
    got, reason = defaults.resolve_amp("auto", CUDA)
    assert got == amp
    cc = f"{capability[0]}.{capability[1]}"
    assert reason.startswith("--amp auto -> ") and f" on {name}: compute capability {cc}" in reason
    assert ("fp32 matmuls use TF32" in reason) == tf32
    if amp == "fp16":
        assert "with a gradient scaler" in reason
    resolved = defaults.resolve_speed(TrainConfig(device="cuda"), CUDA)
    assert resolved.cfg.amp == amp and resolved.cfg.backward == "autograd"
    assert resolved.choices["precision"] == {"device": name, "capability": cc, "amp": amp, "tf32": tf32}
    assert any(r.startswith("--amp auto") for r in resolved.reasons)


@pytest.mark.parametrize(("name", "capability", "amp", "tf32"), DEVICES)
def test_explicit_bf16_warns_where_it_is_emulated(monkeypatch, name, capability, amp, tf32):
    _device(monkeypatch, name, capability)
    resolved = defaults.resolve_speed(TrainConfig(device="cuda", amp="bf16"), CUDA)
    assert resolved.cfg.amp == "bf16"  # an explicit choice is kept
    warned = [r for r in resolved.reasons if r.startswith("warning: --amp bf16")]
    assert bool(warned) == (amp != "bf16")
    assert resolved.choices["precision"]["tf32"] == tf32


def test_tf32_switch_sets_both_backends():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        precision.apply_tf32(True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        precision.apply_tf32(False)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.gpu
def test_the_real_gpu_gets_its_capability_s_choice():
    from sac_edge.common.spec import PolicySpec
    from sac_edge.train.sac import SAC

    major = torch.cuda.get_device_capability(CUDA)[0]
    want = "bf16" if major >= 8 else "fp16" if major == 7 else "off"
    resolved = defaults.resolve_speed(TrainConfig(device="cuda"), CUDA)
    assert resolved.cfg.amp == want
    spec = PolicySpec("Pendulum-v1", 3, 1, (-2.0,), (2.0,), (16, 16))
    SAC(spec, replace(resolved.cfg, hidden=(16, 16), buffer_size=64), CUDA)
    assert torch.backends.cuda.matmul.allow_tf32 == (major >= 8)
