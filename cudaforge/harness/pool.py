"""Evaluation in sandboxed worker processes: the only place a candidate is imported or run.

A WorkerPool has one slot per visible GPU (its processes see only that GPU through
CUDA_VISIBLE_DEVICES), or N CPU slots on a machine without one. Each slot (slot.py) has a
reference process, which judges every output and never imports a candidate, and runs each
candidate in a fresh worker process that exits after that one evaluation, the next one started
ahead (torch imported, CUDA context made) so it costs little. Processes are fresh interpreters
(`python -m ...`, not a fork of the caller), started in the sandbox (processes.py: no network
and their own PID namespace where the OS allows, no secrets in the environment, a private
HOME), and speak JSON frames (wire.py), never pickle. A candidate's prints go to its worker's
log file, not into the protocol. The verdict is assembled here from the reference process's
judgements (verdict.py), and every result is redacted of secrets before it leaves the pool.
The pool and its other slots carry on whatever a candidate does; close() stops every process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import quiet
from .options import make_options
from .problem import Problem
from .results import EvalResult
from .secrets import redact_all
from .slot import Slot


@dataclass
class _Job:
    problem: Problem
    source: str
    options: Any  # EvalOptions
    future: Future


class QueuedPool:
    """What WorkerPool and cluster.RayPool share: a queue of jobs served by one thread per
    worker, futures for the results, and the public calls. A subclass sets timeout,
    compile_timeout and _threads, and may override _enqueue and _after_close."""

    def _init_queue(self) -> None:
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._threads: list[threading.Thread] = []

    def _start_serving(self, members: list, prefix: str) -> None:
        """One thread per member (worker, actor slot) running self._serve(member)."""
        self._threads = [
            threading.Thread(target=self._serve, args=(m,), name=f"{prefix}-{m.index}", daemon=True)
            for m in members
        ]
        for t in self._threads:
            t.start()

    def submit(self, problem: Problem | str, candidate_source: str, **options: Any) -> Future:
        options.setdefault("timeout", self.timeout)
        options.setdefault("compile_timeout", self.compile_timeout)
        return self.submit_options(problem, candidate_source, make_options(**options))

    def submit_options(self, problem: Problem | str, candidate_source: str, options) -> Future:
        if isinstance(problem, str):
            problem = Problem.from_source(problem)
        if not isinstance(candidate_source, str):
            raise TypeError("candidate_source must be the candidate's Python source (a str)")
        for sizes in getattr(options, "extra_sizes", ()):
            problem.with_sizes(**sizes)  # unknown names fail here, in the caller, not in a worker
        job = _Job(problem, candidate_source, options, Future())
        with self._lock:
            if self._closed:
                raise RuntimeError(f"this {type(self).__name__} is closed")
            if self._enqueue(job):
                return job.future
        job.future.set_running_or_notify_cancel()
        job.future.set_result(_failed(job, "crashed", self._refusal()))
        return job.future

    def _enqueue(self, job: _Job) -> bool:
        """Queue the job (under the lock); False when no worker can take it."""
        self._jobs.put(job)
        return True

    def _refusal(self) -> str:
        return "no worker can take the job"

    def evaluate(self, problem: Problem | str, candidate_source: str, **options) -> EvalResult:
        return self.submit(problem, candidate_source, **options).result()

    def map(self, problem: Problem | str, candidates, **options) -> list[EvalResult]:
        futures = [self.submit(problem, c, **options) for c in candidates]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Stop every worker (pending evaluations are cancelled); waits for running ones."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.future.cancel()
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()
        self._after_close()

    def _after_close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


class WorkerPool(QueuedPool):
    """Worker processes that evaluate candidates: one per visible GPU, or `workers` CPU workers
    where there is no GPU (or with device="cpu"). Use as a context manager, or call close().

    - submit(problem, candidate_source, **options) -> Future[EvalResult]
    - map(problem, candidates, **options) -> [EvalResult], evaluated in parallel
    - evaluate(problem, candidate_source, **options) -> EvalResult
    Options are evaluate()'s (cudaforge.harness.options.EvalOptions); `timeout` and `compile_timeout`
    default to the pool's. `spares`: worker processes each slot keeps started ahead (each
    candidate gets a fresh one); more keep a fast stream of short evaluations from waiting for
    a worker to start, at the memory (and CUDA context) of one process each. The default (None)
    is 3 on a GPU slot of a machine with at least 4 cores per slot, else 1: a worker takes
    about 4 s to start on the H200 and a short evaluation about 1 s (benchmarks/RESULTS.md)."""

    def __init__(
        self,
        workers: int | None = None,
        *,
        device: str | None = None,
        timeout: float = 60.0,
        compile_timeout: float = 300.0,
        start_timeout: float = 300.0,
        log_dir: str | os.PathLike | None = None,
        spares: int | None = None,
    ):
        self.timeout = timeout
        self.compile_timeout = compile_timeout
        self.start_timeout = start_timeout
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="cudaforge-workers-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._init_queue()
        slots = _plan_workers(workers, device)
        if not slots:
            raise ValueError("a worker pool needs at least one worker")
        for env, dev in slots:  # one lock per GPU, kept by whoever times on it (quiet.py)
            if dev != "cpu":
                env[quiet.ENV] = quiet.lock_path(self.log_dir, dev)
        if spares is None:
            cores_per_slot = (os.cpu_count() or 1) // len(slots)
            spares = 3 if cores_per_slot >= 4 and slots[0][1] != "cpu" else 1
        self._workers = [
            Slot(i, env, dev, self.log_dir, start_timeout, spares)
            for i, (env, dev) in enumerate(slots)
        ]
        self._started = [threading.Event() for _ in self._workers]
        for slot in self._workers:
            slot.start()
        self._start_serving(self._workers, "cudaforge-worker")

    # ------------------------------------------------------------------ public

    @property
    def size(self) -> int:
        return len(self._workers)

    @property
    def devices(self) -> list[str]:
        return [w.device for w in self._workers]

    @property
    def restarts(self) -> int:
        """Processes replaced after a crash, a hang or a broken protocol (every worker is
        replaced after its evaluation; those are not counted)."""
        return sum(w.restarts for w in self._workers)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every slot's reference process and first worker have started (imported
        torch, made their CUDA context)."""
        return _wait_all(self._started, timeout)

    def pids(self) -> list[int]:
        """Process ids of the workers waiting for a candidate (for tests and diagnostics)."""
        return [pid for w in self._workers for pid in w.pids()]

    def _after_close(self) -> None:
        if self._own_log_dir:
            for path in self.log_dir.glob("*.log"):
                with contextlib.suppress(OSError):
                    path.unlink()
            with contextlib.suppress(OSError):
                self.log_dir.rmdir()

    # ------------------------------------------------------------------ per slot thread

    def _serve(self, slot: Slot) -> None:
        try:
            slot.wait_ready()  # warm up now, not with the first job
            self._started[slot.index].set()
            while True:
                job = self._jobs.get()
                if job is None:
                    break
                if not job.future.set_running_or_notify_cancel():
                    continue
                try:
                    result = slot.run(job.problem, job.source, job.options,
                                      lambda status, error, job=job: _failed(job, status, error))  # fmt: skip
                except Exception as e:  # noqa: BLE001 - the pool must answer every job
                    result = _failed(job, "crashed", f"worker pool error: {type(e).__name__}: {e}")
                    result = EvalResult.from_dict(redact_all(result.to_dict()))
                job.future.set_result(result)
        finally:
            self._started[slot.index].set()
            slot.close()


