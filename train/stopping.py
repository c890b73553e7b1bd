"""Stopping ``sac-train`` on a signal at a step boundary, with a checkpoint.

SIGINT (Ctrl-C) and SIGTERM (a job scheduler, ``docker stop``, systemd) ask the loop to stop after the step it
is in; the trainer saves a checkpoint, so no step since the last one is lost, and the command ends with one
line saying where to continue, exit 128 + the signal (130, 143). A second signal acts at once, as without
this. Only the main thread can take signals: elsewhere (a Ray Tune trial) nothing changes.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class StopRequest:
    """The signal that asked the loop to stop (None: none yet)."""

    signum: int | None = None


class Stopped(Exception):
    """Training to ``total`` steps stopped by ``signum`` at ``step``, after its checkpoint was saved in ``run``."""

    def __init__(self, signum: int, step: int, total: int, run: Path) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step} of {total}")
        self.signum, self.step, self.total, self.run = signum, step, total, run

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """For the ``with`` block, SIGINT and SIGTERM set the request instead of ending the process; the handlers
    before are back after the first signal and at the end."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}

    def ask(signum: int, frame: object) -> None:
        request.signum = signum
        for sig, handler in before.items():
            signal.signal(sig, handler)

    for sig in SIGNALS:
        signal.signal(sig, ask)
    try:
        yield request
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
