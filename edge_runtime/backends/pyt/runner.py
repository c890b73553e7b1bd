"""PyTorch reference backend: the eager ``InferencePolicy`` from the bundle's ``learner.safetensors``.

It is what the other backends are compared against (bench, parity tests) and what the fine-tuner can
drive directly. torch is imported only when this backend is opened. Eager torch allocates its own
intermediates; the interface still holds: ``act`` returns the same preallocated output array each call.
A weight swap loads a copy of the module and publishes it with one assignment (copy-on-write), so the
reader's module is never half-updated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import LEARNER_KIND
from sac_edge.common.errors import SacEdgeError

from ..base import Backend, BackendOptions, PendingSwap, check_weights, missing_package


class TorchBackend(Backend):
    """fp32 eager PyTorch on the CPU."""

    name = "torch"

    def __init__(self, bundle: Bundle, precision: str, options: BackendOptions) -> None:
        super().__init__(bundle.spec)
        try:
            import torch
        except ImportError:
            raise missing_package("torch", "torch", "use --backend onnxruntime") from None
        from safetensors import SafetensorError
        from safetensors.torch import load

        from sac_edge.train.checkpoint import inference_policy

        self.precision = precision
        self._torch = torch
        torch.set_num_threads(options.threads)
        names = bundle.files(LEARNER_KIND)
        if not names:
            raise SacEdgeError(f"{bundle.path}: backend 'torch' needs learner.safetensors, which the bundle lacks")
        self.file = names[0]
        try:
            tensors = load(bundle.read(bundle.path / self.file))  # the verified bytes
            self._module = inference_policy(bundle.spec, tensors)
        except (SafetensorError, KeyError, RuntimeError) as err:
            raise SacEdgeError(f"{bundle.path / self.file}: cannot build the policy ({err})") from None
        self._obs_t = torch.zeros(1, bundle.spec.obs_dim)
        self._action_t = torch.zeros(1, bundle.spec.act_dim)
        self._obs_np, self._action_np = self._obs_t.numpy(), self._action_t.numpy()[0]
        self._shapes = {k: tuple(v.shape) for k, v in self._module.state_dict().items()}

    def act(self, obs: np.ndarray) -> np.ndarray:
        self._obs_np[:] = obs  # (obs_dim,) or (1, obs_dim)
        module = self._module
        with self._torch.inference_mode():
            self._action_t.copy_(module(self._obs_t))
        return self._action_np

    def bare_call(self) -> Callable[[], object]:
        module, inference_mode, obs = self._module, self._torch.inference_mode, self._obs_t

        def call() -> object:
            with inference_mode():
                return module(obs)

        return call

    def act_batch(self, obs: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            x = self._torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32))
            return self._module(x).numpy()

    def prepare_swap(self, weights: Mapping[str, np.ndarray]) -> PendingSwap:
        use, ignored = check_weights(weights, self._shapes)
        module = copy.deepcopy(self._module)
        module.load_state_dict({k: self._torch.from_numpy(v) for k, v in use.items()}, strict=False)

        def run_batch(obs: np.ndarray) -> np.ndarray:
            with self._torch.inference_mode():
                return module(self._torch.from_numpy(np.ascontiguousarray(obs, dtype=np.float32))).numpy()

        def publish() -> None:
            self._module = module

        return PendingSwap(run_batch, use, "swap", len(use), ignored, publish)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "file": self.file, "device": "cpu", "torch": self._torch.__version__}
