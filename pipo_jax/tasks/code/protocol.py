"""What crosses between the processes: plain data as tagged JSON (`_encode` / `_decode`), one
message per line over pipes (`_Pipe`), memfds. Standard library only (both children import it)."""
from __future__ import annotations

import decimal
import fractions
import json
import numbers
import os
from typing import Any

from pipo_jax.tasks.code.feedback import _clip


_MAX_DEPTH = 200  # nesting of one encoded value
_MAX_MESSAGE_BYTES = 1 << 24  # one runner reply


class NotPlain(TypeError):
    """A value with no plain-data encoding."""


def _encode(x: Any, other, depth: int = 0) -> list:
    """`x` as tagged JSON: None, bool, int, float, complex, Fraction, Decimal, str, bytes, list,
    tuple, set, frozenset, dict (subclasses and numpy values as their plain value); anything else is
    ``other(x)`` (a handle on the runner's side, an error on the judge's)."""
    if depth > _MAX_DEPTH:
        raise NotPlain(f"a value nested deeper than {_MAX_DEPTH} levels")

    def enc(v):
        return _encode(v, other, depth + 1)

    if x is None:
        return ["n"]
    if isinstance(x, bool):
        return ["b", bool(x)]
    if type(x).__module__ == "numpy" and hasattr(x, "tolist"):
        return enc(x.tolist())
    if isinstance(x, numbers.Integral):
        return ["i", format(int(x), "x")]  # hex: no int/str digit limit
    if isinstance(x, fractions.Fraction):
        return ["q", format(x.numerator, "x"), format(x.denominator, "x")]
    if isinstance(x, decimal.Decimal):
        return ["D", str(decimal.Decimal(x))]
    if isinstance(x, numbers.Real):
        return ["f", float(x).hex()]
    if isinstance(x, complex):
        return ["c", x.real.hex(), x.imag.hex()]
    if isinstance(x, str):
        return ["s", str.__str__(x)]
    if isinstance(x, (bytes, bytearray)):
        return ["y", bytes(x).hex()]
    for cls, tag in ((list, "l"), (tuple, "t"), (set, "S"), (frozenset, "F")):
        if isinstance(x, cls):
            return [tag, [enc(v) for v in cls.__iter__(x)]]
    if isinstance(x, dict):
        return ["d", [[enc(k), enc(v)] for k, v in dict.items(x)]]
    return other(x)


def _decode(v: Any, ref, depth: int = 0) -> Any:
    """The value `_encode` wrote, built from builtin types only (``ref`` decodes "h" / "r"
    entries); ValueError on anything malformed."""
    if depth > _MAX_DEPTH or not isinstance(v, list) or not v or not isinstance(v[0], str):
        raise ValueError("malformed value")
    tag, args = v[0], v[1:]

    def dec(w):
        return _decode(w, ref, depth + 1)

    def one(kind):
        if len(args) != 1 or not isinstance(args[0], kind):
            raise ValueError(f"malformed {tag!r} value")
        return args[0]

    if tag == "n" and not args:
        return None
    if tag == "b":
        return one(bool)
    if tag == "i":
        return int(one(str), 16)
    if tag == "f":
        return float.fromhex(one(str))
    if tag in ("c", "q") and len(args) == 2 and all(isinstance(a, str) for a in args):
        if tag == "c":
            return complex(float.fromhex(args[0]), float.fromhex(args[1]))
        return fractions.Fraction(int(args[0], 16), int(args[1], 16))
    if tag == "D":
        return decimal.Decimal(one(str))
    if tag == "s":
        return one(str)
    if tag == "y":
        return bytes.fromhex(one(str))
    builders = {"l": list, "t": tuple, "S": set, "F": frozenset}
    try:
        if tag in builders:
            return builders[tag](dec(w) for w in one(list))
        if tag == "d":
            pairs = one(list)
            if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise ValueError("malformed dict")
            return {dec(k): dec(w) for k, w in pairs}
    except TypeError as e:  # an unhashable set element or dict key
        raise ValueError(f"malformed {tag!r} value: {e}") from None
    return ref(v)


class _Broken(Exception):
    """The runner broke the protocol (garbage, an unknown reply, a reply over the size limit)."""


class _Pipe:
    """One JSON object per line over a pair of pipe fds."""

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd, self.buf = read_fd, write_fd, bytearray()

    def send(self, obj: dict) -> None:
        data = memoryview((json.dumps(obj) + "\n").encode())
        while data:
            data = data[os.write(self.write_fd, data):]

    def recv(self, limit: float = _MAX_MESSAGE_BYTES) -> dict:
        """The next message; EOFError when the other side is gone."""
        scanned = 0
        while (end := self.buf.find(b"\n", scanned)) < 0:
            if len(self.buf) > limit:
                raise _Broken(f"a message over {limit} bytes")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise EOFError
            scanned = len(self.buf)
            self.buf += chunk
        line, self.buf = bytes(self.buf[:end]), self.buf[end + 1:]
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise _Broken(f"unreadable message: {_clip(repr(line), 60)}") from e
        if not isinstance(msg, dict):
            raise _Broken("a message that is not an object")
        return msg


def _memfd_with(data: bytes, name: str) -> int:
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_all(fd: int, limit: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, min(1 << 16, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
