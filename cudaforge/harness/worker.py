"""A candidate's worker process: `python -m cudaforge.harness.worker REQUEST RESULT TO_REFERENCE
FROM_REFERENCE INDEX` (pipe fds), started ahead by a WorkerPool (pool.py) in the sandbox
(processes.py). It becomes the reaper of its orphans, imports torch, creates the CUDA context and
the L2 flush buffer and warms up (under the GPU's lock, quiet.py), says it is ready, and waits.
Then it runs exactly one evaluation (run_evaluation), its outputs judged by the reference process
(host_copy.RemoteJudge), kills every process the candidate left (named in the result's notes),
sends the result as a JSON frame, and exits: a process never runs a second candidate. It dies
with the pool."""

from __future__ import annotations

import contextlib
import os
import sys

from . import wire
from .lifeline import die_with_pool
from .sandbox import become_subreaper, kill_descendants


def _warm_up() -> str:
    """Everything an evaluation would otherwise start with: torch, the CUDA context, the L2
    flush buffer, a graph capture and the comparisons' kernels (a fresh worker's first
    comparison took 0.2 s on the H200). Returns the device, for the ready message."""
    import torch
    import torch.nn.functional
    import torch.utils.cpp_extension

    from ..profiling import profiler
    from ..profiling.l2_flush import l2_flush
    from . import evaluation
    from .compare import warm_up_comparisons
    from .evaluate import run_evaluation  # noqa: F401 - imported now, not in the evaluation
    from .graphs import warm_capture
    from .quiet import gpu_quiet

    # this process profiles candidates and nothing else: keep the Range Profiler enabled
    profiler.KEEP_ENABLED = os.environ.get("CUDAFORGE_PROFILER_KEEP", "1") != "0"
    evaluation.EXITS_AFTER = True  # one evaluation, then the process ends: no cleanup for later
    if not torch.cuda.is_available():
        return "cpu"
    with gpu_quiet():  # not while another worker of the pool times on this GPU
        device = torch.device("cuda", torch.cuda.current_device())
        torch.zeros(1, device=device)
        l2_flush(device)  # allocated once per process: the evaluation finds it ready
        # speed-ups for the evaluation, not conditions of it: one that fails leaves its cost
        # to the evaluation, where a real failure is reported
        with contextlib.suppress(Exception):
            warm_capture(torch, device)
        with contextlib.suppress(Exception):
            warm_up_comparisons(device)  # the kernels of the graph check's comparison
        torch.cuda.synchronize(device)
    return f"cuda:{device.index} {torch.cuda.get_device_name(device)}"


def _trimmed(result) -> dict:
    """The result as data, its long texts cut to what the wire's schema takes."""
    for name in ("compile_log", "traceback"):
        text = getattr(result, name)
        if len(text) > wire.MAX_TEXT:
            setattr(result, name, text[-wire.MAX_TEXT :])
    result.notes = [note[:4000] for note in result.notes]
    return result.to_dict()


def main(requests: int, results: int, to_reference: int, from_reference: int, index: int) -> None:
    reaper = become_subreaper()
    die_with_pool(requests)
    device = _warm_up()
    wire.send(results, {"type": "ready", "pid": os.getpid(), "device": device,
                        "torch": sys.modules["torch"].__version__})  # fmt: skip
    try:
        message = wire.recv(requests)
    except wire.PeerClosed:
        return
    if message.get("type") != "evaluate":
        return
    from .evaluate import run_evaluation
    from .host_copy import RemoteJudge
    from .options import options_from_dict
    from .problem import Problem

    problem = Problem.from_dict(message["problem"])
    options = options_from_dict(message["options"])
    print(f"--- evaluation of {problem.name}", flush=True)
    wire.send(results, {"type": "phase", "phase": "accepted"})

    def on_phase(phase: str) -> None:
        wire.send(results, {"type": "phase", "phase": phase})

    judge = RemoteJudge(to_reference, from_reference)
    result = run_evaluation(problem, message["source"], options, on_phase, judge=judge)
    result.worker = index
    killed = kill_descendants()
    if killed:
        result.notes.append("processes the candidate left, killed: " + "; ".join(killed))
    if not reaper:
        result.notes.append("sandbox: could not become the subreaper of the candidate's orphans")
    sys.stdout.flush()
    wire.send(results, {"type": "result", "result": _trimmed(result)})


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit("usage: python -m cudaforge.harness.worker REQUEST RESULT TO_REFERENCE "
                 "FROM_REFERENCE INDEX")  # fmt: skip
    main(*(int(a) for a in sys.argv[1:]))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (CUDA and extension destructors) once done
