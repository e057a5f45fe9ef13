"""The worker process: `python -m cudaforge.harness.worker REQUEST_FD RESULT_FD INDEX PARENT_PID`,
started by a WorkerPool (pool.py). It imports torch once, then runs one evaluation per request
(run_evaluation) and sends the result back; it retires itself after a crash or tampering, and it
dies with the pool's process."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

from .pipes import PipeClosed, receive, send


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel kills us with the parent
    if os.getppid() != parent:
        os._exit(1)

    def watchdog() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watchdog, name="cudaforge-watchdog", daemon=True).start()


def _child(requests: int, results: int, index: int, parent: int) -> None:
    _die_with_parent(parent)
    import torch
    import torch.nn.functional
    import torch.utils.cpp_extension

    from ..profiling import profiler
    from .evaluate import run_evaluation

    # this process profiles candidates and nothing else: keep the Range Profiler enabled
    profiler.KEEP_ENABLED = os.environ.get("CUDAFORGE_PROFILER_KEEP", "1") != "0"

    device = "cpu"
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")  # create the context now, not in the first evaluation
        device = f"cuda:{torch.cuda.current_device()} {torch.cuda.get_device_name()}"
    send(results, {"type": "ready", "pid": os.getpid(), "device": device,
                    "torch": torch.__version__})  # fmt: skip
    while True:
        try:
            message = receive(requests)
        except PipeClosed:
            return
        if message.get("type") == "stop":
            return
        if message.get("type") != "evaluate":
            continue
        print(f"--- evaluation of {message['problem'].name}", flush=True)
        send(results, {"type": "phase", "phase": "accepted"})

        def on_phase(phase: str) -> None:
            send(results, {"type": "phase", "phase": phase})

        result = run_evaluation(message["problem"], message["source"], message["options"], on_phase)
        result.worker = index
        # a dead CUDA context, or a process whose functions the candidate replaced: not reusable
        retire = result.status == "crashed" or "tampering" in result.guards
        send(results, {"type": "result", "result": result.to_dict(), "retire": retire})
        if retire:
            sys.stdout.flush()
            os._exit(0)  # exit without running any more CUDA calls (the context may be dead)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: python -m cudaforge.harness.worker REQUEST_FD RESULT_FD INDEX PARENT_PID")
    _child(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (CUDA and extension destructors) once done
