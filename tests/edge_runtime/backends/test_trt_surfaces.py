"""Every TensorRT use of the product against each generation's real API surface (``tests/trt_surfaces/``).

The build (``common/trt/builder.py``) and the runner (``backends/trt/runner.py``: open, act, act_batch, a
refit swap) run on each release's ``fake_tensorrt``, which raises on a name the release lacks, a method
read as a property, a property it cannot set and an argument count no overload takes. A scan of the
product's source then checks that every ``trt.X.Y`` it writes was reached by those runs, so no use escapes
the check. CUDA is pycuda's model (``fake_pycuda``) and the runner is built directly, not through the
registry that gates it, since no engine computes. Run with ``trt.nptype`` in the runner, the 8.5 case
fails as the real 8.5 does with numpy 1.24.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
from api_surface import VERSIONS, load
from fake_pycuda import fake_runner
from fake_tensorrt import fake_tensorrt

from sac_edge.common.bundle import open_bundle
from sac_edge.common.trt.generations import refit_is_safe
from sac_edge.edge_runtime.backends.base import BackendOptions

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = (
    "common/trt/builder.py",
    "common/trt/api.py",
    "edge_runtime/backends/trt/runner.py",
    "edge_runtime/backends/trt/loader.py",
    "edge_runtime/doctor.py",
)


def run_product(version: str, root: Path, bundle: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The build of every precision and the runner's open, act, act_batch and swap on ``version``'s fake."""
    from sac_edge.common.trt import builder
    from sac_edge.common.trt.calib_cache import write_cache

    runner, used, _ = fake_runner(version, monkeypatch)
    for name in ("policy.onnx", "policy.fp16.onnx", "policy.int8.onnx"):
        (root / name).write_bytes(b"graph")
    write_cache(root / "calib.cache", {"obs": 0.01})
    for precision in ("fp32", "fp16", "int8"):
        onnx, cache = builder.engine_inputs(root, precision, version)
        source = builder.EngineSource(onnx, precision, cache)
        builder.build_engine(source, root / f"{precision}.plan", builder.BuildSettings(refit=True))
    options = BackendOptions(refit=True, engine_dir=root / f"engines-{version}")
    backend = runner.TensorRTBackend(open_bundle(bundle), "fp32", options)
    backend.act(np.zeros(3, np.float32))
    backend.act_batch(np.zeros((70, 3), np.float32))
    backend.swap_weights({"w": np.ones(4, np.float32), "b": np.zeros(2, np.float32)})
    backend.close()
    return used


@pytest.fixture(scope="module")
def uses(pendulum_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    out = {}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for version in VERSIONS:
            out[version] = run_product(version, tmp_path_factory.mktemp(version), pendulum_bundle, monkeypatch)
    return out


def static_uses() -> dict[str, set[str]]:
    """``X`` / ``X.Y`` for every ``trt.X.Y...`` (or ``self.trt.X``) the product's TensorRT modules write."""
    found: dict[str, set[str]] = {}
    for rel in PRODUCT:
        names: set[str] = set()
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            chain = [node.attr]
            base = node.value
            while isinstance(base, ast.Attribute):
                chain.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id == "trt":
                parts = chain
            elif isinstance(base, ast.Name) and base.id == "self" and chain[0] == "trt":
                parts = chain[1:]
            else:
                continue
            if parts and not parts[0].startswith("__"):
                names.add(".".join(parts[:2]))
        found[rel] = names
    return found


@pytest.mark.parametrize("version", VERSIONS)
def test_the_product_runs_on_each_generations_surface(uses: dict[str, list[str]], version: str) -> None:
    surface = load(version)
    for name in uses[version]:
        if ":" in name or name.endswith(".__init__"):  # set_flag:X, create_network:bits
            continue
        cls, _, member = name.partition(".")
        assert surface.top(cls) and (not member or surface.member(cls, member) is not None), name
    assert "nptype" not in uses[version]  # 8.5's raises with numpy 1.24 (its probe in the surface)
    assert "IExecutionContext.execute_async_v3" in uses[version]
    refits = {"Refitter.set_named_weights", "Weights"}  # from 11.3 a swap rebuilds (refit_is_safe)
    assert (refits <= set(uses[version])) == refit_is_safe(version), version


def test_every_static_use_was_reached(uses: dict[str, list[str]]) -> None:
    reached = {u for names in uses.values() for u in names}
    plain = {"ILogger", "IInt8EntropyCalibrator2"}  # Python base classes: a nested read is not recorded
    for rel, names in static_uses().items():
        for name in sorted(names):
            top, _, member = name.partition(".")
            if top in plain and member:
                assert all(load(v).member(top, member) is not None for v in VERSIONS if load(v).top(top)), name
                continue
            assert name in reached or any(u.startswith(name + ".") for u in reached), f"{rel}: trt.{name} never run"
    assert sum(len(n) for n in static_uses().values()) >= 20


@pytest.mark.parametrize("version", VERSIONS)
def test_the_fake_agrees_with_its_surface(version: str) -> None:
    """Every member the fake gives behaviour is the release's, as a method taking the release's argument
    counts or as a property; its enums hold the release's values."""
    trt, _ = fake_tensorrt(version)
    surface = load(version)
    for flag, value in surface.enum("BuilderFlag").items():
        assert int(getattr(trt.BuilderFlag, flag)) == value
    objects = [trt.Builder(trt.ILogger()), trt.Runtime(trt.ILogger())]
    seen: set[str] = set()
    while objects:
        item = objects.pop()
        kind, values = item._kind, item._values
        if kind in seen:
            continue
        seen.add(kind)
        for name, value in values.items():
            record = surface.member(kind, name)
            assert record is not None, f"{kind}.{name}"
            if "method" in record:
                assert callable(value), f"{kind}.{name} is a method in TensorRT {version}"
                params = inspect.signature(value).parameters.values()
                varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
                takes = {len([p for p in params if p.default is p.empty]), len(list(params))}
                assert varargs or any(a.least in takes or a.most in takes for a in surface.arities(kind, name))
                if not any(p.default is p.empty for p in params) and not varargs:
                    result = value()
                    if hasattr(result, "_kind"):
                        objects.append(result)
            else:
                assert "property" in record or "enum" in record, f"{kind}.{name}"
                if hasattr(value, "_kind"):
                    objects.append(value)
    assert {"Builder", "IBuilderConfig", "Runtime"} <= seen
