"""Reading a JSON object from disk with the one-line error convention (the writer is ``atomic_write_json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .bounded import MAX_JSON_BYTES, read_capped
from .errors import SacEdgeError


def read_json(
    path: Path, what: str, fix: str, max_bytes: int = MAX_JSON_BYTES, *, follow: bool = True
) -> dict[str, Any]:
    """The JSON object in ``path``; missing, oversized (over ``max_bytes``), malformed, too deeply nested or
    non-object files raise one SacEdgeError line naming ``what`` the file is and ``fix``, what to do. Only a
    regular file is read, with ``follow=False`` not through a symlink (``bounded.open_regular``)."""
    if not path.exists() and not path.is_symlink():  # anything else there is named by its kind below
        raise SacEdgeError(f"{path}: {what} not found; {fix}")
    try:
        raw = read_capped(path, max_bytes, what, fix, follow=follow)
    except OSError as err:
        raise SacEdgeError(f"{path}: {what} cannot be read ({err.strerror or err}); {fix}") from None
    return parse_json_object(raw, path, what, fix)


def parse_json_object(raw: bytes, path: Path, what: str, fix: str) -> dict[str, Any]:
    """The JSON object in ``raw`` (the bytes of ``path``), with ``read_json``'s one-line errors; never more
    than MAX_JSON_BYTES, whoever read the bytes (a 500 MB JSON file takes ~3 GB and seconds to parse)."""
    if len(raw) > MAX_JSON_BYTES:
        raise SacEdgeError(f"{path}: {what} is larger than {MAX_JSON_BYTES >> 20} MiB, not one sac-edge wrote; {fix}")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SacEdgeError(f"{path}: {what} is not valid JSON ({err}); {fix}") from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise SacEdgeError(f"{path}: {what} holds a number too long to be one sac-edge wrote; {fix}") from None
    except RecursionError:
        raise SacEdgeError(f"{path}: {what} is nested too deeply to be one sac-edge wrote; {fix}") from None
    if not isinstance(data, dict):
        raise SacEdgeError(f"{path}: {what} is not a JSON object; {fix}")
    return data


def read_json_or_none(path: Path, *, follow: bool = True) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing, unreadable, not a regular file (with
    ``follow=False`` also a symlink) or not an object (for records, such as a plan's sidecar, whose absence
    only means "rebuild" or "not trusted")."""
    try:
        data = json.loads(read_capped(path, MAX_JSON_BYTES, "record", "", follow=follow))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, SacEdgeError):
        return None
    return data if isinstance(data, dict) else None
