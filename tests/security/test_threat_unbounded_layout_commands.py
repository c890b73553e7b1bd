"""Threat: a layout (``sac-export --layout FILE``) whose numbers hurt the robot or the reader.

A finite but huge action ``scale``/``offset`` (1e308) passed every check, was signed into the bundle, and
``offset + scale * action`` overflowed to ``+inf`` on the command topic: every command over the policy's
action bounds must be finite (at most ``MAX_COMMAND``), checked at export and again when a bundle's layout
is read. A number of 400 digits is one line, not an OverflowError; ``"version": true`` is not version 1; a
JointState of 16,000 names is mapped in linear time (it took 80 s)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.io_layout import MAX_COMMAND, IoLayout, bundle_layout, parse_layout
from sac_edge.export.cli import main as export_main

PENDULUM = json.loads((Path(__file__).resolve().parents[2] / "docs" / "examples" / "pendulum.layout.json").read_text())


def _pendulum(**action: object) -> dict:
    """The Pendulum example layout with ``action`` fields replaced."""
    layout = json.loads(json.dumps(PENDULUM))
    layout["action"].update(action)
    return layout


@pytest.mark.parametrize(
    ("action", "says"),
    [
        ({"scale": 1e308}, "reaches inf"),
        ({"offset": 1e308}, "reaches 1e+308"),
        ({"scale": [-2e38]}, "reaches 4e+38"),
    ],
    ids=["scale-1e308", "offset-1e308", "scale-past-float32"],
)
def test_a_layout_whose_commands_are_not_finite_is_refused_at_export(
    action: dict, says: str, sb3_zip: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps(_pendulum(**action)))
    out = tmp_path / "bundle"
    err = refused(export_main, [str(sb3_zip), "--layout", str(layout), "--out", str(out)], prog="sac-export")
    assert says in err and "joint 'pendulum'" in err and "an action in [-2, 2]" in err, err
    assert "fix action.scale and action.offset" in err
    assert not out.exists()


def test_the_command_bound_is_float32s_largest_value() -> None:
    """Commands up to float32's largest value pass (a gearbox's scale of 1e6 is fine); one step past fails."""
    layout = parse_layout(json.dumps(_pendulum(scale=1e6, offset=-3.0)), "test")
    layout.check_commands([-2.0], [2.0], "test")
    assert layout.command([2.0]) == {"pendulum": 2e6 - 3.0}
    edge = parse_layout(json.dumps(_pendulum(scale=MAX_COMMAND / 2)), "test")
    edge.check_commands([-2.0], [2.0], "test")
    with pytest.raises(SacEdgeError, match="reaches"):
        edge.check_commands([-2.0], [2.0000001], "test")


def test_a_bundle_signed_with_such_a_layout_is_refused_when_read(tmp_path: Path) -> None:
    """A bundle exported before the check (its layout under the checksums) is refused by every reader."""
    from bundles import make_bundle
    from sac_edge.common.bundle import open_bundle

    out = tmp_path / "bundle"
    out.mkdir()
    (out / "layout.json").write_text(json.dumps(_pendulum(scale=1e308)))
    make_bundle(out, int8=None)
    with pytest.raises(SacEdgeError, match=r"layout.json: the command of joint 'pendulum'.* reaches inf"):
        bundle_layout(open_bundle(out))


@pytest.mark.parametrize(
    "where",
    [("action", "scale"), ("action", "offset"), ("observation", "offset")],
    ids=["action-scale", "action-offset", "observation-offset"],
)
def test_a_400_digit_number_is_one_line(
    where: tuple[str, str], sb3_zip: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    text = json.dumps(PENDULUM)
    part, key = where
    target = '"joints": ["pendulum"]}' if part == "action" else '"transform": "cos"}'
    layout = tmp_path / "layout.json"
    layout.write_text(text.replace(target, target[:-1] + f', "{key}": [1{"0" * 400}]}}', 1))
    err = refused(export_main, [str(sb3_zip), "--layout", str(layout), "--out", str(tmp_path / "b")], prog="sac-export")
    assert f"{key} must be finite numbers" in err, err


@pytest.mark.parametrize("version", [True, 1.0, "1", 10**400], ids=["true", "1.0", "text", "400-digits"])
def test_only_the_integer_1_is_version_1(version: object) -> None:
    with pytest.raises(SacEdgeError, match="is not 1; upgrade sac-edge") as refused:
        parse_layout(json.dumps({**PENDULUM, "version": version}), "test")
    assert len(str(refused.value)) < 200


class _Name(str):
    """A joint name that counts how often it is hashed (each set or dict it is looked up in)."""

    hashes = 0

    def __hash__(self) -> int:
        _Name.hashes += 1
        return str.__hash__(self)


def _named(joints: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_Name(j) for j in joints)


def _counting(layout: IoLayout) -> IoLayout:
    """``layout`` with every joint name a ``_Name``."""
    parts = tuple(dataclasses.replace(p, joints=_named(p.joints)) for p in layout.parts)
    action = dataclasses.replace(layout.action, joints=_named(layout.action.joints))
    return dataclasses.replace(layout, parts=parts, action=action)


def test_mapping_a_joint_state_of_thousands_of_names_is_linear() -> None:
    """Counted, not timed: before, each published name rebuilt the set of the layout's joints (2,000 joints:
    4 million hashes; 16,000 joints: 80 s)."""
    n = 2000
    joints = [f"j{i}" for i in range(n)]
    raw = {
        "observation": [{"source": "joint_states", "field": "position", "joints": joints}],
        "action": {"interface": "effort", "joints": joints[:1]},
    }
    layout = _counting(parse_layout(json.dumps(raw), "test"))
    _Name.hashes = 0
    jmap = layout.joint_map(list(reversed(joints)))
    assert jmap.index[0] is not None and jmap.index[0][0] == n - 1
    assert _Name.hashes < 10 * n, _Name.hashes
    says = r"joint 'j0' of the layout is missing \(the robot publishes j1, j2, .* and 1991 more\)"
    with pytest.raises(SacEdgeError, match=says) as refused:
        layout.joint_map(joints[1:])
    assert len(str(refused.value)) < 300
