"""One frozen dataclass per command; its field docs become ``--help`` and it is saved beside artifacts.

A field's help text is ``field(metadata={"help": ...})``; ``choices`` may be given the same way, and
``const``: the value of the flag given bare (``--compile`` for ``--compile on``), ``no_const`` that of its
``--no-`` form. Booleans become ``--flag/--no-flag``; a field named in ``positional`` becomes a positional
argument; a tuple field with ``metadata={"repeat": True}`` takes one or more values per flag and may be
repeated.

A field whose type is itself a frozen dataclass is a *section*: its fields are flags of the command like
any other (``--help`` groups them under the section's name and first docstring line) and the saved config
nests them under the section's name (a section inside a section with ``metadata={"inline": True}`` saves its
fields in the outer section's object: a switch beside the options it switches). A section typed ``X | None``
may be None in Python (the command line always makes one). A flag is ``--`` plus the field's name with
dashes, unless the field says ``metadata={"flag": "--other"}`` (a section's field named after the section's
subject: ``--backend`` is ``backend.kind``). Flags are unique across a command's sections.
"""

from __future__ import annotations

import argparse
import builtins
import dataclasses
import json
import math
import re
import sys
import typing
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sac_edge import __version__

from .atomic import atomic_write_json
from .errors import InternalError, SacEdgeError

C = TypeVar("C")
_TUPLE_OF = re.compile(r"^tuple\[\s*(\w+)\s*,\s*\.\.\.\s*\]$")


def _field_type(cls: type[Any], annotation: Any) -> Any:
    """The type a field's value converts to: ``X | None`` -> ``X``, ``tuple[X, ...]`` -> ``Tuple[X, ...]``.

    Annotations are strings here (postponed evaluation); they are read by hand rather than evaluated,
    since ``X | None`` and ``tuple[X, ...]`` cannot be evaluated on Python 3.8.
    """
    if not isinstance(annotation, str):
        return annotation
    names = [part.strip() for part in annotation.split("|") if part.strip() != "None"]
    if len(names) != 1:
        return str
    tuple_item = _TUPLE_OF.match(names[0])
    if tuple_item:
        return typing.Tuple[_field_type(cls, tuple_item.group(1)), ...]  # subscriptable on Python 3.8
    namespace = vars(sys.modules[cls.__module__])
    return namespace[names[0]] if names[0] in namespace else getattr(builtins, names[0])


class _BoolFlag(argparse.Action):
    """``--flag`` / ``--no-flag`` (``argparse.BooleanOptionalAction`` needs Python 3.9)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        flag = option_strings[0]
        super().__init__([flag, "--no-" + flag[2:]], dest, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _tuple_parser(item: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    """``"256,256"`` -> ``(256, 256)``."""

    def parse(text: str) -> tuple[Any, ...]:
        try:
            return tuple(item(x) for x in text.split(",") if x.strip())
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from err

    return parse


def flag_of(name: str) -> str:
    """The command-line flag of the config field ``name`` (without a ``flag`` of its own)."""
    return "--" + name.replace("_", "-")


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


class Option(typing.NamedTuple):
    """One setting of a command's config: a field of the config class or of one of its sections."""

    path: tuple[str, ...]
    """Field names from the config down: ``("loop", "rate_hz")``, or ``("seed",)`` outside sections."""
    field: dataclasses.Field
    owner: type[Any]
    """The dataclass that declares the field (its module resolves the annotation)."""

    @property
    def flag(self) -> str:
        return str(self.field.metadata.get("flag", flag_of(self.field.name)))

    @property
    def dest(self) -> str:
        """The flag as a Python name: argparse's destination and ``config_from_flags``' keyword."""
        return self.flag[2:].replace("-", "_")

    @property
    def type(self) -> Any:
        return _field_type(self.owner, self.field.type)


