"""Small helpers shared by every stage: atomic writes, errors, the --json summary, the bundle (its format, manifest
and opening), and ``trt/``: TensorRT engine builds, shared by ``sac-export`` and the device runtime.

Nothing here imports torch or another sac_edge stage, so the inference-only path on a device stays light.
"""
