"""One error convention for every command: a single line on stderr and a meaningful exit code."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence


class SacEdgeError(Exception):
    """A problem the user can fix (bad flag, bad file). Printed as one line; exit code 2."""

    exit_code = 2


class InternalError(SacEdgeError):
    """Something went wrong inside sac-edge (not the user's input). Exit code 1."""

    exit_code = 1


def require_extra(what: str, extra: str, modules: Sequence[str]) -> None:
    """Refuse in one line (exit 2) when a module ``what`` needs is not installed, naming pyproject's extra that
    brings it: the device install (``pip install sac-edge``) and the ROS venv have no torch. Call it before
    importing them."""
    import importlib.util

    missing = next((m for m in modules if importlib.util.find_spec(m) is None), None)
    if missing is not None:
        raise SacEdgeError(
            f"{what} needs the '{extra}' extra ({missing} is not installed): pip install 'sac-edge[{extra}]'"
        )


def run_cli(prog: str, main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None) -> int:
    """Run a command's main and turn every failure into one line on stderr plus an exit code.

    2 means bad input (the message names the problem and the fix), 1 an internal failure, 130 Ctrl-C.
    Warnings from libraries (torch, onnx, gymnasium) would be extra stderr lines: they are dropped unless
    the command line has ``--verbose``.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        with warnings.catch_warnings():
            if "--verbose" not in args:
                warnings.simplefilter("ignore")
            return main(args)
    except SacEdgeError as err:
        print(f"{prog}: error: {printable(str(err))}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one line, never a traceback, for anything unforeseen
        print(f"{prog}: internal error: {printable(one_line(err))}", file=sys.stderr)
        return 1


def one_line(err: BaseException) -> str:
    """``Type: first line of the message``: an unforeseen error as a summary line, a log entry or a message."""
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"


def printable(text: str) -> str:
    """``text`` with every control or format character escaped (``\\n``, ``\\x1b``, ``\\u202e``).

    Messages quote names from untrusted files (a manifest's file names, a zip's member names); a newline
    in one would forge a second line of output, an ANSI escape would drive the terminal.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
