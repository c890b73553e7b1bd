#!/usr/bin/env python3
"""Rebuild the API surfaces of the CUDA bindings the TensorRT runner drives (``edge_runtime/backends/trt/cuda.py``):
``tests/trt_surfaces/cuda-python-<version>.json`` and ``tests/trt_surfaces/pycuda-<version>.json``.

- cuda-python: each release of ``real_tensorrt.CUDA_PYTHON_RELEASES`` is pip-downloaded (its wheels, as pip
  resolves the meta-package) and imported here without a driver, as it imports on any machine. Recorded:
  which of ``cuda.cudart``/``cuda.cuda`` and ``cuda.bindings.runtime``/``driver``/``utils`` import and
  with which deprecation warning, each runtime module's functions (signature and the values each returns,
  from its docstring), enums (members and values) and classes, ``get_cuda_native_handle``, and what the
  calls the runner makes first do without a driver (11.8 and 12.2 raise ``RuntimeError``, later releases
  return an error code).
- pycuda: its sdist is built here against the CUDA toolkit's headers (``nvcc``'s toolkit or
  ``CUDA_HOME``; about two minutes on two cores), linked against an empty ``libcuda.so``; for the import, a
  stub ``libcuda.so.1`` holding every driver function ``_driver.so`` imports (read with ``nm``), each
  answering ``CUDA_ERROR_NO_DEVICE``, is preloaded, so ``pycuda.driver`` imports as on a machine whose
  driver sees no GPU. Recorded: ``pycuda.driver``'s classes (bases, members, method or property, static,
  Boost.Python's signatures in pybind11's form) and functions, and what ``init()`` and ``Context.pop()``
  raise there.

Wheels, sdists and builds go to ``.cache/`` at the repository root (ignored by git). The surfaces are test
data for ``tests/edge_runtime/backends/test_cuda_surfaces.py``; the tests never run this script.

    python scripts/cuda_surface.py                  # every cuda-python release (about 100 MB of wheels once)
    python scripts/cuda_surface.py 12.9.10          # one release
    python scripts/cuda_surface.py pycuda           # pycuda PYCUDA, built from its sdist (needs nvcc, gcc)
    python scripts/cuda_surface.py --dump cuda-python|pycuda OUT.json  # where the module already imports
"""

from __future__ import annotations

import ctypes
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from real_tensorrt import (  # noqa: E402
    CACHE,
    CUDA_PYTHON_RELEASES,
    Unavailable,
    compile_library,
    cuda_python,
    unpacked,
)
from trt_surface import OUT, module_surface, python_version, rebuild_each, write  # noqa: E402

PYCUDA = "2026.1"  # the newest pycuda; it still installs on Python 3.8 (JetPack 5)
RUNTIME_MODULES = ("cuda.bindings.runtime", "cuda.cudart")
MODULES = (*RUNTIME_MODULES, "cuda.bindings.driver", "cuda.cuda", "cuda.bindings.utils")
CUDA_ERROR_NO_DEVICE = 100  # cuda.h: what the driver answers where it sees no GPU


