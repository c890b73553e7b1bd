"""Small helpers shared by every stage: atomic writes, errors, the --json summary, the bundle (its format, manifest
and opening).

Nothing here imports torch or another sac_edge stage, so the inference-only path on a device stays light.
"""
