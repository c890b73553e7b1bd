"""The policy's observation when it sees more than the env's current frame (``sac-train --last-action``,
``--obs-history N``): the contract a run dir and a bundle record, and the one assembler the trainer and
the runtime both use, so the two build the same input bit for bit.

The policy input at control step t, for a frame of F values, K last actions of A values and N frames of
history (docs/CONTRACTS.md, "Observation contract")::

    [ f_t | a_{t-K} ... a_{t-1} | f_{t-N} ... f_{t-1} ]
      F     K * A, oldest first   N * F, oldest first

The current frame comes first, so an I/O layout and the observation bounds keep describing the first F
values; the current frame is never repeated in the history. An action is the one sent, in the policy's
own units (``[-1, 1]``, before scaling to the action bounds). At an episode's start (``reset``) the
history slots hold the first frame and the action slots zeros.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .errors import SacEdgeError
from .spec import MAX_DIM

#: The most frames of history or last actions a contract may name (each widens the input by a frame).
MAX_STEPS = 64


@dataclass(frozen=True)
class ObsContract:
    """What the policy input is made of: the frame's width, the action's, the last actions and the
    history frames it carries (0 and 0: the frame alone)."""

    frame_dim: int
    act_dim: int
    last_actions: int = 0
    history: int = 0

    @property
    def obs_dim(self) -> int:
        """The policy input's width."""
        return self.frame_dim * (1 + self.history) + self.act_dim * self.last_actions

    @property
    def plain(self) -> bool:
        """The input is the frame alone."""
        return self.last_actions == 0 and self.history == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "obs_dim": self.obs_dim, "order": ORDER}

    @classmethod
    def from_dict(cls, data: Any, source: str) -> ObsContract:
        """The contract a file holds, its types checked strictly and its ``obs_dim`` consistent."""
        try:
            if not isinstance(data, dict):
                raise TypeError(f"not an object but {type(data).__name__}")
            values = {k: data[k] for k in ("frame_dim", "act_dim", "last_actions", "history")}
            for name, value in values.items():
                if not isinstance(value, int) or isinstance(value, bool):
                    raise TypeError(f"{name} is {str(value)[:20]!r}")
            contract = cls(**values)
        except (KeyError, TypeError) as err:
            raise SacEdgeError(f"{source}: observation contract is incomplete or malformed ({err})") from None
        if not (1 <= contract.frame_dim <= MAX_DIM and 1 <= contract.act_dim <= MAX_DIM):
            raise SacEdgeError(f"{source}: observation contract frame_dim and act_dim must be 1 to {MAX_DIM}")
        if not (0 <= contract.last_actions <= MAX_STEPS and 0 <= contract.history <= MAX_STEPS):
            raise SacEdgeError(f"{source}: observation contract last_actions and history must be 0 to {MAX_STEPS}")
        if data.get("obs_dim", contract.obs_dim) != contract.obs_dim:
            raise SacEdgeError(f"{source}: observation contract obs_dim {data.get('obs_dim')!r} != {contract.obs_dim}")
        return contract


#: The order, as a file records it (the module docstring's picture).
ORDER = ["frame", "last_actions_oldest_first", "history_frames_oldest_first"]


class ObsAssembler:
    """The policy inputs of ``n`` parallel episodes from their current frames, and the history each keeps.

    ``assemble(frames)`` builds the inputs without changing anything (a warm-up may call it); ``advance``
    records the step's frames and the actions sent; ``reset(rows)`` starts those episodes anew.
    """

    def __init__(self, contract: ObsContract, low: Any, high: Any, n: int = 1) -> None:
        self.contract, self.n = contract, n
        c = contract
        self.frames = np.zeros((n, c.history, c.frame_dim), np.float32)
        self.actions = np.zeros((n, c.last_actions, c.act_dim), np.float32)
        self.fresh: np.ndarray = np.ones(n, bool)
        self._low = np.asarray(low, np.float32)
        self._scale = (np.float32(2.0) / (np.asarray(high, np.float32) - self._low)).astype(np.float32)
        self._out = np.zeros((n, c.obs_dim), np.float32)

    def policy_units(self, action: np.ndarray) -> np.ndarray:
        """An action in the bounds' units as the policy outputs it (``[-1, 1]``), in float32."""
        return (np.asarray(action, np.float32) - self._low) * self._scale - np.float32(1.0)

    def reset(self, rows: Any = slice(None)) -> None:
        """New episodes in ``rows`` (all by default): the next input's history is its first frame, its
        last actions zeros."""
        self.fresh[rows] = True
        self.actions[rows] = 0.0

    def assemble(self, frames: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The inputs ``[n, obs_dim]`` for the current ``frames`` ``[n, frame_dim]``, written into ``out``
        (default: a buffer the next call reuses)."""
        c = self.contract
        out = self._out if out is None else out
        f, k = c.frame_dim, c.last_actions * c.act_dim
        out[:, :f] = frames
        out[:, f : f + k] = self.actions.reshape(self.n, k)
        history = out[:, f + k :].reshape(self.n, c.history, f)
        history[:] = self.frames
        if self.fresh.any():
            history[self.fresh] = np.asarray(frames, np.float32)[self.fresh][:, None, :]
        return out

    def advance(self, frames: np.ndarray | None, actions: np.ndarray) -> None:
        """After a step: ``frames`` (its current frames) join the history and ``actions`` (sent, in the
        bounds' units) the last actions. ``frames`` None: a step whose frame was not trusted (the runtime's
        held steps) leaves the frames as they were."""
        c = self.contract
        if frames is None:
            if c.last_actions:
                self.actions[:, :-1] = self.actions[:, 1:].copy()
                self.actions[:, -1] = self.policy_units(actions)
            return
        if c.history:
            frames = np.asarray(frames, np.float32)
            self.frames[:, :-1] = self.frames[:, 1:].copy()
            self.frames[:, -1] = frames
            if self.fresh.any():
                self.frames[self.fresh] = frames[self.fresh][:, None, :]
        if c.last_actions:
            self.actions[:, :-1] = self.actions[:, 1:].copy()
            self.actions[:, -1] = self.policy_units(actions)
        self.fresh[:] = False

    def replace_last_action(self, actions: np.ndarray) -> None:
        """The last action recorded was not the one applied: ``actions`` (bounds' units) replace it."""
        if self.contract.last_actions:
            self.actions[:, -1] = self.policy_units(actions)

    def state(self) -> dict[str, Any]:
        """JSON-able history (a checkpoint's, for an exact resume)."""
        return {"frames": self.frames.tolist(), "actions": self.actions.tolist(), "fresh": self.fresh.tolist()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.frames[:] = np.asarray(state["frames"], np.float32).reshape(self.frames.shape)
        self.actions[:] = np.asarray(state["actions"], np.float32).reshape(self.actions.shape)
        self.fresh[:] = np.asarray(state["fresh"], bool)
