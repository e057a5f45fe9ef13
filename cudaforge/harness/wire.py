"""The wire between the pool and a worker: length-prefixed JSON frames, never pickle.

A frame is an 8-byte big-endian length, then that many bytes. A message is one frame of UTF-8
JSON holding an object, at most `MAX_MESSAGE_BYTES`. Floats keep NaN and the infinities: they
are written as JSON's common extension `NaN`, `Infinity`, `-Infinity` (Python's `allow_nan`),
which `recv` reads back and which no other token can be mistaken for; `validate_result` then
says where a non-finite number is allowed. Tensors cross as a message whose "tensors" entry
lists each one's dtype, shape and byte count, then one raw frame per tensor (little-endian
bytes); the receiver checks every size before it allocates anything, so a worker that lies
about sizes gets a `WireError`, not a crash or a huge allocation. On a GPU the bytes may lie in
a device area the receiver lent instead (area.py): the message says "in_area", and each tensor
sits at the offset `area_layout` gives, which both sides compute from the sizes alone.

A process that ran a candidate may send anything: whatever `recv` returns is plain data (dicts,
lists, strings, numbers), and results are checked with `validate_result` before use.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import select
import struct
import sys
import time
import types
import typing
from collections.abc import Sequence
from typing import Any

from .results import STATUSES, EvalResult, TrialFailure

MAX_MESSAGE_BYTES = 64 << 20  # one JSON message
MAX_TENSOR_BYTES = 16 << 30  # all the tensors of one message together, unless the caller says
MAX_TENSORS = 1024  # tensors in one message
MAX_DIMS = 32
MAX_TEXT = 1 << 20  # characters of one string in a result
BODY_GRACE = 30.0  # s: once a frame has started, the rest may come this late past the deadline

# bytes per element of each dtype that may cross, by torch's name without "torch."
ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4, "complex32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "complex64": 8,
    "complex128": 16,
}  # fmt: skip

AREA_ALIGN = 256  # bytes: where each tensor starts in a device area

_LENGTH = struct.Struct(">Q")


class WireError(ValueError):
    """A frame that breaks the protocol: over the size limit, not UTF-8 JSON, not an object, or
    tensors whose sizes do not add up. The stream cannot be trusted after it."""


class PeerClosed(EOFError):
    """The other end closed the pipe before a frame began."""


class TruncatedFrame(PeerClosed):
    """The other end closed the pipe in the middle of a frame (it died while writing)."""


class MessageLate(TimeoutError):
    """No frame began before the deadline."""


# ---------------------------------------------------------------- frames


def _byte_view(data: Any) -> memoryview:
    """`data` (bytes-like, C-contiguous) as a flat view of bytes, without a copy."""
    view = memoryview(data)
    if not view.c_contiguous:
        raise ValueError("tensor bytes must be C-contiguous")
    return view.cast("B") if view.nbytes else memoryview(b"")


def _write_all(fd: int, data) -> None:
    view = _byte_view(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _wait_readable(fd: int, deadline: float | None) -> None:
    if deadline is None:
        return
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
        raise MessageLate(f"no message within the deadline on fd {fd}")


def _read_into(fd: int, buffer: memoryview, deadline: float | None, started: bool) -> None:
    """Fill `buffer` from `fd`; `started` says a frame is under way (EOF is then truncation)."""
    done = 0
    while done < len(buffer):
        _wait_readable(fd, deadline)
        count = os.readv(fd, [buffer[done:]])
        if count == 0:
            if started or done:
                raise TruncatedFrame(f"the frame stopped after {done} of {len(buffer)} bytes")
            raise PeerClosed("the other end closed the pipe")
        done += count


def _read_length(fd: int, deadline: float | None) -> tuple[int, float | None]:
    """The length of the next frame, and the deadline for its body."""
    header = bytearray(_LENGTH.size)
    _read_into(fd, memoryview(header), deadline, started=False)
    body_deadline = None if deadline is None else max(deadline, time.monotonic() + BODY_GRACE)
    return _LENGTH.unpack(header)[0], body_deadline


# ---------------------------------------------------------------- JSON messages


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise WireError(f"key {twice!r} appears twice in one object")
    return result


def encode(message: dict) -> bytes:
    """`message` as the body of one frame: ASCII JSON (so valid UTF-8), NaN and the infinities
    as `NaN`/`Infinity`/`-Infinity`. TypeError if it is not a dict, ValueError if too large."""
    if not isinstance(message, dict):
        raise TypeError(f"a message is a dict, not {type(message).__name__}")
    body = json.dumps(message, allow_nan=True, ensure_ascii=True, separators=(",", ":"))
    if len(body) > MAX_MESSAGE_BYTES:
        raise ValueError(f"message of {len(body)} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
    return body.encode("ascii")


def decode(body: bytes) -> dict:
    """The message a frame's body holds; WireError unless it is strict UTF-8 JSON of an object
    (duplicate keys refused; NaN/Infinity/-Infinity read as floats)."""
    try:
        message = json.loads(body.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except WireError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"a message that is not UTF-8 JSON: {str(exc)[:200]}") from None
    if not isinstance(message, dict):
        raise WireError(f"a message that is a JSON {type(message).__name__}, not an object")
    return message


def send(fd: int, message: dict) -> None:
    """Write `message` (a JSON-able dict) to `fd` as one frame."""
    body = encode(message)
    _write_all(fd, _LENGTH.pack(len(body)) + body)


def recv(fd: int, deadline: float | None = None) -> dict:
    """The next message from `fd`. `deadline` (time.monotonic() seconds) bounds the wait for the
    frame to begin; the rest may take BODY_GRACE seconds more. Raises MessageLate, PeerClosed,
    TruncatedFrame, or WireError (too large, checked before reading it; not JSON)."""
    size, body_deadline = _read_length(fd, deadline)
    if size > MAX_MESSAGE_BYTES:
        raise WireError(f"a message of {size} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
    body = bytearray(size)
    _read_into(fd, memoryview(body), body_deadline, started=True)
    return decode(bytes(body))


# ---------------------------------------------------------------- tensors


def _tensor_bytes(dtype: Any, shape: Any, where: str) -> int:
    """Bytes of a tensor of `dtype` and `shape`, both checked to be well formed."""
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise WireError(f"{where}: dtype {str(dtype)[:40]!r} is not one of {sorted(ITEMSIZE)}")
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_DIMS:
        raise WireError(f"{where}: shape is not a list of at most {MAX_DIMS} sizes")
    if not all(type(n) is int and 0 <= n < 1 << 62 for n in shape):
        raise WireError(f"{where}: shape {list(shape)[:8]} holds a size that is not an int >= 0")
    return math.prod(shape) * ITEMSIZE[dtype]


def _listed(i: int, dtype: str, shape: Sequence[int]) -> dict:
    """The "tensors" entry of tensor `i`: its dtype, shape and byte count, checked."""
    return {"dtype": dtype, "shape": list(shape),
            "nbytes": _tensor_bytes(dtype, list(shape), f"tensor {i}")}  # fmt: skip


def send_tensors(fd: int, header: dict, tensors: Sequence[tuple[str, Sequence[int], Any]]) -> None:
    """Send `header` (a JSON-able dict) with a "tensors" entry listing each tensor's dtype, shape
    and byte count, then each tensor's bytes (bytes-like, little-endian, C order) as a frame."""
    if sys.byteorder != "little":
        raise NotImplementedError("the wire carries little-endian tensors only")
    if "tensors" in header:
        raise ValueError('the header has its own "tensors" entry')
    listed, views = [], []
    for i, (dtype, shape, data) in enumerate(tensors):
        view = _byte_view(data)
        entry = _listed(i, dtype, shape)
        if view.nbytes != entry["nbytes"]:
            raise ValueError(f"tensor {i}: {view.nbytes} bytes for {dtype} {list(shape)}")
        listed.append(entry)
        views.append(view)
    send(fd, {**header, "tensors": listed})
    for view in views:
        _write_all(fd, _LENGTH.pack(view.nbytes))
        _write_all(fd, view)


