"""The hand-written update (``--backward manual``) is the autograd update, step for step."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.spec import PolicySpec
from sac_edge.train.config import TrainConfig
from sac_edge.train.sac import SAC

BASE = TrainConfig(
    env="Pendulum-v1", hidden=(32, 32), batch_size=64, buffer_size=2000, seed=0, amp="off", compile="off"
)


def _filled(cfg: TrainConfig, obs_dim: int = 3, act_dim: int = 1) -> SAC:
    spec = PolicySpec("Toy-v0", obs_dim, act_dim, (-2.0,) * act_dim, (2.0,) * act_dim, cfg.hidden)
    sac = SAC(spec, cfg, torch.device("cpu"))
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((1000, obs_dim)).astype(np.float32) * 3.0
    act = rng.uniform(-1, 1, (1000, act_dim)).astype(np.float32)
    reward = -np.square(obs).sum(1) - np.square(act).sum(1)
    done = (rng.random(1000) < 0.05).astype(np.float32)
    sac.buffer.add(obs, act, reward, obs * 0.9 + act.sum(1, keepdims=True) * 0.1, done)
    sac.obs_norm.update(torch.as_tensor(obs))
    return sac


def _state(sac: SAC) -> dict[str, torch.Tensor]:
    tensors, _ = sac.state_tensors()
    return {k: v for k, v in tensors.items() if not k.startswith(("replay.", "rng."))}


def _assert_same_state(a: SAC, b: SAC, rtol: float, atol: float) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], rtol=rtol, atol=atol, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"hidden": (16, 24, 32), "critic_layers": 3},
        {"autotune": False, "gamma": 0.9},
        {"alpha_lr": 1e-3, "init_alpha": 0.2},
    ],
    ids=["default", "deeper", "fixed-alpha", "alpha-lr"],
)
def test_manual_update_matches_autograd(changes):
    cfg = replace(BASE, **changes)
    manual, ref = _filled(replace(cfg, backward="manual"), 5, 2), _filled(replace(cfg, backward="autograd"), 5, 2)
    assert (manual.backward, ref.backward) == ("manual", "autograd")
    _assert_same_state(manual, ref, 0, 0)
    for step in range(25):
        m, r = manual.step(), ref.step()
        for name in ("critic_loss", "actor_loss", "alpha_loss", "alpha"):
            torch.testing.assert_close(getattr(m, name), getattr(r, name), rtol=1e-4, atol=1e-5)
        assert bool(m.finite)
        if step == 0:  # one step: gradients agree to float rounding (a step moves a weight by ~3e-4)
            _assert_same_state(manual, ref, 1e-4, 5e-6)
    _assert_same_state(manual, ref, 1e-3, 1e-4)


def test_checkpoint_state_moves_between_paths():
    manual = _filled(replace(BASE, backward="manual"))
    for _ in range(5):
        manual.step()
    tensors, extra = manual.state_tensors()
    ref = _filled(replace(BASE, backward="autograd"))
    again = _filled(replace(BASE, backward="manual"))
    for sac in (ref, again):  # each gets its own copy, as if read back from the file
        sac.load_state_tensors({k: v.clone() for k, v in tensors.items()}, extra)
    for _ in range(5):
        manual.step()
        again.step()
        ref.step()
    _assert_same_state(again, manual, 0, 0)  # resume within the path is exact
    _assert_same_state(ref, manual, 1e-3, 1e-4)


def test_bf16_manual_update_matches_bf16_autograd():
    """``--amp bf16``: the same gradients as autocast's to bf16 rounding (Adam's first moment after one
    step is 0.1 x the gradient); fp32 and bf16 differ by about 6% here, so a wrong cast would show."""
    cfg = replace(BASE, amp="bf16")
    manual, ref = _filled(replace(cfg, backward="manual"), 5, 2), _filled(replace(cfg, backward="autograd"), 5, 2)
    m, r = manual.step(), ref.step()
    for name in ("critic_loss", "actor_loss", "alpha_loss"):
        torch.testing.assert_close(getattr(m, name), getattr(r, name), rtol=1e-2, atol=1e-3)
    sm, sr = _state(manual), _state(ref)
    moments = [k for k in sr if k.endswith(".exp_avg")]
    assert len(moments) == len(list(ref.actor.parameters())) + len(list(ref.critic.parameters())) + 1
    for key in moments:
        scale = float(sr[key].abs().max())
        torch.testing.assert_close(sm[key], sr[key], rtol=0, atol=0.02 * scale, msg=lambda m, k=key: f"{k}: {m}")
    for _ in range(20):
        assert bool(manual.step().finite)
    assert all(p.dtype == torch.float32 for p in manual.actor.parameters())


def test_auto_picks_manual_only_for_the_cpu_non_fp16_eager_path():
    assert _filled(BASE).backward == "manual"
    assert _filled(replace(BASE, compile="on")).backward == "manual"
    assert _filled(replace(BASE, amp="bf16")).backward == "manual"
    assert _filled(replace(BASE, amp="fp16")).backward == "autograd"
    assert _filled(replace(BASE, critic_layers=3, grad_checkpoint=True)).backward == "autograd"
    with pytest.raises(SacEdgeError, match="--backward manual cannot be combined with --amp fp16"):
        _filled(replace(BASE, backward="manual", amp="fp16"))


def test_manual_update_records_no_autograd_graph():
    sac = _filled(BASE)
    metrics = sac.step()
    assert all(t.grad_fn is None for t in metrics)
    assert all(p.grad is None for p in [*sac.actor.parameters(), *sac.critic.parameters()])


@pytest.mark.parametrize("backward", ["manual", "autograd"])
def test_torch_21_adam_matches_the_fused_kernel(monkeypatch, backward):
    """On torch < 2.4 (JetPack 5's 2.1) there is no fused CPU Adam: the written-out / foreach Adam that runs
    instead keeps the same state and takes the same steps."""
    from sac_edge.train import compat

    fused = _filled(replace(BASE, backward=backward))
    for _ in range(10):
        fused.step()
    monkeypatch.setattr(compat, "FUSED_CPU_ADAM", False)  # what torch 2.1 has
    old = _filled(replace(BASE, backward=backward))
    for _ in range(10):
        old.step()
    assert fused.critic_opt.defaults["fused"] and not old.critic_opt.defaults["fused"]
    assert any("no fused CPU Adam" in note for note in compat.notes())
    _assert_same_state(fused, old, rtol=1e-4, atol=1e-5)
