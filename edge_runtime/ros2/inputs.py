"""The robot's inputs as the node reads them: ``sensor_msgs/JointState`` merged by joint name (each layout
joint's latest position, velocity and effort and when it came, from any number of publishers on the state
topic: an arm driver and a gripper driver each publishing their own joints), and the layout's other topics
(imu, vector) with their arrival times. ``RobotInputs.read(now, obs)`` fills the observation and says which
input is stale."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.io_layout import JOINT_FIELDS, IoLayout
from sac_edge.edge_runtime.control.safety import PYTHON_CHECK_MAX

#: Name orders remembered (a robot has one or a few publishers; a hostile one changing its names each
#: message only costs a map each).
MAX_NAME_ORDERS = 16
STATE = "state"
"""The JointState input's name in stale reports."""
NEVER = -(1 << 62)
"""The arrival time of an input not seen yet (a clock may read 0: simulated time before the first /clock)."""


def escaped(text: str, limit: int = 200) -> str:
    """``text`` safe to log on one line: control characters escaped, cut at ``limit`` characters."""
    out = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return out if len(out) <= limit else out[:limit] + "..."


class RobotInputs:
    """The latest value of every input the layout reads, and when it came (``clock_ns``: the node's clock)."""

    def __init__(self, layout: IoLayout, state_topic: str, clock_ns: Callable[[], int]) -> None:
        self.layout = layout
        self.source = f"JointState on {state_topic}"
        self.joints = layout.state_joints
        self._where = {name: i for i, name in enumerate(self.joints)}
        self._ignored = frozenset(layout.ignore_joints)
        n = len(self.joints)
        self._fields = {f: np.full(n, math.nan) for f in JOINT_FIELDS}
        self._arrays = self._fields  # what gather reads, by field, in ``joints``' order
        self._needed = tuple(dict.fromkeys(
            [p.field for p in layout.parts if p.source == "joint_states" and p.field]
            + (["position"] if layout.action.interface == "position" else [])
        ))  # fmt: skip
        self._seen_ns: np.ndarray = np.full(n, NEVER, np.int64)
        """When each joint last came (``NEVER``: not yet)."""
        self._oldest_ns = NEVER
        """``_seen_ns.min()`` as a Python int, kept by ``on_state``: the step's age check reads it."""
        self._jmap = layout.joint_map(self.joints, self.source)  # one fixed order: the gather is precomputed
        self._flat = _FlatGather.of(layout, self._jmap, self._fields)
        self._orders: dict[tuple[str, ...], _Order | str] = {}
        self._clock_ns = clock_ns
        self.topic_values: dict[str, Any] = dict.fromkeys(layout.topics)
        self.topic_ns: dict[str, int] = dict.fromkeys(layout.topics, NEVER)
        self.latest: Any = None
        """The latest valid JointState (what a recording stores)."""
        self.new_data = False
        """Whether a valid JointState came since the last ``read``."""
        self.invalid = 0
        self.problem: str | None = None
        """The latest invalid JointState's problem, until a valid one comes."""

    # -- messages ----------------------------------------------------------------------------------------
    def on_state(self, msg: Any, now_ns: int) -> str | None:
        """Merge one JointState; its problem (one line, names escaped) when it is invalid, which is dropped."""
        try:
            order = self._order(tuple(msg.name))
            n = len(msg.name)
            for f in self._needed:
                values = getattr(msg, f)
                if len(values) != n:
                    raise SacEdgeError(
                        f"{self.source}: its {f} has {len(values)} values for {n} joints; the layout reads {f}"
                    )
            if order.same:  # the layout's joints in its order (one driver): copied whole
                for f in self._needed:
                    self._fields[f][:] = getattr(msg, f)
            else:
                src, dst = order.src, order.dst
                for f in self._needed:
                    self._fields[f][dst] = np.asarray(getattr(msg, f), dtype=np.float64)[src]
        except SacEdgeError as err:
            self.invalid += 1
            self.problem = str(err)
            return self.problem
        if order.every:  # every layout joint came now: the oldest is now
            self._seen_ns[:] = now_ns
            self._oldest_ns = now_ns
        else:
            self._seen_ns[order.dst] = now_ns
            self._oldest_ns = int(self._seen_ns.min())
        self.latest, self.new_data, self.problem = msg, True, None
        return None

    def _order(self, names: tuple[str, ...]) -> _Order:
        """Where a message of this name order's values go; one line on a duplicate or an unknown joint."""
        order = self._orders.get(names)
        if order is None:
            order = self._map(names)
            if len(self._orders) >= MAX_NAME_ORDERS:
                self._orders.clear()
            self._orders[names] = order
        if isinstance(order, str):
            raise SacEdgeError(order)
        return order

    def _map(self, names: tuple[str, ...]) -> _Order | str:
        src, dst, given = [], [], set()
        for i, name in enumerate(names):
            if name in given:
                return f"{self.source}: joint '{escaped(name)}' appears twice in its name list"
            given.add(name)
            at = self._where.get(name)
            if at is not None:
                src.append(i)
                dst.append(at)
            elif name not in self._ignored:
                return (
                    f"{self.source}: joint '{escaped(name)}' is published by the robot but not in the layout; use "
                    "it in the layout or list it under ignore_joints"
                )
        return _Order(np.array(src, np.intp), np.array(dst, np.intp), len(names), len(self.joints))

    def topic_callback(self, topic: str, source: str) -> Callable[[Any], None]:
        """The subscription callback of an imu or vector topic of the layout."""

        def on_message(msg: Any) -> None:
            if source == "imu":
                v, w, a = msg.orientation, msg.angular_velocity, msg.linear_acceleration
                value: Any = {
                    "orientation": (v.x, v.y, v.z, v.w),
                    "angular_velocity": (w.x, w.y, w.z),
                    "linear_acceleration": (a.x, a.y, a.z),
                }
            else:
                value = msg.data
            self.topic_values[topic] = value
            self.topic_ns[topic] = self._clock_ns()

        return on_message

    # -- reading -----------------------------------------------------------------------------------------
    def missing(self) -> str | None:
        """The first layout joint no valid JointState has given yet, else None."""
        never = np.flatnonzero(self._seen_ns == NEVER)
        return self.joints[int(never[0])] if never.size else None

    def seen_ns(self, name: str) -> int:
        """When input ``name`` (``STATE``: the oldest joint) last came; ``NEVER``: not yet."""
        if name == STATE:
            return self._oldest_ns
        return self.topic_ns.get(name, NEVER)

    def stale(self, now_ns: int, limit_ns: int) -> str | None:
        """The first input missing or older than ``limit_ns`` at ``now_ns``, else None."""
        if now_ns - self._oldest_ns > limit_ns:  # NEVER is older than any limit
            return STATE
        for topic, seen in self.topic_ns.items():
            if now_ns - seen > limit_ns:
                return topic
        return None

    def read(self, now_ns: int, limit_ns: int, obs: np.ndarray) -> str | None:
        """Fill ``obs`` from the latest values when every input is fresh; the stale input's name, else None.
        ``new_data`` tells (until the next read) whether a new JointState came since the last read."""
        stale = self.stale(now_ns, limit_ns)
        if stale is None:
            if self._flat is not None:
                self._flat.gather(obs)
                return None
            try:
                self.layout.gather(obs, self._jmap, self._arrays, self.topic_values, self.source)
            except SacEdgeError as err:  # a topic's value of the wrong size
                self.invalid += 1
                self.problem = str(err)
                return "invalid_input"
        return stale

    def take_new(self) -> bool:
        """Whether a valid JointState came since the last call."""
        new, self.new_data = self.new_data, False
        return new

    def pose_action(self) -> list[float]:
        """The action that commands the action joints' latest positions: the layout's ``offset + scale *
        action`` solved for the action; NaN where a joint has no finite position or a scale of 0
        (``Shield.restart`` takes the safe action's value there)."""
        action = self.layout.action
        positions = self._fields["position"]
        out = []
        for joint, scale, offset in zip(action.joints, action.scale.tolist(), action.offset.tolist()):
            value = float(positions[self._where[joint]])
            out.append((value - offset) / scale if scale and math.isfinite(value) else math.nan)
        return out