def _wait_all(events: list[threading.Event], timeout: float | None) -> bool:
    """Wait for every event within one shared `timeout` (s); False at the first one late."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for event in events:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not event.wait(remaining):
            return False
    return True


def _failed(job: _Job, status: str, error: str) -> EvalResult:
    import hashlib

    return EvalResult(
        problem=job.problem.name,
        status=status,
        error=error,
        problem_hash=job.problem.hash,
        candidate_hash=hashlib.sha256(job.source.encode()).hexdigest(),
        seed=getattr(job.options, "seed", 0),
    )


def _visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        return []


def _plan_workers(workers: int | None, device: str | None) -> list[tuple[dict[str, str], str]]:
    """(environment, device label) of each worker."""
    base = {
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[2])]
            + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ),
        "PYTHONFAULTHANDLER": "1",
        "PYTHONUNBUFFERED": "1",
    }
    gpus = [] if device == "cpu" else _visible_gpus()
    if device not in (None, "cpu") and not gpus:
        raise ValueError(f"device={device!r}: no GPU is visible to this process")
    if gpus:
        count = len(gpus) if workers is None else max(1, workers)
        return [
            ({**base, "CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]}, f"cuda:{gpus[i % len(gpus)]}")
            for i in range(count)
        ]
    count = workers if workers is not None else max(1, min(2, os.cpu_count() or 1))
    threads = str(max(1, (os.cpu_count() or 1) // max(1, count)))
    env = {**base, "CUDA_VISIBLE_DEVICES": ""}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = threads
    return [(dict(env), "cpu") for _ in range(max(1, count))]


_default: WorkerPool | None = None
_default_lock = threading.Lock()


def default_pool() -> WorkerPool:
    """The process-wide pool evaluate() uses when given none: started on first use, closed at
    exit."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = WorkerPool()
            atexit.register(_default.close)
        return _default


__all__ = ["QueuedPool", "WorkerPool", "default_pool"]
