"""The inference watchdog: a call into the backend that runs far past its budget ends the run.

A graph can be made to run for hours (a long chain of large products, a loop the op list would have
refused), and a GPU or driver can stall. The control thread cannot be interrupted inside the runtime's C
code, and a stop request (SIGTERM) is only seen between steps. So a daemon thread watches each call:
the control thread enters the call's start in ``running`` before the call and takes it out when the
call returns; when a call has run longer than the limit, the watchdog takes it out itself and trips,
once. From then on it owns the environment and the summary (the caller's ``on_trip``: hold the last safe
action, end the run); the control thread, should the call ever return, finds its entry gone, touches
neither and waits for ``done``.

A call returning just as the watchdog trips is either in time (the loop goes on) or not (the watchdog has
the run), never both: each side takes the entry with one ``dict.pop``, which the interpreter lock makes
atomic, and only the side that got it acts: an item store and a pop per call instead of a lock taken on
every return (BENCHMARKS.md "Edge: the step as stages"). The watchdog wakes every quarter of the limit (10 ms to
250 ms), so a trip comes at most that long after the limit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MIN_POLL_S, MAX_POLL_S = 0.01, 0.25


class InferenceWatchdog:
    """Trips when one call stamped by the control thread runs longer than ``limit_s``."""

    def __init__(self, limit_s: float, on_trip: Callable[[int], None]) -> None:
        self.limit_ns = int(limit_s * 1e9)
        self.on_trip = on_trip
        """Called once, on the watchdog's thread, with how long the call had run (ns)."""
        self.running: dict[int, bool] = {}
        """The call in progress, by its start (``time.perf_counter_ns()``): the control thread stores
        ``running[start] = True`` before it and ``running.pop(start, None)`` after it, which is None once the
        watchdog took the call (``_watch``)."""
        self.tripped = False
        self.done = threading.Event()
        """Set once ``on_trip`` has returned (the control thread waits for it after a late return)."""
        self._stop = threading.Event()
        self._poll_s = min(max(limit_s / 4, MIN_POLL_S), MAX_POLL_S)
        self._thread = threading.Thread(target=self._watch, name="sac-edge-inference-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the watchdog (the run is over); a trip in progress finishes first."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            now = time.perf_counter_ns()
            for started in list(self.running):  # one call at most; copied, as the control thread changes it
                ran = now - started
                if ran > self.limit_ns and self.running.pop(started, None) is not None:
                    self.tripped = True
                    try:
                        self.on_trip(ran)
                    finally:
                        self.done.set()
                    return
