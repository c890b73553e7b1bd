import math

import pytest
import torch
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

from sac_edge.train.memory import peak_bytes
from sac_edge.train.policies import Actor, CriticEnsemble, InferencePolicy, ObsNormalizer


def test_log_prob_matches_tanh_gaussian_reference():
    torch.manual_seed(0)
    actor = Actor(5, 3, (32, 32))
    obs, noise = torch.randn(64, 5), torch.randn(64, 3)
    action, log_prob = actor.sample(obs, noise)
    mean, log_std = actor(obs)
    ref = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()])
    u = mean + log_std.exp() * noise
    expected = ref.log_prob(torch.tanh(u).clamp(-1 + 1e-6, 1 - 1e-6)).sum(-1)
    assert torch.allclose(action, torch.tanh(u))
    # The reference inverts tanh (atanh), which loses precision near +-1; compare where it is well-conditioned.
    ok = torch.tanh(u).abs().max(-1).values < 0.99
    assert ok.sum() > 20
    assert torch.allclose(log_prob[ok], expected[ok], atol=1e-3)


def test_log_std_is_bounded():
    actor = Actor(4, 2, (16,))
    with torch.no_grad():
        actor.log_std.bias.fill_(100.0)
    _, log_std = actor(torch.randn(8, 4))
    assert float(log_std.detach().max()) <= 2.0 + 1e-6


def test_ensemble_equals_independent_mlps():
    torch.manual_seed(1)
    critic = CriticEnsemble(4, 2, (16, 16), n_critics=2)
    obs, act = torch.randn(10, 4), torch.randn(10, 2)
    q = critic(obs, act)
    assert q.shape == (2, 10)
    x = torch.cat([obs, act], -1)
    for i in range(2):
        h = x
        for layer, (w, b) in enumerate(zip(critic.weights, critic.biases)):
            h = h @ w[i] + b[i]
            if layer < len(critic.weights) - 1:
                h = h.relu()
        assert torch.allclose(q[i], h.squeeze(-1), atol=1e-6)


def test_detached_critic_passes_gradient_to_inputs_only():
    critic = CriticEnsemble(3, 1, (8, 8))
    act = torch.randn(5, 1, requires_grad=True)
    critic(torch.randn(5, 3), act, detach_params=True).sum().backward()
    assert act.grad is not None and act.grad.abs().sum() > 0
    assert all(p.grad is None for p in critic.parameters())


def test_grad_checkpoint_gives_same_gradients():
    torch.manual_seed(2)
    plain = CriticEnsemble(3, 1, (16,) * 7)  # 6 layers after the first: segments of 3
    ckpt = CriticEnsemble(3, 1, (16,) * 7, grad_checkpoint=True)
    ckpt.load_state_dict(plain.state_dict())
    obs, act = torch.randn(7, 3), torch.randn(7, 1)
    plain(obs, act).sum().backward()
    ckpt(obs, act).sum().backward()
    for a, b in zip(plain.parameters(), ckpt.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_normalizer_matches_batch_statistics():
    norm = ObsNormalizer(3)
    data = torch.randn(1000, 3) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([0.0, 3.0, -2.0])
    for chunk in data.split(37):
        norm.update(chunk)
    assert torch.allclose(norm.mean.float(), data.mean(0), atol=1e-4)
    assert torch.allclose(norm.var.float(), data.var(0, unbiased=False), rtol=1e-3)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e30])
def test_inference_policy_action_is_finite_and_in_bounds(bad):
    norm = ObsNormalizer(3)
    norm.update(torch.randn(100, 3))
    policy = InferencePolicy(Actor(3, 2, (16,)), norm, torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0]))
    action = policy(torch.tensor([[bad, 0.5, -0.5]]))
    assert torch.isfinite(action).all()
    assert bool((action >= torch.tensor([-2.0, 0.0])).all() and (action <= torch.tensor([2.0, 1.0])).all())
    assert math.isclose(float(policy.act_bias[1]), 0.5)


def test_grad_checkpoint_saves_activation_memory():
    """Measured, not modelled: the backward of deep critics holds markedly less with checkpointing."""
    torch.manual_seed(0)
    obs, act = torch.randn(1024, 3), torch.randn(1024, 1)
    peaks = {}
    for gc in (False, True):
        critic = CriticEnsemble(3, 1, (256,) * 12, grad_checkpoint=gc)
        peaks[gc] = peak_bytes(lambda c=critic: c(obs, act).sum().backward())
    one_activation = 2 * 1024 * 256 * 4  # both critics' output of one layer, float32
    assert peaks[False] > 12 * one_activation  # the measurement sees the activations at all
    assert peaks[True] < 0.7 * peaks[False], peaks


def test_sample_action_is_the_action_of_sample():
    torch.manual_seed(4)
    actor = Actor(3, 2, (16, 16))
    obs, noise = torch.randn(9, 3), torch.randn(9, 2)
    assert torch.equal(actor.sample_action(obs, noise), actor.sample(obs, noise)[0])
