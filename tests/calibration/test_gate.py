from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import onnx
import pytest

from sac_edge.calibration.calibrators import compute_amax
from sac_edge.calibration.gate import Candidates, GateSettings, gate_model, render_table, run_gate, worst_return
from sac_edge.calibration.graph import layer_name, linear_nodes
from sac_edge.calibration.qdq import quantizable_tensors, quantize_model
from sac_edge.calibration.session import collect_activations
from sac_edge.calibration.states import StateSets
from sac_edge.common.spec import PolicySpec

EPISODES = 3


@pytest.fixture(scope="module")
def amax(fp32_model: onnx.ModelProto, states: StateSets) -> dict[str, float]:
    acts = collect_activations(fp32_model, states.calibration, list(quantizable_tensors(fp32_model)))
    return compute_amax(acts, "percentile")


@pytest.fixture(scope="module")
def pendulum_worst() -> tuple[float, str]:
    return worst_return("Pendulum-v1", [0])


def test_pendulum_worst_return_is_analytic(pendulum_worst: tuple[float, str]) -> None:
    value, source = pendulum_worst
    assert value == pytest.approx(-16.2736044 * 200, abs=1e-3)
    assert "analytic" in source


def test_measured_worst_return_for_other_envs() -> None:
    value, source = worst_return("MountainCarContinuous-v0", [0])
    assert "measured" in source and value <= 0.0


def test_faithful_int8_is_accepted(
    fp32_onnx: Path, amax: dict[str, float], states: StateSets, spec: PolicySpec, pendulum_worst: tuple[float, str]
) -> None:
    # The trained actor is a high-gain stabiliser: int8 on its 3-dim input layer alone costs ~1.4% of the
    # range, so the faithful INT8 model is the one the gate settles on, with the last layer in int8.
    model = onnx.load(str(fp32_onnx))
    int8 = quantize_model(model, amax, float_layers={layer_name(n) for n in linear_nodes(model)[:-1]})
    report = gate_model(fp32_onnx, int8, states.holdout, spec, GateSettings(EPISODES, worst=pendulum_worst))
    assert report.accepted, render_table(report)
    assert report.mean_action_error_frac <= 0.01 and report.max_action_error > 0
    assert report.mean_action_error == pytest.approx(report.mean_action_error_frac * 4.0)
    assert len(report.fp32_returns) == len(report.int8_returns) == EPISODES
    assert report.return_drop <= report.allowed_return_drop
    assert report.allowed_return_drop == pytest.approx(0.02 * (report.fp32_mean_return - report.worst_return))
    json.dumps(report.to_dict())


def test_broken_int8_is_rejected(
    fp32_onnx: Path, amax: dict[str, float], states: StateSets, spec: PolicySpec, pendulum_worst: tuple[float, str]
) -> None:
    broken = quantize_model(onnx.load(str(fp32_onnx)), {k: v / 100 for k, v in amax.items()})
    report = gate_model(fp32_onnx, broken, states.holdout, spec, GateSettings(EPISODES, worst=pendulum_worst))
    assert not report.accepted and report.verdict == "rejected"
    assert report.mean_action_error_frac > 0.01
    table = render_table(report)
    assert "REJECTED" in table and "NO" in table
    # a figure without a limit ends in the value column (the demo's max error in env units read as a limit)
    value_end = len(table.splitlines()[1].split("limit")[0].rstrip())
    for name in ("mean action error (env units)", "max action error (env units)"):
        (line,) = [line for line in table.splitlines() if name in line]
        assert len(line.rstrip()) == value_end, table
    assert json.loads(json.dumps(report.to_dict()))["verdict"] == "rejected"


def test_sensitive_layer_is_kept_in_float(
    fp32_model: onnx.ModelProto,
    amax: dict[str, float],
    states: StateSets,
    spec: PolicySpec,
    pendulum_worst: tuple[float, str],
) -> None:
    layers = [layer_name(n) for n in linear_nodes(fp32_model)]
    first, middle, last = layers
    bad_input = linear_nodes(fp32_model)[1].input[0]
    sabotaged = {**amax, bad_input: amax[bad_input] / 100}  # only the middle layer's input range is wrong

    def build(float_layers: frozenset[str]) -> onnx.ModelProto:
        return quantize_model(fp32_model, sabotaged, float_layers=float_layers)

    candidates = Candidates(build, layers, keep_float={first})
    report, model = run_gate(fp32_model, candidates, states.holdout, spec, GateSettings(EPISODES, worst=pendulum_worst))
    assert report.accepted and model is not None, render_table(report)
    assert report.float_layers == (first, middle)
    by_name = {layer.name: layer for layer in report.layers}
    assert by_name[last].precision == "int8" and by_name[first].sensitivity is None  # forced, not measured
    assert (by_name[middle].sensitivity or 0.0) > 0.05 > (by_name[last].sensitivity or 1.0)
    assert [a.passed for a in report.attempts] == [False, True]
    assert report.mean_action_error_frac <= 0.01
    assert "attempt 1" in render_table(report)


def test_without_an_env_the_action_rule_alone_decides(
    fp32_onnx: Path, amax: dict[str, float], states: StateSets, spec: PolicySpec
) -> None:
    model = onnx.load(str(fp32_onnx))
    int8 = quantize_model(model, amax, float_layers={layer_name(n) for n in linear_nodes(model)[:-1]})
    report = gate_model(fp32_onnx, int8, states.holdout, replace(spec, env_id=""), GateSettings(EPISODES))
    assert report.accepted and report.episode_seeds == () and report.fp32_returns == ()
    assert report.worst_return_source.startswith("no environment") and math.isnan(report.allowed_return_drop)
    assert "skipped: no --env" in render_table(report)
