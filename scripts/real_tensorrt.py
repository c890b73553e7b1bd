#!/usr/bin/env python3
"""NVIDIA's real TensorRT Python modules on a machine without a GPU or TensorRT's libraries.

- 10.x and 11.x: the ``tensorrt-cu12-bindings`` wheels (about 1.2 MB) hold the real ``tensorrt.so``. It
  imports only ten symbols from ``libnvinfer``, ``libnvinfer_plugin`` and ``libnvonnxparser`` (``nm -D
  --undefined-only``): the ``create*_INTERNAL`` factories, the plugin registries, ``initLibNvInferPlugins``
  and the two version functions. Stub libraries with those SONAMEs, built here with the C compiler, let the
  module import; every class, enum, signature and docstring is then NVIDIA's. The factories log TensorRT's
  own no-GPU warning to the logger they are given (``ILogger::log`` is the first virtual function of
  ``nvinfer1::ILogger``) and return nullptr, so ``trt.Builder``/``trt.Runtime`` fail as on a machine
  without a usable GPU. The ``tensorrt`` meta-package's module is ``from tensorrt_bindings import *`` and
  its ``__version__``; ``shim/tensorrt/__init__.py`` is those two lines.
- 8.5: the ``tensorrt==8.5.3.1`` wheel (Python 3.8, 525 MB) holds the real ``libnvinfer.so.8``;
  ``libnvinfer_plugin`` imports 41 versioned cuDNN 8 / cuBLAS 11 symbols (read with ``nm`` at stub time),
  which stub libraries with those SONAMEs and version nodes provide. Without a GPU, NVIDIA's own
  ``trt.Builder(logger)`` logs "CUDA initialization failure with error: 35" at WARNING and raises.

Wheels are fetched with pip (whatever index this machine's pip is configured with) into ``.cache/`` at the
repository root (ignored by git) once, then reused. ``environment(release)`` is what a subprocess needs to
``import tensorrt`` (``PYTHONPATH``, ``LD_LIBRARY_PATH``); ``Unavailable`` says why it cannot be had here.

    python scripts/real_tensorrt.py 10.3.0 -- python -c "import tensorrt; print(tensorrt.__version__)"
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "real-tensorrt"


class Release(NamedTuple):
    version: str
    package: str  # the wheel's distribution name
    python: str  # the Python the wheel is for, "3.11"
    major: int  # the SONAME suffix of its libraries


# The releases the project's tests and surfaces use: 10.3 is JetPack 6's, 10.13 the last with weak typing
# deprecated but present, 11.4 the current 11.x; 8.5.3.1 is the PyPI wheel of JetPack 5.1's 8.5 (8.6.1 on
# PyPI is a placeholder that downloads from a host this machine cannot reach).
BINDINGS = ("10.3.0", "10.13.3.9", "11.4.0.106")
TRT85 = "8.5.3.1"
NEAREST_JETPACK6 = "10.3.0"
CURRENT_11 = "11.4.0.106"
# cuda-python 11.8 and 12.2 raise RuntimeError (not an error code) where libcuda.so.1 cannot be loaded.
CUDA_PYTHON = "12.2.0"
# The cuda-python releases whose API surfaces are recorded (scripts/cuda_surface.py), with the Python
# each is read on: 11.8.2 is the newest 11.x with a Python 3.8 aarch64 wheel (JetPack 5), 12.2.1 is
# JetPack 6.0's CUDA, 12.6.2.post1 JetPack 6.1/6.2's (the first with cuda.bindings), 12.9.10 what
# `pip install 'cuda-python<13'` gets, 13.4.4 the CUDA 13 generation (no cuda.cudart).
CUDA_PYTHON_RELEASES = {"11.8.2": "3.8", "12.2.1": "3.11", "12.6.2.post1": "3.11", "12.9.10": "3.11", "13.4.4": "3.11"}
# Where cuda-python is a meta-package: the wheels that hold its modules, as pip resolves them.
CUDA_PYTHON_WHEELS = {
    "12.9.10": ("cuda-bindings==12.9.10", "cuda-pathfinder==1.9.1"),
    "13.4.4": ("cuda-bindings==13.4.4", "cuda-pathfinder==1.9.1"),
}


class Unavailable(Exception):
    """The real module cannot be had here (no C compiler, no download); the message says which."""


def release(version: str, python: str | None = None) -> Release:
    here = python or f"{sys.version_info[0]}.{sys.version_info[1]}"
    if version == TRT85:
        return Release(version, "tensorrt", "3.8", 8)
    if version not in BINDINGS:
        raise Unavailable(f"no recipe for TensorRT {version}; known: {', '.join((TRT85, *BINDINGS))}")
    return Release(version, "tensorrt-cu12-bindings", here, int(version.split(".")[0]))


def pip_download(requirement: str, python: str, dest: Path) -> Path:
    """``requirement``'s wheel for CPython ``python`` (or a pure-Python wheel) in ``dest`` (downloaded once)."""
    dest.mkdir(parents=True, exist_ok=True)
    name, version = requirement.split("==")
    stem = name.replace("-", "_")
    tags = ("-cp" + python.replace(".", "") + "-", "-py3-none-any")

    def wheels() -> list[Path]:
        return sorted(w for w in dest.glob(f"{stem}-{version}-*.whl") if any(t in w.name for t in tags))

    found = wheels()
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python, "--implementation", "cp", "-d", str(dest), requirement]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = wheels()
    if result.returncode != 0 or not found:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise Unavailable(f"cannot download {requirement} for Python {python}: {last}")
    return found[0]


