"""The on-device SAC learner: the trainer's own ``SAC`` (train/sac.py), sized for the device, loaded from the
bundle's ``learner.safetensors`` (or the last good weights on ``--resume``).

There is no second SAC update here: this builds a ``TrainConfig`` with the device's replay rows, batch and
checkpointing, constructs ``SAC``, loads actor, twin critics, target critics, temperature and normaliser,
and calls ``SAC.update`` on minibatches of its preallocated ``ReplayBuffer``. The observation normaliser
stays frozen at the bundle's statistics: the deployed graph (ONNX, int8, TensorRT) bakes them in and only
the actor's weights are swapped, so training the actor on different statistics would serve it on inputs
scaled differently from the ones it learned on. torch is imported only by this module (``--finetune``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np
import torch

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.spec import PolicySpec
from sac_edge.train.checkpoint import prefixed
from sac_edge.train.config import TrainConfig
from sac_edge.train.policies import Actor, InferencePolicy
from sac_edge.train.sac import SAC
from sac_edge.train.update_types import UpdateMetrics

from .experience import Transitions
from .sizing import NetShape, Sizing

MODULES = ("actor", "critic", "critic_target", "obs_norm")
TIMED_UPDATES = 5


def net_shape(spec: PolicySpec, tensors: Mapping[str, torch.Tensor]) -> NetShape:
    """The networks' widths from the learner tensors (the critic's depth is not in the spec)."""
    critic = prefixed(dict(tensors), "critic")
    if "weights.0" not in critic:
        raise SacEdgeError("learner tensors have no critic (critic.weights.0); fine-tuning needs learner.safetensors")
    n_weights = sum(1 for k in critic if k.startswith("weights."))
    n_critics, _, width = critic["weights.0"].shape
    if n_critics != 2:
        raise SacEdgeError(f"the learner has {n_critics} critics; SAC fine-tuning uses twin critics")
    return NetShape(spec.obs_dim, spec.act_dim, tuple(spec.hidden), (int(width),) * (n_weights - 1), 2)


def warm_up_math(spec: PolicySpec) -> None:
    """One update of a tiny ``SAC`` so torch's math libraries and autograd are resident before the memory
    baseline is read: ~90 MB on x86 CPU torch, a fixed cost that no sizing choice changes."""
    from dataclasses import replace

    tiny = replace(spec, hidden=(8, 8))
    sac = SAC(
        tiny,
        TrainConfig(hidden=(8, 8), buffer_size=2, batch_size=2, threads=1, amp="off", compile="off"),
        torch.device("cpu"),
    )
    sac.update(sac.buffer.sample(2, sac.generator))


class DeviceLearner:
    """``SAC`` on the CPU with one intra-op thread, so the control loop keeps a core."""

    def __init__(self, spec: PolicySpec, tensors: Mapping[str, torch.Tensor], sizing: Sizing, lr: float, seed: int):
        torch.set_num_threads(1)
        net = net_shape(spec, tensors)
        if net.critic_hidden[-1] != spec.hidden[-1]:
            raise SacEdgeError(
                f"critic width {net.critic_hidden[-1]} differs from the actor's last width {spec.hidden[-1]}; "
                "this learner was not written by sac-train"
            )
        self.spec, self.sizing = spec, sizing
        self.cfg = TrainConfig(
            env=spec.env_id,
            seed=seed,
            buffer_size=sizing.buffer_rows,
            batch_size=sizing.batch_size,
            hidden=tuple(spec.hidden),
            critic_layers=len(net.critic_hidden),
            grad_checkpoint=sizing.grad_checkpoint,
            actor_lr=lr,
            critic_lr=lr,
            alpha_lr=lr,
            threads=1,
            # Eager fp32: short bursts beside the control loop (nothing to repay a compile), on device CPUs
            # without bf16 matrix units.
            amp="off",
            compile="off",
        )
        self.sac = SAC(spec, self.cfg, torch.device("cpu"))
        self.update_seconds = self._time_updates()
        self.load(tensors)
        low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
        self._scratch = InferencePolicy(Actor(spec.obs_dim, spec.act_dim, spec.hidden), self.sac.obs_norm, low, high)
        self._scratch.eval()

    def _time_updates(self) -> float:
        """Seconds per update at the chosen batch, timed before the real weights are loaded (then reset)."""
        self.sac.update(self.sac.buffer.sample(self.cfg.batch_size, self.sac.generator))  # warm-up
        start = time.perf_counter()
        for _ in range(TIMED_UPDATES):
            self.sac.update(self.sac.buffer.sample(self.cfg.batch_size, self.sac.generator))
        seconds = (time.perf_counter() - start) / TIMED_UPDATES
        for opt in vars(self.sac).values():
            if isinstance(opt, torch.optim.Optimizer):
                opt.state.clear()  # fresh Adam moments for the loaded weights
        return seconds

    def load(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Actor, critics, target critics, normaliser and log-alpha from checkpoint-style tensors."""
        flat = dict(tensors)
        try:
            for name in MODULES:
                getattr(self.sac, name).load_state_dict(prefixed(flat, name))
            with torch.no_grad():
                self.sac.log_alpha.copy_(flat["log_alpha"].reshape(1))
        except (KeyError, RuntimeError) as err:
            raise SacEdgeError(
                f"learner tensors do not fit the bundle's networks ({str(err).splitlines()[0]})"
            ) from None

    def add(self, chunk: Transitions) -> None:
        self.sac.buffer.add(chunk.obs, chunk.actions, chunk.rewards, chunk.next_obs, chunk.dones)

    @property
    def rows(self) -> int:
        return self.sac.buffer.size

    def update(self, batch_size: int) -> UpdateMetrics:
        """One ``SAC.update`` on a uniform minibatch of the replay buffer."""
        return self.sac.update(self.sac.buffer.sample(batch_size, self.sac.generator))

    def actor_weights(self) -> dict[str, np.ndarray]:
        """A snapshot of the actor, keyed as ``InferencePolicy`` / the ONNX initializers (``actor.*``)."""
        return {f"actor.{k}": v.detach().numpy().copy() for k, v in self.sac.actor.state_dict().items()}

    def load_actor(self, weights: Mapping[str, np.ndarray]) -> None:
        state = {
            k[len("actor.") :]: torch.from_numpy(np.array(v)) for k, v in weights.items() if k.startswith("actor.")
        }
        self.sac.actor.load_state_dict(state)

    def state(self) -> dict[str, torch.Tensor]:
        """Checkpoint-style learner tensors (what ``last_good.safetensors`` holds), as copies."""
        out: dict[str, torch.Tensor] = {}
        for name in MODULES:
            out.update({f"{name}.{k}": v.detach().clone() for k, v in getattr(self.sac, name).state_dict().items()})
        out["log_alpha"] = self.sac.log_alpha.detach().clone()
        return out

    def actions(self, weights: Mapping[str, np.ndarray], states: np.ndarray) -> np.ndarray:
        """Env-unit deterministic actions of the actor ``weights`` on raw ``states`` (the deployed mapping)."""
        self._scratch.actor.load_state_dict(
            {k[len("actor.") :]: torch.from_numpy(np.array(v)) for k, v in weights.items() if k.startswith("actor.")}
        )
        with torch.inference_mode():
            return self._scratch(torch.from_numpy(np.ascontiguousarray(states, np.float32))).numpy()

    def recent_states(self, n: int) -> np.ndarray:
        """The ``n`` most recently stored raw observations."""
        buf = self.sac.buffer
        n = min(n, buf.size)
        idx = (torch.arange(buf.pos - n, buf.pos) % buf.capacity).long()
        return buf.obs[idx].numpy().copy()
