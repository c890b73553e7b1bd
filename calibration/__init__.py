"""INT8 for the policy: state sets, calibrators, explicit Q/DQ, the TensorRT cache and the accuracy gate.

``pipeline.quantize_and_gate`` is the one call ``sac-export --int8`` makes. Torch-free: it works on the
exported ONNX graphs through onnxruntime, so what is calibrated and gated is what ships. May import
``sac_edge.common`` only.
"""
