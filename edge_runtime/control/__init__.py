"""The control path: the fixed-rate loop, observation and action guards, real-time scheduling, telemetry.

One step: observation -> ``safety.ObservationGuard`` -> ``Backend.act`` -> ``safety.ActionGuard`` ->
``env.step`` -> the fine-tuner's ``Experience`` hook. May import ``sac_edge.common`` and ``backends``;
the budget monitor and the fine-tuner plug in through protocols defined in ``loop.py``.
"""
