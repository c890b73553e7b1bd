"""The robot's I/O layout: which named robot values make which slots of the observation, and which joint each
action slot commands (docs/CONTRACTS.md, "Layout").

``sac-export --layout FILE`` checks a layout against the policy's dimensions and stores it in the bundle
(``layout.json``, under the checksums and the signature); ``bundle_layout`` reads it back from the verified
bytes. It needs neither ROS nor torch: a robot's own loop builds the observation from named values with
``IoLayout.observation`` and splits the action by joint name with ``IoLayout.command``; the ROS 2 node maps a
``JointState``'s name order once (``IoLayout.joint_map``) and then gathers by index. Every mistake is one line
naming the joint, the part or the size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .bounded import read_capped
from .bundle_format import LAYOUT_KIND
from .errors import SacEdgeError

LAYOUT_VERSION = 1
#: A layout file is a few KiB; anything past this is not one.
MAX_LAYOUT_BYTES = 1 << 20
JOINT_FIELDS = ("position", "velocity", "effort")
IMU_FIELDS = {"angular_velocity": 3, "linear_acceleration": 3, "orientation": 4}
SOURCES = ("joint_states", "imu", "vector")
TRANSFORMS = ("none", "cos", "sin")
INTERFACES = ("position", "velocity", "effort")
_PART_KEYS = {"source", "field", "joints", "topic", "size", "offset", "scale", "transform"}
_TOP_KEYS = {"version", "observation", "action", "ignore_joints"}
_ACTION_KEYS = {"interface", "joints", "scale", "offset", "min", "max"}
#: The largest command a layout may make from an action within the policy's bounds: float32's largest value,
#: so every command is finite as the double a ROS message carries and as a float a controller may keep.
MAX_COMMAND = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class ObsPart:
    """One run of observation slots: joint fields, an IMU field or a raw vector topic."""

    source: str
    field: str | None
    joints: tuple[str, ...]
    topic: str | None
    size: int
    offset: np.ndarray
    scale: np.ndarray
    transform: str

    def finish(self, raw: np.ndarray) -> np.ndarray:
        """The slots' values from the raw robot values (float64): ``scale * transform(raw - offset)``."""
        value = raw - self.offset
        if self.transform == "cos":
            value = np.cos(value)
        elif self.transform == "sin":
            value = np.sin(value)
        return value * self.scale

    def describe(self) -> str:
        if self.source == "joint_states":
            return f"joint_states {self.field} of {', '.join(self.joints)}"
        if self.source == "imu":
            return f"imu {self.field} on {self.topic}"
        return f"vector on {self.topic} ({self.size} values)"


@dataclass(frozen=True)
class ActionLayout:
    """The command: one joint per action slot, in the order a forward command controller's ``joints`` take."""

    interface: str
    joints: tuple[str, ...]
    scale: np.ndarray
    offset: np.ndarray
    low: np.ndarray | None = None
    """Per joint, the lowest command (after scale and offset; None: no limit): commands are clamped to
    [low, high], since a forward command controller passes on whatever it gets."""
    high: np.ndarray | None = None


@dataclass(frozen=True)
class JointMap:
    """Where each joint_states part's joints sit in a ``JointState`` of one name order (``IoLayout.joint_map``)."""

    names: tuple[str, ...]
    index: tuple[np.ndarray | None, ...]
    """Per observation part: indices into the message's arrays (None for parts from other topics)."""


