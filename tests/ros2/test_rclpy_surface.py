"""Every rclpy name, method and keyword the node uses exists in Humble's rclpy (the oldest ROS 2 it supports;
the tests run on Kilted's wheels), read from ``tests/ros2_surfaces/rclpy-humble.json`` (rebuilt by
``scripts/rclpy_surface.py`` from ros2/rclpy's humble branch). No ROS is needed: the node's source is read with
``ast``.

Checked: imports from ``rclpy.*`` (where a ``try``/``except ImportError`` offers alternatives, one must exist);
``rclpy.f(...)`` calls; calls of imported rclpy classes and functions with their keywords; ``self.m(...)`` of the
node's rclpy base classes with their keywords; methods called on what those return (loggers, clocks, timers,
publishers, executors). Not checked here (C extension members, absent from the Python sources): the members
of ``TransitionCallbackReturn`` and ``SignalHandlerOptions``; the Kilted run exercises them."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SURFACE = json.loads((ROOT / "tests" / "ros2_surfaces" / "rclpy-humble.json").read_text())["modules"]
SOURCES = [*sorted((ROOT / "edge_runtime" / "ros2").glob("*.py"))]
NODE_BASE = "rclpy.lifecycle.node.LifecycleNode"
#: What the node's calls return, by method name, where a further method is called on it.
RETURNS = {
    "get_logger": "rclpy.impl.rcutils_logger.RcutilsLogger",
    "get_clock": "rclpy.clock.Clock",
    "now": "rclpy.time.Time",
    "create_timer": "rclpy.timer.Timer",
    "create_publisher": "rclpy.publisher.Publisher",
    "create_subscription": "rclpy.subscription.Subscription",
}
#: Names bound to rclpy objects other than by a call the checker follows (``compat.event_callbacks()`` returns
#: these classes; the node keeps its timers and publishers in attributes).
BOUND = {
    "sub_events": "rclpy.qos_event.SubscriptionEventCallbacks",
    "pub_events": "rclpy.qos_event.PublisherEventCallbacks",
    "executor": "rclpy.executors.SingleThreadedExecutor",
    "self._timer": "rclpy.timer.Timer",
    "self._diagnostics_timer": "rclpy.timer.Timer",
    "self._command_pub": "rclpy.publisher.Publisher",
    "self._trajectory_pub": "rclpy.publisher.Publisher",
    "self._pub": "rclpy.publisher.Publisher",
    "node": NODE_BASE,  # the node's parts take it as ``node`` and keep it as ``self.node``
    "self.node": NODE_BASE,
    "waiter": "rclpy.node.Node",
    "clock": "rclpy.clock.Clock",
}


def _node_own() -> set[str]:
    """The methods and attributes ``SacEdgeNode`` adds to rclpy's LifecycleNode (its parts call them on it)."""
    tree = ast.parse((ROOT / "edge_runtime" / "ros2" / "node.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SacEdgeNode")
    own = {m.name for m in cls.body if isinstance(m, ast.FunctionDef)}
    own |= {t.attr for n in ast.walk(cls) if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Attribute) and _is_self(t.value)}  # fmt: skip
    return own


C_EXTENSION = {"rclpy.lifecycle.TransitionCallbackReturn", "rclpy.signals.SignalHandlerOptions"}


def _lookup(qualified: str) -> dict | None:
    """The surface entry of ``module.Name``, following re-exports."""
    for _ in range(5):
        module, _, name = qualified.rpartition(".")
        entry = SURFACE.get(module, {}).get(name)
        if entry is None or entry.get("kind") != "import":
            return entry
        qualified = entry["of"]
    return None


def _methods(cls: str) -> dict[str, dict]:
    """A class's methods with its rclpy bases' (nearest first)."""
    entry = _lookup(cls)
    if not entry or entry.get("kind") != "class":
        return {}
    out: dict[str, dict] = {}
    for base in reversed(entry["bases"]):
        out.update(_methods(base))
    out.update(entry["methods"])
    return out