def _import(name: str) -> tuple[Any, dict[str, str]]:
    """(the module or None, its record: the import error, or the deprecation warning it gives)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            module = importlib.import_module(name)
        except Exception as err:
            return None, {"error": f"{type(err).__name__}: {err}"}
    notes = [w for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    return module, ({"warns": f"{notes[0].category.__name__}: {notes[0].message}"} if notes else {})


def _returns(doc: str | None) -> list[str]:
    """The values a cuda-python call returns, from its docstring's ``Returns`` section: ``cudaError_t``
    first, then one type per out-parameter (``pStream : cudaStream_t``)."""
    lines = (doc or "").splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "Returns"]
    if not starts:
        return []
    indent = len(lines[starts[0]]) - len(lines[starts[0]].lstrip())
    body = lines[starts[0] + 2 :]  # after its ------- rule
    out = []
    for line, after in zip(body, [*body[1:], ""]):
        if after.strip().startswith("---"):  # the next section's title
            break
        if line.strip() and len(line) - len(line.lstrip()) == indent:
            kind = line.split(" : ", 1)[1] if " : " in line else line
            out.append(re.sub(r":py:obj:`~?\.?([^`]+)`", r"\1", kind).strip())
    return out


def _runtime_table(module: Any) -> dict[str, Any]:
    functions: dict[str, Any] = {}
    enums: dict[str, dict[str, int]] = {}
    classes: list[str] = []
    for name in sorted(dir(module)):
        value = getattr(module, name)
        if name.startswith("_") or not (getattr(value, "__module__", None) or "").startswith("cuda"):
            continue
        members = getattr(value, "__members__", None)
        if isinstance(value, type) and hasattr(members, "items") and members:
            enums[name] = {k: int(v) for k, v in members.items()}
        elif isinstance(value, type):
            classes.append(name)
        elif callable(value):
            try:
                signature = f"{name}{inspect.signature(value)}"
            except (TypeError, ValueError):
                signature = (value.__doc__ or f"{name}(...)").strip().splitlines()[0]
            functions[name] = {"signature": signature, "returns": _returns(value.__doc__)}
    return {"functions": functions, "enums": enums, "classes": classes}


def _outcome(call: Any) -> dict[str, Any]:
    """What a call does: the exception it raises, or the values it returns (enum members by name)."""
    try:
        result = call()
    except Exception as err:
        return {"raises": f"{type(err).__name__}: {err}"}
    values = result if isinstance(result, tuple) else (result,)
    return {"returns": [getattr(v, "name", None) or (v if isinstance(v, int) else type(v).__name__) for v in values]}


def _probes(rt: Any) -> list[list[Any]]:
    """What the runner's first calls do on a machine without a driver, in the runner's order (the first
    call is the one that finds the driver missing)."""
    calls = [
        ("cudaDriverGetVersion()", rt.cudaDriverGetVersion),
        ("cudaSetDevice(0)", lambda: rt.cudaSetDevice(0)),
        ("cudaStreamCreate()", rt.cudaStreamCreate),
        ("int(cudaStream_t())", lambda: int(rt.cudaStream_t())),
    ]
    return [[text, _outcome(call)] for text, call in calls]


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def dump_cuda_python() -> dict[str, Any]:
    """The surface of the cuda-python this interpreter imports."""
    from importlib.metadata import PackageNotFoundError, version

    installed = {}
    for dist in ("cuda-python", "cuda-bindings"):
        try:
            installed[dist] = version(dist)
        except PackageNotFoundError:
            continue
    modules: dict[str, Any] = {}
    tables: dict[str, Any] = {}
    probes: list[list[Any]] = []
    for name in MODULES:
        module, modules[name] = _import(name)
        if module is None or name not in RUNTIME_MODULES:
            continue
        table = _runtime_table(module)
        same = [other for other, seen in tables.items() if seen == table]
        tables[name] = table
        modules[name]["runtime"] = {"same_as": same[0]} if same else table
        if not probes and not _driver_present():
            probes = _probes(module)
    utils = sys.modules.get("cuda.bindings.utils")
    if utils is not None and hasattr(utils, "get_cuda_native_handle"):
        handle = utils.get_cuda_native_handle
        modules["cuda.bindings.utils"]["functions"] = {"get_cuda_native_handle": str(inspect.signature(handle))}
    return {"distributions": installed, "python": python_version(sys.executable), "modules": modules, "probes": probes}


def dump_pycuda() -> dict[str, Any]:
    """The surface of the pycuda this interpreter imports (over a driver that sees no GPU)."""
    import pycuda
    import pycuda.driver as cuda

    probes = [["init()", _outcome(cuda.init)], ["Context.pop()", _outcome(cuda.Context.pop)]]
    surface = module_surface(cuda, "pycuda", frozenset({"__init__", "__int__"}))  # int(allocation) is its address
    return {"version": pycuda.VERSION_TEXT, **surface, "probes": probes}


def _release_python(version: str) -> str:
    """An interpreter of the Python ``version`` is read on (this one, pyenv's or ``pythonX.Y`` on PATH)."""
    wanted = CUDA_PYTHON_RELEASES[version]
    if python_version(sys.executable) == wanted:
        return sys.executable
    if shutil.which("pyenv"):  # before PATH, where pyenv's shim may stand for a version not selected
        prefix = subprocess.run(["pyenv", "prefix", wanted], capture_output=True, text=True, check=False)
        if prefix.returncode == 0 and prefix.stdout.strip():
            return str(Path(prefix.stdout.split()[0]) / "bin" / "python")
    found = shutil.which(f"python{wanted}")
    if found:
        return found
    raise Unavailable(f"cuda-python {version} is read on Python {wanted}, not installed here (pyenv install {wanted})")


def rebuild_cuda_python(version: str) -> Path:
    if version not in CUDA_PYTHON_RELEASES:
        raise Unavailable(f"no recipe for cuda-python {version}; known: {', '.join(CUDA_PYTHON_RELEASES)}")
    python = _release_python(version)
    site = cuda_python(CUDA_PYTHON_RELEASES[version], version)
    out = OUT / f"cuda-python-{version}.json"
    env = {**os.environ, "PYTHONPATH": str(site)}
    subprocess.run([python, str(Path(__file__).resolve()), "--dump", "cuda-python", str(out)], env=env, check=True)
    return out


def _toolkit() -> Path:
    """The CUDA toolkit pycuda is built against (``CUDA_HOME``, else the one holding ``nvcc``)."""
    for candidate in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if candidate and (Path(candidate) / "include" / "cuda.h").is_file():
            return Path(candidate)
    raise Unavailable("no CUDA toolkit headers (set CUDA_HOME to a toolkit with include/cuda.h)")


def _pycuda_wheel(build: Path) -> Path:
    """pycuda ``PYCUDA`` built from its sdist (once), linked against an empty ``libcuda.so``."""
    found = sorted((build / "dist").glob(f"pycuda-{PYCUDA}-*.whl"))
    if found:
        return found[0]
    build.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "pycuda"]
    subprocess.run([*cmd, "-d", str(build), f"pycuda=={PYCUDA}"], check=True)
    subprocess.run(["tar", "xzf", f"pycuda-{PYCUDA}.tar.gz"], cwd=build, check=True)
    (build / "link").mkdir(exist_ok=True)
    (build / "link" / "empty.c").write_text("")
    compile_library(build / "link" / "empty.c", build / "link" / "libcuda.so", [])
    source = build / f"pycuda-{PYCUDA}"
    configure = ["--cuda-root", str(_toolkit()), "--cudadrv-lib-dir", str(build / "link"), "--no-cuda-enable-curand"]
    subprocess.run([sys.executable, "configure.py", *configure], cwd=source, check=True, capture_output=True)
    wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*wheel, "-w", str(build / "dist"), "."], cwd=source, check=True)
    return sorted((build / "dist").glob(f"pycuda-{PYCUDA}-*.whl"))[0]


