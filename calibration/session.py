"""onnxruntime CPU sessions for the policy graphs: the calibration runs, the rollouts and the gate.

Everything here runs the real ONNX graphs (fp32 and Q/DQ) through onnxruntime, so what is calibrated and
gated is what ships.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from sac_edge.common.errors import SacEdgeError


def session(model: onnx.ModelProto | Path, threads: int = 1) -> ort.InferenceSession:
    """A CPU session; one thread by default, so its timings do not depend on what else the machine runs."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    try:
        return ort.InferenceSession(source, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own exception types for bad graphs
        where = "model" if isinstance(model, onnx.ModelProto) else str(model)
        raise SacEdgeError(f"{where}: onnxruntime cannot load it ({str(err).splitlines()[0]})") from None


class OnnxPolicy:
    """Raw observations ``[batch, obs_dim]`` -> env-unit actions, through an onnxruntime session."""

    def __init__(self, model: onnx.ModelProto | Path, threads: int = 1) -> None:
        self.session = session(model, threads)
        self.input = self.session.get_inputs()[0].name
        self.output = self.session.get_outputs()[0].name

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        batch = np.ascontiguousarray(obs, dtype=np.float32)
        return np.asarray(self.session.run([self.output], {self.input: batch})[0])


def collect_activations(
    model: onnx.ModelProto, states: np.ndarray, names: Sequence[str], batch: int = 4096
) -> dict[str, np.ndarray]:
    """Values of the tensors ``names`` over ``states``, read by exposing them as extra graph outputs.

    A graph input among ``names`` is the states themselves. Returned arrays are ``[N, ...]`` float32.
    """
    inputs = {i.name for i in model.graph.input}
    wanted = [n for n in dict.fromkeys(names) if n not in inputs]
    probe = copy.deepcopy(model)
    present = {o.name for o in probe.graph.output}
    for name in wanted:
        if name not in present:
            probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    sess = session(probe, threads=1)
    feed = sess.get_inputs()[0].name
    chunks: dict[str, list[np.ndarray]] = {n: [] for n in wanted}
    data = np.ascontiguousarray(states, dtype=np.float32)
    for start in range(0, len(data), batch):
        values = sess.run(wanted, {feed: data[start : start + batch]})
        for name, value in zip(wanted, values):
            chunks[name].append(np.asarray(value, dtype=np.float32))
    out = {n: np.concatenate(c) for n, c in chunks.items()}
    for name in names:
        if name in inputs:
            out[name] = data
    return out
