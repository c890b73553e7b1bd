"""``sac-edge run`` / ``bench``: the on-device runtime, as four subpackages and a composition root.

- ``backends/``: the ``Backend`` interface, one loader/runner folder per backend (``onnxrt``, ``trt``,
  ``pyt``), the registry and ``--backend auto``. A new backend goes here.
- ``control/``: the fixed-rate loop, safety guards, real-time scheduling, telemetry.
- ``budget/``: power and memory sensors, the once-a-second monitor, the governor. A new sensor goes in
  ``budget/sensors/``.
- ``finetune/``: learner, experience ring, promotion/rollback and last-good store, weight swap, sizing,
  dynamics shift. A new fine-tuning rule goes here.

``run.py``, ``bench.py``, ``doctor.py``, ``drill.py``, ``cli.py``, ``config.py``, ``preflight.py`` (the flags checked
against the verified bundle before slow work), ``compose.py`` (the one builder
of a run) and ``runtime.py`` (the runtime as a library for a loop the caller owns) compose the subpackages and
are the only modules that import across all of them. Subpackages import ``sac_edge.common`` and each other only
downward: ``control`` may use ``backends``; ``finetune`` may use ``backends`` and ``budget``; ``backends`` and
``budget`` use no other. Of the other stages, ``train`` and ``calibration`` are imported lazily, where torch or
the INT8 gate is needed; ``export`` never (TensorRT builds come from ``sac_edge.common.trt``).
``tests/test_layout.py`` keeps these rules.
"""
