"""The learner process: its loop's decisions, stopping with the run, crashes reported, shared memory unlinked."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from finetune_bundles import make_tuner
from sac_edge.common.bundle import open_bundle
from sac_edge.edge_runtime.backends.registry import open_backend
from sac_edge.edge_runtime.compose import finetune_settings
from sac_edge.edge_runtime.config import RuntimeOptions
from sac_edge.edge_runtime.finetune.experience import StagingRing, ring_layout
from sac_edge.edge_runtime.finetune.finetuner import FineTuner, read_learner_tensors
from sac_edge.edge_runtime.finetune.learner_process import (
    CONTROL_LAYOUT,
    INT8,
    N_STATES,
    WINDOW_OK,
    Channels,
    LearnerLoop,
    _send,
    weights_layout,
)
from sac_edge.edge_runtime.finetune.shared import SharedArrays
from sac_edge.edge_runtime.finetune.weight_swap import Int8Requantizer

SETTINGS = {
    "finetune_buffer": 2000, "finetune_batch": 32, "learning_starts": 100, "mem_budget_mb": None,
    "finetune_lr": 3e-4, "seed": 0, "finetune_utd": 1.0, "rate_hz": 1000.0, "learner_cpu": 0.5,
    "swap_every": 20, "shadow_max_diff": 0.05,
}  # fmt: skip


@contextlib.contextmanager
def built_loop(bundle_dir: Path, **settings: Any) -> Iterator[tuple[LearnerLoop, Any, SharedArrays]]:
    """The child's loop, built in this process on blocks of its own, with the main process's pipe end
    (``int8=True``: with the int8 re-check, its initializers laid out from the bundle's weights)."""
    bundle = open_bundle(bundle_dir)
    spec = bundle.spec
    tensors = read_learner_tensors(bundle)
    where = {"bundle": str(bundle_dir), "manifest": bundle.manifest}
    int8_on = settings.pop("int8", False)
    section = finetune_settings(RuntimeOptions.of(str(bundle_dir), finetune=True, **{**SETTINGS, **settings}))
    cfg = {"main_baseline_mb": 0.0, "int8": int8_on, **where, "tensor_names": list(tensors)}
    int8 = {}
    if cfg["int8"]:
        actor = {k: v for k, v in tensors.items() if k.startswith("actor.")}
        int8 = Int8Requantizer(bundle).requantize(actor, None).initializers
    blocks = [
        SharedArrays(ring_layout(256, spec.obs_dim, spec.act_dim)),
        SharedArrays(weights_layout(spec, tensors, int8)),
        SharedArrays(CONTROL_LAYOUT),
    ]
    ring_block, weights, control = blocks
    try:
        weights.write({**tensors, **{INT8 + k: v for k, v in int8.items()}})
        control["knobs"][:] = (1.0, 32, 0)
        ring = StagingRing(ring_block.arrays, np.array(spec.action_low), np.array(spec.action_high))
        main_end, child_end = mp.Pipe()
        built = LearnerLoop.build(spec, Channels(ring, weights, control, child_end), cfg, section)
        rng = np.random.default_rng(0)
        for _ in range(200):
            obs = rng.normal(0, 1, spec.obs_dim).astype(np.float32)
            ring.push(obs, np.zeros(1, np.float32), -1.0, obs, False)
        built.ingest()
        yield built, main_end, weights
    finally:
        for block in blocks:
            block.unlink()


@pytest.fixture
def loop(finetune_bundle: Path) -> Iterator[tuple[LearnerLoop, Any, SharedArrays]]:
    with built_loop(finetune_bundle) as built:
        yield built


def _plant(loop: LearnerLoop, factor: float) -> dict[str, np.ndarray]:
    return _propose(loop, {k: factor * v for k, v in loop.good_actor().items()})


def _propose(loop: LearnerLoop, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Make ``weights`` the learner's actor after a real update, and propose it."""
    loop.learner.load_actor(weights)
    loop._metrics = loop.learner.update(32)  # finite losses, like a real update
    loop.learner.load_actor(weights)
    loop.propose()
    return weights


def _receive(conn: Any) -> dict[str, Any]:
    assert conn.poll(5)
    message: dict[str, Any] = json.loads(conn.recv_bytes())
    return message


def test_loop_checks_proposes_and_obeys_the_verdicts(loop: tuple[LearnerLoop, Any, SharedArrays]) -> None:
    learner_loop, conn, weights = loop
    good = learner_loop.good_actor()
    _plant(learner_loop, -3.0)  # acts very differently: refused before it serves, learner reset
    message = _receive(conn)
    assert message["kind"] == "event" and message["counter"] == "shadow_rejections"
    np.testing.assert_allclose(learner_loop.learner.actor_weights()["actor.mu.weight"], good["actor.mu.weight"])
    better = _plant(learner_loop, 1.01)
    message = _receive(conn)
    assert message["kind"] == "candidate" and learner_loop.awaiting
    np.testing.assert_allclose(weights["actor.mu.weight"], better["actor.mu.weight"])  # published in shared memory
    assert int(weights[N_STATES]) > 0
    learner_loop.handle({"cmd": "resolve", "verdict": "rollback"})
    assert not learner_loop.awaiting
    np.testing.assert_allclose(learner_loop.learner.actor_weights()["actor.mu.weight"], good["actor.mu.weight"])
    _plant(learner_loop, 1.01)
    assert _receive(conn)["kind"] == "candidate"
    learner_loop.handle({"cmd": "resolve", "verdict": "promote"})
    np.testing.assert_allclose(learner_loop.good_actor()["actor.mu.weight"], better["actor.mu.weight"], rtol=1e-6)


def test_loop_proposes_only_with_a_full_window_and_nothing_pending(loop: tuple[LearnerLoop, Any, SharedArrays]) -> None:
    learner_loop, conn, _ = loop
    learner_loop.credit = 100.0
    for _ in range(25):
        learner_loop.learn_once()
    assert not conn.poll(0)  # the main process has not said the last good weights have a window yet
    learner_loop.flags[WINDOW_OK] = 1
    for _ in range(20):
        learner_loop.learn_once()
    assert _receive(conn)["kind"] in ("candidate", "event")


def test_int8_is_checked_in_the_learner_and_a_failure_reaches_no_backend(finetune_bundle: Path, tmp_path: Path) -> None:
    tuner, _ = make_tuner(finetune_bundle, tmp_path, precisions=("fp32", "int8"))
    backends = tuner.swapper.backends
    obs = np.array([0.3, -0.2, 0.5], np.float32)
    before = {p: b.act(obs).copy() for p, b in backends.items()}
    swaps = {p: b.swaps for p, b in backends.items()}
    try:
        with built_loop(finetune_bundle, int8=True, shadow_max_diff=1.0) as (learner_loop, conn, weights):
            published = weights.copy(list(weights.arrays))
            good = learner_loop.good_actor()
            # hidden activations far outside the bundle's calibrated ranges: int8 clips them, its actions diverge
            _propose(learner_loop, {k: v * 40 if k.endswith("trunk.0.weight") else v for k, v in good.items()})
            skipped = _receive(conn)
            assert skipped["kind"] == "event" and skipped["counter"] == "int8_skipped"
            assert skipped["int8"]["passed"] is False and not learner_loop.awaiting
            for name, value in published.items():  # nothing of it was published
                np.testing.assert_array_equal(weights[name], value)
            tuner._on_message(skipped)
            assert tuner.counts["int8_skipped"] == tuner.counts["candidates"] == 1 and tuner.candidate is None
            assert {p: b.swaps for p, b in backends.items()} == swaps
            for p, b in backends.items():
                np.testing.assert_allclose(b.act(obs), before[p], atol=1e-6)
            # a candidate that passes carries every backend's initializers, re-quantised in the learner
            better = _plant(learner_loop, 1.01)
            candidate = _receive(conn)
            assert candidate["kind"] == "candidate" and candidate["int8"]["passed"] is True
            tuner.learner.weights.write(weights.copy(list(weights.arrays)))  # as if the tuner's child wrote it
            tuner._on_message(candidate)
    finally:
        tuner.stop()
    assert tuner.candidate is not None
    assert {p: b.swaps for p, b in backends.items()} == {p: n + 1 for p, n in swaps.items()}
    bundle = open_bundle(finetune_bundle)
    reference = open_backend(bundle, "onnxruntime", "int8")
    reference.swap_weights(Int8Requantizer(bundle).requantize(better, None).initializers)
    np.testing.assert_allclose(backends["int8"].act(obs), reference.act(obs), atol=1e-6)


def _segments(tuner: FineTuner) -> list[Path]:
    return [Path("/dev/shm") / block.name.lstrip("/") for block in tuner.learner._blocks]


def _wait_for(condition: Any, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_child_stops_with_the_run_and_its_shared_memory_is_unlinked(finetune_bundle: Path, tmp_path: Path) -> None:
    tuner, _ = make_tuner(finetune_bundle, tmp_path)
    process, segments = tuner.learner.process, _segments(tuner)
    assert process.is_alive() and process.daemon and len(segments) == 3 and all(p.exists() for p in segments)
    tuner.start()
    rng = np.random.default_rng(0)
    for _ in range(300):  # the child learns from what the control thread observes
        obs = rng.normal(0, 1, 3).astype(np.float32)
        tuner.observe(obs, np.zeros(1, np.float32), -1.0, obs, False, False)
    _wait_for(lambda: tuner.learner.updates > 0)
    tuner.stop()
    assert not process.is_alive() and process.exitcode == 0
    assert not any(p.exists() for p in segments)
    summary = tuner.summary()  # still readable after the child and the names are gone
    # a transition that finds the ring's lock taken by the child is dropped and counted, never waited for
    assert summary["steps_collected"] + summary["dropped"] == 300 and summary["dropped"] <= 3
    assert summary["updates"] > 0 and summary["error"] is None


def test_a_crash_in_the_child_is_one_line_and_the_last_good_weights_serve(
    finetune_bundle: Path, tmp_path: Path
) -> None:
    tuner, backend = make_tuner(finetune_bundle, tmp_path)
    obs = np.array([0.3, -0.2, 0.5], np.float32)
    good_action = backend.act(obs).copy()
    tuner.start()
    try:
        _send(tuner.learner.conn, {"cmd": "explode"})  # the child raises on a command it does not know
        _wait_for(lambda: tuner.error is not None)
    finally:
        tuner.stop()
    assert tuner.error is not None and "\n" not in tuner.error
    assert "the learner process failed: SacEdgeError" in tuner.error and "unknown command 'explode'" in tuner.error
    assert tuner.learner.process.exitcode == 1
    np.testing.assert_allclose(backend.act(obs), good_action, atol=1e-6)


def test_a_killed_child_is_reported(finetune_bundle: Path, tmp_path: Path) -> None:
    tuner, _ = make_tuner(finetune_bundle, tmp_path)
    segments = _segments(tuner)
    tuner.start()
    try:
        os.kill(tuner.learner.process.pid, signal.SIGKILL)
        _wait_for(lambda: tuner.error is not None)
    finally:
        tuner.stop()
    assert tuner.error == "SacEdgeError: the learner process exited with signal 9"
    assert not any(p.exists() for p in segments)


def test_non_finite_losses_reset_the_whole_learner(loop: tuple[LearnerLoop, Any, SharedArrays]) -> None:
    import torch

    learner_loop, conn, _ = loop
    good = learner_loop.good_actor()
    learner_loop.learner.load_actor({k: 3.0 * v for k, v in good.items()})
    learner_loop._metrics = learner_loop.learner.update(32)._replace(finite=torch.tensor(False))
    learner_loop.propose()
    message = _receive(conn)
    assert message["kind"] == "event" and message["counter"] == "nonfinite"
    assert message["reason"].startswith("non-finite losses") and message["updates"] == 0
    np.testing.assert_allclose(learner_loop.learner.actor_weights()["actor.mu.weight"], good["actor.mu.weight"])
    assert learner_loop.pending is None and not learner_loop.awaiting
