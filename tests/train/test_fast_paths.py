"""The switchable fast paths learn the same thing: AMP, torch.compile, CUDA graphs, gradient checkpointing."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.spec import PolicySpec
from sac_edge.train.config import TrainConfig
from sac_edge.train.sac import SAC

SPEC = PolicySpec("Pendulum-v1", 3, 1, (-2.0,), (2.0,), (32, 32))
BASE = TrainConfig(
    env="Pendulum-v1", hidden=(32, 32), batch_size=64, buffer_size=2000, seed=0, amp="off", compile="off"
)


def _filled(cfg: TrainConfig, device: str = "cpu") -> SAC:
    sac = SAC(SPEC, cfg, torch.device(device))
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((1000, 3)).astype(np.float32)
    act = rng.uniform(-1, 1, (1000, 1)).astype(np.float32)
    reward = -np.square(obs).sum(1)
    sac.buffer.add(obs, act, reward, obs * 0.9 + act * 0.1, np.zeros(1000, np.float32))
    sac.obs_norm.update(torch.as_tensor(obs, device=device))
    sac.prepare_fast_path()
    return sac


def _run(sac: SAC, n: int) -> list[float]:
    return [float(sac.step().critic_loss) for _ in range(n)]


def _params(sac: SAC) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten().cpu() for p in sac.actor.parameters()])


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_amp_updates_track_fp32(amp):
    ref, fast = _filled(BASE), _filled(replace(BASE, amp=amp))
    a, b = _run(ref, 30), _run(fast, 30)
    assert all(np.isfinite(b))
    assert abs(np.mean(a[-10:]) - np.mean(b[-10:])) < 0.25 * abs(np.mean(a[-10:])) + 0.05
    assert (_params(ref) - _params(fast)).abs().max() < 0.05


def test_grad_checkpoint_matches_plain_updates():
    deep = replace(BASE, critic_layers=4)
    a, b = _filled(deep), _filled(replace(deep, grad_checkpoint=True))
    np.testing.assert_allclose(_run(a, 5), _run(b, 5), rtol=1e-4)
    assert torch.allclose(_params(a), _params(b), atol=1e-5)


def test_cuda_graphs_need_cuda():
    with pytest.raises(SacEdgeError, match="--cuda-graphs needs --device cuda"):
        SAC(SPEC, replace(BASE, cuda_graphs=True), torch.device("cpu"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backward", "amp"),
    [("manual", "off"), ("autograd", "off"), ("manual", "bf16")],
    ids=["manual", "autograd", "bf16"],
)
def test_compile_matches_eager_on_cpu(backward, amp):
    cfg = replace(BASE, backward=backward, amp=amp)
    torch._dynamo.utils.counters.clear()
    eager, compiled = _filled(cfg), _filled(replace(cfg, compile="on"))
    assert compiled.backward == backward
    tol = 1e-3 if amp == "off" else 2e-2  # bf16: inductor fuses the casts, so the roundings differ slightly
    np.testing.assert_allclose(_run(eager, 5), _run(compiled, 5), rtol=tol, atol=tol / 10)
    assert torch.allclose(_params(eager), _params(compiled), atol=tol / 10)
    if backward == "manual":  # the whole update, Adam included, is one graph
        assert not torch._dynamo.utils.counters["graph_break"]


@pytest.mark.slow
def test_compiled_update_follows_a_state_load_and_eager_updates():
    """After warm-up the compiled update skips its guards and counts Adam's steps on the host; a state load
    and eager updates in between must still reach it (new tensors, the right bias corrections). The params
    agree to float rounding (about 1e-8); bias corrections a few steps off move them by 1e-5 or more."""
    eager, compiled = _filled(BASE), _filled(replace(BASE, compile="on"))
    _run(eager, 4)
    _run(compiled, 2)
    tensors, extra = eager.state_tensors()
    compiled.load_state_tensors({k: v.clone() for k, v in tensors.items()}, extra)
    np.testing.assert_allclose(_run(eager, 3), _run(compiled, 3), rtol=1e-3, atol=1e-4)
    assert torch.allclose(_params(eager), _params(compiled), atol=3e-6)
    for sac in (eager, compiled):
        for _ in range(10):
            sac.update(sac.buffer.sample(BASE.batch_size, sac.generator))
    np.testing.assert_allclose(_run(eager, 3), _run(compiled, 3), rtol=1e-3, atol=1e-4)
    assert torch.allclose(_params(eager), _params(compiled), atol=3e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("flags", [{}, {"cuda_graphs": True}, {"compile": "on", "cuda_graphs": True}, {"amp": "bf16"}])
def test_cuda_paths_match_cpu_updates(flags):
    cfg = replace(BASE, device="cuda", **flags)
    gpu = _filled(cfg, "cuda")
    losses = _run(gpu, 40)
    assert all(np.isfinite(losses))
    assert gpu.buffer.obs.is_cuda
    cpu = _filled(BASE)
    ref = _run(cpu, 40)
    # Different RNG streams on the two devices: compare learning, not bits.
    assert abs(np.mean(losses[-10:]) - np.mean(ref[-10:])) < 0.5 * abs(np.mean(ref[-10:])) + 0.1