def options(cls: type[Any]) -> list[Option]:
    """Every setting of the config class ``cls`` in declaration order, a section's fields in its place."""
    out: list[Option] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = _field_type(cls, f.type)
        if _is_section(tp):
            out += [o._replace(path=(f.name, *o.path)) for o in options(tp)]
        else:
            out.append(Option((f.name,), f, cls))
    seen: dict[str, Option] = {}
    for o in out:
        if o.dest in seen:
            raise InternalError(f"{cls.__name__}: {'.'.join(o.path)} and {'.'.join(seen[o.dest].path)} share {o.flag}")
        seen[o.dest] = o
    return out


def sections(cls: type[Any]) -> list[tuple[str, type[Any]]]:
    """The config class ``cls``'s sections: (field name, section class), in declaration order."""
    return [(f.name, tp) for f in dataclasses.fields(cls) if f.init and _is_section(tp := _field_type(cls, f.type))]


#: A value that starts with a dash but is a number (or a comma-separated list of numbers): ``-5``, ``-.5``,
#: ``-1e9``, ``-inf``, ``-1,2``. argparse's own pattern knows only ``-5`` and ``-.5``, so ``--flag -1e9``
#: read ``-1e9`` as an unknown flag ("expected one argument"); no flag of sac-edge looks like this.
_NUMBER = r"(?:\d+\.?\d*(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?|inf(?:inity)?|nan)"
_NEGATIVE_VALUE = re.compile(rf"^-{_NUMBER}(?:,\s*[-+]?{_NUMBER})*$", re.IGNORECASE)


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line error convention: a bad flag is a ``SacEdgeError`` naming the flag and the
    fix, not argparse's usage block (tens of lines) and its own exit; and a negative number is a value
    (``--target-return -1e9``), whatever its notation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_VALUE  # argparse consults this (private) attribute

    def error(self, message: str) -> typing.NoReturn:
        raise SacEdgeError(f"{message}; {_fix(message)} ('{self.prog} --help' lists the options)")


def _fix(message: str) -> str:
    """What to do about one of argparse's messages."""
    if "invalid choice" in message:
        return "pass one of the choices"
    if message.startswith("unrecognized arguments"):
        return "remove them or check their spelling"
    if "ignored explicit argument" in message:
        return "a true/false flag takes no value: give it alone, or its --no- form"
    if "required" in message:
        return "give it"
    if "expected" in message and "argument" in message:
        return "give the flag its value"
    match = re.search(r"invalid (\w+) value", message)
    if match:
        kind = {"float": "a number", "int": "an integer"}.get(match.group(1), f"a {match.group(1)} value")
        return f"pass {kind}"
    return "correct the flag"


def _section_doc(cls: type[Any]) -> str:
    """A section's docstring's first paragraph: its group's description in ``--help`` and docs/CLI.md."""
    return " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, where it says something: not ``None`` or an empty list (the help
    says what their absence means), not twice where the help already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, (), [], "") or "default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def version_line(prog: str) -> str:
    """What ``PROG --version`` prints: the command and sac-edge's version (one for every command)."""
    return f"{prog} {__version__}"


def build_parser(
    cls: type[Any], prog: str, description: str, positional: Sequence[str] = ()
) -> argparse.ArgumentParser:
    """An argparse parser whose options are the settings of the dataclass ``cls`` (a section's under its
    own heading); its errors are one-line ``SacEdgeError``s."""
    parser = _Parser(prog=prog, description=description, formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=version_line(prog), help="print the version and exit")
    groups = {name: parser.add_argument_group(name, _section_doc(tp)) for name, tp in sections(cls)}
    for opt in options(cls):
        target = groups[opt.path[0]] if len(opt.path) > 1 else parser
        _add_option(target, opt, positional)
    return parser


