"""Delay-aware training's bookkeeping: the last actions in the policy's input are exactly the actions still
queued in the env's delay, at every step and right after every reset, and the replay buffer stores the input
the policy acted on and the next one, never an episode's actions carried into the next."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sac_edge.common.delay import ActionDelay
from sac_edge.train.config import TrainConfig
from sac_edge.train.trainer import Trainer

FRAME, LAST = 3, 3  # Pendulum's frame; --action-delay 1-3 turns on its 3 most recent actions


def _seen_is_queued(obs: np.ndarray, envs: list[ActionDelay], units) -> None:
    """Each env's pending actions (sent, not yet applied, oldest first) are the newest last actions seen."""
    for i, env in enumerate(envs):
        seen = obs[i, FRAME : FRAME + LAST]
        assert len(env.queue) == env.steps
        queued = units(np.array(list(env.queue), np.float64).reshape(env.steps, 1))[:, 0]
        assert np.array_equal(seen[LAST - env.steps :], queued), (i, seen, queued)


def test_the_last_actions_the_policy_sees_are_the_ones_queued_and_end_with_the_episode(tmp_path: Path) -> None:
    cfg = TrainConfig(env="Pendulum-v1", action_delay="1-3", num_envs=2, total_steps=1200, learning_starts=300,
                      hidden=(16, 16), batch_size=16, compile="off", amp="off", threads=1, eval_every=0,
                      progress=False, out=str(tmp_path / "run"))  # fmt: skip
    trainer = Trainer(cfg)
    envs: list[ActionDelay] = list(trainer.envs.envs)  # type: ignore[attr-defined]
    assert all(isinstance(env, ActionDelay) for env in envs) and trainer.history is not None
    assert trainer.contract.last_actions == LAST
    units, buffer = trainer.history.policy_units, trainer.sac.buffer
    _seen_is_queued(trainer.obs, envs, units)  # the first reset: the bounds' middle queued, zeros seen
    assert not trainer.obs[:, FRAME:].any()
    delays, ends = {env.steps for env in envs}, 0
    for t in range(600):  # random actions for 150 steps, then the policy's; 3 episodes per env
        acted_on = trainer.obs.copy()
        trainer.collect()
        _seen_is_queued(trainer.obs, envs, units)
        delays.update(env.steps for env in envs)
        rows = slice(2 * t, 2 * t + 2)
        assert np.array_equal(buffer.obs[rows].numpy(), acted_on)
        stored_next, sent = buffer.next_obs[rows].numpy(), buffer.actions[rows].numpy()
        # the action just sent is the newest last action of the next input (policy units, to float32 rounding)
        np.testing.assert_allclose(stored_next[:, FRAME + LAST - 1], sent[:, 0], atol=1e-6)
        for i in range(2):
            if trainer.ep_returns[i] == 0.0:  # the episode ended: the stored next input is the old episode's
                ends += 1
                assert np.array_equal(stored_next[i, FRAME : FRAME + LAST - 1], acted_on[i, FRAME + 1 : FRAME + LAST])
                assert not trainer.obs[i, FRAME:].any()  # and the new episode's starts from zeros
            else:
                assert np.array_equal(stored_next[i], trainer.obs[i])
    assert ends == 6 and delays == {1, 2, 3}, (ends, delays)
