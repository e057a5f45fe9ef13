"""Evaluation in isolated worker processes: the only place a candidate is imported or run.

A WorkerPool starts one worker per visible GPU (each sees only its GPU through
CUDA_VISIBLE_DEVICES), or N CPU workers on a machine without one. Workers are fresh interpreters
(`python -m cudaforge.harness.worker`, not a fork of the caller, so the caller's __main__ is not
re-run), kept warm between evaluations, and talk to the pool over two pipes of their own
(pipes.py); a candidate's prints go to the worker's log file, not into the protocol.

What can go wrong, and what the pool does:
- the candidate raises, or fails to compile: an ordinary result (runtime_error, compile_error...);
- a sticky CUDA error (illegal address, trap): the worker sees its context is dead, returns a
  "crashed" result and exits; the pool starts a replacement;
- the process dies (segfault, abort, os._exit): the pool sees the pipe close and returns
  "crashed" with the signal and the tail of the worker's log (faulthandler's traceback included);
- no answer in time (`compile_timeout` while loading, `timeout` after): the pool kills the
  worker's process group (nvcc/ninja children included), returns "timeout" and starts a
  replacement.
The pool and the other workers carry on in every case. Workers die with the pool's process
(PR_SET_PDEATHSIG, and a watchdog thread), and close() stops them all.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .options import make_options
from .pipes import NoMessage, PipeClosed, receive, send
from .problem import Problem
from .results import EvalResult

# ====================================================================== the pool


@dataclass
class _Job:
    problem: Problem
    source: str
    options: Any  # EvalOptions
    future: Future


class _Worker:
    """One worker slot: a process, replaced when it dies or hangs."""

    def __init__(self, pool: WorkerPool, index: int, env: dict[str, str], device: str):
        self.pool = pool
        self.index = index
        self.env = env
        self.device = device  # "cuda:<id>" or "cpu", for messages
        self.process: subprocess.Popen | None = None
        self.requests = self.results = -1
        self.ready = False
        self.generation = 0
        self.log_path: Path | None = None
        self.log_offset = 0
        self.info: dict[str, Any] = {}
        self.started = threading.Event()  # set once the first process said it is ready

    def start(self) -> None:
        self.generation += 1
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        self.log_path = self.pool.log_dir / f"worker{self.index}-{self.generation}.log"
        env = {**os.environ, **self.env}
        try:
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "cudaforge.harness.worker", str(req_r), str(res_w),
                     str(self.index), str(os.getpid())],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(req_r, res_w),
                    env=env,
                    start_new_session=True,  # own process group: killed as a whole
                    close_fds=True,
                )  # fmt: skip
        finally:
            os.close(req_r)
            os.close(res_w)
        self.requests, self.results = req_w, res_r
        self.ready = False
        self.log_offset = 0

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, timeout: float) -> str | None:
        """None once the worker said it is ready; else why it is not."""
        if self.ready:
            return None
        try:
            message = receive(self.results, time.monotonic() + timeout)
        except NoMessage:
            self.kill()
            return f"did not start within {timeout:.0f} s"
        except PipeClosed:
            code = self.process.wait() if self.process else None
            return f"exited while starting ({_describe_exit(code)})"
        self.info = message
        self.ready = True
        return None

    def kill(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            self.process.wait()
        self._close_pipes()

    def stop(self, grace: float = 5.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                send(self.requests, {"type": "stop"})
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        self.process = None

    def _close_pipes(self) -> None:
        for fd in (self.requests, self.results):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.requests = self.results = -1

    def log_tail(self, limit: int = 6000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            start = max(self.log_offset, end - limit)
            f.seek(start)
            return f.read().decode(errors="replace")

    def mark_log(self) -> None:
        if self.log_path is not None and self.log_path.exists():
            self.log_offset = self.log_path.stat().st_size


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
    default to the pool's."""

    def __init__(
        self,
        workers: int | None = None,
        *,
        device: str | None = None,
        timeout: float = 60.0,
        compile_timeout: float = 300.0,
        start_timeout: float = 300.0,
        log_dir: str | os.PathLike | None = None,
    ):
        self.timeout = timeout
        self.compile_timeout = compile_timeout
        self.start_timeout = start_timeout
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="cudaforge-workers-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._init_queue()
        self.restarts = 0
        slots = _plan_workers(workers, device)
        if not slots:
            raise ValueError("a worker pool needs at least one worker")
        self._workers = [_Worker(self, i, env, dev) for i, (env, dev) in enumerate(slots)]
        for w in self._workers:
            w.start()
        self._start_serving(self._workers, "cudaforge-worker")

    # ------------------------------------------------------------------ public

    @property
    def size(self) -> int:
        return len(self._workers)

    @property
    def devices(self) -> list[str]:
        return [w.device for w in self._workers]

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every worker has started (imported torch, made its CUDA context)."""
        return _wait_all([w.started for w in self._workers], timeout)

    def pids(self) -> list[int]:
        """Process ids of the live workers (for tests and diagnostics)."""
        return [w.process.pid for w in self._workers if w.alive()]

    def _after_close(self) -> None:
        if self._own_log_dir:
            for path in self.log_dir.glob("*.log"):
                with contextlib.suppress(OSError):
                    path.unlink()
            with contextlib.suppress(OSError):
                self.log_dir.rmdir()

    # ------------------------------------------------------------------ per worker thread

    def _serve(self, worker: _Worker) -> None:
        try:
            worker.wait_ready(self.start_timeout)  # warm up now, not with the first job
            worker.started.set()
            while True:
                job = self._jobs.get()
                if job is None:
                    break
                if not job.future.set_running_or_notify_cancel():
                    continue
                try:
                    result = self._run(worker, job)
                except Exception as e:  # noqa: BLE001 - the pool must answer every job
                    worker.kill()
                    result = _failed(job, "crashed", f"worker pool error: {type(e).__name__}: {e}")
                job.future.set_result(result)
        finally:
            worker.stop()

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self.restarts += 1
            closed = self._closed
        if not closed:
            worker.start()

    def _run(self, worker: _Worker, job: _Job) -> EvalResult:
        result = self._attempt(worker, job)
        if result is None:  # the worker was already dead when the job came: once more
            result = self._attempt(worker, job) or _failed(
                job, "crashed", f"worker {worker.index} died twice before taking the job"
            )
        return result

    def _attempt(self, worker: _Worker, job: _Job) -> EvalResult | None:
        if not worker.alive():
            worker.kill()  # died between evaluations (killed from outside): a fresh one
            worker.start()
        why = worker.wait_ready(self.start_timeout)
        if why is not None:
            tail = worker.log_tail()
            self._replace(worker)
            result = _failed(job, "crashed", f"worker {worker.index} {why}")
            result.traceback = tail
            return result
        worker.mark_log()
        started = time.monotonic()
        try:
            send(worker.requests, {"type": "evaluate", "problem": job.problem,
                                    "source": job.source, "options": job.options})  # fmt: skip
        except OSError:
            pass  # a dead worker shows up as EOF below
        phase, limit = "loading", job.options.compile_timeout
        deadline = started + limit
        accepted = False
        while True:
            try:
                message = receive(worker.results, deadline)
            except NoMessage:
                pid = worker.process.pid if worker.process else None
                self._replace(worker)
                result = _failed(
                    job,
                    "timeout",
                    f"no result within {limit:g} s while {phase} the candidate; its worker "
                    f"(pid {pid}) was killed and replaced",
                )
                result.compiled = phase == "running"
                result.worker = worker.index
                result.phase_seconds["total"] = time.monotonic() - started
                return result
            except PipeClosed:
                code = worker.process.wait() if worker.process else None
                tail = worker.log_tail()
                self._replace(worker)
                if not accepted:
                    return None  # died before it took the job: not the candidate's doing
                result = _failed(
                    job,
                    "crashed",
                    f"the worker process died while {phase} the candidate ({_describe_exit(code)})"
                    f"; it was replaced. {_crash_summary(tail)}",
                )
                result.traceback = tail
                result.worker = worker.index
                result.compiled = phase == "running"
                result.phase_seconds["total"] = time.monotonic() - started
                return result
            if message.get("type") == "phase" and message.get("phase") == "accepted":
                accepted = True
                continue
            if message.get("type") == "phase":
                phase, limit = "running", job.options.timeout
                deadline = time.monotonic() + limit
                continue
            if message.get("type") == "result":
                result = EvalResult.from_dict(message["result"])
                result.worker = worker.index
                if message.get("retire"):
                    self._replace(worker)
                return result


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


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exit code {code}"


def _crash_summary(log: str) -> str:
    """The lines of a dead worker's log that say what happened: faulthandler's "Fatal Python
    error" and the candidate's frames, else the last lines."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith("Fatal Python error")]
    frames = [line for line in lines if '"<candidate' in line]
    picked = fatal[:1] + frames[:3] if fatal or frames else lines[-4:]
    return ("Log: " + " | ".join(picked)) if picked else "The worker wrote nothing."


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
