"""The package layout's rules, read from the source with ``ast`` (nothing is imported).

- Stages import one way: ``common`` <- ``train``, ``calibration`` <- ``export``, and ``edge_runtime`` on
  ``common``, ``train`` and ``calibration`` (never ``export``: the TensorRT builder both use is
  ``common/trt/``); ``sweep`` sits beside them on ``common`` and ``train``.
- Inside ``edge_runtime`` the four subpackages import each other only downward (``control`` -> ``backends``;
  ``finetune`` -> ``backends``, ``budget``); only the composition root (``run.py``, ``bench.py``,
  ``cli.py``, ``compose.py``, ``config.py``, ``doctor.py``, ``runtime.py``) imports across all of them, and
  only ``cli.py`` imports ``run.py``.
- No module imports itself back through others (no import circles), counting imports inside functions
  and under ``TYPE_CHECKING``.
- Every package says in its ``__init__.py`` docstring what lives there and what it may import.
- The bundle's vocabulary (file names, kinds, precisions, folders) is spelled out only in
  ``common/bundle_format.py``; every other module names it through that module's constants.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("common", "train", "calibration", "export", "edge_runtime", "sweep")
STAGE_MAY_IMPORT = {
    "common": set(),
    "train": {"common"},
    "calibration": {"common"},
    "export": {"common", "train", "calibration"},
    "edge_runtime": {"common", "train", "calibration"},
    "sweep": {"common", "train"},
}
SUBPACKAGES = ("backends", "control", "budget", "finetune", "ros2", "replay")
SUBPACKAGE_MAY_IMPORT = {
    "backends": set(),
    "budget": set(),
    "control": {"backends"},
    "finetune": {"backends", "budget"},
    "ros2": {"root", "control", "replay"},  # the node: a client of the runtime (the composition root), as run.py is
    "replay": set(),
}
COMPOSITION_ROOT = {"run", "bench", "cli", "compose", "config", "doctor", "drill", "preflight", "replayer", "runtime"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["sac_edge", *parts])


def source_files() -> Iterator[Path]:
    for stage in STAGES:
        yield from sorted((ROOT / stage).rglob("*.py"))


def imported_modules(path: Path) -> set[str]:
    """Every ``sac_edge`` module ``path`` imports, anywhere in the file, relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("sac_edge.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("sac_edge."):
                target = node.module
            else:
                continue
            # ``from pkg import mod`` names a submodule when one exists
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if _exists(sub) else target)
    return out


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


GRAPH = {module_name(p): imported_modules(p) for p in source_files()}


def _stage(module: str) -> str:
    return module.split(".")[1]


def _subpackage(module: str) -> str | None:
    parts = module.split(".")
    if parts[1] != "edge_runtime" or len(parts) < 3:
        return None
    return parts[2] if parts[2] in SUBPACKAGES else "root"


def test_the_graph_was_read() -> None:
    assert "sac_edge.edge_runtime.backends.registry" in GRAPH
    assert "sac_edge.edge_runtime.backends.onnxrt.loader" in GRAPH["sac_edge.edge_runtime.backends.registry"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_stages_import_one_way(module: str) -> None:
    stage = _stage(module)
    bad = sorted(m for m in GRAPH[module] if _stage(m) not in {stage} | STAGE_MAY_IMPORT[stage])
    assert not bad, f"{module} ({stage}) may import {sorted(STAGE_MAY_IMPORT[stage])} only, imports {bad}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _subpackage(m) in SUBPACKAGES))
def test_subpackages_import_only_downward(module: str) -> None:
    sub = _subpackage(module)
    assert sub is not None
    allowed = {sub} | SUBPACKAGE_MAY_IMPORT[sub]
    bad = sorted(m for m in GRAPH[module] if _subpackage(m) is not None and _subpackage(m) not in allowed)
    assert not bad, f"{module} ({sub}/) may import subpackages {sorted(allowed)} only, imports {bad}"


def test_only_cli_imports_run() -> None:
    importers = sorted(m for m, deps in GRAPH.items() if "sac_edge.edge_runtime.run" in deps)
    assert importers == ["sac_edge.edge_runtime.cli"]


def test_edge_runtime_top_level_is_the_composition_root() -> None:
    top = {p.stem for p in (ROOT / "edge_runtime").glob("*.py")} - {"__init__"}
    assert top == COMPOSITION_ROOT
    subpackages = {p.name for p in (ROOT / "edge_runtime").iterdir() if (p / "__init__.py").is_file()}
    assert subpackages == set(SUBPACKAGES)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert _cycles(GRAPH) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    "package", sorted(str(p.parent.relative_to(ROOT)) for s in STAGES for p in (ROOT / s).rglob("__init__.py"))
)
def test_every_package_says_what_it_holds_and_may_import(package: str) -> None:
    doc = ast.get_docstring(ast.parse((ROOT / package / "__init__.py").read_text()))
    assert doc, f"{package}/__init__.py has no docstring"
    if package in STAGES or (package.startswith("edge_runtime/") and package.count("/") == 1):
        assert "import" in doc, f"{package}/__init__.py does not say what it may import"


