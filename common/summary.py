"""The ``--json`` contract: the last line a command prints on stdout is one JSON object."""

from __future__ import annotations

import json
import math
import sys
from typing import Any


def json_safe(value: Any) -> Any:
    """Make a summary JSON-safe: numpy scalars to Python, NaN/inf to None (JSON has neither)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def strict_json(value: Any, **options: Any) -> str:
    """``value`` as strict JSON (RFC 8259, what jq, JavaScript and Go parse): a missing figure (NaN, inf) is
    null; anything else JSON lacks is its ``str``."""
    return json.dumps(json_safe(value), allow_nan=False, default=str, **options)


def emit_json(summary: dict[str, Any]) -> None:
    """Print ``summary`` as the final stdout line and flush, so scripts can ``tail -n 1`` it."""
    sys.stdout.write(strict_json(summary, sort_keys=True) + "\n")
    sys.stdout.flush()
