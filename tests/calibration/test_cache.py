from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import onnx
import pytest

from sac_edge.calibration.cache import cache_scales, cache_tensors
from sac_edge.calibration.graph import constants, layer_name, linear_nodes
from sac_edge.calibration.qdq import activation_scale, quantize_model
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.trt.calib_cache import read_cache, scale_hex, write_cache


def test_scale_hex_is_big_endian_float32_bits() -> None:
    assert scale_hex(1.0) == "3f800000"
    assert scale_hex(8.0 / 127) == struct.pack(">f", np.float32(8.0 / 127)).hex() == "3d810204"


def test_cache_round_trips(tmp_path: Path) -> None:
    scales = {"obs": 0.5, "/actor/trunk/trunk.1/Relu_output_0": 0.0123, "weird: name": 3e-5}
    path = tmp_path / "calib.cache"
    write_cache(path, scales)
    text = path.read_text()
    assert text.splitlines()[0] == "TRT-8502-EntropyCalibration2"
    assert "/actor/trunk/trunk.1/Relu_output_0: " + scale_hex(0.0123) in text
    cache = read_cache(path)
    assert (cache.trt_version, cache.calibrator) == (8502, "EntropyCalibration2")
    assert cache.scales == {k: float(np.float32(v)) for k, v in scales.items()}
    assert not list(tmp_path.glob(".*.tmp"))


def test_reads_nvidia_style_unpadded_hex(tmp_path: Path) -> None:
    path = tmp_path / "c.cache"
    path.write_text("TRT-8600-EntropyCalibration2\ninput: 3c010a14\nsmall: 800000\n")
    cache = read_cache(path)
    assert cache.scales["input"] == pytest.approx(0.00787, rel=1e-3)
    assert cache.scales["small"] == struct.unpack(">f", bytes.fromhex("00800000"))[0]
    path.write_text("TRT-8502-EntropyCalibration2\nno separator here\n")
    with pytest.raises(SacEdgeError, match="malformed"):
        read_cache(path)
    path.write_text("not a cache\n")
    with pytest.raises(SacEdgeError, match="not a TensorRT calibration cache"):
        read_cache(path)


def test_cache_scales_match_the_qdq_model(fp32_model: onnx.ModelProto) -> None:
    names = cache_tensors(fp32_model)
    layers = [layer_name(n) for n in linear_nodes(fp32_model)]
    gemm_out = [n.output[0] for n in linear_nodes(fp32_model)]
    assert gemm_out[0] in names and gemm_out[1] in names  # feed a Relu -> next quantised input
    assert gemm_out[-1] not in names and "obs" not in names  # tanh input and raw obs stay high precision
    amax = {n: 1.0 + i for i, n in enumerate(names)}
    scales = cache_scales(fp32_model, amax)
    q = quantize_model(fp32_model, amax)
    const = constants(q)
    for node in q.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] in scales:
            assert const[node.input[1]] == np.float32(scales[node.input[0]])
    assert scales[names[0]] == float(activation_scale(1.0))
    kept = cache_tensors(fp32_model, float_layers={layers[-1]})
    assert linear_nodes(fp32_model)[-1].input[0] not in kept
