"""The policy's interface to the world, shared by every stage without torch: shapes and action bounds."""

from __future__ import annotations

import math
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
        """The spec a file holds, its types checked strictly: a size written as ``"3"`` or ``3.7``, a hidden
        list written as ``"32"`` (which ``int`` would read digit by digit) or a bound ``NaN`` is refused, never
        converted into a different policy."""
        try:
            spec = cls(
                env_id=_typed(data["env_id"], str, "env_id"),
                obs_dim=_typed(data["obs_dim"], int, "obs_dim"),
                act_dim=_typed(data["act_dim"], int, "act_dim"),
                action_low=tuple(_bound(x) for x in _typed(data["action_low"], (list, tuple), "action_low")),
                action_high=tuple(_bound(x) for x in _typed(data["action_high"], (list, tuple), "action_high")),
                hidden=tuple(
                    _typed(x, int, "hidden") for x in _typed(data.get("hidden", (256, 256)), (list, tuple), "hidden")
                ),
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
        if not all(low < high for low, high in zip(spec.action_low, spec.action_high)):
            raise SacEdgeError(f"{source}: each action_low must be below its action_high (a policy scales into them)")
        return spec


def _typed(value: Any, kind: type | tuple[type, ...], name: str) -> Any:
    """``value`` if it is a ``kind`` (a bool is not an int here), else ``TypeError`` naming the field."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{name} is {type(value).__name__} {str(value)[:20]!r}")
    return value


def _bound(value: Any) -> float:
    """An action bound: a finite number (JSON has no NaN, but Python's reader takes ``NaN`` and ``Infinity``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"an action bound is {str(value)[:20]!r}, not a finite number")
    return float(value)