def area_layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """(offsets, span): tensors of `sizes` bytes laid one after another in a device area, each
    starting at a multiple of AREA_ALIGN."""
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += -(-n // AREA_ALIGN) * AREA_ALIGN
    return offsets, end


def send_in_area(fd: int, header: dict, specs: Sequence[tuple[str, Sequence[int]]]) -> None:
    """Send `header` for tensors of `specs` ((dtype, shape) pairs) whose bytes the sender has
    already written into the receiver's device area, at area_layout's offsets."""
    if "tensors" in header or "in_area" in header:
        raise ValueError('the header has its own "tensors" or "in_area" entry')
    listed = [_listed(i, dtype, shape) for i, (dtype, shape) in enumerate(specs)]
    send(fd, {**header, "tensors": listed, "in_area": True})


def recv_tensors(
    fd: int,
    deadline: float | None = None,
    *,
    expect: Sequence[tuple[str, Sequence[int]]] | None = None,
    max_bytes: int = MAX_TENSOR_BYTES,
    area: Any = None,
) -> tuple[dict, list[tuple[str, tuple[int, ...], Any]]]:
    """read_tensors of the next message on `fd`."""
    header = recv(fd, deadline)
    return read_tensors(fd, header, deadline, expect=expect, max_bytes=max_bytes, area=area)


def read_tensors(
    fd: int,
    header: dict,
    deadline: float | None = None,
    *,
    expect: Sequence[tuple[str, Sequence[int]]] | None = None,
    max_bytes: int = MAX_TENSOR_BYTES,
    area: Any = None,
) -> tuple[dict, list[tuple[str, tuple[int, ...], Any]]]:
    """(header, [(dtype, shape, data)]) sent by `send_tensors`; "tensors" is taken out of the
    header. Every size is checked before anything is allocated: the dtypes and shapes must be
    well formed, each byte count must match its shape, all of them together at most `max_bytes`,
    and, when `expect` lists (dtype, shape) pairs (e.g. the reference's outputs), equal to it.
    WireError otherwise. `data` is a writable bytearray (torch.frombuffer takes it as is), or,
    for a message sent with `send_in_area`, `area.view(offset, nbytes)` of the `area` lent to
    the sender (WireError when none was, or when the tensors do not fit in it). `header` is the
    message already received; its tensors' frames follow it on `fd`."""
    in_area = header.pop("in_area", False)
    if in_area not in (True, False):
        raise WireError('an "in_area" entry that is not true or false')
    listed = header.pop("tensors", None)
    if not isinstance(listed, list) or len(listed) > MAX_TENSORS:
        raise WireError(f'the header has no "tensors" list of at most {MAX_TENSORS} entries')
    if expect is not None and len(listed) != len(expect):
        raise WireError(f"{len(listed)} tensors where {len(expect)} were expected")
    total = 0
    for i, entry in enumerate(listed):
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "nbytes"}:
            raise WireError(f"tensor {i}: an entry that is not {{dtype, shape, nbytes}}")
        nbytes = _tensor_bytes(entry["dtype"], entry["shape"], f"tensor {i}")
        if entry["nbytes"] != nbytes or type(entry["nbytes"]) is not int:
            raise WireError(
                f"tensor {i}: {str(entry['nbytes'])[:30]} bytes announced for "
                f"{entry['dtype']} {entry['shape']}, which takes {nbytes}"
            )
        if expect is not None and (entry["dtype"], list(entry["shape"])) != (
            expect[i][0],
            list(expect[i][1]),
        ):
            raise WireError(
                f"tensor {i}: {entry['dtype']} {entry['shape']} where "
                f"{expect[i][0]} {list(expect[i][1])} was expected"
            )
        total += nbytes
        if total > max_bytes:
            raise WireError(f"tensors of more than {max_bytes} bytes in one message")
    if in_area:
        if area is None:
            raise WireError("tensors said to be in a device area, but none was lent")
        offsets, span = area_layout([entry["nbytes"] for entry in listed])
        if span > area.size:
            raise WireError(f"tensors of {span} bytes in a device area of {area.size}")
        return header, [
            (entry["dtype"], tuple(entry["shape"]), area.view(offset, entry["nbytes"]))
            for entry, offset in zip(listed, offsets)
        ]
    body_deadline = None if deadline is None else max(deadline, time.monotonic() + BODY_GRACE)
    tensors = []
    for i, entry in enumerate(listed):
        size, _ = _read_length(fd, body_deadline)
        if size != entry["nbytes"]:
            raise WireError(
                f"tensor {i}: a frame of {size} bytes where {entry['nbytes']} were announced"
            )
        data = bytearray(size)
        _read_into(fd, memoryview(data), body_deadline, started=True)
        tensors.append((entry["dtype"], tuple(entry["shape"]), data))
    return header, tensors


