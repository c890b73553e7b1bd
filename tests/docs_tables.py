"""The tables of docs/CONTRACTS.md as data, so tests hold the page and the code to each other."""

from __future__ import annotations

import re
from pathlib import Path

CONTRACTS = Path(__file__).resolve().parents[1] / "docs" / "CONTRACTS.md"
_ROW = re.compile(r"^\| `([^`]+)` \|(.*)\|$")


def documented(heading: str) -> set[str]:
    """The first-column names of the table under the Markdown heading ``heading`` (any level)."""
    return set(documented_rows(heading))


def documented_rows(heading: str) -> dict[str, str]:
    """The table under the Markdown heading ``heading`` (any level): first-column name -> the rest of the row."""
    lines = CONTRACTS.read_text().splitlines()
    titles = [i for i, line in enumerate(lines) if line.lstrip("#").strip() == heading and line.startswith("#")]
    assert titles, f"docs/CONTRACTS.md has no heading {heading!r}"
    rows: dict[str, str] = {}
    for line in lines[titles[0] + 1 :]:
        if line.startswith("#"):
            break
        row = _ROW.match(line)
        if row:
            rows[row.group(1)] = row.group(2)
    assert rows, f"docs/CONTRACTS.md: no table under {heading!r}"
    return rows
