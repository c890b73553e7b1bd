"""Backends: the ``Backend`` interface (``base.py``), one folder per backend, the registry, ``--backend auto``.

Each backend folder holds a loader (``loader.py``: is it usable here, which precisions a bundle offers,
how to open it; the ``BackendKind`` the registry lists) and a runner (``runner.py``: the ``Backend`` that
acts). Heavy dependencies (onnxruntime, tensorrt, cuda-python/pycuda, torch) are imported only when a
backend is opened. May import ``sac_edge.common`` (``common/trt``: TensorRT builds), and lazily
``sac_edge.train`` (the torch reference); no other ``edge_runtime`` subpackage.
"""
