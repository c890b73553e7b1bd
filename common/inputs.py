"""Checks of values a library caller hands over at run time (``Runtime``'s bounds and done flags): one
``SacEdgeError`` line naming the value and what it must be, never a raw numpy or Python exception."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import SacEdgeError


def ordered_bounds(low: np.ndarray, high: np.ndarray, names: tuple[str, str] = ("obs_low", "obs_high")) -> None:
    """Refuse bounds with a ``low`` above its ``high``: no value would be inside, so a guard would repair
    every observation (or clip it to a point) instead of saying the bounds are swapped."""
    bad = np.flatnonzero(np.asarray(low) > np.asarray(high))
    if bad.size:
        i = int(bad[0])
        raise SacEdgeError(
            f"{names[0]}[{i}] = {float(low[i]):g} is above {names[1]}[{i}] = {float(high[i]):g} "
            f"({bad.size} such dimension(s)); are the two bounds swapped?"
        )


def done_flag(value: Any, name: str) -> bool:
    """``terminated``/``truncated`` as a bool: ``True``/``False``, a numpy bool, an integer 0 or 1, or a
    one-element array of one of them. A string (``"False"`` is true to ``bool``), None, a float or a longer
    array is refused in one line."""
    if value is True or value is False:
        return value
    item = value
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise SacEdgeError(f"{name} must be one bool, got an array of shape {value.shape}")
        item = value.reshape(-1)[0]
    if isinstance(item, (bool, np.bool_)):
        return bool(item)
    if isinstance(item, (int, np.integer)) and item in (0, 1):
        return bool(item)
    shown = repr(item) if len(repr(item)) <= 40 else type(item).__name__
    raise SacEdgeError(f"{name} must be a bool (True or False), got {shown}")
