"""How the critics split their hidden layers for gradient checkpointing, shared by the trainer and the
on-device memory sizing (which must model what the trainer really keeps)."""

from __future__ import annotations

import math


def checkpoint_segments(n_layers: int) -> list[range]:
    """Consecutive segments of about sqrt(n) layers each, over the ``n_layers`` hidden layers after the first.

    Only each segment's input stays saved between forward and backward; a segment's inner activations are
    recomputed during its own backward. Segments of one layer each (or one segment for all) save almost
    nothing in an equal-width MLP, since a layer's saved input is its predecessor's saved output anyway;
    sqrt(n) segments keep about 2 sqrt(n) activations instead of n.
    """
    if n_layers < 1:
        return []
    size = math.ceil(math.sqrt(n_layers))
    return [range(start, min(start + size, n_layers)) for start in range(0, n_layers, size)]
