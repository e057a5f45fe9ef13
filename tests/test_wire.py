"""The JSON wire between the pool and a worker: round trips, size limits, truncated and lying
frames, tensors, and the result schema."""

from __future__ import annotations

import math
import os
import struct
import threading
import time

import pytest
import torch

from cudaforge.harness import wire
from cudaforge.harness.results import EvalResult, KernelTime, TrialFailure
from cudaforge.harness.wire import (
    MessageLate,
    PeerClosed,
    TruncatedFrame,
    WireError,
    recv,
    recv_tensors,
    send,
    send_tensors,
    validate_result,
)


@pytest.fixture
def pipe():
    read, write = os.pipe()
    ends = {"read": read, "write": write}
    yield ends
    for fd in ends.values():
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


def _close_writer(pipe) -> None:
    os.close(pipe["write"])
    pipe["write"] = -1


def _raw(pipe, data: bytes) -> None:
    os.write(pipe["write"], data)


def _frame(body: bytes) -> bytes:
    return struct.pack(">Q", len(body)) + body


def _in_thread(target, *args) -> threading.Thread:
    """Write from a thread: a frame larger than the pipe's buffer blocks until it is read."""
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------- messages


def test_round_trip_keeps_types_unicode_and_non_finite_floats(pipe):
    message = {
        "type": "result",
        "text": "naïve ∑ \U0001f680 and a lone \udc80 surrogate",
        "numbers": [0, -1, 2**62, 1.5, float("nan"), float("inf"), -float("inf"), 1e-300],
        "nested": {"a": [True, False, None], "b": {}},
    }
    send(pipe["write"], message)
    got = recv(pipe["read"], time.monotonic() + 5)
    assert got["text"] == message["text"] and got["nested"] == message["nested"]
    numbers = got["numbers"]
    assert numbers[:4] == [0, -1, 2**62, 1.5] and type(numbers[0]) is int
    assert math.isnan(numbers[4]) and numbers[5] == math.inf and numbers[6] == -math.inf
    assert numbers[7] == 1e-300


def test_the_encoding_is_ascii_json_and_nan_a_json_token():
    body = wire.encode({"x": float("nan"), "y": "é"})
    assert body == b'{"x":NaN,"y":"\\u00e9"}'


def test_a_large_message_crosses_a_pipe(pipe):
    text = "x" * (3 << 20)  # more than a pipe holds: the writer blocks until it is read
    writer = _in_thread(send, pipe["write"], {"text": text})
    assert recv(pipe["read"], time.monotonic() + 10)["text"] == text
    writer.join(5)


def test_a_frame_over_the_size_limit_is_refused_before_it_is_read(pipe, monkeypatch):
    _raw(pipe, struct.pack(">Q", wire.MAX_MESSAGE_BYTES + 1))
    with pytest.raises(WireError, match="over the 67108864-byte limit"):
        recv(pipe["read"], time.monotonic() + 5)
    monkeypatch.setattr(wire, "MAX_MESSAGE_BYTES", 100)
    with pytest.raises(ValueError, match="over the 100-byte limit"):
        send(pipe["write"], {"text": "x" * 100})
    send(pipe["write"], {"text": "x" * 80})
    assert recv(pipe["read"], time.monotonic() + 5) == {"text": "x" * 80}


def test_a_truncated_frame(pipe):
    _raw(pipe, struct.pack(">Q", 100) + b'{"a": 1')
    _close_writer(pipe)
    with pytest.raises(TruncatedFrame, match="after 7 of 100 bytes"):
        recv(pipe["read"], time.monotonic() + 5)


def test_a_truncated_length(pipe):
    _raw(pipe, b"\0\0\0")
    _close_writer(pipe)
    with pytest.raises(TruncatedFrame):
        recv(pipe["read"], time.monotonic() + 5)


def test_a_closed_pipe_and_a_silent_one(pipe):
    with pytest.raises(MessageLate):
        recv(pipe["read"], time.monotonic() + 0.05)
    _close_writer(pipe)
    with pytest.raises(PeerClosed) as info:
        recv(pipe["read"], time.monotonic() + 5)
    assert not isinstance(info.value, TruncatedFrame)


