"""``sac-edge`` with a fault planted in the node's spin loop: the /diagnostics timer's callback raises once
the node has reported twice while configured (``CommandOutputs.subscribers``, which the status report
calls), as a bug in any callback would. ``faulty.py ARGS...`` runs ``sac-edge ARGS...``."""

from __future__ import annotations

import sys

from sac_edge.edge_runtime.ros2.outputs import CommandOutputs

_calls = [0]
_count = CommandOutputs.subscribers


def _raise(self: CommandOutputs) -> int:
    _calls[0] += 1
    if _calls[0] > 2:  # the node has served a while
        raise RuntimeError("planted fault in a timer callback")
    return _count(self)


CommandOutputs.subscribers = _raise  # type: ignore[method-assign]

if __name__ == "__main__":
    from sac_edge.edge_runtime.cli import main

    sys.exit(main(sys.argv[1:]))
