"""Plain-text tables for the end-of-run and bench summaries."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any


def _cell(value: Any) -> str:
    """A value as a table shows it: floats to 4 significant digits, but from 1000 up as whole numbers (never
    ``1.214e+04`` beside ``321756`` in one column)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 999.95 else f"{value:.0f}"
    return str(value)


def format_table(rows: Sequence[Sequence[Any]], header: Sequence[str], width: int | None = None) -> str:
    """Left-aligned columns separated by two spaces, with a rule under the header. The last column may hold
    lines of its own (``\n``); with ``width`` it is wrapped to fit, each continuation indented to the column."""
    cells = [[str(h) for h in header], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header) - 1)]
    indent = sum(widths) + 2 * len(widths)
    room = max(width - indent, 30) if width is not None else None
    lines = []
    for r in cells:
        first, *more = _wrapped(r[-1], room)
        lines.append("  ".join(c.ljust(w) for c, w in zip([*r[:-1], first], [*widths, 0])).rstrip())
        lines.extend(" " * indent + line for line in more)
    last = max(len(line) for r in cells for line in _wrapped(r[-1], room))
    last = last if room is None else min(last, room)
    lines.insert(1, "  ".join("-" * w for w in [*widths, last]))
    return "\n".join(lines)


def _wrapped(cell: str, width: int | None) -> list[str]:
    """A last-column cell as its lines: its own, each wrapped to ``width`` (None: as they are)."""
    paragraphs = cell.split("\n")
    if width is None:
        return paragraphs
    wrap = textwrap.TextWrapper(width, break_long_words=False, break_on_hyphens=False)  # paths stay whole
    return [line for text in paragraphs for line in (wrap.wrap(text) or [""])]