@pytest.mark.parametrize(
    "body",
    [
        b"\xff\xfe not utf-8",
        b'{"a": 1',
        b"[1, 2]",
        b'"text"',
        b'{"a": 1, "a": 2}',
        b'{"a": nan}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a": ' + b"9" * 5000 + b"}",
    ],
    ids=["not-utf8", "cut-json", "array", "string", "duplicate-key", "lowercase-nan", "deep", "long-int"],
)  # fmt: skip
def test_a_body_that_is_not_a_json_object(pipe, body):
    writer = _in_thread(_raw, pipe, _frame(body))
    with pytest.raises(WireError):
        recv(pipe["read"], time.monotonic() + 5)
    writer.join(5)


def test_pickle_is_never_loaded(pipe):
    import pickle

    _raw(pipe, _frame(pickle.dumps({"type": "result"})))
    with pytest.raises(WireError):
        recv(pipe["read"], time.monotonic() + 5)


# ---------------------------------------------------------------- tensors


def _torch_tensors():
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    a[0, 0] = float("nan")
    b = torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16)
    c = torch.zeros(0, 5, dtype=torch.int64)
    return [a, b, c]


def _as_wire(t: torch.Tensor):
    return (
        str(t.dtype).removeprefix("torch."),
        list(t.shape),
        t.contiguous().view(torch.uint8).numpy(),
    )


def test_tensors_round_trip(pipe):
    tensors = _torch_tensors()
    writer = _in_thread(send_tensors, pipe["write"], {"type": "outputs", "trial": 2},
                        [_as_wire(t) for t in tensors])  # fmt: skip
    header, got = recv_tensors(
        pipe["read"], time.monotonic() + 5, expect=[(d, s) for d, s, _ in map(_as_wire, tensors)]
    )
    writer.join(5)
    assert header == {"type": "outputs", "trial": 2}
    for original, (dtype, shape, data) in zip(tensors, got, strict=True):
        back = torch.frombuffer(data, dtype=getattr(torch, dtype)) if data else torch.empty(0)
        back = back.to(original.dtype).reshape(shape)
        assert back.dtype == original.dtype and back.shape == original.shape
        assert torch.equal(back.nan_to_num(7.0), original.nan_to_num(7.0))


def test_a_large_tensor_crosses_a_pipe(pipe):
    t = torch.randn(1 << 20)  # 4 MB
    writer = _in_thread(send_tensors, pipe["write"], {}, [_as_wire(t)])
    _, [(_, _, data)] = recv_tensors(pipe["read"], time.monotonic() + 10)
    writer.join(5)
    assert torch.equal(torch.frombuffer(data, dtype=torch.float32), t)


def _lying_header(pipe, tensors, frames=()):
    _raw(pipe, _frame(wire.encode({"type": "outputs", "tensors": tensors})))
    for frame in frames:
        _raw(pipe, frame)


@pytest.mark.parametrize(
    "entry, match",
    [
        ({"dtype": "float32", "shape": [2, 3], "nbytes": 20}, "takes 24"),
        ({"dtype": "float32", "shape": [1 << 40, 1 << 20], "nbytes": 4 << 60}, "more than"),
        ({"dtype": "float32", "shape": [-1, 4], "nbytes": -16}, "not an int >= 0"),
        ({"dtype": "float32", "shape": [2.0], "nbytes": 8}, "not an int >= 0"),
        ({"dtype": "object", "shape": [2], "nbytes": 16}, "not one of"),
        ({"dtype": "float32", "shape": [1] * 40, "nbytes": 4}, "at most 32"),
        ({"dtype": "float32", "shape": [2], "nbytes": True}, "bytes announced"),
        ({"dtype": "float32", "shape": [2], "nbytes": 8, "extra": 1}, "not {dtype, shape"),
    ],
    ids=["count", "huge", "negative", "float-dim", "dtype", "dims", "bool-count", "extra-key"],
)  # fmt: skip
def test_a_tensor_header_that_lies_about_sizes(pipe, entry, match):
    _lying_header(pipe, [entry])
    with pytest.raises(WireError, match=match):
        recv_tensors(pipe["read"], time.monotonic() + 5)


def test_a_tensor_frame_that_does_not_match_its_header(pipe):
    entry = {"dtype": "float32", "shape": [2], "nbytes": 8}
    _lying_header(pipe, [entry], [struct.pack(">Q", 1 << 40)])
    with pytest.raises(WireError, match="frame of 1099511627776 bytes where 8"):
        recv_tensors(pipe["read"], time.monotonic() + 5)