def _add_option(parser: Any, opt: Option, positional: Sequence[str]) -> None:
    """``opt`` as an argument of ``parser`` (the parser or one of its groups)."""
    f, tp, flag = opt.field, opt.type, opt.flag
    kwargs: dict[str, Any] = {"help": f.metadata.get("help", "")}
    if "choices" in f.metadata:
        kwargs["choices"] = f.metadata["choices"]
    if "metavar" in f.metadata:
        kwargs["metavar"] = f.metadata["metavar"]
    if "const" in f.metadata:  # the value of the bare flag (``--compile`` = ``--compile on``)
        kwargs.update(nargs="?", const=f.metadata["const"])
    default = f.default if f.default is not dataclasses.MISSING else None
    if opt.path == (f.name,) and f.name in positional:
        if f.default is not dataclasses.MISSING:  # an optional positional
            kwargs.update(nargs="?", default=default)
        parser.add_argument(f.name, type=tp if tp is not bool else _parse_bool, **kwargs)
        return
    kwargs["dest"] = opt.dest
    if tp is bool:
        parser.add_argument(flag, action=_BoolFlag, default=default, **kwargs)
    elif typing.get_origin(tp) is tuple and f.metadata.get("repeat"):
        parser.add_argument(flag, action="extend", nargs="+", default=list(default or ()), **kwargs)
    elif typing.get_origin(tp) is tuple:
        parser.add_argument(
            flag, type=_tuple_parser(typing.get_args(tp)[0]), default=default, metavar="A,B,...", **kwargs
        )
    else:
        parser.add_argument(flag, type=tp, default=default, **kwargs)
    if "no_const" in f.metadata:  # ``--no-compile`` = ``--compile off``
        parser.add_argument(
            "--no-" + flag[2:],
            dest=opt.dest,
            action="store_const",
            const=f.metadata["no_const"],
            help=argparse.SUPPRESS,
        )


def reference_markdown(cls: type[Any], positional: Sequence[str] = ()) -> str:
    """Markdown tables of the command line ``build_parser(cls, ...)`` makes (argument, default, help): the
    settings outside sections, then one table per section under its name and description."""
    headings = {"": "", **{name: f"**{name}**: {_section_doc(tp)}\n\n" for name, tp in sections(cls)}}
    rows: dict[str, list[str]] = {name: [] for name in headings}
    for opt in options(cls):
        rows[opt.path[0] if len(opt.path) > 1 else ""].append(_reference_row(opt, positional))
    header = "| argument | default | meaning |\n|---|---|---|\n"
    return "\n".join(headings[name] + header + "".join(row + "\n" for row in rows[name]) for name in rows if rows[name])


def _reference_row(opt: Option, positional: Sequence[str]) -> str:
    f, tp, flag = opt.field, opt.type, opt.flag
    default = f.default if f.default is not dataclasses.MISSING else None
    if opt.path == (f.name,) and f.name in positional:
        arg = f.name.upper() if f.default is dataclasses.MISSING else f"[{f.name.upper()}]"
    elif tp is bool:
        arg = f"{flag}, --no-{flag[2:]}"
    elif "const" in f.metadata:
        arg = f"{flag} [VALUE]"
    elif typing.get_origin(tp) is tuple:
        arg = f"{flag} {'VALUE [VALUE ...]' if f.metadata.get('repeat') else 'A,B,...'}"
    else:
        arg = f"{flag} {getattr(tp, '__name__', 'VALUE').upper()}"
    if isinstance(default, tuple):
        shown = ",".join(map(str, default)) if default else "(none)"
    else:
        shown = "(required)" if f.default is dataclasses.MISSING else str(default)
    meaning = f.metadata.get("help", "")
    if "choices" in f.metadata:
        meaning += f" (one of: {', '.join(map(str, f.metadata['choices']))})"
    meaning = meaning.replace("|", "\\|")
    return f"| `{arg}` | `{shown}` | {meaning} |"


