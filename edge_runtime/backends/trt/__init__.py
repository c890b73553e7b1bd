"""TensorRT engines built on the target from the bundle's ONNX: plan cache, CUDA memory, runner, loader."""