# ---------------------------------------------------------------- the result schema

# Dataclasses whose floats may be NaN or infinite: a failure's errors and values describe what
# went wrong (a NaN output, an infinite error). Everywhere else (times, speedups, shares,
# tolerances) a number decides a verdict or a ranking and must be finite.
_NON_FINITE_ALLOWED = (TrialFailure,)


def _fail(where: str, what: str) -> typing.NoReturn:
    raise ValueError(f"result field {where}: {what}" if where else f"result: {what}")


def _kind(value: Any) -> str:
    """What a wrong value is, for a message: its type, and the value itself when short."""
    text = repr(value)
    return f"{type(value).__name__} {text}" if len(text) <= 40 else type(value).__name__


def _check_json(value: Any, where: str, depth: int = 0) -> None:
    """A free-form field (dict[str, Any]): JSON values, strings capped, not deeper than 32."""
    if depth > 32:
        _fail(where, "nested more than 32 levels deep")
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            _fail(where, f"a string of {len(value)} characters (limit {MAX_TEXT})")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_json(key, where, depth + 1)
            _check_json(item, f"{where}.{str(key)[:40]}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]", depth + 1)
    elif value is not None and not isinstance(value, (bool, int, float)):
        _fail(where, f"expected a JSON value, got {_kind(value)}")


