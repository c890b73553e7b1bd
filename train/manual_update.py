"""The SAC update with hand-written gradients: the CPU fast path (``--backward manual``).

Same losses, same order, same random draws and the same fused Adam kernel as ``SAC.autograd_update``,
which stays the readable reference and the path fp16, CUDA graphs and gradient checkpointing use. On a
CPU an update is sixteen 256x256x256 GEMMs, and autograd's tape, per-op backward dispatch and
``Optimizer.step``'s bookkeeping cost about as much again (``bench/train_speed.py`` times both paths). Written out
by hand (the derivatives are the textbook ones for ReLU MLPs and the reparameterised tanh-Gaussian), the update:

- runs the actor once on ``[next_obs; obs]``: one 512-row GEMM per layer instead of two 256-row ones
  (the actor's weights do not change between the critic target and the actor loss);
- computes only the gradients that are used: no critic weight gradients for the actor loss and no input
  gradients below the first layers;
- masks ReLU gradients with ``threshold_backward`` on the saved outputs, as autograd does;
- calls the fused Adam kernel directly on the optimiser's own state, so checkpoints, ``--resume`` and a
  switch back to ``--backward autograd`` see one format;
- under ``--amp bf16`` gives the GEMMs bfloat16 operands, as autocast would (about 1.9x the fp32 matmul
  rate on a CPU with AVX512-BF16); everything else stays float32.

``tests/train/test_manual_update.py`` checks it against autograd update for update.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from . import compat
from .buffer import ReplayBatch
from .policies import LOG_STD_HALF_RANGE, Actor, squash_log_std, squashed_gaussian
from .profiling import Phases, phase
from .update_types import LearnerState, UpdateMetrics

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


def _adam_step(opt: torch.optim.Optimizer, grads: list[list[Tensor]], corrections: Tensor | None = None) -> None:
    """What ``Adam(fused=True).step()`` does with ``grads`` (one list per param group), minus its overhead.

    Eager, it calls the fused kernel; under ``torch.compile`` (which cannot functionalise that kernel's
    in-place update) it writes the same arithmetic out, with each group's bias corrections as a row of
    ``corrections`` (``ManualUpdate.corrections``), so the whole update stays one graph with no breaks. The moments
    and step counts are the optimiser's own state (``_init_adam_state``), so the checkpoint holds the same
    tensors whichever path ran.
    """
    for i, (group, group_grads) in enumerate(zip(opt.param_groups, grads)):
        states = [opt.state[p] for p in group["params"]]
        steps = [s["step"] for s in states]
        torch._foreach_add_(steps, 1)
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        if compat.is_compiling() or not compat.fused_adam(steps[0].device):
            if corrections is None:  # eager on a torch without the fused CPU kernel
                assert not compat.is_compiling(), "the compiled update takes its Adam bias corrections as an input"
                t = float(steps[0])
                step_size, bias2_sqrt = lr / (1.0 - beta1**t), math.sqrt(1.0 - beta2**t)
            else:
                step_size, bias2_sqrt = corrections[i, 0], corrections[i, 1]
            for p, g, state in zip(group["params"], group_grads, states):
                g = g + weight_decay * p if weight_decay else g
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(g, 1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                p.sub_(step_size * exp_avg / (exp_avg_sq.sqrt() / bias2_sqrt + eps))
            continue
        torch._fused_adam_(
            group["params"],
            group_grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            steps,
            amsgrad=False,
            lr=lr,
            beta1=beta1,
            beta2=beta2,
            weight_decay=weight_decay,
            eps=eps,
            maximize=False,
            grad_scale=None,
            found_inf=None,
        )


_THIN = 8


def _matmul(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    """``a @ b (+ bias)``, 2-D or batched, in the operands' dtype.

    Eagerly the GEMM, with the bias fused as ``addmm``/``baddbmm`` do. Under inductor the bias is left to
    the pointwise kernel that follows (ReLU, cast), instead of being copied into the GEMM's output first
    (a measurable share of a bf16 update), and a product over a thin inner dimension (at most ``_THIN``: a
    first layer on a few observations) becomes a float32 multiply-sum fused into that kernel too: a GEMM at
    that shape is bound by writing its output (it pays at Pendulum's 3 to 4 inputs, not at 12 to 23).
    """
    if compat.is_compiling():
        thin = a.shape[-1] <= _THIN
        out = (a.unsqueeze(-1).float() * b.unsqueeze(-3).float()).sum(-2) if thin else a @ b
        # The bias joins in float32 before the one rounding, as inside addmm (and inductor then keeps it out
        # of the GEMM: it folds only a same-dtype bias back into addmm).
        return (out if bias is None else out + bias.float()).to(a.dtype)
    if bias is None:
        return a @ b
    return torch.baddbmm(bias, a, b) if a.dim() == 3 else torch.addmm(bias, a, b)


def _critic_forward(weights: list[Tensor], biases: list[Tensor], x: Tensor) -> tuple[list[Tensor], Tensor]:
    """Every critic layer's input ``[n, B, .]`` and the Q-values ``[n, B]`` in float32 (the ensemble's
    own math, in the dtype of ``weights`` and ``x``)."""
    n = weights[0].shape[0]
    acts = [x.unsqueeze(0).expand(n, -1, -1)]
    for w, b in zip(weights[:-1], biases[:-1]):
        acts.append(_matmul(acts[-1], w, b).relu_())
    # The head as ``w^T h^T``, as in ``q_head``: one output row, not one column.
    return acts, _matmul(weights[-1].transpose(1, 2), acts[-1].transpose(1, 2), biases[-1]).squeeze(1).float()


def _critic_backward(
    weights: list[Tensor], acts: list[Tensor], dq: Tensor, weight_grads: bool
) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """Back-propagate ``dq = dL/dQ`` ``[n, B]`` (float32): float32 weight and bias gradients (if asked)
    and ``dL/dz`` of the first layer's pre-activation (which the actor loss turns into the action gradient).

    The GEMMs run in the dtype of ``weights``; bias gradients are summed in float32. The single-output last
    layer is an outer product and a row GEMM, not a one-column bmm (see ``q_head``).
    """
    dws: list[Tensor] = []
    dbs: list[Tensor] = []
    last = len(weights) - 1
    if weight_grads:
        dbs.append(dq.sum(1).view(-1, 1, 1))
    dq = dq.to(weights[last].dtype)
    if weight_grads:
        dws.append(_matmul(dq.unsqueeze(1), acts[last]).transpose(1, 2).float())
    dz = _relu_backward(dq.unsqueeze(-1) * weights[last].transpose(1, 2), acts[last], 0.0)
    for i in range(last - 1, -1, -1):
        if weight_grads:
            dws.append(_matmul(acts[i].transpose(1, 2), dz).float())
            dbs.append(dz.sum(1, keepdim=True, dtype=torch.float32))
        if i > 0:
            dz = _relu_backward(_matmul(dz, weights[i].transpose(1, 2)), acts[i], 0.0)
    return dws[::-1], dbs[::-1], dz


class ManualUpdate:
    """``SAC.update`` with its gradients written out (fp32 or bf16 GEMMs; eager, or compiled through ``step``)."""

    def __init__(self, sac: LearnerState) -> None:
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

        self.target_params = (list(sac.critic_target.weights), list(sac.critic_target.biases))
        # ``--amp bf16``: the GEMMs take bfloat16 operands (as under autocast); losses, log-probs, alpha,
        # gradient sums and Adam stay float32 on float32 weights.
        self.dtype = torch.bfloat16 if sac.cfg.amp == "bf16" else torch.float32
        self._compiled_core_at: Callable[[Tensor, Tensor, Tensor, Tensor | None], UpdateMetrics] | None = None
        self._guards_checked_at = 0  # torch's thread count at the last call with the guards in full (0: none)
        self._adam_steps: list[float] | None = None  # host mirror of each param group's Adam step

    def compile(self) -> None:
        """``--compile``: ``core_at`` (gather and update) as one inductor graph; the noise is drawn outside."""
        self._compiled_core_at = torch.compile(self.core_at)

    def recheck_guards(self) -> None:
        """Evaluate the compiled graph's guards in full on the next call, and read the step counts again
        (after the state was replaced)."""
        self._guards_checked_at = 0
        self._adam_steps = None

    def corrections(self) -> Tensor:
        """Adam's bias corrections for the coming update, one row per param group (the critic's first):
        ``lr / (1 - beta1^t)`` and ``sqrt(1 - beta2^t)``, in float64 as in the fused kernel, then float32.

        Worked out on the host for the compiled update: inside its graph inductor would inline both float64
        ``pow`` calls into every vector iteration of every parameter's Adam loop, a cost that grows with
        the parameter count. The step counts are mirrored on the host, read from the
        optimiser state once after a (re)start (no host sync per update).
        """
        groups = [(opt, g) for opt in (self.sac.critic_opt, self.sac.actor_opt) for g in opt.param_groups]
        if self._adam_steps is None:
            self._adam_steps = [float(opt.state[g["params"][0]]["step"]) for opt, g in groups]
        self._adam_steps = [t + 1.0 for t in self._adam_steps]
        rows = [
            (g["lr"] / (1.0 - g["betas"][0] ** t), math.sqrt(1.0 - g["betas"][1] ** t))
            for (_, g), t in zip(groups, self._adam_steps)
        ]
        host = torch.tensor(rows, dtype=torch.float32)
        if self.sac.device.type == "cuda":
            host = host.pin_memory()
        return host.to(self.sac.device, non_blocking=True)

    def _draw_noise(self, n: int) -> tuple[Tensor, Tensor]:
        _init_adam_state(self.sac.critic_opt)  # no-ops after the first update (or a checkpoint load)
        _init_adam_state(self.sac.actor_opt)
        return self.sac.noise(n), self.sac.noise(n)  # the autograd path's draw order

    def __call__(self, batch: ReplayBatch) -> UpdateMetrics:
        """The update on a given minibatch, eagerly (``SAC.update``)."""
        self._adam_steps = None  # the fused kernel advances the step counts
        return self.core(batch, *self._draw_noise(batch.obs.shape[0]))

    def step(self, rows: Tensor) -> UpdateMetrics:
        """The update on the replay rows ``rows`` (``SAC.train_step``), compiled under ``--compile``."""
        next_noise, noise = self._draw_noise(rows.shape[0])
        if self._compiled_core_at is None:
            return self.core_at(rows, next_noise, noise)
        corrections = self.corrections()
        threads = torch.get_num_threads()
        if self._guards_checked_at != threads:
            # The first call, and the first after a change of torch's thread count (part of dynamo's global
            # state guard: the thread watch moves it beside busy neighbours): the guards in full, which
            # compile the update once for a count not seen before and pick the cached graph of one seen.
            self._guards_checked_at = threads
            return self._compiled_core_at(rows, next_noise, noise, corrections)
        # Every later call passes the same guards: shapes and dtypes are fixed by the frozen config and the
        # hyperparameters never change within a run, so dynamo's per-call guard tree (a sizeable share of
        # a small update) is skipped, as set_stance documents for warmed-up graphs.
        try:
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return self._compiled_core_at(rows, next_noise, noise, corrections)
        except RuntimeError as err:
            # Some other global state changed under the caller (grad mode, a torch flag): dynamo refuses
            # before the graph runs, so the same call goes again with the guards in full.
            if "skip_guard_eval_unsafe" not in str(err):
                raise
            return self._compiled_core_at(rows, next_noise, noise, corrections)

    def core_at(
        self, rows: Tensor, next_noise: Tensor, noise: Tensor, corrections: Tensor | None = None
    ) -> UpdateMetrics:
        """``core`` on the replay rows ``rows``: compiled, the gather fuses into the normalisation (3 to 6%)."""
        with phase("sample"):
            batch = self.sac.buffer.gather(rows)
        return self.core(batch, next_noise, noise, corrections)

    @torch.no_grad()
    def core(
        self, batch: ReplayBatch, next_noise: Tensor, noise: Tensor, corrections: Tensor | None = None
    ) -> UpdateMetrics:
        """The update from a minibatch and its two noise draws (standard normal, ``[B, act_dim]``); compiled,
        it takes Adam's bias corrections too (``corrections``)."""
        critic_groups = len(self.sac.critic_opt.param_groups)
        critic_corr = None if corrections is None else corrections[:critic_groups]
        actor_corr = None if corrections is None else corrections[critic_groups:]

        sac, cfg, dt = self.sac, self.sac.cfg, self.dtype
        actor = sac.actor
        n = batch.obs.shape[0]
        alpha = sac.log_alpha.detach().exp()

        def low(tensors: list[Tensor]) -> list[Tensor]:
            """The GEMM operands in the compute dtype (no copies in float32)."""
            return [t.to(dt) for t in tensors]

        phases = Phases()  # the shared actor forward below feeds the critic's target, so it is the critic's
        phases.enter("critic")
        # Actor forward once for both halves: rows [:n] are next_obs (target), rows [n:] are obs (actor loss).
        trunk_in = [sac.obs_norm(torch.cat([batch.next_obs, batch.obs])).to(dt)]
        next_obs, obs = trunk_in[0][:n], trunk_in[0][n:]
        trunk_w = low([lin.weight for lin in self.trunk])
        for w, lin in zip(trunk_w, self.trunk):
            trunk_in.append(_matmul(trunk_in[-1], w.t(), lin.bias.to(dt)).relu_())
        feat = trunk_in[-1]
        act_dim = actor.mu.out_features
        head_w = torch.cat([actor.mu.weight, actor.log_std.weight]).to(dt)
        head_b = torch.cat([actor.mu.bias, actor.log_std.bias]).to(dt)
        heads = _matmul(head_w, feat.t(), head_b.unsqueeze(1)).t().float()
        raw = heads[:, act_dim:]
        action_all, log_prob_all = squashed_gaussian(
            heads[:, :act_dim], squash_log_std(raw), torch.cat([next_noise, noise])
        )
        next_action, action = action_all[:n], action_all[n:]
        next_log_prob, log_prob = log_prob_all[:n], log_prob_all[n:]

        # Critic: soft Bellman target from the target critics, then 0.5 * sum over critics of the MSE.
        target_w, target_b = self.target_params
        _, next_q_all = _critic_forward(low(target_w), low(target_b), torch.cat([next_obs, next_action.to(dt)], -1))
        next_q = next_q_all.min(0).values - alpha * next_log_prob
        target_q = batch.rewards + cfg.gamma * (1.0 - batch.dones) * next_q
        critic_w, critic_b = low(self.critic_weights), low(self.critic_biases)
        acts, q = _critic_forward(critic_w, critic_b, torch.cat([obs, batch.actions.to(dt)], -1))
        td = q - target_q
        critic_loss = 0.5 * td.square().mean(1).sum()
        dws, dbs, _ = _critic_backward(critic_w, acts, td / n, weight_grads=True)
        _adam_step(sac.critic_opt, [dws + dbs], critic_corr)

        phases.enter("actor")
        # Actor: maximise min-Q (updated critics) minus alpha * log-prob. dL/dQ reaches only the argmin critic.
        critic_w, critic_b = low(self.critic_weights), low(self.critic_biases)
        acts, q_pi = _critic_forward(critic_w, critic_b, torch.cat([obs, action.to(dt)], -1))
        q_min, which = q_pi.min(0)
        actor_loss = (alpha * log_prob - q_min).mean()
        dq = torch.zeros_like(q_pi).scatter_(0, which.unsqueeze(0), -1.0 / n)
        _, _, dz = _critic_backward(critic_w, acts, dq, weight_grads=False)
        obs_dim = obs.shape[1]
        d_action = _matmul(critic_w[0][:, obs_dim:], dz.transpose(1, 2)).float().sum(0).t()

        # Through a = tanh(u), u = mean + exp(log_std) * noise; d log_prob / du = 2a, d log_prob / d log_std = -1.
        d_log_prob = alpha / n
        std = squash_log_std(raw[n:]).exp()
        d_u = d_action * (1.0 - action.square()) + (2.0 * d_log_prob) * action
        d_raw = (d_u * std * noise - d_log_prob) * (LOG_STD_HALF_RANGE * (1.0 - torch.tanh(raw[n:]).square()))
        d_heads = torch.cat([d_u, d_raw], 1)
        d_head_w = _matmul(d_heads.t().to(dt), feat[n:]).float()
        d_head_b = d_heads.sum(0)
        grads = [d_head_w[:act_dim], d_head_b[:act_dim], d_head_w[act_dim:], d_head_b[act_dim:]]
        dh = _relu_backward(_matmul(d_heads.to(dt), head_w), feat[n:], 0.0)
        for i in range(len(self.trunk) - 1, -1, -1):
            inp = trunk_in[i][n:]
            grads[:0] = [_matmul(dh.t(), inp).float(), dh.sum(0, dtype=torch.float32)]
            if i > 0:
                dh = _relu_backward(_matmul(dh, trunk_w[i]), inp, 0.0)
        # Temperature: d/d log_alpha of -(log_alpha * (log_prob + target_entropy)).mean().
        phases.enter("alpha")
        alpha_loss = -(sac.log_alpha * (log_prob + sac.target_entropy)).mean()
        groups = [grads]
        if cfg.autotune:
            groups.append([-(log_prob + sac.target_entropy).mean().reshape(1)])
        phases.enter("actor")  # one Adam step for the actor and the temperature, as in the autograd path
        _adam_step(sac.actor_opt, groups, actor_corr)

        phases.enter("target")
        torch._foreach_lerp_(sac.target_params, sac.critic_params, cfg.tau)
        phases.end()
        finite = torch.isfinite(critic_loss) & torch.isfinite(actor_loss)
        return UpdateMetrics(critic_loss, actor_loss, alpha_loss, alpha, finite)