@dataclass(frozen=True)
class IoLayout:
    """A parsed, checked layout (``parse_layout``)."""

    parts: tuple[ObsPart, ...]
    """The observation's parts, in order."""
    action: ActionLayout
    ignore_joints: tuple[str, ...]

    @property
    def obs_dim(self) -> int:
        return sum(p.size for p in self.parts)

    @property
    def act_dim(self) -> int:
        return len(self.action.joints)

    @property
    def state_joints(self) -> tuple[str, ...]:
        """Every joint the layout reads from or commands, each once, in first-use order."""
        seen: dict[str, None] = {}
        for part in self.parts:
            seen.update(dict.fromkeys(part.joints))
        seen.update(dict.fromkeys(self.action.joints))
        return tuple(seen)

    @property
    def topics(self) -> tuple[str, ...]:
        """The topics of the imu and vector parts, each once."""
        return tuple(dict.fromkeys(p.topic for p in self.parts if p.topic is not None))

    def to_dict(self) -> dict[str, Any]:
        """The layout as the JSON the bundle stores (every default spelled out)."""
        parts = []
        for p in self.parts:
            part: dict[str, Any] = {"source": p.source}
            if p.field is not None:
                part["field"] = p.field
            if p.joints:
                part["joints"] = list(p.joints)
            if p.topic is not None:
                part["topic"] = p.topic
            if p.source == "vector":
                part["size"] = p.size
            part.update(offset=p.offset.tolist(), scale=p.scale.tolist(), transform=p.transform)
            parts.append(part)
        a = self.action
        action = {
            "interface": a.interface,
            "joints": list(a.joints),
            "scale": a.scale.tolist(),
            "offset": a.offset.tolist(),
        }
        if a.low is not None:
            action["min"] = a.low.tolist()
        if a.high is not None:
            action["max"] = a.high.tolist()
        return {
            "version": LAYOUT_VERSION,
            "observation": parts,
            "action": action,
            "ignore_joints": list(self.ignore_joints),
        }

    def check_dims(self, obs_dim: int, act_dim: int, source: str) -> None:
        """One line when the layout does not fill the policy's observation or command its action."""
        if self.obs_dim != obs_dim:
            sizes = " + ".join(str(p.size) for p in self.parts)
            raise SacEdgeError(
                f"{source}: the layout's observation has {self.obs_dim} values ({sizes}) but the policy takes "
                f"{obs_dim}; add or remove parts so the sizes sum to {obs_dim}"
            )
        if self.act_dim != act_dim:
            raise SacEdgeError(
                f"{source}: the layout's action names {self.act_dim} joints but the policy outputs {act_dim} "
                f"values; list {act_dim} joints under action.joints"
            )

    def check_commands(self, action_low: Sequence[float], action_high: Sequence[float], source: str) -> None:
        """One line when a command ``offset + scale * action`` for an action within the policy's bounds could
        be larger than ``MAX_COMMAND`` (a scale of 1e308 makes ``+inf`` from an action of 2: sent to the robot);
        ``check_dims`` first."""
        a = self.action
        low, high = np.asarray(action_low, np.float64), np.asarray(action_high, np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            reach = np.abs(a.offset) + np.abs(a.scale) * np.maximum(np.abs(low), np.abs(high))
        bad = np.flatnonzero(~(reach <= MAX_COMMAND))
        if bad.size:
            i = int(bad[0])
            raise SacEdgeError(
                f"{source}: the command of joint {a.joints[i]!r}, offset {a.offset[i]:.3g} + scale {a.scale[i]:.3g} "
                f"* an action in [{low[i]:.3g}, {high[i]:.3g}], reaches {reach[i]:.3g}, past {MAX_COMMAND:.3g} (a "
                "command must be finite, as a float too); fix action.scale and action.offset"
            )

    # -- the robot's values -> the observation --------------------------------------------------------
    def joint_map(self, names: Sequence[str], source: str = "JointState") -> JointMap:
        """The index of every layout joint in a ``JointState`` whose ``name`` is ``names``. A joint the layout
        uses that the message lacks, a joint the message has that the layout neither uses nor lists in
        ``ignore_joints``, or a name given twice is one line naming it. Linear in the number of joints."""
        given = list(names)
        where: dict[str, int] = {}
        for i, name in enumerate(given):
            if name in where:
                raise SacEdgeError(f"{source}: joint {name!r} appears twice in its name list")
            where[name] = i
        used = self.state_joints
        missing = [j for j in used if j not in where]
        if missing:
            raise SacEdgeError(
                f"{source}: joint {missing[0]!r} of the layout is missing (the robot publishes "
                f"{_few(given) or 'no joints'}); fix the joint's name in the layout"
            )
        known = {*used, *self.ignore_joints}
        extra = [n for n in given if n not in known]
        if extra:
            raise SacEdgeError(
                f"{source}: joint {extra[0]!r} is published by the robot but not in the layout; use it in the "
                "layout or list it under ignore_joints"
            )
        index = tuple(
            np.array([where[j] for j in p.joints], dtype=np.intp) if p.source == "joint_states" else None
            for p in self.parts
        )
        return JointMap(tuple(given), index)

    def gather(
        self,
        out: np.ndarray,
        jmap: JointMap,
        fields: Mapping[str, Sequence[float]],
        topics: Mapping[str, Any],
        source: str = "JointState",
    ) -> np.ndarray:
        """Fill ``out`` (float32, ``obs_dim``) from one ``JointState``'s arrays by field (``position``...,
        in ``jmap``'s name order) and the other parts' latest values by topic (an imu part's value is a mapping
        field -> numbers). An empty or short field array is one line (a robot that publishes no velocities
        for a layout that reads them)."""
        at = 0
        for part, idx in zip(self.parts, jmap.index):
            if idx is not None:
                values = fields.get(part.field or "")
                raw = np.asarray(values if values is not None else (), dtype=np.float64)
                if raw.shape[0] != len(jmap.names):
                    raise SacEdgeError(
                        f"{source}: its {part.field} has {raw.shape[0]} values for {len(jmap.names)} joints; the "
                        f"layout reads {part.describe()}"
                    )
                raw = raw[idx]
            else:
                raw = self._topic_values(part, topics)
            out[at : at + part.size] = part.finish(raw)
            at += part.size
        return out

    def _topic_values(self, part: ObsPart, topics: Mapping[str, Any]) -> np.ndarray:
        assert part.topic is not None
        value = topics.get(part.topic)
        if value is None:
            raise SacEdgeError(f"layout: no value for {part.describe()}")
        if part.source == "imu":
            value = value.get(part.field) if isinstance(value, Mapping) else None
            if value is None:
                raise SacEdgeError(f"layout: no {part.field} for {part.describe()}")
        raw = np.asarray(value, dtype=np.float64).reshape(-1)
        if raw.shape[0] != part.size:
            raise SacEdgeError(f"layout: {part.describe()} got {raw.shape[0]} values, needs {part.size}")
        return raw

    def observation(
        self, joints: Mapping[str, Mapping[str, float]] | None = None, topics: Mapping[str, Any] | None = None
    ) -> np.ndarray:
        """The observation (float32) from named values: ``joints[field][joint]`` (``{"position": {"j1": 0.1},
        ...}``) and ``topics[topic]`` for imu parts (a mapping field -> numbers) and vector parts (numbers).
        A missing joint, field or topic, or a wrong size, is one line naming it."""
        joints = joints or {}
        names = self.state_joints
        fields: dict[str, list[float]] = {}
        for part in self.parts:
            if part.source != "joint_states" or part.field in fields:
                continue
            by_joint = joints.get(part.field or "")
            if by_joint is None:
                raise SacEdgeError(f"layout: no {part.field} values given (the layout reads {part.describe()})")
            missing = [j for j in names if j in part.joints and j not in by_joint]
            if missing:
                raise SacEdgeError(f"layout: joint {missing[0]!r} has no {part.field} value")
            fields[part.field or ""] = [float(by_joint.get(j, math.nan)) for j in names]
        jmap = JointMap(
            names,
            tuple(
                np.array([names.index(j) for j in p.joints], np.intp) if p.source == "joint_states" else None
                for p in self.parts
            ),
        )
        return self.gather(np.empty(self.obs_dim, np.float32), jmap, fields, topics or {}, "layout")

    # -- the action -> commands -----------------------------------------------------------------------
    def command_vector(self, action: Any, out: np.ndarray | None = None) -> np.ndarray:
        """The command in the layout's joint order (float64): ``offset + scale * action``."""
        a = self.action
        act = np.asarray(action, dtype=np.float64).reshape(-1)
        if act.shape[0] != len(a.joints):
            raise SacEdgeError(f"layout: the action has {act.shape[0]} values for {len(a.joints)} joints")
        if out is None:
            out = np.empty(len(a.joints), np.float64)
        np.multiply(act, a.scale, out=out)
        out += a.offset
        if a.low is not None:
            np.maximum(out, a.low, out=out)
        if a.high is not None:
            np.minimum(out, a.high, out=out)
        return out

    def command_terms(self) -> list[tuple[float, float, float, float]]:
        """Per action joint ``(scale, offset, low, high)`` as Python floats (no limit: an infinity), for
        ``command_into``."""
        a, n, inf = self.action, len(self.action.joints), math.inf
        low = a.low.tolist() if a.low is not None else [-inf] * n
        high = a.high.tolist() if a.high is not None else [inf] * n
        return list(zip(a.scale.tolist(), a.offset.tolist(), low, high))

    @staticmethod
    def command_into(values: list[float], terms: list[tuple[float, float, float, float]], out: Any) -> bool:
        """``command_vector`` over Python floats (the same float64 arithmetic) written into ``out`` (a float64
        buffer, e.g. a message's ``array.array``): the cheaper form at a robot's few joints, one call and no
        array temporaries a step. ``values``: the action; ``terms``: ``command_terms()``. Returns whether
        every command is finite."""
        if len(values) != len(terms):
            raise SacEdgeError(f"layout: the action has {len(values)} values for {len(terms)} joints")
        finite = True
        for i, (v, (scale, offset, low, high)) in enumerate(zip(values, terms)):
            v = v * scale + offset
            if v < low:
                v = low
            elif v > high:
                v = high
            if not -math.inf < v < math.inf:  # NaN too
                finite = False
            out[i] = v
        return finite

    def command(self, action: Any) -> dict[str, float]:
        """The command split by joint name: ``{joint: offset + scale * action}``."""
        return dict(zip(self.action.joints, self.command_vector(action).tolist()))


# -- parsing -----------------------------------------------------------------------------------------------
def load_layout(path: str | Path) -> IoLayout:
    """Read and check a layout file (JSON, or YAML where PyYAML is installed); one line on any problem."""
    p = Path(path)
    if not p.is_file():
        raise SacEdgeError(f"--layout {path}: no such file")
    data = read_capped(p, MAX_LAYOUT_BYTES, "the layout file", "a layout is a few KiB of JSON (docs/CONTRACTS.md)")
    return parse_layout(data, f"--layout {path}", yaml=p.suffix.lower() in (".yaml", ".yml"))


def bundle_layout(bundle: Any) -> IoLayout | None:
    """The layout stored in a verified bundle (``common.bundle.Bundle``), from its verified bytes; None
    when it was exported without ``--layout``."""
    names = bundle.files(LAYOUT_KIND)
    if not names:
        return None
    path = bundle.path / names[0]
    layout = parse_layout(bundle.read(path), str(path))
    layout.check_dims(bundle.frame_dim, bundle.spec.act_dim, str(path))  # the frame: the runtime assembles the rest
    layout.check_commands(bundle.spec.action_low, bundle.spec.action_high, str(path))
    return layout


def parse_layout(data: bytes | str, source: str, *, yaml: bool = False) -> IoLayout:
    """A layout from JSON (or YAML) text; every part checked, one line naming the first problem."""
    try:
        if yaml:
            try:
                import yaml as pyyaml  # type: ignore[import-untyped]
            except ImportError:
                raise SacEdgeError(
                    f"{source}: reading YAML needs PyYAML (pip install pyyaml); or write it as JSON"
                ) from None
            raw = pyyaml.safe_load(data)
        else:
            raw = json.loads(data)
    except SacEdgeError:
        raise
    except Exception as err:  # json's or yaml's syntax errors
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise SacEdgeError(f"{source}: not a valid layout file ({first})") from None
    if not isinstance(raw, dict):
        raise SacEdgeError(f"{source}: a layout is an object with 'observation' and 'action'")
    _no_unknown(raw, _TOP_KEYS, source)
    version = raw.get("version", LAYOUT_VERSION)
    if type(version) is not int or version != LAYOUT_VERSION:  # ``true`` == 1 in Python: not a version
        raise SacEdgeError(f"{source}: layout version {_shown(version)} is not {LAYOUT_VERSION}; upgrade sac-edge")
    obs = raw.get("observation")
    if not isinstance(obs, list) or not obs:
        raise SacEdgeError(f"{source}: 'observation' must be a non-empty list of parts")
    parts = tuple(_part(p, f"{source}: observation[{i}]") for i, p in enumerate(obs))
    action = _action(raw.get("action"), f"{source}: action")
    ignore = _names(raw.get("ignore_joints", []), f"{source}: ignore_joints", allow_empty=True)
    clash = sorted(set(ignore) & {j for p in parts for j in p.joints} | set(ignore) & set(action.joints))
    if clash:
        raise SacEdgeError(f"{source}: joint {clash[0]!r} is both used and listed in ignore_joints")
    return IoLayout(parts, action, ignore)


def _no_unknown(raw: Mapping[str, Any], known: set[str], source: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SacEdgeError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def _shown(value: Any) -> str:
    """A value from the file as a message shows it: its repr, cut short (a 4,000-digit number, a long text)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**40 else f"a {len(str(value))}-digit number"
    return text if len(text) <= 60 else text[:57] + "..."


def _few(names: Sequence[str], most: int = 8) -> str:
    """The first ``most`` names, then how many more (a 16,000-joint list would otherwise be the message)."""
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown} and {len(names) - most} more"


def _choice(value: Any, choices: Sequence[str], what: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise SacEdgeError(f"{what} must be one of {', '.join(choices)}, got {_shown(value)}")
    return value


def _names(value: Any, what: str, allow_empty: bool = False) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or not all(isinstance(v, str) and v for v in value)
        or (not value and not allow_empty)
    ):
        raise SacEdgeError(f"{what} must be a {'' if allow_empty else 'non-empty '}list of joint names")
    seen = set()
    for name in value:
        if name in seen:
            raise SacEdgeError(f"{what}: joint {name!r} is listed twice")
        seen.add(name)
    return tuple(value)


def _numbers(value: Any, size: int, default: float, what: str) -> np.ndarray:
    """One number for every slot, or one per slot; finite."""
    if value is None:
        return np.full(size, default)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        values = [value] * size
    elif isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        if len(value) != size:
            raise SacEdgeError(f"{what} has {len(value)} values for {size} slots; give one number or {size}")
        values = value
    else:
        raise SacEdgeError(f"{what} must be a number or a list of {size} numbers")
    try:
        out = np.array([float(v) for v in values], dtype=np.float64)
    except OverflowError:  # an integer of 400 digits: past any float
        out = np.full(size, np.inf)
    if not np.isfinite(out).all():
        raise SacEdgeError(f"{what} must be finite numbers (at most {np.finfo(np.float64).max:.3g})")
    return out


def _part(raw: Any, what: str) -> ObsPart:
    if not isinstance(raw, dict):
        raise SacEdgeError(f"{what} must be an object with a 'source'")
    _no_unknown(raw, _PART_KEYS, what)
    source = _choice(raw.get("source"), SOURCES, f"{what}.source")
    joints: tuple[str, ...] = ()
    topic = field = None
    if source == "joint_states":
        field = _choice(raw.get("field"), JOINT_FIELDS, f"{what}.field")
        joints = _names(raw.get("joints"), f"{what}.joints")
        size = len(joints)
        if "topic" in raw or "size" in raw:
            raise SacEdgeError(f"{what}: a joint_states part comes from the state topic; drop 'topic' and 'size'")
    else:
        topic = raw.get("topic")
        if not isinstance(topic, str) or not topic:
            raise SacEdgeError(f"{what}: a {source} part needs its 'topic'")
        if "joints" in raw:
            raise SacEdgeError(f"{what}: a {source} part has no 'joints'")
        if source == "imu":
            field = _choice(raw.get("field"), tuple(IMU_FIELDS), f"{what}.field")
            size = IMU_FIELDS[field]
        else:
            given = raw.get("size")
            if not isinstance(given, int) or isinstance(given, bool) or not 1 <= given <= 65536:
                raise SacEdgeError(f"{what}: a vector part needs its 'size' (1 to 65536)")
            size = given
    transform = _choice(raw.get("transform", "none"), TRANSFORMS, f"{what}.transform")
    offset = _numbers(raw.get("offset"), size, 0.0, f"{what}.offset")
    scale = _numbers(raw.get("scale"), size, 1.0, f"{what}.scale")
    return ObsPart(source, field, joints, topic, size, offset, scale, transform)


def _action(raw: Any, what: str) -> ActionLayout:
    if not isinstance(raw, dict):
        raise SacEdgeError(f"{what} must be an object with 'interface' and 'joints'")
    _no_unknown(raw, _ACTION_KEYS, what)
    interface = _choice(raw.get("interface"), INTERFACES, f"{what}.interface")
    joints = _names(raw.get("joints"), f"{what}.joints")
    scale = _numbers(raw.get("scale"), len(joints), 1.0, f"{what}.scale")
    offset = _numbers(raw.get("offset"), len(joints), 0.0, f"{what}.offset")
    low, high = (_numbers(raw[k], len(joints), 0.0, f"{what}.{k}") if k in raw else None for k in ("min", "max"))
    if low is not None and high is not None and (low > high).any():
        i = int(np.flatnonzero(low > high)[0])
        raise SacEdgeError(f"{what}: joint {joints[i]!r} has min {low[i]:g} above max {high[i]:g}; swap them")
    return ActionLayout(interface, joints, scale, offset, low, high)
