"""Small helpers shared by every stage: atomic writes, errors, the --json summary, manifests.

Nothing here imports torch or another sac_edge stage, so the inference-only path on a device stays light.
"""
