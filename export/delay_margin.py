"""The delay margin of a policy trained under an action delay (``sac-train --action-delay`` /
``--delay-profile``): the exported fp32 graph's mean return with each action applied late by the recorded
delay's median, its p99 and twice its p99, on seeded episodes, so the bundle says how much more delay than
it was trained for it can take (``manifest.json``'s ``action_delay.returns``, ``sac-export --json``'s
``delay_returns``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sac_edge.common.delay import DelayDistribution
from sac_edge.common.obs_history import ObsContract
from sac_edge.common.spec import PolicySpec

#: Episode seeds, disjoint from calibration (seed+k), the gate (+200_000) and parity (+300_000).
DELAY_SEED_OFFSET = 400_000


def delay_returns(
    onnx_path: Path,
    spec: PolicySpec,
    observation: dict[str, Any] | None,
    delay: dict[str, Any],
    episodes: int,
    seed: int,
) -> dict[str, dict[str, float]]:
    """``{"median" | "p99" | "2x_p99": {"steps": d, "mean_return": r}}`` of the graph at ``onnx_path``."""
    from sac_edge.calibration.session import OnnxPolicy
    from sac_edge.common.rollout import EnvSetup, run_episode

    recorded = DelayDistribution.from_dict(delay, "action_delay")
    policy = OnnxPolicy(onnx_path)
    contract = ObsContract.from_dict(observation, "observation") if observation else None
    p99 = recorded.quantile(0.99)
    out = {}
    for name, steps in (("median", recorded.quantile(0.5)), ("p99", p99), ("2x_p99", 2 * p99)):
        env = EnvSetup(spec.env_id, contract, steps).make()  # the inputs Runtime assembles, each action late
        returns = [run_episode(policy, env, seed + DELAY_SEED_OFFSET + i).total_return for i in range(episodes)]
        env.close()
        out[name] = {"steps": steps, "mean_return": round(float(np.mean(returns)), 3)}
    return out
