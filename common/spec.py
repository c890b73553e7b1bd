"""The policy's interface to the world, shared by every stage without torch: shapes and action bounds."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .errors import SacEdgeError

#: The largest observation, action or hidden size a spec may name: buffers are sized from it before any
#: graph runs (a manifest saying obs_dim=10^9 would otherwise allocate hundreds of GiB in sac-edge bench).
MAX_DIM = 1 << 16


@dataclass(frozen=True)
class PolicySpec:
    """What a run dir, a bundle and the runtime agree on: env, obs/action sizes, action bounds."""

    env_id: str
    obs_dim: int
    act_dim: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    hidden: tuple[int, ...] = (256, 256)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "spec") -> PolicySpec:
        try:
            spec = cls(
                env_id=str(data["env_id"]),
                obs_dim=int(data["obs_dim"]),
                act_dim=int(data["act_dim"]),
                action_low=tuple(float(x) for x in data["action_low"]),
                action_high=tuple(float(x) for x in data["action_high"]),
                hidden=tuple(int(x) for x in data.get("hidden", (256, 256))),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise SacEdgeError(f"{source}: policy spec is incomplete or malformed ({err})") from None
        sizes = (spec.obs_dim, spec.act_dim, *spec.hidden)
        if not all(1 <= n <= MAX_DIM for n in sizes):
            raise SacEdgeError(
                f"{source}: obs_dim, act_dim and hidden sizes must be from 1 to {MAX_DIM}, got obs_dim="
                f"{spec.obs_dim}, act_dim={spec.act_dim}, hidden={','.join(map(str, spec.hidden))[:40]}"
            )
        if len(spec.action_low) != spec.act_dim or len(spec.action_high) != spec.act_dim:
            raise SacEdgeError(f"{source}: action bounds do not match act_dim={spec.act_dim}")
        return spec