def _takes(params: dict, keywords: list[str], what: str) -> list[str]:
    if params.get("varkw"):
        return []
    known = set(params["args"]) | set(params["kwonly"])
    return [f"{what}: no keyword {k!r} in Humble" for k in keywords if k not in known]


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _is_super(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


class _Checker(ast.NodeVisitor):
    def __init__(self, source: Path) -> None:
        self.source, self.problems, self.checked = source, [], 0
        self.imported: dict[str, str] = {}
        self.own_methods: set[str] = set()
        self.in_node = False
        """Inside a class derived from rclpy's LifecycleNode (``self`` is the node)."""

    def add(self, problem: str, node: ast.AST) -> None:
        self.problems.append(f"{self.source.name}:{getattr(node, 'lineno', 0)}: {problem}")

    # -- imports -----------------------------------------------------------------------------------------
    def visit_Try(self, node: ast.Try) -> None:
        handles_import = any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
        )
        if handles_import and any(isinstance(s, ast.ImportFrom) for s in node.body):
            branches = [node.body, *(h.body for h in node.handlers)]
            ok = [
                b for b in branches if all(self._import_problem(s) is None for s in b if isinstance(s, ast.ImportFrom))
            ]
            if not ok:
                self.add("no alternative of this try/except ImportError exists in Humble", node)
            for branch in ok[:1]:
                for s in branch:
                    if isinstance(s, ast.ImportFrom):
                        self._bind(s)
            return
        self.generic_visit(node)

    def _import_problem(self, node: ast.ImportFrom) -> str | None:
        module = node.module or ""
        if not module.startswith("rclpy"):
            return None
        if module not in SURFACE:
            return f"module {module} is not in Humble's rclpy"
        missing = [a.name for a in node.names if a.name not in SURFACE[module] and f"{module}.{a.name}" not in SURFACE]
        return f"{module} has no {', '.join(missing)} in Humble" if missing else None

    def _bind(self, node: ast.ImportFrom) -> None:
        if not (node.module or "").startswith("rclpy"):
            return
        for a in node.names:
            self.imported[a.asname or a.name] = f"{node.module}.{a.name}"

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        problem = self._import_problem(node)
        self.checked += (node.module or "").startswith("rclpy")
        if problem:
            self.add(problem, node)
        elif (node.module or "").startswith("rclpy"):
            self._bind(node)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name.startswith("rclpy") and a.name not in SURFACE:
                self.add(f"module {a.name} is not in Humble's rclpy", node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.own_methods |= {m.name for m in node.body if isinstance(m, ast.FunctionDef)}
        outer, self.in_node = self.in_node, any(ast.unparse(b).endswith("LifecycleNode") for b in node.bases)
        self.generic_visit(node)
        self.in_node = outer

    # -- calls -------------------------------------------------------------------------------------------
    def _type_of(self, expr: ast.AST) -> str | None:
        """The rclpy class an expression evaluates to, where the checker can tell."""
        text = ast.unparse(expr)
        if text in BOUND:
            return BOUND[text]
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
            return RETURNS.get(expr.func.attr)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
            name = self.imported.get(expr.func.id)
            return name if name and (_lookup(name) or {}).get("kind") == "class" else None
        return None

    def visit_Call(self, node: ast.Call) -> None:
        keywords = [k.arg for k in node.keywords if k.arg]
        func = node.func
        if isinstance(func, ast.Name) and (func.id in self.imported or func.id in BOUND):
            qualified = BOUND.get(func.id) or self.imported[func.id]
            entry = _lookup(qualified)
            self.checked += 1
            if qualified in C_EXTENSION:
                pass
            elif entry is None:
                self.add(f"{qualified} is not in Humble's rclpy", node)
            elif entry["kind"] == "class":
                init = _methods(qualified).get("__init__", {"args": [], "kwonly": [], "varkw": True})
                self.problems += [f"{self.source.name}:{node.lineno}: {p}" for p in _takes(init, keywords, qualified)]
            elif entry["kind"] == "function":
                self.problems += [f"{self.source.name}:{node.lineno}: {p}" for p in _takes(entry, keywords, qualified)]
        elif isinstance(func, ast.Attribute):
            owner = func.value
            if isinstance(owner, ast.Name) and owner.id == "rclpy":
                entry = _lookup(f"rclpy.{func.attr}")
                self.checked += 1
                if entry is None:
                    self.add(f"rclpy.{func.attr} is not in Humble's rclpy", node)
                else:
                    self.problems += [
                        f"{self.source.name}:{node.lineno}: {p}" for p in _takes(entry, keywords, func.attr)
                    ]
            elif (self.in_node and _is_self(owner) and func.attr not in self.own_methods) or _is_super(owner):
                self._method(NODE_BASE, func.attr, keywords, node)
            else:
                cls = self._type_of(owner)
                if cls is not None:
                    self._method(cls, func.attr, keywords, node)
        self.generic_visit(node)

    def _method(self, cls: str, name: str, keywords: list[str], node: ast.AST) -> None:
        self.checked += 1
        if cls == NODE_BASE and name in NODE_OWN and not name.startswith("_LifecycleNodeMixin__"):
            return
        name = name.replace("_LifecycleNodeMixin__", "__")  # a private method, name-mangled where it is called
        methods = _methods(cls)
        if name not in methods:
            self.add(f"{cls} has no method {name} in Humble", node)
            return
        self.problems += [
            f"{self.source.name}:{getattr(node, 'lineno', 0)}: {p}"
            for p in _takes(methods[name], keywords, f"{cls}.{name}")
        ]


NODE_OWN = _node_own()


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_every_rclpy_call_exists_in_humble(source: Path) -> None:
    checker = _Checker(source)
    checker.visit(ast.parse(source.read_text()))
    assert checker.problems == []


def test_the_node_is_checked_at_all() -> None:
    checked = 0
    for source in SOURCES:
        checker = _Checker(source)
        checker.visit(ast.parse(source.read_text()))
        checked += checker.checked
    assert checked > 40  # imports, rclpy calls and node methods


def test_the_checker_finds_what_humble_lacks() -> None:
    """Names from later releases, planted: each is found."""
    planted = (
        "from rclpy.event_handler import SubscriptionEventCallbacks\n"  # Iron+
        "from rclpy.experimental import EventsExecutor\n"  # Jazzy+
        "from rclpy.qos import QoSProfile\n"
        "class N(LifecycleNode):\n"
        "    def f(self):\n"
        "        self.create_timer(0.1, self.f, autostart=False)\n"  # Jazzy's keyword
        "        self.get_logger().warn_once('x')\n"
        "        rclpy.init(args=None, enable_rosout=False)\n"
    )
    path = ROOT / "planted.py"
    checker = _Checker(path)
    checker.visit(ast.parse(planted))
    found = "\n".join(checker.problems)
    assert "module rclpy.event_handler is not in Humble's rclpy" in found
    assert "module rclpy.experimental is not in Humble's rclpy" in found
    assert "no keyword 'autostart'" in found
    assert "RcutilsLogger has no method warn_once" in found
    assert "no keyword 'enable_rosout'" in found