def _unit(module: str) -> str:
    """What relative imports may reach: one subpackage of ``edge_runtime``, its composition root, or a stage."""
    sub = _subpackage(module)
    return f"{_stage(module)}.{sub}" if sub else _stage(module)


def _imports_by_style(path: Path) -> Iterator[tuple[bool, str]]:
    """(relative?, target module) of every ``sac_edge`` from-import in ``path``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            yield True, ".".join(base + ([node.module] if node.module else []))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sac_edge."):
            yield False, node.module


@pytest.mark.parametrize("path", list(source_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_one_import_style(path: Path) -> None:
    """Relative imports inside a unit (a stage, or one subpackage or the root of edge_runtime), absolute across."""
    unit = _unit(module_name(path))
    for relative, target in _imports_by_style(path):
        if relative:
            assert _unit(target) == unit, f"relative import of {target} crosses out of {unit}: import it absolutely"
        else:
            assert _unit(target) != unit, f"absolute import of {target} inside {unit}: import it relatively"


FILE_MAP = ROOT / "docs" / "FILES.md"
_MAPPED = re.compile(r"^\| `([^`]+)` \|")


def _file_map() -> set[str]:
    return {m.group(1) for line in FILE_MAP.read_text().splitlines() if (m := _MAPPED.match(line))}


README_LIMIT = 10_000
"""Bytes: the README is a quick start (what it is, the demo, one example per command, the library loop and
where the rest is); detail goes to docs/. It grew past 10 KB twice."""


def test_the_readme_stays_a_quick_start() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size < README_LIMIT, f"README.md is {size} bytes: move detail to docs/ (limit {README_LIMIT})"


def test_the_file_map_is_complete() -> None:
    """docs/FILES.md names every module, benchmark and script, and nothing else."""
    packages = {f"{p.parent.relative_to(ROOT)}/" for p in source_files() if p.name == "__init__.py"}
    modules = {str(p.relative_to(ROOT)) for p in source_files() if p.name != "__init__.py"}
    tools = {
        str(p.relative_to(ROOT))
        for folder in ("bench", "scripts")
        for p in (ROOT / folder).iterdir()
        if p.suffix in (".py", ".sh")
    }
    mapped = _file_map()
    assert sorted((packages | modules | tools) - mapped) == [], "missing from the file map"
    assert sorted(mapped - (packages | modules | tools)) == [], "in the file map, but no such file"


FORMAT_MODULE = ROOT / "common" / "bundle_format.py"
#: Literals equal to a bundle word that mean something else there: (file, literal) -> what it is.
NOT_THE_FORMAT = {
    ("train/config.py", "fp16"): "an --amp mode (mixed-precision training), not a bundle precision",
    ("train/sac.py", "fp16"): "an --amp mode (mixed-precision training), not a bundle precision",
    ("train/precision.py", "fp16"): "an --amp mode (mixed-precision training), not a bundle precision",
    ("export/cli.py", "int8"): "the --json summary's key for the INT8 gate's measurements (docs/CONTRACTS.md)",
    ("common/trt/builder.py", "int8"): "a word searched for in TensorRT's engine-inspector JSON",
    ("edge_runtime/finetune/finetuner.py", "int8"): "a key of the learner process's JSON messages",
    ("edge_runtime/finetune/learner_process.py", "int8"): "a key of the learner process's JSON messages",
}


def _format_words() -> tuple[set[str], set[str]]:
    """Every string the format module defines (and each plan's name), split into words that are the format
    wherever they appear (a dot, a dash or a digit: ``policy.onnx``, ``fp16``, ``onnx-cpu``) and plain words
    (``engines``, ``onnx``, ``learner``) that are the format only where they name a bundle path or kind."""
    tree = ast.parse(FORMAT_MODULE.read_text())
    words = {
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
    }
    precisions = {w for w in words if re.fullmatch(r"(fp|int)\d+", w)}
    words |= {f"policy.{p}.plan" for p in precisions}
    plain = {w for w in words if w.isalpha()}
    return words - plain, plain


def format_literals(source: str, strict: set[str], plain: set[str]) -> Iterator[tuple[int, str]]:
    """(line, literal) of every bundle word spelled out in ``source``: a strict word anywhere but a docstring;
    a plan name put together in an f-string; a plain one as a path part (``bundle / "engines"``) or as what
    ``Bundle.files``/``onnx``/``cpu_onnx`` or a kind or precision comparison is given."""
    tree = ast.parse(source)
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in strict and id(node) not in docstrings:
            yield node.lineno, str(node.value)
        if isinstance(node, ast.JoinedStr):  # a plan's name built by hand: f"policy.{precision}.plan"
            template = "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
            if re.fullmatch(r"policy\.\{\}(\.\{\})?\.plan", template):
                yield node.lineno, template
        named = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            named = [node.right]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("files", "onnx", "cpu_onnx"):
                named = node.args[:2]
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
            named = node.comparators
        for arg in named:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value in plain:
                yield arg.lineno, arg.value


def test_the_bundle_format_is_spelled_out_in_one_module() -> None:
    """A bundle file name, kind, precision or folder written as a literal outside ``common/bundle_format.py``
    drifts on its own the day the format changes: use that module's constant."""
    strict, plain = _format_words()
    assert {"policy.onnx", "manifest.json", "fp16", "int8", "policy.int8.plan"} <= strict
    assert {"engines", "finetune"} <= plain
    found, allowed = [], set()
    for path in source_files():
        rel = str(path.relative_to(ROOT))
        if path == FORMAT_MODULE:
            continue
        for line, word in format_literals(path.read_text(), strict, plain):
            if (rel, word) in NOT_THE_FORMAT:
                allowed.add((rel, word))
            else:
                found.append(f"{rel}:{line}: {word!r}")
    assert found == [], "spell these with sac_edge.common.bundle_format's names: " + ", ".join(found)
    assert allowed == set(NOT_THE_FORMAT), f"stale NOT_THE_FORMAT entries: {sorted(set(NOT_THE_FORMAT) - allowed)}"


def test_the_format_check_finds_each_kind_of_literal() -> None:
    strict, plain = _format_words()
    planted = (
        '"""A docstring may say policy.onnx."""\n'
        'A = bundle / "parity_states.npy"\n'
        'B = precision == "int8"\n'
        'C = bundle.path / "engines"\n'
        'D = bundle.files("learner")\n'
        'E = entry.get("kind") == "onnx"\n'
        'F = {"engines": 1, "onnx": 2}  # plain words as keys are not the format\n'
        'G = work / f"policy.{precision}.plan"\n'
    )
    assert sorted(format_literals(planted, strict, plain)) == [
        (2, "parity_states.npy"),
        (3, "int8"),
        (4, "engines"),
        (5, "learner"),
        (6, "onnx"),
        (8, "policy.{}.plan"),
    ]


def test_bundle_and_open_bundle_are_defined_once() -> None:
    """``Bundle`` and ``open_bundle`` live in ``common/bundle.py`` and are imported from there; a second
    definition would be a copy, and an import through another module (``backends.base`` imports ``Bundle``
    for its own signatures) would hide where they live."""
    names, home = ("Bundle", "open_bundle"), (("sac_edge.common.bundle", 0), ("bundle", 1))
    defined, elsewhere = [], []
    for path in [*source_files(), *sorted(ROOT.glob("bench/*.py")), *sorted(ROOT.glob("tests/**/*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in names:
                defined.append(str(path.relative_to(ROOT)))
            elif (
                isinstance(node, ast.ImportFrom)
                and any(a.name in names for a in node.names)
                and (node.module, node.level) not in home
            ):
                elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert defined == ["common/bundle.py", "common/bundle.py"]
    assert elsewhere == [], "import Bundle/open_bundle from sac_edge.common.bundle: " + ", ".join(elsewhere)


def test_every_package_folder_ships_in_the_wheel() -> None:
    """A folder with an ``__init__.py`` missing from pyproject's package list is left out of a wheel (the
    editable dev install still finds it, so only the device install would fail, at its first import)."""
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        "sac_edge." + ".".join(init.parent.relative_to(ROOT).parts)
        for stage in STAGES
        for init in (ROOT / stage).rglob("__init__.py")
    }
    assert folders - set(setuptools["packages"]) == set()
    for package in folders:
        assert setuptools["package-dir"].get(package) == package.split(".", 1)[1].replace(".", "/"), package
