#!/usr/bin/env python3
"""Rebuild the Python API surfaces of real TensorRT releases: ``tests/trt_surfaces/<version>.json``.

For each release, the real module is imported in a subprocess (``real_tensorrt.py``: the 10.x/11.x
bindings over stub libraries; 8.5 from its own wheel on Python 3.8) and read: every class with its bases,
enum values, members (method signatures as pybind11 documents them, or property with its type and whether
it can be set), ``[DEPRECATED]`` notes, the module's functions, and the results of the calls that need no
GPU and that the project makes (``nptype`` for every ``DataType``). Dunder members other than ``__init__``
are left out. The JSON is compact and sorted, so a rebuild shows only real differences in review.

    python scripts/trt_surface.py                 # the 10.x/11.x bindings (downloads ~4 MB once)
    python scripts/trt_surface.py 8.5.3.1         # needs Python 3.8 and the 525 MB wheel (make test-trt85)
    python scripts/trt_surface.py --dump OUT.json # inside an environment where tensorrt imports
"""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "tests" / "trt_surfaces"
_PREFIX = re.compile(r"\btensorrt(?:_bindings)?\.tensorrt\.|\btensorrt(?:_bindings)?\.")
_KEPT_DUNDERS = frozenset({"__init__"})


def _clean(text: str) -> str:
    return _PREFIX.sub("", " ".join(text.split()))


def signatures(obj: Any, name: str, bound: bool = False) -> list[str]:
    """pybind11's or Boost.Python's signature lines for ``name`` (one per overload), module prefixes removed;
    Boost.Python's are rewritten in pybind11's form (its ``bound`` methods' first parameter named ``self``)."""
    doc = inspect.getdoc(obj) or getattr(obj, "__doc__", None) or ""
    lines = [line.strip() for line in doc.splitlines()]
    found = [re.sub(r"^\d+\.\s*", "", line) for line in lines if re.match(rf"^(\d+\.\s*)?{re.escape(name)}\(", line)]
    if "Overloaded function." in lines:  # its first line is a generic (*args, **kwargs): the overloads follow
        found = [line for line in found if not line.startswith(f"{name}(*args, **kwargs)")]
    return [_clean(_from_boost(line, bound) if BOOST.match(line) else line) for line in found]


# Boost.Python documents ``name( (T1)a1, (T2)a2 [, (T3)a3=d [, (T4)a4]]) -> R :``
BOOST = re.compile(r"^\w+\(.*\) -> .+ :$")
_BOOST_PARAM = re.compile(r"\((?P<type>[^()]*)\)(?P<name>\w+)(?:=(?P<default>.*))?$")


def _from_boost(line: str, bound: bool) -> str:
    """A Boost.Python signature line as pybind11 writes one: ``name(a1: T1, a3: T3 = d, a4: T4 = ...) -> R``."""
    name, rest = line.split("(", 1)
    params_text, _, returns = rest.rpartition(") -> ")
    params = []
    for index, raw in enumerate(p.strip() for p in params_text.replace("[", ",").replace("]", "").split(",")):
        match = _BOOST_PARAM.match(raw)
        if not match:
            continue
        optional = params_text.index(raw) > params_text.find("[") >= 0
        pname = "self" if bound and index == 0 else match["name"]
        default = match["default"] if match["default"] is not None else ("..." if optional else None)
        params.append(f"{pname}: {match['type']}" + (f" = {default}" if default is not None else ""))
    return f"{name}({', '.join(params)}) -> {returns.rstrip(' :').strip()}"


def _deprecated(doc: str | None) -> str | None:
    if not doc or "[DEPRECATED]" not in doc:
        return None
    after = doc.split("[DEPRECATED]", 1)[1]
    return " ".join(after.strip().split("\n\n")[0].split())


def _enum_notes(doc: str | None) -> dict[str, str]:
    """Per-member ``[DEPRECATED]`` notes from a pybind11 enum's ``Members:`` section."""
    notes: dict[str, str] = {}
    if not doc or "Members:" not in doc:
        return notes
    entries = re.split(r"\n\s{2}(?=[A-Za-z0-9_]+ :)", "\n" + doc.split("Members:", 1)[1])
    for entry in entries:
        name, _, text = entry.strip().partition(" :")
        note = _deprecated(text)
        if name and note:
            notes[name] = note
    return notes


def _property(prop: property) -> dict[str, Any]:
    """Whether it can be set and its type (its getter's pybind11 signature, ``(arg0: X) -> int``)."""
    doc = (getattr(prop.fget, "__doc__", None) or "").strip().splitlines()
    returns = _clean(doc[0].rsplit("->", 1)[1]) if doc and "->" in doc[0] else "?"
    return {"property": "rw" if prop.fset is not None else "ro", "type": returns}


