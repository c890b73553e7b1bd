"""The runtime's half of the observation contract (``common/obs_history.py``): the caller passes the current
frame alone, and the step infers on the frame, the last actions sent and the frames before it, assembled
here exactly as the trainer assembled them.

``inputs`` (a pipeline stage) builds the policy input from the checked frame; ``sent`` records the step's
frame and the action it sent (a held step, whose frame was not trusted, records the action alone);
``applied`` replaces that action with the one the caller says it applied (``Runtime.observe``);
``restart`` (an episode's end, ``Shield.restart``) starts the history anew; ``transition`` gives on-device
fine-tuning the step's input and the next one, as the trainer stored them.
"""

from __future__ import annotations

import numpy as np

from sac_edge.common.obs_history import ObsAssembler, ObsContract


class InputHistory:
    """One control loop's observation history, for the pipeline's inference and the runtime's bookkeeping."""

    def __init__(self, contract: ObsContract, low: object, high: object) -> None:
        self.assembler = ObsAssembler(contract, low, high, 1)
        self._frame: np.ndarray | None = None
        self.inferred = False
        """Whether the last step inferred (a held step's input was not the policy's)."""

    def inputs(self, frame: np.ndarray) -> np.ndarray:
        """The policy input for the checked ``frame`` (a buffer the next step reuses)."""
        self._frame = frame
        return self.assembler.assemble(frame.reshape(1, -1))[0]

    def peek(self, frame: np.ndarray) -> np.ndarray:
        """``inputs`` without noting the frame (a warm-up step changes nothing the step keeps)."""
        return self.assembler.assemble(frame.reshape(1, -1))[0]

    def last_input(self) -> np.ndarray:
        """A copy of the policy input of the last inferred step."""
        return self.assembler._out[0].copy()

    def sent(self, action: np.ndarray) -> None:
        """The step is over: its frame (when it inferred) and ``action`` join the history."""
        frame, self._frame = self._frame, None
        self.inferred = frame is not None
        self.assembler.advance(None if frame is None else frame.reshape(1, -1), np.asarray(action).reshape(1, -1))

    def applied(self, action: object) -> None:
        """The caller applied ``action`` (bounds' units) for the last step; one that is not ``act_dim``
        finite numbers is not taken (the action ``act`` returned stays)."""
        try:
            values = np.asarray(action, np.float64).reshape(-1)
        except (TypeError, ValueError):
            return
        if values.shape == (self.assembler.contract.act_dim,) and np.isfinite(values).all():
            self.assembler.replace_last_action(values.reshape(1, -1))

    def transition(self, next_frame: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(the last inferred step's input, the input ``next_frame`` makes with the action applied): the
        replay row's observations, taken before an episode's end restarts the history; None after a held
        step (the policy did not act on an input of its own)."""
        if not self.inferred:
            return None
        upcoming = np.empty((1, self.assembler.contract.obs_dim), np.float32)  # last_input() stays the step's
        self.assembler.assemble(np.asarray(next_frame, np.float32).reshape(1, -1), upcoming)
        return self.last_input(), upcoming[0]

    def restart(self) -> None:
        self._frame = None
        self.inferred = False
        self.assembler.reset()
