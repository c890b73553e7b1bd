"""Rebuilds the Python API surface of rclpy's ``humble`` branch (the oldest ROS 2 the node supports) into
tests/ros2_surfaces/, from a git mirror of ros2/rclpy (``python scripts/rclpy_surface.py MIRROR [BRANCH]``).

Per module of ``rclpy/rclpy``: its top-level names (functions with their parameters, classes with their
bases and methods' parameters, assigned and imported names). ``tests/ros2/test_rclpy_surface.py`` checks every
rclpy name, method and keyword the node uses against it, as ``tests/trt_surfaces/`` holds TensorRT's."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "ros2_surfaces"


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, object]:
    a = fn.args
    return {
        "args": [x.arg for x in a.posonlyargs + a.args],
        "kwonly": [x.arg for x in a.kwonlyargs],
        "varargs": a.vararg is not None,
        "varkw": a.kwarg is not None,
    }


def _dotted(node: ast.expr) -> str:
    """``a.b.C`` of a base class expression (ast.unparse is not in Python 3.8, which mypy checks for)."""
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _module(source: str, name: str) -> dict[str, object]:
    tree = ast.parse(source)
    imported: dict[str, str] = {}
    names: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:
                parts = name.split(".")[: -node.level] if not name.endswith("__init__") else name.split(".")
                base = ".".join([*parts, node.module])
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{base}.{alias.name}"
                names[alias.asname or alias.name] = {"kind": "import", "of": f"{base}.{alias.name}"}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = {"kind": "function", **_params(node)}
        elif isinstance(node, ast.ClassDef):
            methods = {m.name: _params(m) for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
            attrs = sorted(
                t.id for m in node.body if isinstance(m, ast.Assign) for t in m.targets if isinstance(t, ast.Name)
            )
            bases = [imported.get(_dotted(b), f"{name}.{_dotted(b)}") for b in node.bases]
            names[node.name] = {"kind": "class", "bases": bases, "methods": methods, "attributes": attrs}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    names[t.id] = {"kind": "name"}
    return names


def surface(mirror: Path, branch: str) -> dict[str, object]:
    files = subprocess.run(
        ["git", "-C", str(mirror), "ls-tree", "-r", "--name-only", branch, "rclpy/rclpy/"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    modules: dict[str, object] = {}
    for path in sorted(f for f in files if f.endswith(".py")):
        name = path[len("rclpy/") : -3].replace("/", ".")
        name = name[: -len(".__init__")] if name.endswith(".__init__") else name
        text = subprocess.run(["git", "-C", str(mirror), "show", f"{branch}:{path}"], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
        modules[name] = _module(text, name if not path.endswith("__init__.py") else name + ".__init__")
    commit = subprocess.run(["git", "-C", str(mirror), "rev-parse", branch], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    return {"rclpy_branch": branch, "commit": commit, "modules": modules}


def main() -> None:
    mirror, branch = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "humble"
    OUT.mkdir(exist_ok=True)
    out = OUT / f"rclpy-{branch}.json"
    data = surface(mirror, branch)
    modules: dict[str, object] = data.pop("modules")  # type: ignore[assignment]
    # One module a line: small, and a rebuild's diff shows what moved
    lines = [
        f"{json.dumps(name)}: {json.dumps(modules[name], sort_keys=True, separators=(',', ':'))}" for name in modules
    ]
    head = json.dumps(data, sort_keys=True)[:-1]
    out.write_text(head + ', "modules": {\n' + ",\n".join(lines) + "\n}}\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
