"""SAC networks, kept apart from the algorithm: actor, fused twin-critic ensemble, obs normaliser.

The twin critics are one module whose weights are stacked ``[n_critics, in, out]``, so both critics run
as one batched matmul per layer instead of two separate MLPs (fewer, larger kernels; one optimiser
group). ``InferencePolicy`` is the deterministic deployment policy (normalise -> actor mean -> tanh ->
scale to the env's bounds); evaluation in training and the ONNX export both use it, so they agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sac_edge.common.checkpointing import checkpoint_segments

LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0
OBS_CLIP = 10.0


def mlp(in_dim: int, hidden: Sequence[int]) -> nn.Sequential:
    """ReLU MLP trunk ``in_dim -> hidden[0] -> ... -> hidden[-1]``."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), nn.ReLU(inplace=True)]
        in_dim = width
    return nn.Sequential(*layers)


class ObsNormalizer(nn.Module):
    """Running mean/variance of raw observations (parallel-variance update, float64 accumulators).

    Applied to replay samples at training time and baked into the exported graph, so the device sees
    raw sensor values.
    """

    mean: Tensor
    var: Tensor
    count: Tensor
    clip: Tensor

    def __init__(self, obs_dim: int, eps: float = 1e-8, clip: float = OBS_CLIP) -> None:
        super().__init__()
        self.eps = eps
        # A buffer, so a run without normalisation (clip=inf, identity stats) round-trips through the checkpoint.
        self.register_buffer("clip", torch.tensor(clip, dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(obs_dim, dtype=torch.float64))
        self.register_buffer("count", torch.full((), 1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, batch: Tensor) -> None:
        """Fold a batch ``[n, obs_dim]`` of raw observations into the running statistics."""
        n = batch.shape[0]
        b_var, b_mean = torch.var_mean(batch.to(torch.float64), 0, correction=0)
        # Chan et al.'s merge with w = n / (count + n): mean += w * delta and
        # var = (1 - w) * var + w * b_var + w * (1 - w) * delta^2, i.e. a lerp (fewer small ops per env step).
        w = n / (self.count + n)
        delta = b_mean - self.mean
        self.mean.add_(delta * w)
        self.var.lerp_(b_var + delta.square() * (1.0 - w), w)
        self.count.add_(n)

    def scale(self) -> tuple[Tensor, Tensor]:
        """(mean, 1/std) as float32, the two constants the exported graph uses."""
        inv_std = torch.rsqrt(self.var + self.eps)
        return self.mean.float(), inv_std.float()

    def forward(self, obs: Tensor) -> Tensor:
        mean, inv_std = self.scale()
        clip = self.clip.to(obs.dtype)  # a tensor bound: no host sync, capturable in a CUDA graph
        return torch.clamp((obs - mean.to(obs.dtype)) * inv_std.to(obs.dtype), -clip, clip)


LOG_STD_HALF_RANGE = 0.5 * (LOG_STD_MAX - LOG_STD_MIN)


def squash_log_std(raw: Tensor) -> Tensor:
    """The log-std head's output mapped smoothly into [LOG_STD_MIN, LOG_STD_MAX] (a tanh, not a clamp)."""
    return LOG_STD_MIN + LOG_STD_HALF_RANGE * (torch.tanh(raw) + 1.0)


def squashed_gaussian(mean: Tensor, log_std: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
    """``tanh(mean + std * noise)`` and its log-probability under the tanh-squashed Gaussian."""
    u = mean + log_std.exp() * noise
    # log N(u; mean, std) - sum log(1 - tanh(u)^2), the latter in its stable softplus form.
    log_prob = (-0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    log_prob = log_prob - (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
    return torch.tanh(u), log_prob


class Actor(nn.Module):
    """Tanh-squashed diagonal Gaussian policy on normalised observations; actions in [-1, 1]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        self.trunk = mlp(obs_dim, hidden)
        self.mu = nn.Linear(hidden[-1], act_dim)
        self.log_std = nn.Linear(hidden[-1], act_dim)

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Pre-tanh mean and log-std (squashed smoothly into [LOG_STD_MIN, LOG_STD_MAX])."""
        h = self.trunk(obs)
        return self.mu(h), squash_log_std(self.log_std(h))

    def sample(self, obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """Reparameterised action in [-1, 1] and its log-probability, from standard normal ``noise``.

        The log-prob is computed in float32 even under autocast: it feeds the entropy term and alpha.
        """
        mean, log_std = self(obs)
        return squashed_gaussian(mean.float(), log_std.float(), noise)

    def sample_action(self, obs: Tensor, noise: Tensor) -> Tensor:
        """The action of ``sample`` from the same ``noise``, without the log-probability (data collection:
        a third of the policy's time at one env)."""
        mean, log_std = self(obs)
        return torch.tanh(mean + log_std.exp() * noise)

    def deterministic(self, obs: Tensor) -> Tensor:
        """The mode of the squashed policy: tanh(mean)."""
        return torch.tanh(self(obs)[0])


class CriticEnsemble(nn.Module):
    """``n_critics`` Q-networks evaluated together: weights ``[n, in, out]``, one bmm per layer."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        n_critics: int = 2,
        grad_checkpoint: bool = False,
    ) -> None:
        super().__init__()
        self.n_critics = n_critics
        self.grad_checkpoint = grad_checkpoint
        dims = [obs_dim + act_dim, *hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(dims, dims[1:]):
            bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default init, per critic
            self.weights.append(nn.Parameter(torch.empty(n_critics, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n_critics, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, obs: Tensor, act: Tensor, detach_params: bool = False) -> Tensor:
        """Q-values ``[n_critics, batch]``. ``detach_params`` lets gradients reach the inputs only
        (the actor loss), which skips every critic weight-gradient GEMM."""
        ws = [w.detach() if detach_params else w for w in self.weights]
        bs = [b.detach() if detach_params else b for b in self.biases]
        x = torch.cat([obs, act], dim=-1)
        h = torch.baddbmm(bs[0], x.unsqueeze(0).expand(self.n_critics, -1, -1), ws[0]).relu_()
        hidden = [t for pair in zip(ws[1:-1], bs[1:-1]) for t in pair]  # w1, b1, w2, b2, ...
        if self.grad_checkpoint and torch.is_grad_enabled():
            for seg in checkpoint_segments(len(hidden) // 2):
                h = checkpoint(_hidden_layers, h, *hidden[2 * seg.start : 2 * seg.stop], use_reentrant=False)
        else:
            h = _hidden_layers(h, *hidden)
        return q_head(h, ws[-1], bs[-1])


def q_head(h: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """The critics' last layer ``[n, B, H] -> [n, B]``, as ``w^T h^T``: BLAS runs a GEMM with one output
    column markedly slower than the same GEMM with one output row."""
    return torch.baddbmm(b, w.transpose(1, 2), h.transpose(1, 2)).squeeze(1)


def _hidden_layers(h: Tensor, *weights_and_biases: Tensor) -> Tensor:
    """ReLU layers ``h @ w + b`` for each (w, b) pair in turn (one checkpoint segment)."""
    for i in range(0, len(weights_and_biases), 2):
        h = torch.baddbmm(weights_and_biases[i + 1], h, weights_and_biases[i]).relu_()
    return h


class InferencePolicy(nn.Module):
    """Deployment policy: raw observation -> action in env units. What export puts in the ONNX graph.

    Non-finite observations are zeroed after normalisation (``nan_to_num``) so the action stays finite.
    """

    obs_mean: Tensor
    obs_inv_std: Tensor
    act_scale: Tensor
    act_bias: Tensor

    def __init__(self, actor: Actor, normalizer: ObsNormalizer, low: Tensor, high: Tensor) -> None:
        super().__init__()
        self.actor = actor
        mean, inv_std = normalizer.scale()
        self.clip = float(normalizer.clip)
        self.register_buffer("obs_mean", mean.clone())
        self.register_buffer("obs_inv_std", inv_std.clone())
        self.register_buffer("act_scale", ((high - low) / 2.0).float())
        self.register_buffer("act_bias", ((high + low) / 2.0).float())

    def forward(self, obs: Tensor) -> Tensor:
        # NaN -> 0 before the clamp (TensorRT's Clip may map NaN to a bound), then ±inf -> ±bound. Written as
        # IsNaN + Where + Clip: nan_to_num exports IsInf, which TensorRT 8.5 (JetPack 5) cannot parse. The bound
        # stays finite even without normalisation (clip=inf), so a non-finite observation never yields a
        # non-finite action.
        bound = min(self.clip, 1e6)
        x = (obs - self.obs_mean) * self.obs_inv_std
        x = torch.where(torch.isnan(x), 0.0, x).clamp(-bound, bound)
        return self.actor.deterministic(x) * self.act_scale + self.act_bias
