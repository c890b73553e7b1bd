"""One TensorRT code path per generation, and the API-surface check of each path.

The build runs here against ``fake_tensorrt``, a module with exactly one real release's Python names and
signatures (the committed surfaces): these tests check that no path touches a name its TensorRT lacks
(e.g. the ``BuilderFlag.FP16`` that TensorRT 11 removed) and which flags and inputs each path chooses.
Engines built for real are the ``tensorrt``-marked tests in tests/export/test_tensorrt.py and the parity gate
on a device.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from api_surface import load
from fake_tensorrt import REMOVED_IN_11, VERSIONS, fake_tensorrt

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.trt import builder
from sac_edge.common.trt.calib_cache import read_cache, trt_version_code, write_cache
from sac_edge.common.trt.generations import TRT8, TRT10, TRT10_STRONG, TRT11, generation


@pytest.mark.parametrize(
    ("version", "gen"),
    [
        ("8.5.2.2", TRT8),
        ("8.6.1", TRT8),
        ("10.3.0", TRT10),
        ("10.11.0.33", TRT10),
        ("10.12.0.36", TRT10_STRONG),
        ("10.13.2.6", TRT10_STRONG),
        ("11.4.0", TRT11),
    ],
)
def test_generation_is_chosen_from_the_version(version: str, gen: object) -> None:
    assert generation(version) is gen


@pytest.mark.parametrize("version", ["8.4.1", "7.1.3", "12.0.0", "nightly"])
def test_unsupported_tensorrt_is_one_line_naming_the_fix(version: str) -> None:
    with pytest.raises(SacEdgeError) as err:
        generation(version)
    assert "\n" not in str(err.value) and ("8.5/8.6, 10.x or 11.x" in str(err.value) or "reinstall" in str(err.value))


def _has(version: str, name: str) -> bool:
    cls, _, member = name.partition(".")
    surface = load(version)
    return surface.top(cls) and (not member or surface.member(cls, member) is not None)


def test_the_documented_surfaces() -> None:
    """TensorRT 11 lacks what its migration guide removed; 8.5 and 10 have it (the real modules' surfaces)."""
    for name in REMOVED_IN_11:
        assert [_has(v, name) for v in VERSIONS] == [True, True, True, False], name
    for version in VERSIONS:  # the name-based execution API the runner uses exists from 8.5 on
        assert _has(version, "IExecutionContext.execute_async_v3")
        assert _has(version, "IExecutionContext.set_optimization_profile_async")


def _bundle(root: Path) -> Path:
    for name in ("policy.onnx", "policy.fp16.onnx", "policy.int8.onnx"):
        (root / name).write_bytes(b"graph")  # the fake parser does not read it
    write_cache(root / "calib.cache", {"obs": 0.01, "h": 0.02})
    return root


def _build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, precision: str) -> tuple[object, list[str]]:
    module, used = fake_tensorrt(version)
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    monkeypatch.setattr(builder, "tensorrt_unavailable", lambda: None)
    monkeypatch.setattr(builder, "cuda_device", lambda index=0: builder.CudaDevice("Fake GPU", "9.0"))
    root = _bundle(tmp_path)
    onnx, cache = builder.engine_inputs(root, precision, version)
    source = builder.EngineSource(onnx, precision, cache)
    info = builder.build_engine(source, root / f"{precision}.plan", builder.BuildSettings(refit=True))
    return info, used


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_each_generation_path_uses_only_its_own_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, precision: str
) -> None:
    info, used = _build(tmp_path, monkeypatch, version, precision)  # the fake raises on a name it lacks
    assert all(_has(version, u) for u in used if ":" not in u and not u.endswith("__init__"))
    assert info.profiles == 2 and info.refit and "REFIT" in info.flags  # type: ignore[attr-defined]
    gen = generation(version)
    assert info.generation == gen.name  # type: ignore[attr-defined]
    if version.startswith("11"):
        assert not set(REMOVED_IN_11) & set(used)
    if not gen.precision_flags:
        assert info.flags == ("REFIT",)  # type: ignore[attr-defined]  strongly typed: no precision flags
    elif precision != "fp32":
        assert precision.upper() in info.flags  # type: ignore[attr-defined]
    _no_deprecated_flag(version, used)