def parse_value(cls: type[Any], name: str, text: str) -> Any:
    """``text`` parsed as the command line would parse the setting ``name`` (its flag without ``--``, as a
    Python name) of the dataclass ``cls``.

    Raises ``KeyError`` for a setting ``cls`` does not have and ``ValueError`` (naming the expected type or
    choices) for a value that does not parse.
    """
    opt = {o.dest: o for o in options(cls)}[name]
    tp = opt.type
    if tp is bool:
        parse: Callable[[str], Any] = _parse_bool
    elif typing.get_origin(tp) is tuple:
        parse = _tuple_parser(typing.get_args(tp)[0])
    else:
        parse = tp
    try:
        value = parse(text)
    except (ValueError, argparse.ArgumentTypeError):
        kind = "a comma-separated list" if typing.get_origin(tp) is tuple else getattr(tp, "__name__", str(tp))
        raise ValueError(f"expected {kind}, got {text!r}") from None
    if not _finite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    choices = opt.field.metadata.get("choices")
    if choices is not None and value not in choices:
        raise ValueError(f"expected one of {', '.join(map(str, choices))}, got {text!r}")
    return value


def parse_config(
    cls: type[C], argv: Sequence[str] | None, prog: str, description: str, positional: Sequence[str] = ()
) -> C:
    """Parse ``argv`` into a frozen ``cls`` instance (a bad flag is one ``SacEdgeError`` line, exit 2)."""
    ns = build_parser(cls, prog, description, positional).parse_args(argv)
    return config_from_flags(cls, vars(ns), prog)


def config_from_flags(cls: type[C], flags: Mapping[str, Any], source: str) -> C:
    """A ``cls`` instance from settings named as their flags (``rate_hz=100`` for ``--rate-hz 100``), each
    put in its section; a name that is no flag of ``cls`` is a one-line error naming ``source``."""
    by_dest = {o.dest: o for o in options(cls)}
    _refuse_unknown(
        flags,
        by_dest,
        lambda names: (
            f"{source}: {names} is no setting of {cls.__name__}; check the spelling against the "
            "command's --help (its flags' names, dashes as underscores)"
        ),
    )
    nested: dict[str, Any] = {}
    for dest, value in flags.items():
        *outer, name = by_dest[dest].path
        target = nested
        for part in outer:
            target = target.setdefault(part, {})
        target[name] = value
    return config_from_dict(cls, nested, source)


def config_from_dict(cls: type[C], values: Mapping[str, Any], source: str) -> C:
    """A ``cls`` instance from a saved config (a section as a nested object; JSON lists become tuples); a
    name ``cls`` has no field for is a one-line error naming ``source``, and so is a NaN or infinite
    number: no setting takes one (a NaN compares false with every bound, so range checks after this one
    would let it through)."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    values = _nest_inline(cls, fields, values)
    _refuse_unknown(
        values,
        fields,
        lambda names: (
            f"{source}: unknown setting(s) {names} (written by another sac-edge version?); "
            "remove them or rerun without the saved settings"
        ),
    )
    out: dict[str, Any] = {}
    for name, value in values.items():
        tp = _field_type(cls, fields[name].type)
        if _is_section(tp) and isinstance(value, Mapping):
            out[name] = config_from_dict(tp, value, source)
            continue
        if not _finite(value):
            flag = fields[name].metadata.get("flag", flag_of(name))
            raise SacEdgeError(f"{flag} must be a finite number, got {value}; pass a finite value")
        out[name] = tuple(value) if isinstance(value, list) else value
    return cls(**out)


def _nest_inline(cls: type[Any], fields: Mapping[str, dataclasses.Field], values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each inline section's settings (saved in ``cls``'s own object) under the section's name."""
    out = dict(values)
    for name, f in fields.items():
        if f.metadata.get("inline"):
            own = {g.name for g in dataclasses.fields(_field_type(cls, f.type))}
            moved = {key: out.pop(key) for key in list(out) if key in own}
            if moved:
                out[name] = {**out.get(name, {}), **moved}
    return out


