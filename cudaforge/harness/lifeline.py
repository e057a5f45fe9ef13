"""How a pool's process dies with the pool: the kernel's parent-death signal, and a watchdog
thread that sees the pool's end of the request pipe close (POLLHUP). Inside a PID namespace the
parent is outside it and os.getppid() is 0, so the pipe, not the parent's pid, is the signal."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import threading

_PR_SET_PDEATHSIG = 1


def die_with_pool(request_fd: int) -> None:
    """Exit at once when the pool is gone: SIGKILL from the kernel when the parent dies, and a
    daemon thread that exits the process when `request_fd` hangs up."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    def watchdog() -> None:
        poller = select.poll()
        poller.register(request_fd, select.POLLHUP | select.POLLERR)
        while True:
            for _, events in poller.poll(1000):
                if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    os._exit(1)

    threading.Thread(target=watchdog, name="cudaforge-watchdog", daemon=True).start()


__all__ = ["die_with_pool"]