def _no_deprecated_flag(version: str, used: list[str]) -> None:
    """No builder or network flag the release's own docstrings mark deprecated (10.12+: FP16/INT8 are
    "Superseded by strong typing"; 11: STRONGLY_TYPED is always on and ignored; 10: EXPLICIT_BATCH)."""
    surface = load(version)
    for use in used:
        if use.startswith("set_flag:BuilderFlag."):
            flag = use.rpartition(".")[2]
            assert surface.deprecated("BuilderFlag", flag) is None, (version, flag)
        if use.startswith("create_network:"):
            bits = int(use.partition(":")[2])
            for name, value in surface.enum("NetworkDefinitionCreationFlag").items():
                if bits & (1 << value):
                    assert surface.deprecated("NetworkDefinitionCreationFlag", name) is None, (version, name)


def test_strong_typing_exactly_where_the_release_deprecates_the_precision_flags() -> None:
    for version in VERSIONS:
        surface = load(version)
        superseded = "Superseded by strong typing" in (surface.deprecated("BuilderFlag", "FP16") or "")
        removed = "FP16" not in surface.enum("BuilderFlag")
        gen = generation(version)
        assert gen.precision_flags == (not superseded and not removed), version
        assert gen.strongly_typed_flag == superseded, version


def test_the_inputs_and_int8_source_per_generation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fp16_11, _ = _build(tmp_path, monkeypatch, "11.4.0.106", "fp16")
    assert fp16_11.onnx == "policy.fp16.onnx"  # type: ignore[attr-defined]
    fp16_10, _ = _build(tmp_path, monkeypatch, "10.3.0", "fp16")
    assert fp16_10.onnx == "policy.onnx"  # type: ignore[attr-defined]
    fp16_1013, used = _build(tmp_path, monkeypatch, "10.13.3.9", "fp16")
    assert fp16_1013.onnx == "policy.fp16.onnx" and "create_network:2" in used  # type: ignore[attr-defined]
    int8_8, used = _build(tmp_path, monkeypatch, "8.5.3.1", "int8")
    assert int8_8.onnx == "policy.onnx" and int8_8.int8_source == "calib.cache"  # type: ignore[attr-defined]
    assert int8_8.calib_header == "TRT-8503-EntropyCalibration2"  # type: ignore[attr-defined]
    assert "IBuilderConfig.set_calibration_profile" in used
    for version in ("10.3.0", "10.13.3.9", "11.4.0.106"):
        info, used = _build(tmp_path, monkeypatch, version, "int8")
        assert info.onnx == "policy.int8.onnx" and info.int8_source == "explicit Q/DQ"  # type: ignore[attr-defined]
        assert "IBuilderConfig.int8_calibrator" not in used


def test_the_check_can_fail_the_10x_path_on_11(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same build forced onto the 10.x path against TensorRT 11's names hits the removed flag."""
    monkeypatch.setattr(builder, "generation", lambda version: TRT10)
    with pytest.raises(AttributeError, match=r"BuilderFlag\.FP16"):
        _build(tmp_path, monkeypatch, "11.4.0.106", "fp16")


def test_refit_is_off_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, used = fake_tensorrt("10.3.0")
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    monkeypatch.setattr(builder, "tensorrt_unavailable", lambda: None)
    monkeypatch.setattr(builder, "cuda_device", lambda index=0: builder.CudaDevice("Fake GPU", "9.0"))
    root = _bundle(tmp_path)
    info = builder.build_engine(builder.EngineSource(root / "policy.onnx", "fp32"), root / "x.plan")
    assert not info.refit and "REFIT" not in info.flags and "set_flag:BuilderFlag.REFIT" not in used


def test_calib_cache_header_follows_the_tensorrt_version(tmp_path: Path) -> None:
    from sac_edge.common.trt.calib_cache import for_tensorrt

    assert (trt_version_code("8.5.2.2"), trt_version_code("8.6.1"), trt_version_code("8.4.1")) == (8502, 8601, 8401)
    write_cache(tmp_path / "calib.cache", {"obs": 0.5})
    (tmp_path / "86.cache").write_bytes(for_tensorrt(tmp_path / "calib.cache", "8.6.1.6"))
    cache = read_cache(tmp_path / "86.cache")
    assert cache.trt_version == 8601 and cache.scales == read_cache(tmp_path / "calib.cache").scales
