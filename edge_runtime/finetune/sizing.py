"""Up-front sizing of the on-device learner from ``--mem-budget-mb``: replay rows, batch, checkpointing, UTD.

Estimate (float32 everywhere, bytes):

- replay row: ``4 * (2 * obs_dim + act_dim + 2)`` (obs, next_obs, action, reward, done), plus the same
  per row of the control thread's staging ring;
- learner state: actor + critic parameters x 4 (value, gradient, Adam's two moments) + target critic x 1;
- activations per update: ``4 * batch * 3 * (sum(actor widths) + 2 * n_critics * sum(kept critic widths))``:
  forward values, ReLU outputs and their gradients of the actor pass and of the two critic passes (critic
  step and actor step) that autograd keeps at once. Gradient checkpointing (``CriticEnsemble(grad_checkpoint=
  True)``) splits the hidden layers after the first into about sqrt(n) segments (``checkpoint_segments``):
  it keeps the first layer and each segment's output, plus one segment's layers while that segment is
  recomputed in the backward pass. With two hidden layers that is more, not less, so it is offered only
  where the model says it saves memory (``tests/train/test_policies.py`` checks that it does for a deep
  critic).

The room for all of it is the budget less the resident memory measured just before the learner is built
(the control process's backends, env and swap path: ``WeightSwapper.warm_up``; plus the learner process's
torch after a warm-up update and its int8 re-check after a warm-up one: ``learner_process.LearnerLoop.build``)
less a 10% headroom for allocator slack. That slack is real: each later swap (session rebuilds, the int8
re-check) leaves a little more resident at first, less as the allocator's free lists fill, and the peak
has to stay under the budget all run (``bench/finetune.py``'s tight-budget run checks exactly that).
Choices, in order, until the estimate fits: the requested sizes; fewer replay rows (down to
``min_rows``); gradient checkpointing (where it saves memory); halving the batch (down to 32).
If even that does not fit it is a one-line error with the sizes. The update-to-data ratio is a compute
choice, not a memory one: :func:`choose_utd` caps it so the learner process uses at most ``learner_cpu``
of one core at the control rate, from a timed update at the chosen batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sac_edge.common.checkpointing import checkpoint_segments
from sac_edge.common.errors import SacEdgeError

F32 = 4
HEADROOM = 0.10
MIN_BATCH = 32
ACTIVATION_FACTOR = 3
MB = 2**20


@dataclass(frozen=True)
class NetShape:
    """What the estimate needs to know about the networks."""

    obs_dim: int
    act_dim: int
    actor_hidden: tuple[int, ...]
    critic_hidden: tuple[int, ...]
    n_critics: int = 2


@dataclass(frozen=True)
class Sizing:
    """The learner's sizes, why they were chosen, and the estimate they were chosen on (MiB)."""

    buffer_rows: int
    batch_size: int
    grad_checkpoint: bool
    staging_rows: int
    budget_mb: float | None
    baseline_mb: float
    estimate_mb: dict[str, float]
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def row_bytes(net: NetShape) -> int:
    return F32 * (2 * net.obs_dim + net.act_dim + 2)


def _mlp_params(dims: Sequence[int]) -> int:
    return sum(a * b + b for a, b in zip(dims, dims[1:]))


def learner_state_bytes(net: NetShape) -> int:
    """Parameters, gradients and Adam moments of actor and critics, plus the target critics."""
    actor = _mlp_params([net.obs_dim, *net.actor_hidden]) + 2 * _mlp_params([net.actor_hidden[-1], net.act_dim])
    critic = net.n_critics * _mlp_params([net.obs_dim + net.act_dim, *net.critic_hidden, 1])
    return F32 * (4 * (actor + critic) + critic)


def activation_bytes(net: NetShape, batch: int, grad_checkpoint: bool) -> int:
    kept, recompute = list(net.critic_hidden), 0
    if grad_checkpoint:  # as CriticEnsemble: the first layer, each segment's output, one segment recomputed
        rest = net.critic_hidden[1:]
        segments = checkpoint_segments(len(rest))
        kept = [*net.critic_hidden[:1], *(rest[seg.stop - 1] for seg in segments)]
        recompute = max((sum(rest[i] for i in seg) for seg in segments), default=0)
    per_sample = sum(net.actor_hidden) + 2 * net.n_critics * (sum(kept) + recompute)
    return F32 * batch * ACTIVATION_FACTOR * per_sample


