"""One frozen dataclass per command; its field docs become ``--help`` and it is saved beside artifacts.

A field's help text is ``field(metadata={"help": ...})``; ``choices`` may be given the same way, and
``const``: the value of the flag given bare (``--compile`` for ``--compile on``), ``no_const`` that of its
``--no-`` form. Booleans become ``--flag/--no-flag``; a field named in ``positional`` becomes a positional
argument; a tuple field with ``metadata={"repeat": True}`` takes one or more values per flag and may be
repeated.
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .atomic import atomic_write_json
from .errors import SacEdgeError

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
    """The command-line flag of the config field ``name``."""
    return "--" + name.replace("_", "-")


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line error convention: a bad flag is a ``SacEdgeError`` naming the flag and the
    fix, not argparse's usage block (tens of lines) and its own exit."""

    def error(self, message: str) -> typing.NoReturn:
        raise SacEdgeError(f"{message}; {_fix(message)} ('{self.prog} --help' lists the options)")


def _fix(message: str) -> str:
    """What to do about one of argparse's messages."""
    if "invalid choice" in message:
        return "pass one of the choices"
    if message.startswith("unrecognized arguments"):
        return "remove them or check their spelling"
    if "required" in message:
        return "give it"
    if "expected" in message and "argument" in message:
        return "give the flag its value"
    match = re.search(r"invalid (\w+) value", message)
    if match:
        kind = {"float": "a number", "int": "an integer"}.get(match.group(1), f"a {match.group(1)} value")
        return f"pass {kind}"
    return "correct the flag"


def build_parser(
    cls: type[Any], prog: str, description: str, positional: Sequence[str] = ()
) -> argparse.ArgumentParser:
    """An argparse parser whose options are the fields of the dataclass ``cls``; its errors are one-line
    ``SacEdgeError``s."""
    parser = _Parser(prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = _field_type(cls, f.type)
        help_text = f.metadata.get("help", "")
        kwargs: dict[str, Any] = {"help": help_text}
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if "const" in f.metadata:  # the value of the bare flag (``--compile`` = ``--compile on``)
            kwargs.update(nargs="?", const=f.metadata["const"])
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.name in positional:
            if f.default is not dataclasses.MISSING:  # an optional positional
                kwargs.update(nargs="?", default=default)
            parser.add_argument(f.name, type=tp if tp is not bool else _parse_bool, **kwargs)
            continue
        flag = flag_of(f.name)
        if tp is bool:
            parser.add_argument(flag, action=_BoolFlag, default=default, **kwargs)
        elif typing.get_origin(tp) is tuple and f.metadata.get("repeat"):
            parser.add_argument(flag, action="extend", nargs="+", default=list(default or ()), **kwargs)
        elif typing.get_origin(tp) is tuple:
            parser.add_argument(
                flag,
                type=_tuple_parser(typing.get_args(tp)[0]),
                default=default,
                metavar="A,B,...",
                **kwargs,
            )
        else:
            parser.add_argument(flag, type=tp, default=default, **kwargs)
        if "no_const" in f.metadata:  # ``--no-compile`` = ``--compile off``
            parser.add_argument(
                "--no-" + flag[2:],
                dest=f.name,
                action="store_const",
                const=f.metadata["no_const"],
                help=argparse.SUPPRESS,
            )
    return parser


def reference_markdown(cls: type[Any], positional: Sequence[str] = ()) -> str:
    """A Markdown table of the command line ``build_parser(cls, ...)`` makes: argument, default, help."""
    lines = ["| argument | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = _field_type(cls, f.type)
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.name in positional:
            arg = f.name.upper() if f.default is dataclasses.MISSING else f"[{f.name.upper()}]"
        elif tp is bool:
            arg = f"{flag_of(f.name)}, --no-{flag_of(f.name)[2:]}"
        elif "const" in f.metadata:
            arg = f"{flag_of(f.name)} [VALUE]"
        elif typing.get_origin(tp) is tuple:
            arg = f"{flag_of(f.name)} {'VALUE [VALUE ...]' if f.metadata.get('repeat') else 'A,B,...'}"
        else:
            arg = f"{flag_of(f.name)} {getattr(tp, '__name__', 'VALUE').upper()}"
        if isinstance(default, tuple):
            shown = ",".join(map(str, default)) if default else "(none)"
        else:
            shown = "(required)" if f.default is dataclasses.MISSING else str(default)
        meaning = f.metadata.get("help", "")
        if "choices" in f.metadata:
            meaning += f" (one of: {', '.join(map(str, f.metadata['choices']))})"
        meaning = meaning.replace("|", "\\|")
        lines.append(f"| `{arg}` | `{shown}` | {meaning} |")
    return "\n".join(lines) + "\n"


def parse_value(cls: type[Any], name: str, text: str) -> Any:
    """``text`` parsed as the command line would parse ``--name`` of the dataclass ``cls``.

    Raises ``KeyError`` for a field ``cls`` does not have and ``ValueError`` (naming the expected type or
    choices) for a value that does not parse.
    """
    fld = {f.name: f for f in dataclasses.fields(cls) if f.init}[name]
    tp = _field_type(cls, fld.type)
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
    choices = fld.metadata.get("choices")
    if choices is not None and value not in choices:
        raise ValueError(f"expected one of {', '.join(map(str, choices))}, got {text!r}")
    return value


def parse_config(
    cls: type[C], argv: Sequence[str] | None, prog: str, description: str, positional: Sequence[str] = ()
) -> C:
    """Parse ``argv`` into a frozen ``cls`` instance (a bad flag is one ``SacEdgeError`` line, exit 2)."""
    ns = build_parser(cls, prog, description, positional).parse_args(argv)
    return config_from_dict(cls, vars(ns), prog)


def config_from_dict(cls: type[C], values: Mapping[str, Any], source: str) -> C:
    """A ``cls`` instance from parsed flags or a saved config (JSON lists become tuples); a name ``cls``
    has no field for is a one-line error naming ``source``, and so is a NaN or infinite number: no setting
    takes one (a NaN compares false with every bound, so range checks after this one would let it through)."""
    fields = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(values) - fields)
    if unknown:
        raise SacEdgeError(
            f"{source}: unknown setting(s) {', '.join(unknown)} (written by another sac-edge version?); "
            "remove them or rerun without the saved settings"
        )
    for name, value in values.items():
        if not _finite(value):
            raise SacEdgeError(f"--{name.replace('_', '-')} must be a finite number, got {value}; pass a finite value")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def _finite(value: Any) -> bool:
    """False for a NaN or infinite float, alone or inside a tuple or list; True for anything else."""
    if isinstance(value, (tuple, list)):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def config_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain JSON-able values."""
    out = dataclasses.asdict(cfg)
    return json.loads(json.dumps(out, default=str))


def save_config(cfg: Any, path: str | Path, **extra: Any) -> None:
    """Write the resolved config (plus ``extra`` facts, e.g. spaces and versions) atomically as JSON."""
    atomic_write_json(path, {**config_dict(cfg), **extra})
