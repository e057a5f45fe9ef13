"""Device memory the reference process lends a candidate's worker for its outputs, so that
gigabytes of outputs reach the comparison without a host copy (the C core's area_create,
area_import, area_free: cuMemCreate memory exported as a file descriptor, passed with
SCM_RIGHTS).

The reference process creates the area per evaluation, at most the size its own outputs and
inputs need (wire.area_layout), and frees it when the evaluation ends. The worker maps it, copies
each output into it at the offsets both sides compute from the sizes alone, waits for the copies,
and says so; the reference copies what it reads into its own memory before comparing, so what
it judges cannot change under it. Where the driver cannot share memory this way (no GPU, no
virtual memory management, too little memory) outputs cross as host copies, as on the CPU."""

from __future__ import annotations

import socket

from . import wire
from .guards import DeviceBytes


class DeviceArea:
    """An area mapped in this process: `size` bytes at `pointer` on `device`."""

    def __init__(self, pointer: int, size: int, device):
        import torch

        self.pointer, self.size, self.device = pointer, size, device
        self.bytes = torch.as_tensor(DeviceBytes(pointer, size), device=device)

    def view(self, offset: int, nbytes: int):
        """The bytes at [offset, offset + nbytes) as a uint8 tensor on the device, no copy."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise wire.WireError(f"bytes {offset}..{offset + nbytes} of a {self.size}-byte area")
        return self.bytes[offset : offset + nbytes]

    def free(self) -> None:
        """Unmap it here (the memory goes when no process maps it any more)."""
        from .. import _core

        if self.bytes is None:
            return
        self.bytes = None
        _core.area_free(self.pointer, self.size)

    @classmethod
    def create(cls, nbytes: int, device) -> tuple[DeviceArea, int]:
        """(area, fd): a new area of at least `nbytes` on `device` and the descriptor that
        lends it (the caller closes it). CudaforgeError when the driver cannot make one."""
        from .. import _core
        from ..cuda import libs

        libs.ensure("cuda")
        pointer, fd, size = _core.area_create(int(nbytes))
        try:
            return cls(pointer, size, device), fd
        except BaseException:
            _core.area_free(pointer, size)
            raise

    @classmethod
    def adopt(cls, fd: int, size: int, device) -> DeviceArea:
        """The area another process lent by `fd`, mapped here."""
        from .. import _core
        from ..cuda import libs

        libs.ensure("cuda")
        pointer = _core.area_import(int(fd), int(size))
        try:
            return cls(pointer, size, device)
        except BaseException:
            _core.area_free(pointer, size)
            raise


def send_fd(fd_channel: int, fd: int) -> None:
    """Pass `fd` over the Unix socket `fd_channel` (one marker byte carries it)."""
    sock = socket.socket(fileno=fd_channel)
    try:
        socket.send_fds(sock, [b"A"], [fd])
    finally:
        sock.detach()


def recv_fd(fd_channel: int) -> int:
    """The descriptor `send_fd` passed; WireError when the marker comes without exactly one."""
    sock = socket.socket(fileno=fd_channel)
    try:
        marker, fds, _, _ = socket.recv_fds(sock, 1, 4)
    finally:
        sock.detach()
    if marker != b"A" or len(fds) != 1:
        for extra in fds:
            socket.close(extra)
        raise wire.WireError("a lent area came without its one file descriptor")
    return fds[0]


__all__ = ["DeviceArea", "recv_fd", "send_fd"]