def _refuse_unknown(given: Iterable[str], known: Container[str], message: Callable[[str], str]) -> None:
    """A one-line error, ``message`` of the sorted names in ``given`` that ``known`` lacks, if there are any."""
    unknown = sorted(name for name in set(given) if name not in known)
    if unknown:
        raise SacEdgeError(message(", ".join(unknown)))


def _finite(value: Any) -> bool:
    """False for a NaN or infinite float, alone or inside a tuple or list; True for anything else."""
    if isinstance(value, (tuple, list)):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _accepts(tp: Any, value: Any) -> bool:
    """Whether ``value`` is of the setting type ``tp`` as the command line would make it (an int is a float)."""
    if typing.get_origin(tp) is tuple:
        return isinstance(value, tuple) and all(_accepts(typing.get_args(tp)[0], v) for v in value)
    if tp is bool:
        return isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, tp) and not (tp is int and isinstance(value, bool))


def check_fields(config: Any) -> None:
    """The type, finiteness and choices of each of ``config``'s own settings (a section's are its own
    ``check``'s): what the command line's parser checks, for a config built in Python. A bad one is a
    one-line ``SacEdgeError`` naming its flag."""
    cls = type(config)
    for f in dataclasses.fields(config):
        if not f.init:
            continue
        tp, value = _field_type(cls, f.type), getattr(config, f.name)
        optional = isinstance(f.type, str) and "None" in (p.strip() for p in f.type.split("|"))
        if value is None and optional:
            continue
        if _is_section(tp):
            if not isinstance(value, tp):
                name = tp.__name__
                fix = f"{name}(...) or None" if optional else f"{name}(...)"
                raise SacEdgeError(f"{cls.__name__}.{f.name} must be a {name}, got {value!r}; pass {fix}")
            continue
        flag = f.metadata.get("flag", flag_of(f.name))
        if not _accepts(tp, value):
            item = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else None
            kind = f"a tuple of {item.__name__} values" if item is not None else _KINDS.get(tp, str(tp))
            raise SacEdgeError(f"{flag} must be {kind}, got {value!r}; pass {kind}")
        if not _finite(value):
            raise SacEdgeError(f"{flag} must be a finite number, got {value}; pass a finite value")
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise SacEdgeError(f"{flag} must be one of {', '.join(map(str, choices))}, got {value!r}")


def resume_conflicts(cfg: Any, saved: Mapping[str, Any], taken: Container[str]) -> list[str]:
    """What a ``--resume`` would drop in silence: the settings of the flat config ``cfg`` that the command line
    gave (other than their defaults), that differ from the ``saved`` ones and that the resume does not take
    (all but ``taken``), each as ``--flag VALUE (saved: VALUE)``. The same command line again has none."""
    now, default = config_dict(cfg), config_dict(type(cfg)())
    was = json.loads(json.dumps({k: v for k, v in saved.items() if k in now}, default=str))  # JSON forms, as now's
    flags = {opt.dest: opt.flag for opt in options(type(cfg))}
    return [
        f"{flags.get(k, k)} {_shown(v)} (saved: {_shown(was[k])})"
        for k, v in now.items()
        if k not in taken and v != default[k] and k in was and v != was[k]
    ]


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def config_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain JSON-able values (a section as a nested object, an inline section's
    settings in its outer object)."""
    return json.loads(json.dumps(_saved(cfg), default=str))


def _saved(cfg: Any) -> dict[str, Any]:
    """``dataclasses.asdict`` but for inline sections, whose settings go in the outer object."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            out[f.name] = value
        elif f.metadata.get("inline"):
            out.update(_saved(value))
        else:
            out[f.name] = _saved(value)
    return out


def save_config(cfg: Any, path: str | Path, **extra: Any) -> None:
    """Write the resolved config (plus ``extra`` facts, e.g. spaces and versions) atomically as JSON."""
    atomic_write_json(path, {**config_dict(cfg), **extra})
