"""One frozen dataclass per command; its field docs become ``--help`` and it is saved beside artifacts.

A field's help text is ``field(metadata={"help": ...})``; ``choices`` may be given the same way, and
``const``: the value of the flag given bare (``--compile`` for ``--compile on``), ``no_const`` that of its
``--no-`` form. Booleans
become ``--flag/--no-flag``; a field named in ``positional`` becomes a positional argument.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .atomic import atomic_write_json

C = TypeVar("C")


def _base_type(tp: Any) -> Any:
    """Strip ``X | None`` down to ``X``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return tp


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


def build_parser(
    cls: type[Any], prog: str, description: str, positional: Sequence[str] = ()
) -> argparse.ArgumentParser:
    """An argparse parser whose options are the fields of the dataclass ``cls``."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = _base_type(hints[f.name])
        help_text = f.metadata.get("help", "")
        kwargs: dict[str, Any] = {"help": help_text}
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if "const" in f.metadata:  # the value of the bare flag (``--compile`` = ``--compile on``)
            kwargs.update(nargs="?", const=f.metadata["const"])
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.name in positional:
            parser.add_argument(f.name, type=tp if tp is not bool else _parse_bool, **kwargs)
            continue
        flag = "--" + f.name.replace("_", "-")
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, **kwargs)
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


def parse_config(
    cls: type[C], argv: Sequence[str] | None, prog: str, description: str, positional: Sequence[str] = ()
) -> C:
    """Parse ``argv`` into a frozen ``cls`` instance (argparse exits 2 with one line on a bad flag)."""
    ns = build_parser(cls, prog, description, positional).parse_args(argv)
    return cls(**vars(ns))


def config_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain JSON-able values."""
    out = dataclasses.asdict(cfg)
    return json.loads(json.dumps(out, default=str))


def save_config(cfg: Any, path: str | Path, **extra: Any) -> None:
    """Write the resolved config (plus ``extra`` facts, e.g. spaces and versions) atomically as JSON."""
    atomic_write_json(path, {**config_dict(cfg), **extra})
