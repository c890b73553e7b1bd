"""``calib.cache``: the INT8 scales in TensorRT's implicit-calibration cache format (TensorRT 8.5, JetPack 5).

Format, as NVIDIA's own tools write it (NVIDIA/Deep-Learning-Accelerator-SW tools/qdq-translator/utils.py
``export_to_trt_calib``; TAO's ``_calibration_cache_from_dict``): a header line
``TRT-<version>-<calibrator>`` (version = major*1000 + minor*100 + patch, so TensorRT 8.5.2 is ``8502``;
calibrator = the IInt8 calibrator class that reads it back, ``EntropyCalibration2`` for
IInt8EntropyCalibrator2), then one ``<tensor name>: <hex>`` line per tensor, where ``<hex>`` is the
IEEE-754 bit pattern of the float32 *scale* (amax / 127) as a big-endian hex integer. TensorRT ignores a
cache whose calibrator name differs from the calibrator in use, so the header names the reader, not how
the scales were found.

TensorRT skips a cache whose header version is not its own (NVIDIA/TensorRT#1378), and the bundle's cache
is written once for TensorRT 8.5.2 (JetPack 5.1) while 8.x builds also run on 8.6 (x86): the engine builder
re-heads the cache for the TensorRT that builds (``for_tensorrt``); the scales do not depend on the
version. Whether the layers then really run INT8 is recorded from the engine inspector at build time.

Tensors are named as TensorRT's ONNX parser names them: the ONNX tensor names of ``policy.onnx``. Written
from the same amax as the Q/DQ model: the data inputs of every quantised MatMul/Gemm, plus the layer's
output when it feeds another quantised input directly or through a Relu (TensorRT needs a range on both
sides of a layer to run it in INT8 and fuses Gemm+Relu). Normalisation ops before the first layer and the
last layer's output (tanh input) get no scale, so TensorRT keeps them in higher precision, as the Q/DQ
model does. Layers kept in float get no scales at all.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import NamedTuple

import onnx

from sac_edge.common.atomic import atomic_write_text
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.versions import parse_version

from .graph import constants, consumers, layer_name, linear_inputs, linear_nodes
from .qdq import activation_scale

TRT_VERSION = 8502  # TensorRT 8.5.2, JetPack 5.1
CALIBRATOR = "EntropyCalibration2"


class CalibCache(NamedTuple):
    """A parsed cache: TensorRT version, calibrator name and scale per tensor."""

    trt_version: int
    calibrator: str
    scales: dict[str, float]


def cache_tensors(model: onnx.ModelProto, float_layers: Collection[str] = ()) -> list[str]:
    """The activation tensors ``calib.cache`` gives a scale (see the module docstring), in graph order."""
    const = constants(model)
    users = consumers(model)
    quantised = [n for n in linear_nodes(model) if layer_name(n) not in float_layers]
    inputs = [name for n in quantised for name in linear_inputs(n, const).data if name not in const]
    wanted = set(inputs)
    names = list(inputs)
    for node in quantised:
        out = node.output[0]
        readers = users.get(out, [])
        direct = out in wanted
        via_relu = bool(readers) and all(r.op_type == "Relu" and r.output[0] in wanted for r in readers)
        if direct or via_relu:
            names.append(out)
    return list(dict.fromkeys(names))


def cache_scales(
    model: onnx.ModelProto, amax: Mapping[str, float], float_layers: Collection[str] = ()
) -> dict[str, float]:
    """Scale (amax / 127, as in the Q/DQ model) per cached tensor."""
    missing = [n for n in cache_tensors(model, float_layers) if n not in amax]
    if missing:
        raise SacEdgeError(f"no calibration range for cache tensors: {', '.join(missing)}")
    return {n: float(activation_scale(amax[n])) for n in cache_tensors(model, float_layers)}


def scale_hex(scale: float) -> str:
    """The float32 bit pattern of ``scale`` as 8 big-endian hex digits (``1.0`` -> ``3f800000``)."""
    return struct.pack(">f", scale).hex()


def cache_text(scales: Mapping[str, float], trt_version: int = TRT_VERSION, calibrator: str = CALIBRATOR) -> str:
    """The cache file's content."""
    lines = [f"TRT-{trt_version}-{calibrator}"]
    for name, scale in scales.items():
        if not name or "\n" in name:
            raise SacEdgeError(f"tensor name {name!r} cannot be written to a calibration cache")
        lines.append(f"{name}: {scale_hex(scale)}")
    return "\n".join(lines) + "\n"


def write_cache(
    path: Path, scales: Mapping[str, float], trt_version: int = TRT_VERSION, calibrator: str = CALIBRATOR
) -> None:
    """Write ``calib.cache`` atomically."""
    atomic_write_text(path, cache_text(scales, trt_version, calibrator))


def trt_version_code(version: str) -> int:
    """The number a cache header carries for TensorRT ``version``: major*1000 + minor*100 + patch
    (8.5.2 -> 8502, 8.6.1 -> 8601)."""
    major, minor, patch = parse_version(version)
    return major * 1000 + minor * 100 + patch


def for_tensorrt(path: Path, version: str, data: bytes | None = None) -> bytes:
    """``path``'s cache (``data``: its bytes, already read and verified) with the header of TensorRT
    ``version`` (same calibrator, same scales)."""
    cache = read_cache(path, data)
    return cache_text(cache.scales, trt_version_code(version), cache.calibrator).encode()


def read_cache(path: Path, data: bytes | None = None) -> CalibCache:
    """Parse a TensorRT calibration cache (ours or TensorRT's own) at ``path``, or ``data`` when given
    (``path`` then only names it in errors)."""
    try:
        lines = (path.read_bytes() if data is None else data).decode().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise SacEdgeError(f"{path}: cannot read the calibration cache ({err})") from None
    header = lines[0].split("-") if lines else []
    if len(header) != 3 or header[0] != "TRT" or not header[1].isdigit():
        raise SacEdgeError(f"{path}: not a TensorRT calibration cache (header {lines[:1]})")
    scales: dict[str, float] = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        name, sep, value = line.rpartition(": ")
        try:
            if not sep:
                raise ValueError("no ': '")
            scales[name] = struct.unpack(">f", int(value, 16).to_bytes(4, "big"))[0]
        except (ValueError, OverflowError) as err:
            raise SacEdgeError(f"{path}:{number}: malformed cache line {line!r} ({err})") from None
    return CalibCache(int(header[1]), header[2], scales)