def test_a_tensor_frame_cut_short(pipe):
    entry = {"dtype": "float32", "shape": [4], "nbytes": 16}
    _lying_header(pipe, [entry], [struct.pack(">Q", 16) + b"\0" * 6])
    _close_writer(pipe)
    with pytest.raises(TruncatedFrame):
        recv_tensors(pipe["read"], time.monotonic() + 5)


def test_tensors_other_than_expected_and_over_the_budget(pipe):
    entry = {"dtype": "float32", "shape": [4], "nbytes": 16}
    _lying_header(pipe, [entry])
    with pytest.raises(WireError, match="float16 \\[4\\] was expected"):
        recv_tensors(pipe["read"], time.monotonic() + 5, expect=[("float16", (4,))])
    _lying_header(pipe, [entry, entry])
    with pytest.raises(WireError, match="where 1 were expected"):
        recv_tensors(pipe["read"], time.monotonic() + 5, expect=[("float32", (4,))])
    _lying_header(pipe, [entry, entry])
    with pytest.raises(WireError, match="more than 24 bytes"):
        recv_tensors(pipe["read"], time.monotonic() + 5, max_bytes=24)


def test_send_tensors_checks_its_own_sizes(pipe):
    with pytest.raises(ValueError, match="12 bytes for float32 \\[2, 2\\]"):
        send_tensors(pipe["write"], {}, [("float32", [2, 2], b"\0" * 12)])


# ---------------------------------------------------------------- results


_KERNEL = {"name": "k", "calls": 1, "total_us": 1.0, "mean_us": 1.0, "own": True}


def _full_result() -> EvalResult:
    return EvalResult(
        problem="relu",
        status="incorrect",
        compiled=True,
        error="output 0 differs",
        failure=TrialFailure(
            trial=1,
            output_index=0,
            message="differs",
            max_abs_err=float("inf"),
            actual=float("nan"),
            worst_index=[3, 4],
            seed=7,
        ),
        trials=3,
        tolerances={"atol": 1e-4, "rtol": 1e-4},
        candidate_ms=0.25,
        kernels=[KernelTime(name="relu_kernel", calls=3, total_us=12.0, mean_us=4.0, own=True)],
        guards=["poisoning"],
        profile={"metrics": {"dram__bytes_read.sum": 1024, "note": None, "x": [1.5, "a"]}},
        worker=0,
        phase_seconds={"load": 0.1},
        timing={"method": "cuda events", "reps": 100},
        notes=["killed pid 12: sleep 60"],
    )


def test_a_result_round_trips_and_validates(pipe):
    result = _full_result()
    send(pipe["write"], {"type": "result", "result": result.to_dict()})
    message = recv(pipe["read"], time.monotonic() + 5)
    back = EvalResult.from_dict(validate_result(message["result"]))
    assert back.failure.max_abs_err == math.inf and math.isnan(back.failure.actual)
    assert math.isnan(back.failure.max_rel_err)  # the default: not computed
    back.failure.actual = result.failure.actual = back.failure.max_rel_err = 0.0
    result.failure.max_rel_err = result.failure.rel_l2_err = back.failure.rel_l2_err = 0.0
    assert back == result
    assert validate_result(EvalResult(problem="p").to_dict())["problem"] == "p"
    assert validate_result({"problem": "p"}) == {"problem": "p"}  # defaults may be left out


@pytest.mark.parametrize(
    "change, field",
    [
        ({"verdict": "ok"}, "verdict: not a field of EvalResult"),
        ({"speedup": "2.1"}, "speedup: expected a number, got str '2.1'"),
        ({"speedup": float("inf")}, "speedup: expected a finite number, got inf"),
        ({"candidate_ms": float("nan")}, "candidate_ms: expected a finite number, got nan"),
        ({"correct": 1}, "correct: expected true or false, got int 1"),
        ({"trials": True}, "trials: expected a 64-bit integer, got bool True"),
        ({"trials": 1 << 70}, "trials: expected a 64-bit integer, got int"),
        ({"error": "x" * (wire.MAX_TEXT + 1)}, "error: a string of 1048577 characters"),
        ({"notes": ["ok", 3]}, "notes\\[1\\]: expected a string, got int 3"),
        (
            {"tolerances": {"atol": float("nan")}},
            "tolerances.atol: expected a finite number, got nan",
        ),
        ({"guards": "tampering"}, "guards: expected a list, got str 'tampering'"),
        ({"kernels": [{**_KERNEL, "pid": 3}]}, "kernels\\[0\\].pid: not a field of KernelTime"),
        ({"kernels": [{"name": "k"}]}, "kernels\\[0\\].calls: missing"),
        (
            {"failure": {"trial": 0, "output_index": 0, "message": "m", "phase": ["x"]}},
            "failure.phase: expected a string, got list",
        ),
        ({"status": "excellent"}, "status: 'excellent' is not one of"),
        ({"profile": {"m": object()}}, "profile.m: expected a JSON value, got object"),
        ({"profile": {"m": "y" * (wire.MAX_TEXT + 1)}}, "profile.m: a string of"),
        ({"timing": []}, "timing: expected an object, got list \\[\\]"),
    ],
)
def test_an_invalid_result_names_its_field(change, field):
    data = {**_full_result().to_dict(), **change}
    with pytest.raises(ValueError, match=f"result field {field}"):
        validate_result(data)


