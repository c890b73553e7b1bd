"""Every cuda-python and pycuda use of the runner's CUDA layer (``backends/trt/cuda.py``) against the real
modules' surfaces (``tests/trt_surfaces/``, written by ``scripts/cuda_surface.py``).

cuda-python: for each release (JetPack 5's 11.8, JetPack 6's 12.2 and 12.6, the newest 12.x, CUDA 13's),
``fake_cuda_python`` lays out the release's modules, so the product picks its runtime module as it would
there; the whole CUDA layer then runs on it (open, current, allocations, copies with their bytes checked,
close), with a driver of the release's major, with an older driver and with none. A scan of the source
checks that every ``rt.X.Y`` the layer writes exists on every release's path and was reached.

pycuda: the real ``pycuda.driver`` (built from its sdist against the CUDA toolkit here) was read into a
surface; the layer's pycuda path runs on ``fake_pycuda`` through a proxy that checks every name, method
or property, static method and argument count against that surface, and the fake's own classes and
functions are checked against it.
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from api_surface import (
    CUDA_PYTHON_VERSIONS,
    FOLDER,
    PYCUDA_VERSION,
    Arity,
    Surface,
    accepts,
    arity,
    load_cuda_python,
    load_pycuda,
)
from fake_cuda_python import FakeCudaPython
from fake_pycuda import FakePyCuda

from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime.backends.trt import cuda as layer

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "edge_runtime" / "backends" / "trt" / "cuda.py"


def _driver_of(version: str) -> int:
    return int(version.split(".")[0]) * 1000 + 20  # e.g. 12020, a driver of the release's own major


def _install(version: str, driver: int | None, monkeypatch: pytest.MonkeyPatch) -> FakeCudaPython:
    fake = FakeCudaPython(version, driver)
    fake.install(monkeypatch)
    monkeypatch.setattr(layer, "installed_version", lambda *names: fake.surface.version)
    return fake


def exercise(cuda: Any) -> None:
    """Every call of the CUDA layer, as the runner makes them, with the bytes of a round trip checked."""
    with cuda.current():
        device = cuda.device_alloc(64)
        src = cuda.pinned((4, 4), np.float32)
        dst = cuda.pinned((4, 4), np.float32)
        src[:] = np.arange(16, dtype=np.float32).reshape(4, 4)
        cuda.htod(device, src)
        cuda.dtoh(dst, device)
        cuda.sync()
    np.testing.assert_array_equal(dst, src)
    assert isinstance(cuda.stream, int)
    cuda.close()


@pytest.fixture(scope="module")
def uses() -> dict[str, list[str]]:
    out = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for version in CUDA_PYTHON_VERSIONS:
            fake = _install(version, _driver_of(version), monkeypatch)
            cuda = layer.open_cuda()
            assert isinstance(cuda, layer.CudaPython)
            exercise(cuda)
            assert not fake.device and not fake.host and not fake.streams  # close freed everything
            out[version] = fake.used
    return out


def test_the_surfaces_are_the_recorded_releases() -> None:
    recorded = sorted(p.name for p in FOLDER.glob("cuda-python-*.json"))
    assert recorded == sorted(f"cuda-python-{v}.json" for v in CUDA_PYTHON_VERSIONS)
    assert {load_cuda_python(v).version for v in CUDA_PYTHON_VERSIONS} == set(CUDA_PYTHON_VERSIONS)


@pytest.mark.parametrize("version", CUDA_PYTHON_VERSIONS)
def test_the_product_takes_a_runtime_module_that_is_there_and_not_deprecated(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _install(version, _driver_of(version), monkeypatch)
    module = layer._runtime_module()
    assert module is not None, f"no runtime module found for cuda-python {version}"
    record = fake.surface.modules[module.__name__]
    assert "error" not in record and "warns" not in record, (module.__name__, record)


def test_the_paths_differ_across_the_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    """13 removed cuda.cudart, which 12.6-12.9 deprecate; 11.8.2 and 12.2 have nothing else."""
    taken = {}
    for version in CUDA_PYTHON_VERSIONS:
        _install(version, _driver_of(version), monkeypatch)
        taken[version] = layer._runtime_module().__name__  # type: ignore[union-attr]
    assert taken == {
        "11.8.2": "cuda.cudart",
        "12.2.1": "cuda.cudart",
        "12.6.2.post1": "cuda.bindings.runtime",
        "12.9.10": "cuda.bindings.runtime",
        "13.4.4": "cuda.bindings.runtime",
    }
    assert not load_cuda_python("13.4.4").imports("cuda.cudart")


@pytest.mark.parametrize("version", CUDA_PYTHON_VERSIONS)
def test_the_cuda_layer_runs_on_each_release(uses: dict[str, list[str]], version: str) -> None:
    assert uses[version][:1] == ["cudaDriverGetVersion"]  # before any device call (see the next tests)
    assert {"cudaMemcpyAsync", "cudaMallocHost", "cudaStreamDestroy"} <= set(uses[version])


@pytest.mark.parametrize("version", CUDA_PYTHON_VERSIONS)
def test_the_stream_handle_is_read_the_releases_way(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``get_cuda_native_handle`` where the release has it (12.9, 13), else ``int()``; both the address."""
    fake = _install(version, _driver_of(version), monkeypatch)
    cuda = layer.open_cuda()
    assert cuda.stream in fake.streams
    assert ("get_cuda_native_handle" in fake.surface.utils()) == (version >= "12.9")
    cuda.close()


