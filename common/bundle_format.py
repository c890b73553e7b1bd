"""The deployment bundle's format: every file name, file kind and precision, and the folders the device
writes (docs/CONTRACTS.md, "Bundle").

``sac-export`` and the INT8 pipeline write these names, the edge runtime reads them; nothing else spells
them out (``tests/test_layout.py`` fails on one of these literals anywhere else in the stage packages).
The manifest's schema and checksums are ``manifest.py``; opening a bundle (verified bytes only) is
``bundle.py``, which reads through ``manifest.py`` and ``signing.py``, both of which need these names: so
this module imports nothing and everything else imports it.
"""

from __future__ import annotations

FORMAT_VERSION = 1
"""The manifest's ``format_version``; a bundle of a newer one is refused with the upgrade to make."""

# Precisions, most to least expensive: the order the governor steps down through ("cheaper precision").
FP32 = "fp32"
FP16 = "fp16"
INT8 = "int8"
PRECISIONS = (FP32, FP16, INT8)

# Files sac-export writes at the bundle's top level.
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"  # only with ``sac-export --sign-key``; covers MANIFEST, listed in no ``files``
POLICY_ONNX = "policy.onnx"
FP16_ONNX = "policy.fp16.onnx"
INT8_ONNX = "policy.int8.onnx"  # explicit Q/DQ, what TensorRT 10/11 builds INT8 from
INT8_CPU_ONNX = "policy.int8-cpu.onnx"  # integer storage for onnxruntime's CPU provider
CALIB_CACHE = "calib.cache"  # TensorRT 8.5's implicit-calibration cache from the same scales
PARITY_STATES = "parity_states.npy"  # held-out states the runtime's engine parity gate runs
LEARNER = "learner.safetensors"
EXPORT_CONFIG = "export_config.json"
ENVELOPE = "envelope.json"
LAYOUT = "layout.json"  # the robot's I/O layout (``sac-export --layout``; ``io_layout.py``)
TIMING_CACHE = "timing.cache"  # TensorRT's tactic timings, beside the plans they sped up (here and in ENGINES_DIR)

# The manifest's ``files[name]["kind"]`` values.
ONNX_KIND = "onnx"
ONNX_CPU_KIND = "onnx-cpu"
CALIB_KIND = "calibration-cache"
PARITY_STATES_KIND = "parity-states"
LEARNER_KIND = "learner"
CONFIG_KIND = "config"
ENVELOPE_KIND = "envelope"
LAYOUT_KIND = "io-layout"
TIMING_CACHE_KIND = "tensorrt-timing-cache"
PLAN_KIND = "tensorrt-engine"
GRAPH_KINDS = (ONNX_KIND, ONNX_CPU_KIND)
"""Kinds whose files are ONNX graphs, checked (ops, widths, no external data) when a bundle is opened."""

# Folders the device writes inside a bundle, never beside the exported files.
ENGINES_DIR = "engines"  # engines and provider caches built on this device
ORT_TRT_CACHE = "ort-trt"  # ENGINES_DIR's folder for onnxruntime's TensorRT provider engine cache
SWAP_BUILDS = "swap"  # ENGINES_DIR's folder for engines rebuilt with swapped-in weights
FINETUNE_DIR = "finetune"  # the last good fine-tuned weights (``sac-edge run --finetune``), in these files:
LAST_GOOD = "last_good.safetensors"  # the promoted weights
LAST_GOOD_INFO = "last_good.json"  # their record
PREVIOUS = "previous.safetensors"  # the set they replaced, named when the last good set is damaged
PREVIOUS_INFO = "previous.json"
LOCK = "lock"  # one fine-tuner per bundle


def plan_name(precision: str, tag: str | None = None) -> str:
    """A TensorRT engine's file name: ``policy.<precision>.plan`` in the bundle, with the device ``tag``
    (``trt10.8.0-nvidia-h200-sm90``) in ``ENGINES_DIR``."""
    return f"policy.{precision}.{tag}.plan" if tag else f"policy.{precision}.plan"


FILE_KINDS: dict[str, tuple[str, str | None]] = {
    POLICY_ONNX: (ONNX_KIND, FP32),
    INT8_ONNX: (ONNX_KIND, INT8),
    INT8_CPU_ONNX: (ONNX_CPU_KIND, INT8),
    FP16_ONNX: (ONNX_KIND, FP16),
    PARITY_STATES: (PARITY_STATES_KIND, None),
    CALIB_CACHE: (CALIB_KIND, INT8),
    LEARNER: (LEARNER_KIND, FP32),
    EXPORT_CONFIG: (CONFIG_KIND, None),
    ENVELOPE: (ENVELOPE_KIND, None),
    LAYOUT: (LAYOUT_KIND, None),
    TIMING_CACHE: (TIMING_CACHE_KIND, None),
    **{plan_name(p): (PLAN_KIND, p) for p in PRECISIONS},
}
"""Every file sac-export may list in the manifest's ``files``: name -> (kind, precision)."""
