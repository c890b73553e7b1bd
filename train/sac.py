"""Soft Actor-Critic: the learner state and its update step.

``SAC.update`` reads top to bottom like CleanRL's: critic step, actor step, temperature step, target
update. It never calls ``.item()``: metrics come back as device scalars, so the loop syncs only when it
logs. ``train_step`` (sample + update) is the unit that ``--compile`` compiles and ``--cuda-graphs``
captures.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.common.spec import PolicySpec

from . import compat, precision
from .buffer import ReplayBatch, ReplayBuffer
from .config import TrainConfig
from .manual_update import ManualUpdate
from .policies import OBS_CLIP, Actor, CriticEnsemble, ObsNormalizer
from .profiling import phase
from .update_types import UpdateMetrics

_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def use_manual_backward(cfg: TrainConfig, device: torch.device) -> bool:
    """Resolve ``--backward``: the hand-written update runs fp32 or bf16 GEMMs (no fp16 GradScaler) and is
    not capturable in a CUDA graph."""
    needs_autograd = [
        flag
        for flag, on in (
            ("--amp fp16", cfg.amp == "fp16"),
            ("--cuda-graphs", cfg.cuda_graphs),
            ("--grad-checkpoint", cfg.grad_checkpoint),
        )
        if on
    ]
    if cfg.backward == "manual" and needs_autograd:
        raise SacEdgeError(
            f"--backward manual cannot be combined with {', '.join(needs_autograd)}; use --backward auto"
        )
    if cfg.backward == "auto":
        return device.type == "cpu" and not needs_autograd
    return cfg.backward == "manual"


def _adam(params: Any, lr: float, capturable: bool, device: torch.device) -> torch.optim.Adam:
    """Adam with the fused kernel (CPU and CUDA; foreach on a torch without the CPU one), capturable when a
    CUDA graph replays it."""
    fused = compat.fused_adam(device)
    return torch.optim.Adam(params, lr=lr, fused=fused, foreach=not fused, capturable=capturable)


class SAC:
    """Actor, twin critics with targets, entropy temperature, their optimisers and the replay buffer."""

    def __init__(self, spec: PolicySpec, cfg: TrainConfig, device: torch.device) -> None:
        """``cfg`` resolved: ``--amp`` and ``--compile`` not ``auto`` (``train.defaults.resolve_speed``)."""
        if "auto" in (cfg.amp, cfg.compile):
            raise InternalError("SAC needs --amp and --compile resolved; pass the config through resolve_speed")
        if cfg.cuda_graphs and device.type != "cuda":
            raise SacEdgeError("--cuda-graphs needs --device cuda")
        if cfg.cuda_graphs and cfg.amp == "fp16":
            raise SacEdgeError("--cuda-graphs cannot capture the fp16 GradScaler; use --amp bf16 or --amp off")
        self.cfg = cfg
        self.spec = spec
        self.device = device
        if device.type == "cuda":  # fp32 matmuls on TF32 tensor cores from compute capability 8.0
            precision.apply_tf32(precision.device_precision(device).tf32)
        torch.manual_seed(cfg.seed)
        self.actor = Actor(spec.obs_dim, spec.act_dim, cfg.hidden).to(device)
        self.critic = CriticEnsemble(
            spec.obs_dim, spec.act_dim, cfg.critic_hidden, n_critics=2, grad_checkpoint=cfg.grad_checkpoint
        ).to(device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.obs_norm = ObsNormalizer(spec.obs_dim, clip=OBS_CLIP if cfg.normalize_obs else float("inf")).to(device)
        self.log_alpha = torch.full((1,), float(np.log(cfg.init_alpha)), device=device, requires_grad=True)
        self.target_entropy = -float(spec.act_dim)

        capturable = cfg.cuda_graphs
        self.critic_opt = _adam(self.critic.parameters(), cfg.critic_lr, capturable, device)
        # Actor and temperature step together: their losses share no parameters, so one backward of the
        # sum and one fused Adam call give exactly the two separate steps, with less dispatch overhead.
        groups: list[dict[str, Any]] = [{"params": list(self.actor.parameters()), "lr": cfg.actor_lr}]
        if cfg.autotune:
            groups.append({"params": [self.log_alpha], "lr": cfg.alpha_lr})
        self.actor_opt = _adam(groups, cfg.actor_lr, capturable, device)
        self.scaler = compat.grad_scaler(device, enabled=cfg.amp == "fp16")

        # CUDA graphs replay the default generator's Philox offsets correctly; elsewhere a private one.
        if cfg.cuda_graphs:
            self.generator = torch.cuda.default_generators[device.index or 0]
        else:
            self.generator = torch.Generator(device)
        self.generator.manual_seed(cfg.seed)
        self.buffer = ReplayBuffer(cfg.buffer_size, spec.obs_dim, spec.act_dim, device)
        self.critic_params: list[Tensor] = list(self.critic.parameters())
        self.target_params: list[Tensor] = list(self.critic_target.parameters())
        self._manual = ManualUpdate(self) if use_manual_backward(cfg, device) else None
        self._step_fn: Callable[[], UpdateMetrics] = self.train_step
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_out: UpdateMetrics | None = None

    # -- acting -----------------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.cfg.amp == "off":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=_AMP_DTYPES[self.cfg.amp])

    def noise(self, n: int) -> Tensor:
        return torch.randn((n, self.spec.act_dim), device=self.device, generator=self.generator)

    @torch.inference_mode()
    def explore(self, obs: np.ndarray) -> np.ndarray:
        """Stochastic actions in [-1, 1] for a batch of raw observations (data collection)."""
        x = self.obs_norm(torch.as_tensor(obs, dtype=torch.float32, device=self.device))
        return self.actor.sample_action(x, self.noise(x.shape[0])).cpu().numpy()

    # -- learning ---------------------------------------------------------------------------------
    @property
    def backward(self) -> str:
        """The gradient path in use: ``manual`` or ``autograd``."""
        return "autograd" if self._manual is None else "manual"

    def update(self, batch: ReplayBatch) -> UpdateMetrics:
        """One SAC update on ``batch`` through the configured gradient path (``--backward``)."""
        if self._manual is not None:
            return self._manual(batch)
        return self.autograd_update(batch)

    def autograd_update(self, batch: ReplayBatch) -> UpdateMetrics:
        """One SAC update on ``batch``: critics, actor, temperature, targets. No host syncs.

        The reference: ``manual_update.ManualUpdate`` computes the same step with hand-written gradients.
        """
        cfg = self.cfg
        obs, next_obs = self.obs_norm(batch.obs), self.obs_norm(batch.next_obs)
        alpha = self.log_alpha.detach().exp()

        # Critic: soft Bellman target from the target critics (min of the twins), entropy bonus included.
        with phase("critic"):
            with torch.no_grad(), self._autocast():
                next_action, next_log_prob = self.actor.sample(next_obs, self.noise(obs.shape[0]))
                next_q = self.critic_target(next_obs, next_action).float().min(0).values - alpha * next_log_prob
                target_q = batch.rewards + cfg.gamma * (1.0 - batch.dones) * next_q
            with self._autocast():
                q = self.critic(obs, batch.actions).float()
            critic_loss = 0.5 * (q - target_q).square().mean(1).sum()
            self.critic_opt.zero_grad(set_to_none=not cfg.cuda_graphs)
            self.scaler.scale(critic_loss).backward()
            self.scaler.step(self.critic_opt)

        # Actor: maximise min-Q minus alpha * log-prob; critic weights detached (no weight-grad GEMMs).
        with phase("actor"), self._autocast():
            action, log_prob = self.actor.sample(obs, self.noise(obs.shape[0]))
            q_pi = self.critic(obs, action, detach_params=True).float().min(0).values
        actor_loss = (alpha * log_prob - q_pi).mean()
        # Temperature: drive the policy entropy towards -act_dim (fp32), stepped with the actor (its range
        # holds the loss; the shared backward and Adam step are the actor's).
        with phase("alpha"):
            alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        with phase("actor"):
            self.actor_opt.zero_grad(set_to_none=not cfg.cuda_graphs)
            self.scaler.scale(actor_loss + alpha_loss if cfg.autotune else actor_loss).backward()
            self.scaler.step(self.actor_opt)
            self.scaler.update()

        # Targets: Polyak averaging in one fused foreach kernel.
        with phase("target"), torch.no_grad():
            torch._foreach_lerp_(self.target_params, self.critic_params, cfg.tau)

        finite = torch.isfinite(critic_loss) & torch.isfinite(actor_loss)
        return UpdateMetrics(critic_loss.detach(), actor_loss.detach(), alpha_loss.detach(), alpha, finite)

    def train_step(self) -> UpdateMetrics:
        """Sample a minibatch on the device and update (the compiled / captured unit)."""
        with phase("sample"):
            rows = self.buffer.sample_rows(self.cfg.batch_size, self.generator)
        if self._manual is not None:
            return self._manual.step(rows)  # gathers the minibatch inside its compiled graph
        with phase("sample"):
            batch = self.buffer.gather(rows)
        return self.autograd_update(batch)

    def prepare_fast_path(self) -> None:
        """Apply ``--compile`` and/or ``--cuda-graphs``; call once the buffer holds data."""
        if self.cfg.compile == "on":
            compat.check_compile()
        if self.cfg.compile == "on" and self._manual is not None:
            self._manual.compile()
        elif self.cfg.compile == "on":
            self._step_fn = torch.compile(self.train_step)
        if self.cfg.cuda_graphs:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(3):  # warm-up: allocator pools, optimiser state, compiled kernels
                    self._step_fn()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._graph_out = self._step_fn()
            self._graph = graph

    def step(self) -> UpdateMetrics:
        """One update through the configured path (eager, compiled, or graph replay)."""
        if self._graph is not None:
            assert self._graph_out is not None
            self._graph.replay()
            return self._graph_out
        return self._step_fn()

    # -- checkpoint state -------------------------------------------------------------------------
    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_opt, "critic": self.critic_opt}

    def state_tensors(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """All learner tensors (checkpoint keys) and the JSON part (optimiser groups, scaler)."""
        tensors: dict[str, Tensor] = {}
        for prefix, module in (
            ("actor", self.actor),
            ("critic", self.critic),
            ("critic_target", self.critic_target),
            ("obs_norm", self.obs_norm),
        ):
            tensors.update({f"{prefix}.{k}": v for k, v in module.state_dict().items()})
        tensors["log_alpha"] = self.log_alpha.detach()
        groups: dict[str, Any] = {}
        for name, opt in self._optimizers().items():
            sd = opt.state_dict()
            for idx, slots in sd["state"].items():
                for slot, value in slots.items():
                    tensors[f"optim.{name}.{idx}.{slot}"] = torch.as_tensor(value)
            groups[name] = sd["param_groups"]
        tensors["rng.torch"] = self.generator.get_state()
        tensors["rng.torch_global"] = torch.get_rng_state()
        tensors.update(self.buffer.state_tensors())
        return tensors, {"param_groups": groups, "scaler": self.scaler.state_dict()}

    def load_state_tensors(self, tensors: dict[str, Tensor], extra: dict[str, Any]) -> None:
        """Restore ``state_tensors`` output exactly (modules, optimisers, RNG, replay)."""
        for prefix, module in (
            ("actor", self.actor),
            ("critic", self.critic),
            ("critic_target", self.critic_target),
            ("obs_norm", self.obs_norm),
        ):
            cut = len(prefix) + 1
            module.load_state_dict({k[cut:]: v for k, v in tensors.items() if k.startswith(prefix + ".")})
        with torch.no_grad():
            self.log_alpha.copy_(tensors["log_alpha"])
        for name, opt in self._optimizers().items():
            state: dict[int, dict[str, Tensor]] = {}
            head = f"optim.{name}."
            for key, value in tensors.items():
                if key.startswith(head):
                    idx, slot = key[len(head) :].split(".", 1)
                    state.setdefault(int(idx), {})[slot] = value
            opt.load_state_dict({"state": state, "param_groups": extra["param_groups"][name]})
        self.generator.set_state(tensors["rng.torch"])
        torch.set_rng_state(tensors["rng.torch_global"])
        if extra.get("scaler"):
            self.scaler.load_state_dict(extra["scaler"])
        self.buffer.load_state_tensors(tensors)
        if self._manual is not None:
            self._manual.recheck_guards()
