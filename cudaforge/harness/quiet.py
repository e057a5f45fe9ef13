"""A GPU kept quiet while a worker times on it. The processes of a pool on one GPU share a lock
file (its path in CUDAFORGE_GPU_LOCK, set by the pool): a worker holds the lock through its
timing phase, and a starting worker holds it while it creates its CUDA context and warms up.

Why: a pool starts a spare worker each time it hands one out, so spares come up while an
evaluation runs, and a GPU shared by two processes' contexts switches between them. On the
H200, some evaluations of 2-3 ms forwards had a quarter of their runs about 12% slow, while NVML
saw other processes of the pool on the GPU (RESULTS.md, "Timings users can trust"); which
process's work slowed them is not established. Without the variable (an evaluation in the
caller's process, tests) nothing is locked.

The lock is flock(2) on the file: it is released when its holder closes it or dies, so a worker
killed mid-timing cannot hold it. A candidate can take it too, but only within its own
evaluation, which its timeout bounds."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

ENV = "CUDAFORGE_GPU_LOCK"


@contextlib.contextmanager
def gpu_quiet() -> Iterator[float | None]:
    """Hold the GPU's lock (exclusive) for the block; yields the seconds spent waiting for it,
    or None when there is no lock to take (no variable, or the file cannot be opened)."""
    path = os.environ.get(ENV)
    fd = None
    if path:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    if fd is None:
        yield None
        return
    try:
        began = time.perf_counter()
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield time.perf_counter() - began
    finally:
        os.close(fd)  # releases the lock


def lock_path(folder: os.PathLike | str, device: str) -> str:
    """The lock file of `device` ("cuda:<id>", as the pool names a slot's GPU) in `folder`."""
    name = "".join(c if c.isalnum() else "-" for c in device)
    return os.path.join(os.fspath(folder), f"{name}.lock")


__all__ = ["ENV", "gpu_quiet", "lock_path"]