def describe_class(cls: type, package: str = "tensorrt", dunders: frozenset[str] = _KEPT_DUNDERS) -> dict[str, Any]:
    """A class's bases within ``package``, enum values, members (of the dunders, only ``dunders``) and
    deprecation notes."""
    out: dict[str, Any] = {"bases": [b.__name__ for b in cls.__mro__[1:] if b.__module__.startswith(package)]}
    values = getattr(cls, "__members__", None)
    if not isinstance(values, dict):  # Boost.Python's enums: ``names`` maps each name to its value
        values = vars(cls).get("names")
    if isinstance(values, dict) and values and all(hasattr(v, "__int__") for v in values.values()):
        out["enum"] = {k: int(v) for k, v in values.items()}
    members: dict[str, Any] = {}
    deprecated: dict[str, str] = dict(_enum_notes(cls.__doc__)) if "enum" in out else {}
    for name in sorted(dir(cls)):
        if name.startswith("_") and name not in dunders:
            continue
        if "enum" in out and name in out["enum"]:
            continue
        try:
            static = inspect.getattr_static(cls, name)
        except AttributeError:
            continue
        if isinstance(static, property):
            members[name] = _property(static)
            note = _deprecated(static.__doc__)
        elif isinstance(static, type):
            members[name] = {"class": f"{cls.__name__}.{name}"}
            note = None
        elif callable(static) or isinstance(static, (staticmethod, classmethod)):
            func = getattr(cls, name)
            bound = not isinstance(static, (staticmethod, classmethod))
            members[name] = {"method": signatures(func, name, bound)}
            if not bound:
                members[name]["static"] = True
            note = _deprecated(getattr(func, "__doc__", None))
        else:
            members[name] = {"value": type(static).__name__}
            note = None
        if note:
            deprecated[name] = note
    out["members"] = members
    if deprecated:
        out["deprecated"] = deprecated
    return out


def module_surface(module: Any, package: str, dunders: frozenset[str] = _KEPT_DUNDERS) -> dict[str, Any]:
    """``{"classes": ..., "functions": ...}``: every public class (nested ones as ``Outer.Inner``) and
    function of ``module`` defined in ``package``."""
    classes: dict[str, Any] = {}
    functions: dict[str, list[str]] = {}

    def visit(prefix: str, cls: type) -> None:
        classes[prefix] = describe_class(cls, package, dunders)
        for name, value in sorted(vars(cls).items()):
            if isinstance(value, type) and not name.startswith("_") and value.__module__.startswith(package):
                visit(f"{prefix}.{name}", value)

    for name in sorted(dir(module)):
        value = getattr(module, name)
        if name.startswith("_"):
            continue
        if isinstance(value, type) and getattr(value, "__module__", "").startswith(package):
            visit(name, value)
        elif callable(value) and (getattr(value, "__module__", None) or "").startswith(package):
            if inspect.isfunction(value):  # pure Python (nptype, volume): its own signature
                functions[name] = [f"{name}{inspect.signature(value)}"]
            else:
                functions[name] = signatures(value, name) or [f"{name}(...)"]
    return {"classes": classes, "functions": functions}


def dump() -> dict[str, Any]:
    """The surface of the ``tensorrt`` this interpreter imports."""
    import numpy as np
    import tensorrt as trt

    nptype: dict[str, str] = {}
    for member in trt.DataType.__members__:
        try:
            nptype[member] = np.dtype(trt.nptype(getattr(trt.DataType, member))).name
        except Exception as err:  # recorded: what the project must not rely on
            nptype[member] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
    return {
        "version": str(trt.__version__),
        "numpy": np.__version__,
        **module_surface(trt, "tensorrt"),
        "probes": {"nptype": nptype},
    }


def write(surface: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(surface, sort_keys=True, separators=(",", ":")) + "\n")


def rebuild(version: str, python: str) -> Path:
    """Dump ``version``'s surface through the real module in a subprocess of ``python``."""
    sys.path.insert(0, str(HERE))
    from real_tensorrt import environment

    out = OUT / f"{version}.json"
    env = environment(version, python_version(python))
    subprocess.run([python, str(Path(__file__).resolve()), "--dump", str(out)], env=env, check=True)
    return out


def python_version(python: str) -> str:
    result = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--dump"]:
        write(dump(), Path(argv[1]))
        return 0
    sys.path.insert(0, str(HERE))
    from real_tensorrt import BINDINGS

    python = sys.executable
    if "--python" in argv:
        at = argv.index("--python")
        python, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    return rebuild_each("trt_surface", argv or list(BINDINGS), lambda version: rebuild(version, python))


def rebuild_each(tool: str, targets: list[str], rebuild_one: Callable[[str], Path]) -> int:
    """Rebuild each target's surface, printing its file and size; 2, with the reason, at the first that
    cannot be had here."""
    from real_tensorrt import Unavailable

    for target in targets:
        try:
            out = rebuild_one(target)
        except (Unavailable, subprocess.CalledProcessError) as err:
            print(f"{tool}: {target}: {err}", file=sys.stderr)
            return 2
        print(f"{out.relative_to(HERE.parent)}: {out.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