@pytest.mark.parametrize("version", CUDA_PYTHON_VERSIONS)
def test_without_a_driver_the_error_is_one_line_naming_the_driver(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """11.8 and 12.2 raise RuntimeError from their first call; later releases return an error code and
    report driver version 0 (each as the real release did here)."""
    fake = _install(version, None, monkeypatch)
    first = fake.surface.probes[0]
    assert first[0] == "cudaDriverGetVersion()"  # the probes were taken in the layer's own order
    with pytest.raises(SacEdgeError) as err:
        layer.open_cuda()
    message = str(err.value)
    assert "\n" not in message and "driver" in message and "nvidia-smi" in message, message
    if "raises" in first[1]:
        assert "Failed to dlopen libcuda.so.1" in message


@pytest.mark.parametrize("version", [v for v in CUDA_PYTHON_VERSIONS if int(v.split(".")[0]) > 11])
def test_a_release_newer_than_the_driver_names_which_to_install(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA runtime refuses device calls on an older driver (cudaErrorInsufficientDriver): the layer
    reads the driver's version first, so the user is told which cuda-python fits."""
    older = int(version.split(".")[0]) - 1
    _install(version, older * 1000 + 40, monkeypatch)
    with pytest.raises(SacEdgeError) as err:
        layer.open_cuda()
    assert f"pip install 'cuda-python<{older + 1}'" in str(err.value)


def static_uses(module: str) -> set[str]:
    """``X`` / ``X.Y`` for every ``module.X.Y`` or ``self.module.X.Y`` the CUDA layer writes (``rt`` is
    cuda-python's runtime module, ``cuda`` is ``pycuda.driver``)."""
    found = set()
    for node in ast.walk(ast.parse(SOURCE.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        chain, base = [node.attr], node.value
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id == "self" and chain[0] == module:
            chain = chain[1:]
        elif not (isinstance(base, ast.Name) and base.id == module):
            continue
        if chain:
            found.add(".".join(chain[:2]))
    return found


def test_every_runtime_name_the_layer_writes_is_on_every_releases_path(uses: dict[str, list[str]]) -> None:
    names = static_uses("rt")
    assert len(names) >= 12, names
    for version in CUDA_PYTHON_VERSIONS:
        surface = load_cuda_python(version)
        module = next(m for m in layer.RUNTIME_MODULES if surface.imports(m))
        table = surface.runtime(module)
        for name in names:
            top, _, member = name.partition(".")
            assert top in table["functions"] or top in table["enums"], f"{version}: rt.{top}"
            assert not member or member in table["enums"][top], f"{version}: rt.{name}"
            assert top in uses[version], f"{version}: rt.{top} never run"


def test_the_module_names_the_layer_imports_exist_somewhere() -> None:
    """A misspelt module path would make the layer fall through to pycuda on every release."""
    for name in (*layer.RUNTIME_MODULES, "cuda.bindings.utils"):
        assert any(load_cuda_python(v).imports(name) for v in CUDA_PYTHON_VERSIONS), name
    assert "cuda.bindings.utils" in SOURCE.read_text()


# --- pycuda ---------------------------------------------------------------------------------------------


class Checked:
    """``pycuda.driver`` or one of its objects, every attribute the product reads checked on the surface."""

    def __init__(self, target: Any, kind: str, surface: Surface, used: list[str]) -> None:
        self._target, self._kind, self._surface, self._used = target, kind, surface, used

    def _record(self, name: str) -> dict[str, Any]:
        surface, kind = self._surface, self._kind
        if not kind:
            if name in surface.functions:
                return {"method": surface.functions[name], "static": True}
            if name in surface.classes:
                return {"class": name}
            raise AttributeError(f"pycuda.driver has no {name} in pycuda {surface.version}")
        for owner in (kind, *surface.classes[kind]["bases"]):
            record = surface.member(owner, name)
            if record is not None:
                return record
        raise AttributeError(f"pycuda {kind} has no {name} in pycuda {surface.version}")

    def __getattr__(self, name: str) -> Any:
        record = self._record(name)
        self._used.append(f"{self._kind}.{name}" if self._kind else name)
        value = getattr(self._target, name)
        if "class" in record:  # exception classes as they are, to be caught by type
            exception = isinstance(value, type) and issubclass(value, BaseException)
            return value if exception else CheckedClass(value, record["class"], self._surface, self._used)
        if "method" in record:
            arities = [arity(sig, bool(self._kind)) for sig in record["method"]]
            return _call(value, arities, f"{self._kind}.{name}", self._surface, self._used)
        assert "property" in record, f"{self._kind}.{name} is neither a method nor a property"
        return value

    def __int__(self) -> int:
        assert self._surface.member(self._kind, "__int__") is not None, f"int() of a {self._kind}"
        return int(self._target)


class CheckedClass(Checked):
    """A pycuda class: constructed with the arguments its ``__init__`` takes; only static methods read."""

    def __call__(self, *args: Any) -> Checked:
        assert accepts(self._surface.arities(self._kind, "__init__"), args, {}), f"{self._kind}{args}"
        return Checked(self._target(*args), self._kind, self._surface, self._used)

    def __getattr__(self, name: str) -> Any:
        assert self._record(name).get("static"), f"{self._kind}.{name} read from the class is not a static method"
        return super().__getattr__(name)


def _call(function: Any, arities: list[Arity], name: str, surface: Surface, used: list[str]) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        assert accepts(arities, args, kwargs), f"{name}: {len(args)} arguments"
        result = function(*args, **kwargs)
        kind = type(result).__name__
        return Checked(result, kind, surface, used) if kind in surface.classes else result

    return call


@pytest.fixture
def checked_pycuda(monkeypatch: pytest.MonkeyPatch) -> tuple[FakePyCuda, list[str]]:
    """The fake pycuda installed, ``pycuda.driver`` reached through the checking proxy."""
    fake = FakePyCuda()
    fake.install(monkeypatch)
    used: list[str] = []
    monkeypatch.setattr(fake.package, "driver", Checked(fake.driver, "", load_pycuda(), used))
    monkeypatch.setitem(sys.modules, "pycuda.driver", fake.package.driver)
    return fake, used


def test_the_pycuda_path_runs_on_the_real_surface(checked_pycuda: tuple[FakePyCuda, list[str]]) -> None:
    fake, used = checked_pycuda
    cuda = layer.PyCuda()
    exercise(cuda)
    assert not fake.aborts and fake.stack() == [] and not fake.device
    expected = {"init", "Device", "Device.retain_primary_context", "Context.push", "Context.pop", "Stream"}
    expected |= {"Stream.handle", "Stream.synchronize", "mem_alloc", "DeviceAllocation.free", "pagelocked_empty"}
    expected |= {"memcpy_htod_async", "memcpy_dtoh_async"}
    assert expected <= set(used), expected - set(used)
    written = static_uses("cuda")  # every pycuda.driver name the layer writes was checked by this run,
    unreached = written - set(used)  # but for the exception classes its except clauses name
    assert len(written) >= 9 and all(n.endswith("Error") and n in load_pycuda().classes for n in unreached), unreached


def test_pycuda_without_a_device_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ``init()`` raises its RuntimeError (a ``pycuda.driver.Error``) where the driver sees no GPU."""
    probes = dict(load_pycuda().probes)
    kind, _, message = probes["init()"]["raises"].partition(": ")
    fake = FakePyCuda(no_device=message)
    fake.install(monkeypatch)
    assert kind == "RuntimeError" and "Error" in load_pycuda().classes[kind]["bases"]
    with pytest.raises(SacEdgeError) as err:
        layer.PyCuda()
    assert str(err.value) == f"pycuda cannot open CUDA device 0: {message}"


def test_the_fake_pycuda_matches_the_real_surface() -> None:
    """Every class and function the fake defines is pycuda's: same bases among them, methods as methods
    (static where pycuda's are), properties as properties, argument counts pycuda accepts."""
    surface = load_pycuda()
    driver = FakePyCuda().driver
    names = [n for n in vars(driver) if not n.startswith("_")]
    assert names
    for name in names:
        value = getattr(driver, name)
        if isinstance(value, type):
            assert name in surface.classes, name
            bases = [b.__name__ for b in value.__mro__[1:] if b.__module__ == value.__module__]
            assert all(b in surface.classes[name]["bases"] for b in bases), (name, bases)
            _check_class(surface, name, value)
        else:
            assert name in surface.functions, name
            _check_arity([arity(s, False) for s in surface.functions[name]], value, name, bound=False)


def _check_class(surface: Surface, name: str, cls: type) -> None:
    if issubclass(cls, Exception):
        return
    for member, static in vars(cls).items():
        if member.startswith("_") and member not in ("__init__", "__int__"):
            continue
        record = surface.member(name, member)
        assert record is not None, f"{name}.{member}"
        if isinstance(static, property):
            assert "property" in record, f"{name}.{member} is a method in pycuda"
            continue
        assert "method" in record, f"{name}.{member} is a property in pycuda"
        if member == "__init__" and not record["method"]:  # no constructor: only pycuda's functions make one
            with pytest.raises(RuntimeError, match="cannot be instantiated"):
                cls()
            continue
        assert isinstance(static, staticmethod) == bool(record.get("static")), f"{name}.{member} static"
        _check_arity(surface.arities(name, member), getattr(cls, member), f"{name}.{member}", bound=True)


def _check_arity(arities: list[Arity], function: Any, name: str, bound: bool) -> None:
    params = list(inspect.signature(function).parameters.values())[1 if bound else 0 :]
    least = len([p for p in params if p.default is p.empty])
    assert any(a.least <= least and len(params) <= a.most for a in arities), (name, arities, least, len(params))


def test_the_pycuda_surface_is_the_built_release() -> None:
    surface = load_pycuda()
    assert surface.version == PYCUDA_VERSION
    assert {"Context", "Device", "DeviceAllocation", "Stream", "Error", "LogicError"} <= set(surface.classes)
    assert surface.member("Context", "pop") == {"method": ["pop() -> None"], "static": True}
    assert "property" in (surface.member("Stream", "handle") or {})