def _libcuda_stub(driver_module: Path, out: Path) -> Path:
    """A ``libcuda.so.1`` with every ``cu*`` function ``driver_module`` imports, each failing with
    ``CUDA_ERROR_NO_DEVICE`` (``cuGetErrorString``/``Name`` answer with that error's text)."""
    listing = subprocess.run(["nm", "-D", "--undefined-only", str(driver_module)], capture_output=True, text=True)
    names = sorted({line.split()[-1] for line in listing.stdout.splitlines() if line.split()[-1].startswith("cu")})
    text = "no CUDA-capable device is detected"
    lines = [
        f'int {n}(int e, const char **s) {{ if (s) *s = "{text}"; return 0; }}'
        if n in ("cuGetErrorString", "cuGetErrorName")
        else f"int {n}(void) {{ return {CUDA_ERROR_NO_DEVICE}; }}"
        for n in names
    ]
    out.mkdir(parents=True, exist_ok=True)
    (out / "libcuda.c").write_text("\n".join(lines) + "\n")
    return compile_library(out / "libcuda.c", out / "libcuda.so.1", [])


def rebuild_pycuda() -> Path:
    if not shutil.which("nm"):
        raise Unavailable("no nm (binutils) to read which driver functions pycuda imports")
    build = CACHE / "pycuda"
    site = unpacked(_pycuda_wheel(build), CACHE / f"site-pycuda-{PYCUDA}")
    stub = _libcuda_stub(next((site / "pycuda").glob("_driver*.so")), build / "stub")
    out = OUT / f"pycuda-{PYCUDA}.json"
    env = {**os.environ, "PYTHONPATH": str(site), "LD_PRELOAD": str(stub)}
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--dump", "pycuda", str(out)], env=env, check=True)
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["--dump"]:
        write(dump_pycuda() if argv[1] == "pycuda" else dump_cuda_python(), Path(argv[2]))
        return 0
    targets = argv or list(CUDA_PYTHON_RELEASES)
    return rebuild_each(
        "cuda_surface", targets, lambda t: rebuild_pycuda() if t == "pycuda" else rebuild_cuda_python(t)
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
