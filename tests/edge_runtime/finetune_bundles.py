"""Small bundles for the fine-tuning tests, with an INT8 graph made the way ``sac-export --int8`` makes it.

The fp32 graph, learner tensors and manifest come from ``bundles.py``; the INT8 graph is
``calibration.qdq.quantize_model`` with activation ranges from ``calibration.calibrators.compute_amax`` on
observations of the env, and the manifest records those ranges under ``calibration.amax`` as sac-export
does (the episode part of the gate is skipped: it is not what these tests are about).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnx

from bundles import export_onnx, learner_tensors, spec_for
from sac_edge.calibration.calibrators import compute_amax
from sac_edge.calibration.integer import integer_graph
from sac_edge.calibration.qdq import quantizable_tensors, quantize_model
from sac_edge.calibration.session import collect_activations
from sac_edge.common.bundle import open_bundle
from sac_edge.common.bundle_format import INT8_CPU_ONNX, INT8_ONNX, LEARNER, POLICY_ONNX
from sac_edge.common.manifest import files_table, write_manifest
from sac_edge.edge_runtime.backends.base import Backend, BackendOptions
from sac_edge.edge_runtime.backends.registry import open_backend
from sac_edge.edge_runtime.budget.memory import MemoryProbe
from sac_edge.edge_runtime.compose import finetune_settings
from sac_edge.edge_runtime.config import RuntimeOptions
from sac_edge.edge_runtime.finetune.finetuner import FineTuner, TunerSetup, build_finetuner
from sac_edge.train.checkpoint import save_tensors


def env_states(env_id: str, n: int, seed: int = 0) -> np.ndarray:
    """Observations of random-action episodes (real states of the env)."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out = []
    for _ in range(n):
        out.append(np.asarray(obs, np.float32))
        obs, _, term, trunc, _ = env.step(rng.uniform(env.action_space.low, env.action_space.high))  # type: ignore[attr-defined]
        if term or trunc:
            obs, _ = env.reset()
    env.close()
    return np.stack(out)


def make_finetune_bundle(out: Path, env_id: str = "Pendulum-v1", hidden: tuple[int, ...] = (32, 32)) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    spec = spec_for(env_id, hidden)
    tensors = learner_tensors(spec)
    export_onnx(spec, tensors, out / POLICY_ONNX)
    save_tensors(out / LEARNER, tensors)
    model = onnx.load(str(out / POLICY_ONNX))
    names = list(quantizable_tensors(model))
    amax = compute_amax(collect_activations(model, env_states(env_id, 512), names), "minmax")
    qdq = quantize_model(model, amax)
    onnx.save(qdq, str(out / INT8_ONNX))
    onnx.save(integer_graph(qdq), str(out / INT8_CPU_ONNX))
    manifest = {
        "spec": spec.to_dict(),
        "files": files_table(out),
        "gate": {"verdict": "accepted", "float_layers": []},
        "calibration": {"method": "minmax", "amax": amax},
    }
    write_manifest(out, manifest)
    return out


def make_tuner(
    bundle_dir: Path,
    tmp_path: Path,
    emit: Callable[[dict[str, Any]], None] = lambda _: None,
    precisions: tuple[str, ...] = ("fp32",),
    **overrides: Any,
) -> tuple[FineTuner, Backend]:
    """A fine-tuner (its learner process started) on ``bundle_dir``'s onnxruntime backends of ``precisions``
    (the first one returned), built as ``sac-edge run --finetune`` builds it, with small buffers so the
    tests learn quickly."""
    cfg = RuntimeOptions.of(
        str(bundle_dir),
        finetune=True,
        finetune_dir=str(tmp_path / "ft"),
        finetune_buffer=2000,
        finetune_batch=32,
        learning_starts=100,
        **overrides,
    )
    bundle = open_bundle(bundle_dir)
    options = BackendOptions(refit=True)  # as the run opens them with --finetune
    backends = {p: open_backend(bundle, "onnxruntime", p, options) for p in precisions}
    tuner, _ = build_finetuner(
        TunerSetup(finetune_settings(cfg), bundle, backends, MemoryProbe()), emit, lambda _: None
    )
    return tuner, backends[precisions[0]]