class _Order:
    """Where the values of a message with one name order (``names`` of them) go: its ``src`` indices into the
    ``dst`` indices of the layout's joints; ``every``: it names every layout joint; ``same``: it names exactly
    them, in their order."""

    def __init__(self, src: np.ndarray, dst: np.ndarray, names: int, joints: int) -> None:
        self.src, self.dst = src, dst
        self.every = len(np.unique(dst)) == joints
        in_order = np.arange(joints)
        self.same = names == joints and self.every and bool((src == in_order).all() and (dst == in_order).all())


class _FlatGather:
    """The observation of a layout made of joint_states parts only, as one precomputed gather: the merged
    fields stacked, one index into them, then the parts' offsets, transforms and scales as whole vectors
    (the same arithmetic as ``ObsPart.finish``, float64, into the float32 observation)."""

    def __init__(self, stacked: np.ndarray, index: np.ndarray, offset: np.ndarray, scale: np.ndarray,
                 cos: np.ndarray, sin: np.ndarray) -> None:  # fmt: skip
        self.stacked, self.index, self.offset, self.scale, self.cos, self.sin = stacked, index, offset, scale, cos, sin
        self._raw = np.empty(index.size)
        transform: list[Callable[[float], float] | None] = [None] * index.size
        for at in cos.tolist():
            transform[at] = math.cos
        for at in sin.tolist():
            transform[at] = math.sin
        self._slots = list(zip(index.tolist(), offset.tolist(), scale.tolist(), transform))
        """Per observation slot ``(index, offset, scale, transform)`` as Python values, for ``gather``'s form
        over Python floats (up to ``PYTHON_CHECK_MAX`` slots; the same float64 arithmetic)."""
        self.gather: Callable[[np.ndarray], None] = (
            self._gather_floats if index.size <= PYTHON_CHECK_MAX else self._gather_arrays
        )
        """The observation from the merged fields into ``obs`` (float32)."""

    @classmethod
    def of(cls, layout: IoLayout, jmap: Any, fields: dict[str, np.ndarray]) -> _FlatGather | None:
        if any(p.source != "joint_states" for p in layout.parts):
            return None
        n = len(jmap.names)
        stacked = np.zeros(n * len(JOINT_FIELDS))
        for i, f in enumerate(JOINT_FIELDS):  # the merged arrays become views of one buffer
            stacked[i * n : (i + 1) * n] = fields[f]
            fields[f] = stacked[i * n : (i + 1) * n]
        index, offset, scale, cos, sin = [], [], [], [], []
        for part, idx in zip(layout.parts, jmap.index):
            assert idx is not None
            index.append(idx + JOINT_FIELDS.index(part.field or "") * n)
            offset.append(np.broadcast_to(part.offset, (part.size,)))
            scale.append(np.broadcast_to(part.scale, (part.size,)))
            cos.append(np.full(part.size, part.transform == "cos"))
            sin.append(np.full(part.size, part.transform == "sin"))
        join = np.concatenate
        return cls(stacked, join(index), join(offset), join(scale), np.flatnonzero(join(cos)),
                   np.flatnonzero(join(sin)))  # fmt: skip

    def _gather_floats(self, obs: np.ndarray) -> None:
        """``gather`` over Python floats: one conversion in, one out, no array temporaries (a cold step pays
        several microseconds per numpy call). A non-finite value's cos or sin is NaN, as numpy's."""
        raw = self.stacked.tolist()
        values = []
        for at, offset, scale, transform in self._slots:
            v = raw[at] - offset
            if transform is not None:
                v = transform(v) if v - v == 0.0 else math.nan  # v - v is NaN for an infinity or NaN
            values.append(v * scale)
        obs[:] = values

    def _gather_arrays(self, obs: np.ndarray) -> None:
        raw = np.take(self.stacked, self.index, out=self._raw)
        raw -= self.offset
        if self.cos.size:
            raw[self.cos] = np.cos(raw[self.cos])
        if self.sin.size:
            raw[self.sin] = np.sin(raw[self.sin])
        raw *= self.scale
        obs[:] = raw