def test_a_result_without_its_problem_or_not_an_object():
    with pytest.raises(ValueError, match="result field problem: missing"):
        validate_result({"status": "ok"})
    with pytest.raises(ValueError, match="^result: expected a EvalResult object, got list"):
        validate_result([])


# ---------------------------------------------------------------- device areas (CPU stand-in)


class _Area:
    """What recv_tensors needs of a lent area: its size and views of it (here host bytes)."""

    def __init__(self, size: int):
        self.size = size
        self.bytes = torch.zeros(size, dtype=torch.uint8)

    def view(self, offset: int, nbytes: int):
        return self.bytes[offset : offset + nbytes]


def test_area_layout_aligns_every_tensor():
    offsets, span = wire.area_layout([4, 0, 300, 256])
    assert offsets == [0, 256, 256, 768]
    assert span == 1024
    assert all(o % wire.AREA_ALIGN == 0 for o in offsets)


def test_tensors_in_an_area_are_read_at_the_layouts_offsets(pipe):
    a, b = torch.arange(10, dtype=torch.float32), torch.arange(6, dtype=torch.int64).reshape(2, 3)
    area = _Area(1024)
    offsets, _ = wire.area_layout([a.numel() * 4, b.numel() * 8])
    area.view(offsets[0], 40).copy_(a.view(torch.uint8))
    area.view(offsets[1], 48).copy_(b.reshape(-1).view(torch.uint8))
    wire.send_in_area(pipe["write"], {"type": "check"}, [("float32", [10]), ("int64", [2, 3])])
    header, got = recv_tensors(pipe["read"], time.monotonic() + 5, area=area)
    assert header == {"type": "check"}
    assert torch.equal(got[0][2].view(torch.float32), a)
    assert torch.equal(got[1][2].view(torch.int64).reshape(2, 3), b)


def test_tensors_in_an_area_never_lent_or_too_small_are_refused(pipe):
    wire.send_in_area(pipe["write"], {}, [("float32", [100])])
    with pytest.raises(WireError, match="none was lent"):
        recv_tensors(pipe["read"], time.monotonic() + 5)
    wire.send_in_area(pipe["write"], {}, [("float32", [100])])
    with pytest.raises(WireError, match="512 bytes in a device area of 256"):
        recv_tensors(pipe["read"], time.monotonic() + 5, area=_Area(256))
    send(pipe["write"], {"tensors": [], "in_area": "yes"})
    with pytest.raises(WireError, match="in_area"):
        recv_tensors(pipe["read"], time.monotonic() + 5)


def test_a_descriptor_crosses_a_unix_socket():
    import socket

    from cudaforge.harness.area import recv_fd, send_fd

    ours, theirs = socket.socketpair()
    read, write = os.pipe()
    try:
        send(ours.fileno(), {"type": "area", "ok": True, "size": 4})
        send_fd(ours.fileno(), write)
        assert recv(theirs.fileno(), time.monotonic() + 5)["size"] == 4
        got = recv_fd(theirs.fileno())
        os.write(got, b"hi")
        os.close(got)
        assert os.read(read, 2) == b"hi"
        ours.send(b"A")  # the marker without a descriptor
        with pytest.raises(WireError, match="one file descriptor"):
            recv_fd(theirs.fileno())
    finally:
        for end in (ours, theirs):
            end.close()
        os.close(read)
        os.close(write)
