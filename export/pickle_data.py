"""A pickle read as data: the opcode stream is walked by a small stack machine that never imports,
looks up or calls anything the file names.

A pickle is a program for an interpreter that imports any global it names and calls it; even a restricted
unpickler runs numpy's own reconstructors on the file's arguments (``dtype.__setstate__`` on a dtype an
array already uses rewrites its layout in place: memory corruption from a 700-byte file). Here a global is
only a name: the caller maps the few names its files use to plain records (``Ref``), and the opcodes that
would call something (REDUCE, NEWOBJ, BUILD) only record their arguments on that record. Arrays are built by
the caller from the raw bytes and the declared dtype and shape (``plain_array``), after checking both.

Only the opcodes of protocols 2 to 5 that such files use are known; any other opcode, a global not in the
caller's list, a truncated stream or an oversized value refuses the file (``PickleDataError``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


class PickleDataError(ValueError):
    """The stream is not a pickle this reader accepts (the message says why, in a few words)."""


class Ref:
    """A global the caller allowed (``kind`` is the caller's name for it), or what the stream made of it:
    ``args`` from REDUCE/NEWOBJ, ``state`` from BUILD (at most once), never called."""

    def __init__(self, kind: str, args: tuple[Any, ...] | None = None) -> None:
        self.kind, self.args, self.state, self.built = kind, args, None, False

    def __repr__(self) -> str:  # never the file's values: error messages stay short
        return f"<{self.kind}>"


#: The kind a caller gives a dict class (``collections.OrderedDict``): called without arguments, a dict.
DICT = "dict"
#: Plain numeric dtypes by numpy's type string, without byte order: no objects, strings, voids or records.
PLAIN_DTYPES = {"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8"}
#: The largest integer a file may write (LONG1/LONG4 bytes); sizes fit in 8, a random seed state in 17.
_MAX_LONG_BYTES = 64
#: The most opcodes a stream may run (a state dict takes ~30 per tensor, a VecNormalize file ~500). Each makes
#: at most one value (a list, a dict, a memo entry: ~100 bytes besides the file's own bytes), so this bounds
#: what a stream of ``]`` opcodes (in an SB3 zip, deflated: 16 KiB for 16 MiB of them, 900 MiB of lists)
#: can make the reader allocate to ~25 MiB, and its time to about a second.
MAX_OPCODES = 1 << 18
#: Dict keys must be of these types: hashing a file's nested tuple could recurse without bound.
_KEY_TYPES = (str, bytes, int, float, bool, type(None))
_MARK = object()


class _Machine:
    def __init__(self, raw: bytes, globals_: Mapping[tuple[str, str], str], persistent: Callable[[Any], Any] | None):
        self.raw, self.pos, self.globals, self.persistent = raw, 0, globals_, persistent
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}

    # -- the raw stream ------------------------------------------------------------------------------------
    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.raw):
            raise PickleDataError(f"truncated stream (needs {n} bytes at byte {self.pos})")
        chunk = self.raw[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def line(self) -> str:
        end = self.raw.find(b"\n", self.pos, self.pos + 256)
        if end < 0:
            raise PickleDataError(f"unterminated text argument at byte {self.pos}")
        text = self.raw[self.pos : end].decode("ascii", "strict")
        self.pos = end + 1
        return text

    # -- the stack ---------------------------------------------------------------------------------------
    def pop(self) -> Any:
        if not self.stack or (self.marks and len(self.stack) == self.marks[-1]):
            raise PickleDataError(f"stack underflow at byte {self.pos}")
        return self.stack.pop()

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise PickleDataError(f"no mark at byte {self.pos}")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def top(self) -> Any:
        if not self.stack or (self.marks and len(self.stack) == self.marks[-1]):
            raise PickleDataError(f"stack underflow at byte {self.pos}")
        return self.stack[-1]

    def memo_get(self, key: int) -> Any:
        if key not in self.memo:
            raise PickleDataError(f"memo {key} read before it was written")
        return self.memo[key]

    def global_(self, module: Any, name: Any) -> Ref:
        if not (isinstance(module, str) and isinstance(name, str)):
            raise PickleDataError("a global named by something other than text")
        kind = self.globals.get((module, name))
        if kind is None:
            raise PickleDataError(f"refused global {module[:60]}.{name[:60]}")
        return Ref(kind)

    def call(self, func: Any, args: Any) -> Any:
        if not (isinstance(func, Ref) and func.args is None) or not isinstance(args, tuple):
            raise PickleDataError(f"a call of something other than an allowed global at byte {self.pos}")
        if func.kind == DICT and args == ():  # a global the caller maps to DICT: an empty (ordered) dict
            return {}
        return Ref(func.kind, args)

    @staticmethod
    def set_items(target: Any, items: list[Any]) -> None:
        if not isinstance(target, dict) or len(items) % 2:
            raise PickleDataError("SETITEM(S) on something other than a dict")
        for key, value in zip(items[::2], items[1::2]):
            if not isinstance(key, _KEY_TYPES):
                raise PickleDataError("a dict key that is not a plain value")
            target[key] = value

    def build(self) -> None:
        state, target = self.pop(), self.top()
        if isinstance(target, dict) and isinstance(state, dict):
            return  # attributes of a dict subclass (a state dict's ``_metadata``): not kept
        if not isinstance(target, Ref) or target.built:
            raise PickleDataError("BUILD on something other than a fresh allowed record (built once only)")
        target.state, target.built = state, True

    # -- the program -------------------------------------------------------------------------------------
    def run(self) -> Any:
        ops = _OPS
        for _ in range(MAX_OPCODES):
            code = self.take(1)[0]
            op = ops.get(code)
            if op is None:
                raise PickleDataError(f"unknown or refused opcode 0x{code:02x} at byte {self.pos - 1}")
            if op(self) is _STOP:
                if self.marks or len(self.stack) != 1:
                    raise PickleDataError("STOP with a malformed stack")
                return self.stack[0]
        raise PickleDataError(f"more than {MAX_OPCODES} opcodes, past any state dict or statistics file")


_STOP = object()


def _push(value: Callable[[_Machine], Any]) -> Callable[[_Machine], None]:
    return lambda m: m.stack.append(value(m))


def _long(m: _Machine, n: int) -> int:
    if n > _MAX_LONG_BYTES:
        raise PickleDataError(f"an integer of {n} bytes")
    return int.from_bytes(m.take(n), "little", signed=True)


def _tuple_n(n: int) -> Callable[[_Machine], None]:
    def op(m: _Machine) -> None:
        items = [m.pop() for _ in range(n)][::-1]
        m.stack.append(tuple(items))

    return op


def _memoize(m: _Machine, key: int) -> None:
    m.memo[key] = m.top()


def _append(m: _Machine) -> None:
    value = m.pop()
    target = m.top()
    if not isinstance(target, list):
        raise PickleDataError("APPEND on something other than a list")
    target.append(value)


def _appends(m: _Machine) -> None:
    items = m.pop_mark()
    target = m.top()
    if not isinstance(target, list):
        raise PickleDataError("APPENDS on something other than a list")
    target.extend(items)


def _setitem(m: _Machine) -> None:
    value, key = m.pop(), m.pop()
    m.set_items(m.top(), [key, value])


def _setitems(m: _Machine) -> None:
    items = m.pop_mark()
    m.set_items(m.top(), items)


def _dict(m: _Machine) -> None:
    target: dict[Any, Any] = {}
    m.set_items(target, m.pop_mark())
    m.stack.append(target)


def _reduce(m: _Machine) -> None:
    args = m.pop()
    m.stack.append(m.call(m.pop(), args))


def _newobj_ex(m: _Machine) -> None:
    kwargs, args = m.pop(), m.pop()
    if kwargs != {}:
        raise PickleDataError("NEWOBJ_EX with keyword arguments")
    m.stack.append(m.call(m.pop(), args))


def _persid(m: _Machine) -> None:
    if m.persistent is None:
        raise PickleDataError("a persistent reference where none is expected")
    m.stack.append(m.persistent(m.pop()))


def _mark(m: _Machine) -> None:
    m.marks.append(len(m.stack))


def _pop(m: _Machine) -> None:
    m.pop()


def _stop(m: _Machine) -> object:
    return _STOP


def _proto(m: _Machine) -> None:
    if m.take(1)[0] not in (2, 3, 4, 5):
        raise PickleDataError("a pickle protocol other than 2 to 5")


def _frame(m: _Machine) -> None:
    m.unpack("<Q")  # frame length: a hint for buffered readers; the stream is already in memory


_OPS: dict[int, Callable[[_Machine], Any]] = {
    0x80: _proto,
    0x95: _frame,
    ord("."): _stop,
    ord("("): _mark,
    ord("0"): _pop,
    ord("1"): lambda m: m.pop_mark().clear(),
    # memo
    0x94: lambda m: _memoize(m, len(m.memo)),
    ord("q"): lambda m: _memoize(m, m.unpack("<B")),
    ord("r"): lambda m: _memoize(m, m.unpack("<I")),
    ord("h"): _push(lambda m: m.memo_get(m.unpack("<B"))),
    ord("j"): _push(lambda m: m.memo_get(m.unpack("<I"))),
    # constants
    ord("N"): _push(lambda m: None),
    0x88: _push(lambda m: True),
    0x89: _push(lambda m: False),
    ord("K"): _push(lambda m: m.unpack("<B")),
    ord("M"): _push(lambda m: m.unpack("<H")),
    ord("J"): _push(lambda m: m.unpack("<i")),
    0x8A: _push(lambda m: _long(m, m.unpack("<B"))),
    0x8B: _push(lambda m: _long(m, m.unpack("<i"))),
    ord("G"): _push(lambda m: m.unpack(">d")),
    0x8C: _push(lambda m: m.take(m.unpack("<B")).decode("utf-8", "strict")),
    ord("X"): _push(lambda m: m.take(m.unpack("<I")).decode("utf-8", "strict")),
    0x8D: _push(lambda m: m.take(m.unpack("<Q")).decode("utf-8", "strict")),
    ord("C"): _push(lambda m: m.take(m.unpack("<B"))),
    ord("B"): _push(lambda m: m.take(m.unpack("<I"))),
    0x8E: _push(lambda m: m.take(m.unpack("<Q"))),
    0x96: _push(lambda m: m.take(m.unpack("<Q"))),  # BYTEARRAY8: read-only bytes here
    # containers
    ord(")"): _push(lambda m: ()),
    ord("t"): _push(lambda m: tuple(m.pop_mark())),
    0x85: _tuple_n(1),
    0x86: _tuple_n(2),
    0x87: _tuple_n(3),
    ord("]"): _push(lambda m: []),
    ord("l"): _push(lambda m: m.pop_mark()),
    ord("a"): _append,
    ord("e"): _appends,
    ord("}"): _push(lambda m: {}),
    ord("d"): _dict,
    ord("s"): _setitem,
    ord("u"): _setitems,
    # names and the opcodes that would call them: recorded only
    ord("c"): _push(lambda m: m.global_(m.line(), m.line())),
    0x93: lambda m: m.stack.append(m.global_(*reversed([m.pop(), m.pop()]))),
    ord("R"): _reduce,
    0x81: _reduce,  # NEWOBJ: cls, args -> a record of cls with args
    0x92: _newobj_ex,
    ord("b"): lambda m: m.build(),
    ord("Q"): _persid,
}


def read_pickle(
    raw: bytes, globals_: Mapping[tuple[str, str], str], persistent: Callable[[Any], Any] | None = None
) -> Any:
    """The object ``raw`` describes, as plain values (None, bool, int, float, str, bytes, tuple, list, dict)
    and ``Ref`` records of the globals in ``globals_`` (``(module, name) -> kind``). ``persistent``, if
    given, maps a BINPERSID reference to a value. Raises PickleDataError."""
    try:
        return _Machine(raw, globals_, persistent).run()
    except (UnicodeDecodeError, struct.error) as err:
        raise PickleDataError(f"malformed value ({type(err).__name__})") from None


def plain_dtype(kind: str, args: Any, state: Any) -> np.dtype[Any]:
    """The dtype of a ``numpy.dtype(code, align, copy)`` record whose BUILD state is a plain one (byte
    order only: no fields, names, subarray or flags); anything else is refused."""
    if not (isinstance(args, tuple) and len(args) >= 1 and isinstance(args[0], str)):
        raise PickleDataError(f"{kind} without a type code")
    code = args[0]
    order = "|"
    if state is not None:
        if not (isinstance(state, tuple) and len(state) == 8 and state[0] in (3, 4)):
            raise PickleDataError(f"dtype {code[:8]!r} with an unknown state")
        order = state[1]
        if order not in ("<", ">", "|", "=") or state[2:] != (None, None, None, -1, -1, 0):
            raise PickleDataError(f"dtype {code[:8]!r} with fields, a subarray or flags (only plain dtypes)")
    if code not in PLAIN_DTYPES:
        raise PickleDataError(f"dtype {code[:8]!r} is not a plain numeric dtype")
    return np.dtype(code).newbyteorder("=" if order in ("|", "=") else order)


def plain_array(dtype: np.dtype[Any], shape: Any, data: Any, fortran: bool, max_bytes: int) -> np.ndarray:
    """An array copied from ``data`` (raw bytes) with ``dtype`` and ``shape``, after checking that the shape
    is a tuple of sizes, the array is at most ``max_bytes`` and ``data`` has exactly its length."""
    if not (isinstance(shape, tuple) and len(shape) <= 8 and all(type(d) is int and d >= 0 for d in shape)):
        raise PickleDataError("array shape is not a tuple of sizes")
    count = 1
    for dim in shape:
        count *= dim
    nbytes = count * dtype.itemsize
    if nbytes > max_bytes:
        raise PickleDataError(f"an array of {nbytes} bytes is larger than {max_bytes >> 20} MiB")
    if not isinstance(data, bytes) or len(data) != nbytes:
        raise PickleDataError(f"array data of {len(data) if isinstance(data, bytes) else 'no'} bytes for {nbytes}")
    flat = np.frombuffer(data, dtype=dtype, count=count)
    return flat.reshape(shape, order="F" if fortran else "C").copy()
