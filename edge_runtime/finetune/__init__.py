"""On-device fine-tuning: learner, experience ring, promotion/rollback, last-good store, weight swap, sizing.

``finetuner.py`` wires them for ``sac-edge run --finetune``; ``shift.py`` changes an env's dynamics so
there is something to recover. May import ``sac_edge.common``, ``backends`` and ``budget``, and lazily
``sac_edge.train`` (the learner reuses the server's SAC) and ``sac_edge.calibration`` (INT8 re-gating: in the
learner process for candidates, in the control process only before the loop starts).
"""
