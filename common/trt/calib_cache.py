"""``calib.cache``: INT8 scales in TensorRT's implicit-calibration cache format (TensorRT 8.5, JetPack 5).

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
version. Which tensors get a scale is calibration's choice (``sac_edge.calibration.cache``); this module
is the file format, which the calibration writes and the engine builder reads.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from ..atomic import atomic_write_text
from ..errors import SacEdgeError
from ..versions import parse_version

TRT_VERSION = 8502  # TensorRT 8.5.2, JetPack 5.1
CALIBRATOR = "EntropyCalibration2"


class CalibCache(NamedTuple):
    """A parsed cache: TensorRT version, calibrator name and scale per tensor."""

    trt_version: int
    calibrator: str
    scales: dict[str, float]


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
