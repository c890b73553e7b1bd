"""The committed Python API surfaces of real TensorRT releases (``tests/trt_surfaces/``, written by
``scripts/trt_surface.py`` from NVIDIA's modules), read for the checks: which classes, members and enum
values a release has, whether a member is a method or a property, and how many arguments each method's
overloads accept (from pybind11's signatures). The same folder holds the CUDA bindings' surfaces
(``scripts/cuda_surface.py``): pycuda's in the same form (``load_pycuda``), and each cuda-python release's
module layout, runtime functions, enums and behaviour without a driver (``CudaPythonSurface``).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

FOLDER = Path(__file__).resolve().parent / "trt_surfaces"
VERSIONS = ("8.5.3.1", "10.3.0", "10.13.3.9", "11.4.0.106")  # one per generation path, 10.x twice
# JetPack 5's (Python 3.8), JetPack 6.0's, 6.1/6.2's (the first with cuda.bindings), the newest 12.x, CUDA 13's
CUDA_PYTHON_VERSIONS = ("11.8.2", "12.2.1", "12.6.2.post1", "12.9.10", "13.4.4")
PYCUDA_VERSION = "2026.1"


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


@lru_cache(maxsize=None)
def load_pycuda() -> Surface:
    """pycuda's ``pycuda.driver`` (Boost.Python signatures in pybind11's form; ``static`` marks static methods)."""
    return Surface(json.loads((FOLDER / f"pycuda-{PYCUDA_VERSION}.json").read_text()))


class CudaPythonSurface:
    """One cuda-python release: which modules import (and which warn), each runtime module's functions
    (signature, the values returned), enums and classes, and what the first calls did without a driver."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.distributions: dict[str, str] = data["distributions"]
        self.version: str = self.distributions.get("cuda-bindings") or self.distributions["cuda-python"]
        self.modules: dict[str, Any] = data["modules"]
        self.probes: list[tuple[str, dict[str, Any]]] = [(call, outcome) for call, outcome in data["probes"]]

    def imports(self, module: str) -> bool:
        return "error" not in self.modules.get(module, {"error": "not recorded"})

    def runtime(self, module: str) -> dict[str, Any]:
        """The runtime table of ``module`` (followed where it re-exports another's)."""
        table: dict[str, Any] = self.modules[module]["runtime"]
        return self.runtime(table["same_as"]) if "same_as" in table else table

    def utils(self) -> dict[str, str]:
        return dict(self.modules.get("cuda.bindings.utils", {}).get("functions", {}))


@lru_cache(maxsize=None)
def load_cuda_python(version: str) -> CudaPythonSurface:
    return CudaPythonSurface(json.loads((FOLDER / f"cuda-python-{version}.json").read_text()))
