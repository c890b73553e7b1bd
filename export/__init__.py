"""``sac-export``: a run dir or an SB3 zip -> a verified bundle (ONNX, parity, INT8, TensorRT engines).

TensorRT engines are built with ``sac_edge.common.trt``, which the device runtime shares. May import
``sac_edge.common``, ``sac_edge.train`` (networks, run dirs) and ``sac_edge.calibration``.
"""
