"""The SAC update with hand-written gradients: the CPU fast path (``--backward manual``).

Same losses, same order, same random draws and the same fused Adam kernel as ``SAC.autograd_update``,
which stays the readable reference and the path AMP, ``--compile`` and CUDA graphs use. On a 2-core CPU
an update is sixteen 256x256x256 GEMMs, and autograd's tape, per-op backward dispatch and
``Optimizer.step``'s bookkeeping cost about as much again. Written out by hand (the derivatives are the
textbook ones for ReLU MLPs and the reparameterised tanh-Gaussian), the update:

- runs the actor once on ``[next_obs; obs]``: one 512-row GEMM per layer instead of two 256-row ones
  (the actor's weights do not change between the critic target and the actor loss);
- computes only the gradients that are used: no critic weight gradients for the actor loss and no input
  gradients below the first layers;
- masks ReLU gradients with ``threshold_backward`` on the saved outputs, as autograd does;
- calls the fused Adam kernel directly on the optimiser's own state, so checkpoints, ``--resume`` and a
  switch back to ``--backward autograd`` see one format.

``tests/train/test_manual_update.py`` checks it against autograd update for update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .buffer import ReplayBatch
from .policies import LOG_STD_HALF_RANGE, Actor, q_head, squash_log_std, squashed_gaussian

if TYPE_CHECKING:
    from .sac import SAC, UpdateMetrics

_relu_backward = torch.ops.aten.threshold_backward


def _linears(actor: Actor) -> list[nn.Linear]:
    return [m for m in actor.trunk if isinstance(m, nn.Linear)]


def _init_adam_state(opt: torch.optim.Optimizer) -> None:
    """Create Adam's per-parameter state (step, exp_avg, exp_avg_sq) as ``Adam(fused=True)`` does lazily."""
    for group in opt.param_groups:
        for p in group["params"]:
            state = opt.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


@torch.compiler.disable  # inductor cannot functionalise the fused kernel's in-place update: a graph break
def _adam_step(opt: torch.optim.Optimizer, grads: list[list[Tensor]]) -> None:
    """What ``Adam(fused=True).step()`` does with ``grads`` (one list per param group), minus its overhead.

    The moments and step counts are the optimiser's own state (``_init_adam_state``), so the checkpoint
    holds the same tensors whichever path ran.
    """
    for group, group_grads in zip(opt.param_groups, grads, strict=True):
        states = [opt.state[p] for p in group["params"]]
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        torch._fused_adam_(
            group["params"],
            group_grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            steps,
            amsgrad=False,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
            grad_scale=None,
            found_inf=None,
        )


def _critic_forward(weights: list[Tensor], biases: list[Tensor], x: Tensor) -> tuple[list[Tensor], Tensor]:
    """Every critic layer's input ``[n, B, .]`` and the Q-values ``[n, B]`` (the ensemble's own math)."""
    n = weights[0].shape[0]
    acts = [x.unsqueeze(0).expand(n, -1, -1)]
    for w, b in zip(weights[:-1], biases[:-1], strict=True):
        acts.append(torch.baddbmm(b, acts[-1], w).relu_())
    return acts, q_head(acts[-1], weights[-1], biases[-1])


def _critic_backward(
    weights: list[Tensor], acts: list[Tensor], dq: Tensor, weight_grads: bool
) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """Back-propagate ``dq = dL/dQ`` ``[n, B]``: weight and bias gradients (if asked) and ``dL/dz`` of the
    first layer's pre-activation (which the actor loss turns into the action gradient).

    The single-output last layer is an outer product and a row GEMM, not a one-column bmm (see ``q_head``).
    """
    dws: list[Tensor] = []
    dbs: list[Tensor] = []
    last = len(weights) - 1
    if weight_grads:
        dws.append(torch.bmm(dq.unsqueeze(1), acts[last]).transpose(1, 2))
        dbs.append(dq.sum(1).view(-1, 1, 1))
    dz = _relu_backward(dq.unsqueeze(-1) * weights[last].transpose(1, 2), acts[last], 0.0)
    for i in range(last - 1, -1, -1):
        if weight_grads:
            dws.append(torch.bmm(acts[i].transpose(1, 2), dz))
            dbs.append(dz.sum(1, keepdim=True))
        if i > 0:
            dz = _relu_backward(torch.bmm(dz, weights[i].transpose(1, 2)), acts[i], 0.0)
    return dws[::-1], dbs[::-1], dz


