"""The fine-tuning section of the run's configuration (``RunConfig.finetune``): one frozen dataclass, the same
object in the main process and (sent as JSON, never pickled) in the learner process.

The section is defined here rather than beside ``RunConfig`` so that ``finetune/`` never imports the command
layer; its field help is ``sac-edge run --help``'s fine-tuning group and ``check`` is where its flags are
validated, before any work. ``FinetuneSettings`` is what the learner and the fine-tuner are handed: the
section itself plus the few facts it works on from the rest of the run's config.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from sac_edge.common.config import check_fields
from sac_edge.common.errors import InternalError, SacEdgeError

from .promotion import PromotionRules

#: The fewest replay rows the learner takes (it also needs room for ``--learning-starts`` transitions).
MIN_FINETUNE_ROWS = 1000
#: The most replay rows and the largest minibatch a fine-tuner may ask for: far above what a Jetson holds
#: (10^7 HalfCheetah rows are 1.6 GiB), and a typo past them would otherwise be found only when the learner
#: process fails to allocate, after minutes of start-up.
MAX_FINETUNE_ROWS, MAX_FINETUNE_BATCH = 10**7, 1 << 16


@dataclass(frozen=True)
class FinetuneSection:
    """SAC on the device while running, in a learner process, with promotion and rollback."""

    enabled: bool = field(
        default=False,
        metadata={
            "flag": "--finetune",
            "help": "fine-tune on the device while running (SAC in a learner process; needs torch)",
        },
    )
    resume: bool = field(
        default=False,
        metadata={
            "help": "start from the last good fine-tuned weights in --finetune-dir (served; with --finetune also "
            "learned from)"
        },
    )
    restart: bool = field(
        default=False,
        metadata={
            "help": "with --finetune, start again from the bundle weights although last good fine-tuned weights "
            "exist (they are kept as the previous generation until a candidate is promoted)"
        },
    )
    finetune_dir: str | None = field(
        default=None, metadata={"help": "where the last good weights are kept (default: BUNDLE/finetune)"}
    )
    finetune_buffer: int = field(
        default=200_000, metadata={"help": "replay rows wanted; --mem-budget-mb may choose fewer"}
    )
    finetune_batch: int = field(
        default=256, metadata={"help": "minibatch wanted; --mem-budget-mb or the governor may choose less"}
    )
    finetune_utd: float = field(
        default=1.0,
        metadata={"help": "updates per collected step wanted; capped so updates use at most --learner-cpu of a core"},
    )
    learner_cpu: float = field(
        default=0.6, metadata={"help": "fraction of one core the learner's updates may take at --rate-hz"}
    )
    finetune_lr: float = field(default=3e-4, metadata={"help": "actor, critic and temperature learning rate"})
    learning_starts: int = field(default=1000, metadata={"help": "transitions collected before the first update"})
    swap_every: int = field(default=500, metadata={"help": "updates between candidate policies (K)"})
    promotion_window: int = field(
        default=8,
        metadata={"help": "episodes served by a candidate, compared with as many served by the last good weights"},
    )
    rollback_threshold: float = field(
        default=0.25,
        metadata={
            "help": "roll back when the candidate's mean return is below the last good one's by more than this "
            "fraction of |last good mean| (at least 1)"
        },
    )
    rollback_noise_z: float = field(
        default=2.0,
        metadata={
            "help": "...and by more than this many standard errors of the difference of the two windows' means, "
            "so that episode-to-episode noise is not mistaken for a regression (0: the threshold alone)"
        },
    )
    shadow_max_diff: float = field(
        default=0.5,
        metadata={
            "help": "refuse to serve a candidate whose mean action differs from the last good one's by more than "
            "this fraction of the action range on recent states"
        },
    )
    explore_std: float = field(
        default=0.1,
        metadata={"help": "exploration noise while fine-tuning, std as a fraction of the half action range (0: off)"},
    )

    def check(self) -> None:
        """Every fine-tuning flag (one ``SacEdgeError`` line, exit 2), including the ones the learner process
        and the promotion rules read; torch's presence only with ``--finetune``."""
        check_fields(self)
        if self.resume and self.restart:
            raise SacEdgeError("--resume and --restart exclude each other: continue from the last good weights, or not")
        if self.restart and not self.enabled:
            raise SacEdgeError("--restart only applies with --finetune")
        for name in ("finetune_buffer", "finetune_batch", "swap_every", "learning_starts"):
            if getattr(self, name) < 1:
                raise SacEdgeError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.finetune_buffer > MAX_FINETUNE_ROWS or self.finetune_batch > min(
            MAX_FINETUNE_BATCH, self.finetune_buffer
        ):
            raise SacEdgeError(
                f"--finetune-buffer must be at most {MAX_FINETUNE_ROWS} rows and --finetune-batch at most "
                f"{MAX_FINETUNE_BATCH} and the buffer, got {self.finetune_buffer} and {self.finetune_batch}"
            )
        if self.finetune_buffer < max(self.learning_starts, MIN_FINETUNE_ROWS):
            raise SacEdgeError(
                f"--finetune-buffer {self.finetune_buffer} is below the "
                f"{max(self.learning_starts, MIN_FINETUNE_ROWS)} rows fine-tuning needs (at least "
                f"{MIN_FINETUNE_ROWS} and --learning-starts)"
            )
        if not 0 < self.finetune_utd < math.inf:
            raise SacEdgeError(f"--finetune-utd must be a positive number, got {self.finetune_utd}")
        if not 0 < self.learner_cpu <= 1:
            raise SacEdgeError(f"--learner-cpu is a fraction of one core in (0, 1], got {self.learner_cpu}")
        if not 0 < self.finetune_lr < math.inf:
            raise SacEdgeError(f"--finetune-lr must be positive, got {self.finetune_lr}")
        if not 0 <= self.explore_std < math.inf:
            raise SacEdgeError(f"--explore-std must be non-negative, got {self.explore_std}")
        self.rules()
        if self.enabled and importlib.util.find_spec("torch") is None:
            raise SacEdgeError(
                "--finetune needs the Python package 'torch' (pip install 'sac-edge[finetune]'; "
                "the inference-only path does not)"
            )

    def rules(self) -> PromotionRules:
        """``--promotion-window``, ``--rollback-threshold``, ``--rollback-noise-z`` and ``--shadow-max-diff``,
        checked where the rules are made."""
        return PromotionRules(
            self.promotion_window, self.rollback_threshold, self.shadow_max_diff, self.rollback_noise_z
        )


@dataclass(frozen=True)
class FinetuneSettings:
    """What the fine-tuner and the learner process work from: the run's fine-tuning section as it is, and
    the facts about the run it needs from the other sections."""

    section: FinetuneSection
    bundle: str
    env: str | None
    seed: int
    rate_hz: float
    """The control rate: the learner's updates per second are budgeted against it."""
    mem_budget_mb: float | None
    """The memory budget the learner sizes its replay buffer and batch for."""
    cpus: tuple[int, ...]
    """The control loop's CPUs: the learner process keeps off them."""

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON values, for the learner process's start message."""
        return {**asdict(self), "cpus": list(self.cpus)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FinetuneSettings:
        """The settings as the learner process receives them from its parent (``to_json``'s output)."""
        section = data.get("section")
        want, want_section = {f.name for f in fields(cls)}, {f.name for f in fields(FinetuneSection)}
        if set(data) != want or not isinstance(section, Mapping) or set(section) != want_section:
            odd = sorted((set(data) ^ want) | (set(section or {}) ^ want_section))
            raise InternalError(f"the learner's fine-tuning settings differ from this version's in {odd[:3]}")
        return cls(**{**data, "section": FinetuneSection(**section), "cpus": tuple(int(c) for c in data["cpus"])})
