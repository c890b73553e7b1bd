"""The control path: the step's stages, the fixed-rate scheduler, observation and action guards, the shield,
the inference watchdog, real-time scheduling, telemetry.

The parts of one step live here; ``step.StepPipeline`` runs them as named stages that hand each other
values (``safety.ObservationGuard`` -> ``Backend.act`` -> ``safety.ActionGuard`` -> ``shield.Shield``),
``runtime.Runtime`` (the library's lifecycle) owns a pipeline composed by ``compose.step_pipeline``, and
``loop.ControlLoop`` schedules it around ``env.step``, reaching the runtime through the ``StepRuntime``
protocol. May import ``sac_edge.common`` and ``backends``.
"""
