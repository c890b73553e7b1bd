"""TensorRT, shared by ``sac-export`` and the device runtime: the engine builder, the Python API pieces every
generation shares, one code path per generation, the CUDA device probe and the ``calib.cache`` file format.

Engines are specific to a GPU and a TensorRT version, so the device builds its own from the bundle's ONNX
with the same code ``sac-export`` uses; it lives here because the device runtime does not import ``export``.
Nothing here imports tensorrt at module import time. May import ``sac_edge.common`` only.
"""
