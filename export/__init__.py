"""``sac-export``: a run dir or an SB3 zip -> a verified bundle (ONNX, parity, INT8, TensorRT engines).

May import ``sac_edge.common``, ``sac_edge.train`` (networks, run dirs) and ``sac_edge.calibration``.
"""
