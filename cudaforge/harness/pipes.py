"""The messages between the worker pool and its worker processes: one pickled dict per message,
behind an 8-byte big-endian length, over a pipe of their own; a deadline for the first byte."""

from __future__ import annotations

import os
import pickle
import select
import struct
import time

_HEADER = struct.Struct(">Q")


class PipeClosed(Exception):
    """The other end of the pipe is gone."""


class NoMessage(Exception):
    """No message before the deadline."""


def send(fd: int, message: dict) -> None:
    """Write one message (blocks until the pipe took all of it)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoMessage
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                raise NoMessage
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise PipeClosed
        buf += chunk
    return bytes(buf)


def receive(fd: int, deadline: float | None = None) -> dict:
    """Read one message; NoMessage when none starts before `deadline` (time.monotonic()),
    PipeClosed when the other end is gone."""
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    # once a message has started, the rest follows at pipe speed
    body = _read_exact(fd, size, None if deadline is None else max(deadline, time.monotonic() + 30))
    return pickle.loads(body)
