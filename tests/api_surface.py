"""The committed Python API surfaces of real TensorRT releases (``tests/trt_surfaces/``, written by
``scripts/trt_surface.py`` from NVIDIA's modules), read for the checks: which classes, members and enum
values a release has, whether a member is a method or a property, and how many arguments each method's
overloads accept (from pybind11's signatures).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

FOLDER = Path(__file__).resolve().parent / "trt_surfaces"
VERSIONS = ("8.5.3.1", "10.3.0", "10.13.3.9", "11.4.0.106")  # one per generation path, 10.x twice


class Arity(NamedTuple):
    """One overload: positional arguments accepted (``self`` not counted) and the parameter names."""

    least: int
    most: int  # a large number for *args
    names: tuple[str, ...]


def _params(signature: str) -> list[str]:
    """The parameters of ``name(a: T, b: U = d) -> R``, split at top-level commas."""
    start = signature.index("(") + 1
    depth, current, out = 0, "", []
    for ch in signature[start:]:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
            continue
        current += ch
    if current.strip():
        out.append(current.strip())
    return out


def arity(signature: str, method: bool) -> Arity:
    params = _params(signature)
    if method and params and re.match(r"^(self|arg0)\b", params[0]):
        params = params[1:]
    if any(p.startswith("*") for p in params):
        return Arity(0, 1 << 30, ())
    names = tuple(p.split(":")[0].split("=")[0].strip() for p in params)
    least = sum("=" not in p for p in params)
    return Arity(least, len(params), names)


class Surface:
    """One release's surface."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.version: str = data["version"]
        self.classes: dict[str, Any] = data["classes"]
        self.functions: dict[str, list[str]] = data["functions"]
        self.probes: dict[str, Any] = data.get("probes", {})

    def top(self, name: str) -> bool:
        return name in self.functions or name in self.classes

    def member(self, cls: str, name: str) -> dict[str, Any] | None:
        """``cls.name``'s record (``{"method": [...]}``, ``{"property": "ro"|"rw", "type": T}``, ...), else None;
        enum values are ``{"enum": value}``."""
        record = self.classes.get(cls)
        if record is None:
            return None
        if name in record.get("enum", {}):
            return {"enum": record["enum"][name]}
        found = record["members"].get(name)
        return found if isinstance(found, dict) else None

    def enum(self, cls: str) -> dict[str, int]:
        return dict(self.classes[cls].get("enum", {}))

    def arities(self, cls: str, name: str) -> list[Arity]:
        """Every overload's arity of method ``cls.name`` (``__init__`` for a constructor)."""
        record = self.member(cls, name) or {}
        return [arity(sig, True) for sig in record.get("method", [])]

    def returns(self, cls: str, name: str) -> str | None:
        """The return type every overload of method ``cls.name`` declares (None when they differ)."""
        record = self.member(cls, name) or {}
        types = {sig.rsplit("->", 1)[1].strip() for sig in record.get("method", []) if "->" in sig}
        return types.pop() if len(types) == 1 else None

    def deprecated(self, cls: str, name: str) -> str | None:
        return self.classes.get(cls, {}).get("deprecated", {}).get(name)


@lru_cache(maxsize=None)
def load(version: str) -> Surface:
    return Surface(json.loads((FOLDER / f"{version}.json").read_text()))


def accepts(arities: list[Arity], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether some overload takes ``len(args)`` positional arguments and these keyword names."""
    count = len(args) + len(kwargs)
    return (
        any(a.least <= count <= a.most and all(k in a.names[len(args) :] for k in kwargs) for a in arities)
        or not arities
    )
