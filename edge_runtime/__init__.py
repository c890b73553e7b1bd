"""``sac-edge run`` / ``bench``: the on-device runtime, as four rooms and a composition root.

- ``backends/``: the ``Backend`` interface, one loader/runner folder per backend (``onnxrt``, ``trt``,
  ``pyt``), the registry and ``--backend auto``. A new backend goes here.
- ``control/``: the fixed-rate loop, safety guards, real-time scheduling, telemetry.
- ``budget/``: power and memory sensors, the once-a-second monitor, the governor. A new sensor goes in
  ``budget/sensors/``.
- ``finetune/``: learner, experience ring, promotion/rollback and last-good store, weight swap, sizing,
  dynamics shift. A new fine-tuning rule goes here.

``run.py``, ``bench.py``, ``doctor.py``, ``cli.py``, ``config.py``, ``compose.py`` (the one builder of a run) and
``runtime.py`` (the runtime as a library for a loop the caller owns) compose the rooms and are the only modules
that import across all of them. Rooms import ``sac_edge.common`` and each other only downward: ``control`` may
use ``backends``; ``finetune`` may use ``backends`` and ``budget``; ``backends`` and ``budget`` use no room.
Other stages (``train``, ``export``, ``calibration``) are imported lazily, where torch or TensorRT is
needed. ``tests/test_layout.py`` keeps these rules.
"""