class ManualUpdate:
    """``SAC.update`` with its gradients written out (fp32, eager or compiled); call with a ``ReplayBatch``."""

    def __init__(self, sac: SAC) -> None:
        self.sac = sac
        self.critic_weights: list[Tensor] = list(sac.critic.weights)
        self.critic_biases: list[Tensor] = list(sac.critic.biases)
        self.trunk = _linears(sac.actor)
        # The optimisers' parameter order is the order their gradients are handed over in.
        actor_params = [p for lin in self.trunk for p in (lin.weight, lin.bias)]
        actor_params += [sac.actor.mu.weight, sac.actor.mu.bias, sac.actor.log_std.weight, sac.actor.log_std.bias]
        if [id(p) for p in sac.actor_opt.param_groups[0]["params"]] != [id(p) for p in actor_params]:
            raise AssertionError("actor optimiser parameter order differs from the manual gradients")
        if [id(p) for p in sac.critic_opt.param_groups[0]["params"]] != [
            id(p) for p in self.critic_weights + self.critic_biases
        ]:
            raise AssertionError("critic optimiser parameter order differs from the manual gradients")

        self._core: Callable[[ReplayBatch, Tensor, Tensor], UpdateMetrics] = self.core

    def compile(self) -> None:
        """``--compile``: inductor graphs between the optimiser steps; the noise is drawn outside."""
        self._core = torch.compile(self.core)

    def __call__(self, batch: ReplayBatch) -> UpdateMetrics:
        n = batch.obs.shape[0]
        next_noise, noise = self.sac._noise(n), self.sac._noise(n)  # the autograd path's draw order
        _init_adam_state(self.sac.critic_opt)  # no-ops after the first update (or a checkpoint load)
        _init_adam_state(self.sac.actor_opt)
        return self._core(batch, next_noise, noise)

    @torch.no_grad()
    def core(self, batch: ReplayBatch, next_noise: Tensor, noise: Tensor) -> UpdateMetrics:
        """The update from a minibatch and its two noise draws (standard normal, ``[B, act_dim]``)."""
        from .sac import UpdateMetrics

        sac, cfg = self.sac, self.sac.cfg
        actor = sac.actor
        n = batch.obs.shape[0]
        alpha = sac.log_alpha.detach().exp()

        # Actor forward once for both halves: rows [:n] are next_obs (target), rows [n:] are obs (actor loss).
        trunk_in = [sac.obs_norm(torch.cat([batch.next_obs, batch.obs]))]
        next_obs, obs = trunk_in[0][:n], trunk_in[0][n:]
        for lin in self.trunk:
            trunk_in.append(F.linear(trunk_in[-1], lin.weight, lin.bias).relu_())
        feat = trunk_in[-1]
        act_dim = actor.mu.out_features
        head_w = torch.cat([actor.mu.weight, actor.log_std.weight])
        heads = torch.addmm(torch.cat([actor.mu.bias, actor.log_std.bias]).unsqueeze(1), head_w, feat.t()).t()
        raw = heads[:, act_dim:]
        action_all, log_prob_all = squashed_gaussian(
            heads[:, :act_dim], squash_log_std(raw), torch.cat([next_noise, noise])
        )
        next_action, action = action_all[:n], action_all[n:]
        next_log_prob, log_prob = log_prob_all[:n], log_prob_all[n:]

        # Critic: soft Bellman target from the target critics, then 0.5 * sum over critics of the MSE.
        next_q = sac.critic_target(next_obs, next_action).min(0).values - alpha * next_log_prob
        target_q = batch.rewards + cfg.gamma * (1.0 - batch.dones) * next_q
        acts, q = _critic_forward(self.critic_weights, self.critic_biases, torch.cat([obs, batch.actions], -1))
        td = q - target_q
        critic_loss = 0.5 * td.square().mean(1).sum()
        dws, dbs, _ = _critic_backward(self.critic_weights, acts, td / n, weight_grads=True)
        _adam_step(sac.critic_opt, [dws + dbs])

        # Actor: maximise min-Q (updated critics) minus alpha * log-prob. dL/dQ reaches only the argmin critic.
        acts, q_pi = _critic_forward(self.critic_weights, self.critic_biases, torch.cat([obs, action], -1))
        q_min, which = q_pi.min(0)
        actor_loss = (alpha * log_prob - q_min).mean()
        dq = torch.zeros_like(q_pi).scatter_(0, which.unsqueeze(0), -1.0 / n)
        _, _, dz = _critic_backward(self.critic_weights, acts, dq, weight_grads=False)
        obs_dim = obs.shape[1]
        d_action = torch.bmm(self.critic_weights[0][:, obs_dim:], dz.transpose(1, 2)).sum(0).t()

        # Through a = tanh(u), u = mean + exp(log_std) * noise; d log_prob / du = 2a, d log_prob / d log_std = -1.
        d_log_prob = alpha / n
        std = squash_log_std(raw[n:]).exp()
        d_u = d_action * (1.0 - action.square()) + (2.0 * d_log_prob) * action
        d_raw = (d_u * std * noise - d_log_prob) * (LOG_STD_HALF_RANGE * (1.0 - torch.tanh(raw[n:]).square()))
        d_heads = torch.cat([d_u, d_raw], 1)
        d_head_w = d_heads.t().mm(feat[n:])
        d_head_b = d_heads.sum(0)
        grads = [d_head_w[:act_dim], d_head_b[:act_dim], d_head_w[act_dim:], d_head_b[act_dim:]]
        dh = _relu_backward(d_heads.mm(head_w), feat[n:], 0.0)
        for i in range(len(self.trunk) - 1, -1, -1):
            inp = trunk_in[i][n:]
            grads[:0] = [dh.t().mm(inp), dh.sum(0)]
            if i > 0:
                dh = _relu_backward(dh.mm(self.trunk[i].weight), inp, 0.0)
        # Temperature: d/d log_alpha of -(log_alpha * (log_prob + target_entropy)).mean().
        alpha_loss = -(sac.log_alpha * (log_prob + sac.target_entropy)).mean()
        groups = [grads]
        if cfg.autotune:
            groups.append([-(log_prob + sac.target_entropy).mean().reshape(1)])
        _adam_step(sac.actor_opt, groups)

        torch._foreach_lerp_(sac._target_params, sac._critic_params, cfg.tau)
        finite = torch.isfinite(critic_loss) & torch.isfinite(actor_loss)
        return UpdateMetrics(critic_loss, actor_loss, alpha_loss, alpha, finite)