def _check(value: Any, hint: Any, where: str, finite: bool) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        _check_json(value, where)
    elif origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        (inner,) = [a for a in args if a is not type(None)]  # the schema has X | None only
        _check(value, inner, where, finite)
    elif hint is str:
        if not isinstance(value, str):
            _fail(where, f"expected a string, got {_kind(value)}")
        if len(value) > MAX_TEXT:
            _fail(where, f"a string of {len(value)} characters (limit {MAX_TEXT})")
    elif hint is bool:
        if type(value) is not bool:
            _fail(where, f"expected true or false, got {_kind(value)}")
    elif hint is int:
        if type(value) is not int or not -(1 << 63) <= value < 1 << 63:
            _fail(where, f"expected a 64-bit integer, got {_kind(value)}")
    elif hint is float:
        if type(value) not in (int, float):
            _fail(where, f"expected a number, got {_kind(value)}")
        if finite and not math.isfinite(value):
            _fail(where, f"expected a finite number, got {value}")
    elif origin is list:
        if not isinstance(value, list):
            _fail(where, f"expected a list, got {_kind(value)}")
        for i, item in enumerate(value):
            _check(item, args[0], f"{where}[{i}]", finite)
    elif origin is dict:
        if not isinstance(value, dict):
            _fail(where, f"expected an object, got {_kind(value)}")
        for key, item in value.items():
            _check(key, str, f"{where} (a key)", finite)
            _check(item, args[1], f"{where}.{key[:40]}", finite)
    elif dataclasses.is_dataclass(hint):
        _check_dataclass(value, hint, where)
    else:
        raise TypeError(f"{where}: the schema's type {hint} has no check")  # a new field's type


def _check_dataclass(value: Any, cls: type, where: str) -> None:
    if not isinstance(value, dict):
        _fail(where, f"expected a {cls.__name__} object, got {_kind(value)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    prefix = f"{where}." if where else ""
    for key in value:
        if key not in fields:
            _fail(f"{prefix}{str(key)[:40]}", f"not a field of {cls.__name__}")
    finite = cls not in _NON_FINITE_ALLOWED
    for name, spec in fields.items():
        if name not in value:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                _fail(f"{prefix}{name}", "missing")
            continue
        _check(value[name], hints[name], f"{prefix}{name}", finite)


def validate_result(data: dict) -> dict:
    """`data` if it is a valid EvalResult.to_dict(): only the dataclass's fields (and those of
    its TrialFailure and KernelTime), each of its declared type (bool is not an int here),
    strings at most MAX_TEXT characters, numbers finite (NaN and infinities only in `failure`)
    or None where the field allows, `status` one of STATUSES. ValueError naming the field
    otherwise."""
    _check_dataclass(data, EvalResult, "")
    if data.get("status", "load_error") not in STATUSES:
        _fail("status", f"{str(data['status'])[:40]!r} is not one of {', '.join(STATUSES)}")
    return data


__all__ = [
    "ITEMSIZE",
    "MAX_MESSAGE_BYTES",
    "MAX_TENSOR_BYTES",
    "MAX_TEXT",
    "MessageLate",
    "PeerClosed",
    "TruncatedFrame",
    "WireError",
    "area_layout",
    "decode",
    "encode",
    "read_tensors",
    "recv",
    "recv_tensors",
    "send",
    "send_in_area",
    "send_tensors",
    "validate_result",
]
