"""The control path: the fixed-rate scheduler, observation and action guards, the shield, the inference
watchdog, real-time scheduling, telemetry.

The parts of one step live here; ``runtime.Runtime`` (the composition root) puts them together in ``act``
(``safety.ObservationGuard`` -> ``Backend.act`` -> ``safety.ActionGuard`` -> ``shield.Shield``), and
``loop.ControlLoop`` schedules it around ``env.step``, reaching the runtime through the ``StepRuntime``
protocol. May import ``sac_edge.common`` and ``backends``.
"""
