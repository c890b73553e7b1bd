"""Memory sizing under small and large budgets, the UTD cap, and the staging ring."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime.finetune.experience import Exploration, StagingRing, ring_layout
from sac_edge.edge_runtime.finetune.sizing import NetShape, choose_sizing, choose_utd, estimate

CHEETAH = NetShape(17, 6, (256, 256), (256, 256))


def _size(budget: float | None, baseline: float = 300.0, rows: int = 1_000_000, batch: int = 256):
    return choose_sizing(
        CHEETAH, rows=rows, batch=batch, staging=8192, min_rows=1000, budget_mb=budget, baseline_mb=baseline
    )


def test_large_budget_keeps_the_requested_sizes() -> None:
    sizing = _size(4000.0)
    assert (sizing.buffer_rows, sizing.batch_size, sizing.grad_checkpoint) == (1_000_000, 256, False)
    assert sizing.estimate_mb["total"] < 4000 * 0.9 - 300
    assert _size(None).reasons == ("no --mem-budget-mb: requested sizes",)
    assert sizing.reasons[1:] == ("requested sizes fit",) and sizing.reasons[0].startswith("room 3300.0 MiB")


def test_small_budget_shrinks_the_replay_first_then_checkpoints_then_the_batch() -> None:
    fewer = _size(400.0)  # room 60 MiB: the 1M-row replay (160 MiB) does not fit
    assert 1000 <= fewer.buffer_rows < 1_000_000 and fewer.batch_size == 256 and not fewer.grad_checkpoint
    assert fewer.estimate_mb["total"] <= 400 * 0.9 - 300 + 1e-6
    full = estimate(CHEETAH, 1000, 8192, 256, False)["total"]
    tight = _size((300.0 + full - 0.5) / 0.9)  # a little less than the smallest replay at batch 256 needs
    # Two hidden critic layers: checkpointing would keep more than it frees, so the batch shrinks instead.
    assert tight.buffer_rows >= 1000 and tight.batch_size < 256 and not tight.grad_checkpoint
    assert fewer.reasons[1:] == (f"replay 1000000 -> {fewer.buffer_rows} rows to fit",)
    assert tight.reasons[1:] == (
        f"replay 1000000 -> {tight.buffer_rows} rows to fit",
        f"batch 256 -> {tight.batch_size} to fit",
    )


def test_deep_critics_checkpoint_before_the_batch_shrinks() -> None:
    deep = NetShape(17, 6, (256, 256), (256,) * 10)
    assert (
        estimate(deep, 1000, 8192, 256, True)["activations"]
        < 0.75 * estimate(deep, 1000, 8192, 256, False)["activations"]
    )

    def size(budget: float):
        return choose_sizing(
            deep, rows=1000, batch=256, staging=8192, min_rows=1000, budget_mb=budget, baseline_mb=300.0
        )

    full = estimate(deep, 1000, 8192, 256, False)["total"]
    checkpointed = size((300.0 + full - 0.5) / 0.9)
    assert checkpointed.batch_size == 256 and checkpointed.grad_checkpoint
    smaller_batch = size((300.0 + estimate(deep, 1000, 8192, 64, True)["total"] + 0.2) / 0.9)
    assert smaller_batch.batch_size < 256 and smaller_batch.grad_checkpoint
    assert checkpointed.reasons[1:] == ("gradient checkpointing in the critics to fit",)


def test_budget_below_the_smallest_learner_is_refused_with_the_numbers() -> None:
    with pytest.raises(SacEdgeError, match=r"cannot hold fine-tuning: 300\.0 MiB resident"):
        _size(320.0)


def test_utd_is_capped_by_the_learner_cpu_share() -> None:
    assert choose_utd(1.0, 0.001, 100.0, 0.5)[0] == 1.0  # 100 updates/s take 10% of a core
    utd, why = choose_utd(1.0, 0.008, 200.0, 0.6)
    assert utd == pytest.approx(0.375) and "60%" in why


def _ring(publish: Any = None) -> StagingRing:
    arrays = {name: np.zeros(shape, dtype) for name, dtype, shape in ring_layout(4, 3, 1)}
    return StagingRing(arrays, np.array([-2.0]), np.array([2.0]), publish)


@pytest.mark.parametrize("publish", [None, threading.Lock()], ids=["plain", "lock"])
def test_staging_ring_hands_over_whole_rows_and_counts_drops(publish: Any) -> None:
    ring = _ring(publish)
    for i in range(6):
        ring.push(np.full(3, i, np.float32), np.array([2.0 * (i % 2)], np.float32), float(i), np.full(3, i + 1), i == 5)
    assert ring.dropped == 2  # the learner never drained: rows are not overwritten
    chunk = ring.drain()
    assert chunk is not None
    np.testing.assert_array_equal(chunk.obs[:, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(chunk.actions[:, 0], [0, 1, 0, 1])  # env units -> [-1, 1]
    ring.push(np.zeros(3), np.zeros(1), 9.0, np.zeros(3), True)
    again = ring.drain()
    assert again is not None and again.rewards.tolist() == [9.0] and again.dones.tolist() == [1.0]
    assert ring.drain() is None


def test_staging_ring_never_waits_for_a_consumer_holding_the_lock() -> None:
    lock = threading.Lock()
    ring = _ring(lock)
    with lock:  # the consumer is reading the count (or died while doing so)
        ring.push(np.zeros(3), np.zeros(1), 1.0, np.zeros(3), False)
    assert ring.dropped == 1 and ring.written == 0 and ring.drain() is None
    ring.push(np.zeros(3), np.zeros(1), 2.0, np.zeros(3), False)
    chunk = ring.drain()
    assert chunk is not None and chunk.rewards.tolist() == [2.0]


def test_exploration_noise_is_scaled_and_off_at_zero() -> None:
    action = np.zeros(2, np.float32)
    assert Exploration(0.0, np.array([-1.0, -1.0]), np.array([1.0, 1.0]), 0)(action) is action
    noisy = np.stack(
        [Exploration(0.1, np.array([-2.0, 0.0]), np.array([2.0, 10.0]), s)(action).copy() for s in range(400)]
    )
    np.testing.assert_allclose(noisy.std(0), [0.2, 0.5], rtol=0.2)


def test_a_transition_is_one_row_with_the_action_normalised_and_clipped() -> None:
    ring = _ring()
    ring.push(np.array([1.0, 2.0, 3.0]), np.array([5.0], np.float32), -0.5, np.array([4.0, 5.0, 6.0]), True)
    chunk = ring.drain()
    assert chunk is not None
    assert chunk.obs.tolist() == [[1, 2, 3]] and chunk.next_obs.tolist() == [[4, 5, 6]]
    assert chunk.actions.tolist() == [[1.0]] and chunk.rewards.tolist() == [-0.5] and chunk.dones.tolist() == [1.0]


def test_exploration_draws_fresh_noise_across_its_blocks() -> None:
    explore = Exploration(0.1, np.array([-1.0]), np.array([1.0]), 0)
    draws = np.array([explore(np.zeros(1, np.float32))[0] for _ in range(3 * Exploration.NOISE_BLOCK)])
    assert len(np.unique(draws)) == len(draws)  # no block repeats
    assert abs(draws.mean()) < 0.02 and draws.std() == pytest.approx(0.1, rel=0.15)
