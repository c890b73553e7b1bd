"""The fine-tuning section of the run's configuration: one frozen dataclass, the same object in the main
process and (sent as JSON, never pickled) in the learner process.

``FinetuneSettings.of`` cuts it out of ``sac-edge run``'s ``RunConfig`` (the composition root's), so this
room never imports the command layer; a field is validated where the command's config is, before any work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from sac_edge.common.errors import InternalError


@dataclass(frozen=True)
class FinetuneSettings:
    """The ``sac-edge run`` fields that steer on-device learning (see ``sac-edge run --help``)."""

    bundle: str
    env: str | None
    seed: int
    rate_hz: float
    mem_budget_mb: float | None
    finetune_dir: str | None
    finetune_buffer: int
    finetune_batch: int
    finetune_utd: float
    learner_cpu: float
    finetune_lr: float
    learning_starts: int
    swap_every: int
    promotion_window: int
    rollback_threshold: float
    rollback_noise_z: float
    shadow_max_diff: float
    explore_std: float
    cpus: tuple[int, ...]

    @classmethod
    def of(cls, config: object) -> FinetuneSettings:
        """The section of a command's config that has these fields (``RunConfig``, validated already)."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values, for the learner process's start message."""
        return {**asdict(self), "cpus": list(self.cpus)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FinetuneSettings:
        """The section as the learner process receives it from its parent (``to_json``'s output)."""
        want = {f.name for f in fields(cls)}
        if set(data) != want:
            odd = sorted(set(data) ^ want)
            raise InternalError(f"the learner's fine-tuning settings differ from this version's in {odd[:3]}")
        return cls(**{**data, "cpus": tuple(int(c) for c in data["cpus"])})