def estimate(net: NetShape, rows: int, staging: int, batch: int, grad_checkpoint: bool) -> dict[str, float]:
    """The estimate in MiB, by part."""
    parts = {
        "replay": row_bytes(net) * (rows + staging) / MB,
        "learner_state": learner_state_bytes(net) / MB,
        "activations": activation_bytes(net, batch, grad_checkpoint) / MB,
    }
    parts["total"] = sum(parts.values())
    return {k: round(v, 3) for k, v in parts.items()}


def choose_sizing(
    net: NetShape,
    *,
    rows: int,
    batch: int,
    staging: int,
    min_rows: int,
    budget_mb: float | None,
    baseline_mb: float,
) -> Sizing:
    """Replay rows, batch and checkpointing for ``budget_mb`` (see the module docstring for the order)."""
    if rows < min_rows:
        raise SacEdgeError(f"--finetune-buffer {rows} is below the {min_rows} rows fine-tuning needs")
    if batch < 1:
        raise SacEdgeError(f"--finetune-batch must be >= 1, got {batch}")
    if budget_mb is None:
        est = estimate(net, rows, staging, batch, False)
        return Sizing(rows, batch, False, staging, None, baseline_mb, est, ("no --mem-budget-mb: requested sizes",))
    room_mb = budget_mb * (1 - HEADROOM) - baseline_mb
    reasons = [f"room {room_mb:.1f} MiB = budget {budget_mb:g} x {1 - HEADROOM:g} - resident {baseline_mb:.1f}"]

    def fixed_mb(b: int, gc: bool) -> float:
        return (learner_state_bytes(net) + activation_bytes(net, b, gc) + row_bytes(net) * staging) / MB

    def rows_that_fit(b: int, gc: bool) -> int:
        return max(0, math.floor((room_mb - fixed_mb(b, gc)) * MB / row_bytes(net)))

    options = _options(net, batch)
    for b, gc in options:
        fit = rows_that_fit(b, gc)
        if fit >= min_rows:
            chosen = min(rows, fit)
            reasons += _changes(rows, chosen, batch, b, gc)
            return Sizing(
                chosen, b, gc, staging, budget_mb, baseline_mb, estimate(net, chosen, staging, b, gc), tuple(reasons)
            )
    smallest = options[-1]
    need = baseline_mb + fixed_mb(*smallest) + row_bytes(net) * min_rows / MB
    raise SacEdgeError(
        f"--mem-budget-mb {budget_mb:g} cannot hold fine-tuning: {baseline_mb:.1f} MiB resident before the learner "
        f"+ {need - baseline_mb:.1f} MiB for the smallest learner ({min_rows} rows, batch {smallest[0]}, "
        f"checkpointing {smallest[1]}) needs about {need / (1 - HEADROOM):.0f} MiB with headroom; raise the budget"
    )


def _options(net: NetShape, batch: int) -> list[tuple[int, bool]]:
    """The (batch, checkpointing) pairs to try, in order: as requested, with checkpointing where it saves
    memory, then the batch halved (with checkpointing where it helps) down to ``MIN_BATCH``."""
    helps = activation_bytes(net, batch, True) < activation_bytes(net, batch, False)
    options = [(batch, False)]
    if helps:
        options.append((batch, True))
    b = batch
    while b // 2 >= min(MIN_BATCH, batch) and b > MIN_BATCH:
        b //= 2
        options.append((b, helps))
    return options


def _changes(rows: int, chosen: int, batch: int, b: int, gc: bool) -> list[str]:
    """What the budget changed from the requested sizes, one reason each."""
    changes = []
    if chosen < rows:
        changes.append(f"replay {rows} -> {chosen} rows to fit")
    if gc:
        changes.append("gradient checkpointing in the critics to fit")
    if b < batch:
        changes.append(f"batch {batch} -> {b} to fit")
    return changes or ["requested sizes fit"]


def choose_utd(requested: float, update_s: float, rate_hz: float, learner_cpu: float) -> tuple[float, str]:
    """Updates per collected step: ``requested``, capped so updates take at most ``learner_cpu`` of a core."""
    if not requested > 0:
        raise SacEdgeError(f"--finetune-utd must be positive, got {requested}")
    cap = learner_cpu / max(update_s * rate_hz, 1e-12)
    if cap >= requested:
        return (
            requested,
            f"utd {requested:g} (an update takes {update_s * 1e3:.2f} ms; {rate_hz:g} Hz allows {cap:.2f})",
        )
    return round(cap, 4), (
        f"utd {requested:g} -> {cap:.3f}: an update takes {update_s * 1e3:.2f} ms, at {rate_hz:g} Hz that keeps "
        f"the learner within {learner_cpu:.0%} of a core"
    )
