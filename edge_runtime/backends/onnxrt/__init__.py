"""onnxruntime: the CPU, CUDA and TensorRT execution providers over the bundle's ONNX graphs."""