def unpacked(wheels: Path | list[Path], into: Path) -> Path:
    """The wheel (or wheels, together, as pip installs them) unzipped into ``into``; a finished unpack
    leaves a marker naming them, so an interrupted or different one is redone."""
    wheels = [wheels] if isinstance(wheels, Path) else wheels
    done = into / ".unpacked"
    if not done.is_file() or done.read_text() != "\n".join(w.name for w in wheels):
        shutil.rmtree(into, ignore_errors=True)
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(into)
        done.write_text("\n".join(w.name for w in wheels))
    return into


STUB_C = r"""
#include <stddef.h>
typedef void (*log_fn)(void *self, int severity, const char *msg);
static void warn(void *logger) {
    if (logger != NULL) ((log_fn)(*(void ***)logger)[LOG_SLOT])(logger, 2, NO_DEVICE);
}
void *createInferBuilder_INTERNAL(void *logger, int version) { warn(logger); return NULL; }
void *createInferRuntime_INTERNAL(void *logger, int version) { warn(logger); return NULL; }
void *createInferRefitter_INTERNAL(void *engine, void *logger, int version) { warn(logger); return NULL; }
void *createNvOnnxParser_INTERNAL(void *network, void *logger, int version) { warn(logger); return NULL; }
void *createNvOnnxParserRefitter_INTERNAL(void *refitter, void *logger, int version) { warn(logger); return NULL; }
void *getPluginRegistry(void) { return NULL; }
void *getBuilderPluginRegistry(int capability) { return NULL; }
int initLibNvInferPlugins(void *logger, const char *ns) { return 0; }
int getInferLibVersion(void) { return LIB_VERSION; }
int getNvOnnxParserVersion(void) { return LIB_VERSION; }
"""
# ILogger::log's slot in the vtable: first through 10.x; 11's ILogger is a versioned interface
# (nvinfer1::v_1_0) whose log is the fifth virtual function (found by calling each slot of the real module's).
LOG_SLOT_11 = 4
NO_DEVICE = "CUDA initialization failure with error: 35"  # what the real 8.5 logs at WARNING without a GPU


def compiler() -> str:
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise Unavailable("no C compiler (cc, gcc or clang) to build the stub TensorRT libraries")


def compile_library(source: Path, target: Path, flags: list[str]) -> Path:
    """``source`` built into the shared library ``target`` (its file name is the SONAME); written whole or
    not at all, so an interrupted build is not taken for a finished one."""
    partial = target.with_name(f".{target.name}")
    cmd = [compiler(), "-shared", "-fPIC", f"-Wl,-soname,{target.name}", *flags, "-o", str(partial), str(source)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise Unavailable(f"the C compiler cannot build {target.name}: {result.stderr.strip()[:200]}")
    partial.replace(target)
    return target


def stub_libraries(major: int, version: str) -> Path:
    """libnvinfer/libnvinfer_plugin/libnvonnxparser ``.so.<major>`` stubs in one folder (built once)."""
    out = CACHE / f"stubs-{version}"
    names = [f"lib{lib}.so.{major}" for lib in ("nvinfer", "nvinfer_plugin", "nvonnxparser")]
    source = out / "stub.c"
    if source.is_file() and source.read_text() == STUB_C and all((out / n).is_file() for n in names):
        return out  # built from this very source
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        (out / name).unlink(missing_ok=True)
    source.write_text(STUB_C)
    parts = [int(p) for p in version.split(".")[:3]]
    code = parts[0] * 10000 + parts[1] * 100 + parts[2]  # NV_TENSORRT_VERSION's layout from 10.0
    for name in names:
        flags = ["-O1", f"-DLIB_VERSION={code}", f"-DLOG_SLOT={LOG_SLOT_11 if major >= 11 else 0}"]
        compile_library(source, out / name, [*flags, f'-DNO_DEVICE="{NO_DEVICE}"'])
    return out


SHIM = '''"""The ``tensorrt`` meta-package's module: NVIDIA's bindings under their usual name."""
from tensorrt_bindings import *  # noqa: F403
from tensorrt_bindings import __version__  # noqa: F401
'''


def bindings(version: str, python: str | None = None, stubs: bool = True) -> tuple[Path, Path | None]:
    """(the folder to put on PYTHONPATH, the stub-library folder or None where ``stubs`` is false) for a
    10.x/11.x bindings release."""
    rel = release(version, python)
    wheel = pip_download(f"{rel.package}=={rel.version}", rel.python, CACHE / "wheels")
    site = unpacked(wheel, CACHE / f"site-{rel.version}-py{rel.python}")
    shim = site / "tensorrt" / "__init__.py"
    if not shim.is_file():
        shim.parent.mkdir(exist_ok=True)
        shim.write_text(SHIM)
    return site, stub_libraries(rel.major, rel.version) if stubs else None


def _missing_symbols(folder: Path) -> dict[str, list[str]]:
    """SONAME -> versioned symbols that the wheel's libraries import from libraries the wheel lacks."""
    have = {p.name for p in folder.glob("*.so*")}
    wanted: dict[str, set[str]] = {}
    for lib in sorted(folder.glob("*.so*")):
        if not shutil.which("nm"):
            raise Unavailable("no nm (binutils) to read which cuDNN/cuBLAS symbols TensorRT 8.5 imports")
        out = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True, check=True)
        for line in out.stdout.splitlines():
            name, _, soname = line.split()[-1].partition("@")
            if soname.startswith(("libcublas", "libcudnn")) and soname not in have:
                wanted.setdefault(soname, set()).add(name)
    return {k: sorted(v) for k, v in wanted.items()}


