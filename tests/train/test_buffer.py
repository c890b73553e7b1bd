import numpy as np
import torch

from sac_edge.train.buffer import ReplayBuffer


def _rows(start, k, obs_dim=3):
    obs = np.arange(start, start + k, dtype=np.float32)[:, None].repeat(obs_dim, 1)
    return obs, obs[:, :1] * 0.1, obs[:, 0], obs + 1, np.zeros(k, np.float32)


def test_add_wraps_around_and_keeps_capacity():
    buf = ReplayBuffer(5, 3, 1, "cpu")
    buf.add(*_rows(0, 3))
    buf.add(*_rows(3, 4))
    assert buf.size == 5 and buf.pos == 2
    assert buf.obs[:, 0].tolist() == [5, 6, 2, 3, 4]  # rows 5 and 6 wrapped to the start
    assert torch.equal(buf.next_obs, buf.obs + 1)


def test_sample_only_filled_rows_and_is_seeded():
    buf = ReplayBuffer(100, 3, 1, "cpu")
    buf.add(*_rows(0, 10))
    batch = buf.sample(512, torch.Generator().manual_seed(0))
    assert batch.obs.shape == (512, 3) and set(batch.obs[:, 0].tolist()) <= set(range(10))
    assert len(set(batch.obs[:, 0].tolist())) == 10
    again = buf.sample(512, torch.Generator().manual_seed(0))
    assert torch.equal(batch.obs, again.obs)
    assert torch.equal(batch.rewards, batch.obs[:, 0])


def test_state_round_trip():
    buf = ReplayBuffer(8, 3, 1, "cpu")
    buf.add(*_rows(0, 11))  # more than fit: the newest 8, where adding them one by one puts them
    assert buf.pos == 3 and buf.obs[:, 0].tolist() == [8, 9, 10, 3, 4, 5, 6, 7]
    other = ReplayBuffer(8, 3, 1, "cpu")
    other.load_state_tensors(buf.state_tensors())
    assert (other.pos, other.size) == (buf.pos, buf.size)
    for name in ReplayBuffer.FIELDS:
        assert torch.equal(getattr(other, name), getattr(buf, name))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(buf.sample(16, g1).obs, other.sample(16, g2).obs)


def test_sample_observations_uniform_subset():
    buf = ReplayBuffer(50, 3, 1, "cpu")
    buf.add(*_rows(0, 40))
    states = buf.sample_observations(20, np.random.default_rng(0))
    assert states.shape == (20, 3) and states.dtype == np.float32
    assert len(np.unique(states[:, 0])) == 20
