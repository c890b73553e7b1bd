"""A finding (one line naming joints) and the names of a layout's observation slots."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sac_edge.common.io_layout import IoLayout

KINDS = ("swapped", "sign", "scale", "frozen", "out_of_range", "stale")


@dataclass(frozen=True)
class Finding:
    """One thing the log shows is wrong: ``kind`` (``KINDS``), the ``joints`` it names, and one line."""

    kind: str
    joints: tuple[str, ...]
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "joints": list(self.joints), "detail": self.detail}

    def line(self) -> str:
        return f"{self.kind:<12} {', '.join(self.joints) or '-':<20} {self.detail}"


@dataclass(frozen=True)
class Slot:
    """One observation slot: its name, the joints it reads, and the raw (field, joint) it is when it is a
    joint value with no transform (None otherwise)."""

    name: str
    joints: tuple[str, ...]
    raw: tuple[str, str] | None


def slots(layout: IoLayout) -> list[Slot]:
    """The layout's observation slots in order (``position of bthigh``, ``sin(position) of bthigh``,
    ``imu angular_velocity[0] on /imu``, ``vector[2] on /cmd``)."""
    out = []
    for part in layout.parts:
        if part.source == "joint_states":
            for joint in part.joints:
                field = part.field or ""
                if part.transform == "none":
                    out.append(Slot(f"{field} of {joint}", (joint,), (field, joint)))
                else:
                    out.append(Slot(f"{part.transform}({field}) of {joint}", (joint,), None))
        else:
            what = f"imu {part.field}" if part.source == "imu" else "vector"
            out.extend(Slot(f"{what}[{i}] on {part.topic}", (), None) for i in range(part.size))
    return out