def trt85() -> tuple[Path, Path]:
    """(PYTHONPATH folder, stub folder) for the real 8.5.3.1 wheel: its cuDNN/cuBLAS imports stubbed (each
    returns a failure status; nothing calls them without a GPU)."""
    rel = release(TRT85)
    wheel = pip_download(f"{rel.package}=={rel.version}", rel.python, CACHE / "wheels")
    site = unpacked(wheel, CACHE / f"site-{rel.version}-py{rel.python}")
    out = CACHE / f"stubs-{rel.version}"
    missing = _missing_symbols(site / "tensorrt")
    if all((out / soname).is_file() for soname in missing):
        return site, out
    out.mkdir(parents=True, exist_ok=True)
    for soname, names in missing.items():
        (out / "stub.c").write_text("".join(f"int {name}(void) {{ return 1; }}\n" for name in names))
        (out / "version.map").write_text(f"{soname} {{ global: *; }};\n")  # the symbols are versioned
        compile_library(out / "stub.c", out / soname, [f"-Wl,--version-script={out / 'version.map'}"])
    return site, out


def cuda_python(python: str | None = None, version: str = CUDA_PYTHON) -> Path:
    """The real cuda-python ``version`` unpacked (a folder for PYTHONPATH): from 11.8.6 and 12.8 the
    ``cuda-python`` wheel is a meta-package and the modules are ``cuda-bindings``' (with, from 12.9,
    ``cuda-pathfinder``), so those wheels are unpacked together."""
    here = python or f"{sys.version_info[0]}.{sys.version_info[1]}"
    requirements = CUDA_PYTHON_WHEELS.get(version, (f"cuda-python=={version}",))
    wheels = [pip_download(requirement, here, CACHE / "wheels") for requirement in requirements]
    return unpacked(wheels, CACHE / f"site-cuda-python-{version}-py{here}")


def environment(
    version: str, python: str | None = None, libraries: bool = True, with_cuda_python: bool = False
) -> dict[str, str]:
    """Environment variables under which ``python`` imports the real ``tensorrt`` ``version``: over the stub
    libraries, or without any (``libraries=False``: installed as pip installs the bindings alone, so the
    import fails as it does without TensorRT's libraries), and with the real cuda-python if asked."""
    if platform.machine() != "x86_64":  # .cache/ is shared with the arm64 chroot of make test-aarch64
        raise Unavailable(
            f"the wheels and stub libraries in .cache/ are x86_64's (this is {platform.machine()}); a Jetson runs "
            "the tensorrt-marked tests on its own TensorRT"
        )
    site, stubs = trt85() if version == TRT85 else bindings(version, python, stubs=libraries)
    env = dict(os.environ)
    paths = [str(site), *([str(cuda_python(python))] if with_cuda_python else []), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if stubs is not None and libraries:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(stubs), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: real_tensorrt.py VERSION -- COMMAND...", file=sys.stderr)
        return 2
    try:
        env = environment(argv[0])
    except Unavailable as err:
        print(f"real_tensorrt: {err}", file=sys.stderr)
        return 2
    return subprocess.run(argv[2:], env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
