"""The observation contract and its assembler (common/obs_history.py): the order of docs/CONTRACTS.md's
picture, an episode's start, strict reading."""

from __future__ import annotations

import numpy as np
import pytest

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.obs_history import ObsAssembler, ObsContract


def test_the_input_is_frame_then_last_actions_then_history_oldest_first():
    contract = ObsContract(frame_dim=2, act_dim=1, last_actions=2, history=2)
    assert contract.obs_dim == 2 + 2 * 1 + 2 * 2
    history = ObsAssembler(contract, low=[-2.0], high=[2.0])
    frames = [np.array([[10.0 * t, 10.0 * t + 1]], np.float32) for t in range(4)]
    sent = [np.array([[0.5 * t]]) for t in range(4)]  # bounds' units: 2 * t / 4 in the policy's
    first = history.assemble(frames[0]).copy()
    assert first.tolist() == [[0, 1, 0, 0, 0, 1, 0, 1]]  # no actions yet; the history is the first frame
    history.advance(frames[0], sent[0])
    history.advance(frames[1], sent[1])
    third = history.assemble(frames[2])[0]
    # f_2 | a_0, a_1 (in [-1, 1]: 0 and 0.25) | f_0, f_1: the current frame never repeated in the history
    assert third.tolist() == [20, 21, 0, 0.25, 0, 1, 10, 11]
    history.reset()
    assert history.assemble(frames[3])[0].tolist() == [30, 31, 0, 0, 30, 31, 30, 31]


def test_a_held_step_records_its_action_alone():
    history = ObsAssembler(ObsContract(1, 1, 1, 1), low=[-1.0], high=[1.0])
    history.advance(np.array([[1.0]]), np.array([[0.5]]))
    history.advance(None, np.array([[-0.5]]))
    assert history.assemble(np.array([[3.0]]))[0].tolist() == [3, -0.5, 1]


def test_a_contract_is_read_strictly():
    contract = ObsContract(3, 1, 1, 3)
    assert ObsContract.from_dict(contract.to_dict(), "x") == contract
    for bad in ({**contract.to_dict(), "history": "3"}, {**contract.to_dict(), "obs_dim": 12},
                {**contract.to_dict(), "last_actions": 65}, {"frame_dim": 3}, [3]):  # fmt: skip
        with pytest.raises(SacEdgeError, match="observation contract"):
            ObsContract.from_dict(bad, "x")
