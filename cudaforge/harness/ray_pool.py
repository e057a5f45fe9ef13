"""Evaluation past one host: the worker pool's isolation, in Ray actors on a cluster's nodes.

A RayPool places one actor per GPU of the cluster (`num_gpus=1` each; Ray sets the actor's
CUDA_VISIBLE_DEVICES), or `workers` CPU actors with device="cpu". An actor never runs a candidate
itself: it owns a one-worker WorkerPool on its node and evaluates through it, so a candidate that
segfaults or hangs costs only that worker subprocess, which the actor's pool replaces, and the
actor carries on. Results travel back as EvalResult.to_dict() and are rebuilt here; each says
which node (`node`, a Ray node id) and which actor slot (`worker`) measured it.

Jobs wait in one queue here and each actor takes the next when it is free, so a slow candidate
does not hold up the others. An actor that dies (its node lost, its process killed) gives a
"crashed" result for the job it held and is replaced; one that cannot be started in
`start_timeout` (no free GPU in the cluster) is left out, and when none is left the queued jobs
fail with the reason.

Ray is an optional extra (`pip install cudaforge[ray]`); cudaforge must be installed on every
node, as on the driver (or brought by a Ray runtime_env, passed in `init_options`).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from typing import Any

from ..errors import ExtraNotInstalled, NoGPUError
from .pool import QueuedPool, _failed, _Job, _wait_all
from .problem import Problem
from .results import EvalResult

# beyond the pool's own deadlines, how long an actor may take to answer before it is given up
ACTOR_GRACE_S = 60.0


def _ray():
    try:
        import ray
    except ImportError:
        raise ExtraNotInstalled(
            "ray", "ray", "cudaforge.RayPool (evaluation on a Ray cluster)"
        ) from None
    return ray


class _EvalActor:
    """Lives in a Ray worker process on some node and holds a one-worker WorkerPool there."""

    def __init__(self, device: str, start_timeout: float, log_dir: str | None):
        import ray

        from .pool import WorkerPool

        self.pool = WorkerPool(1, device=device, start_timeout=start_timeout, log_dir=log_dir)
        context = ray.get_runtime_context()
        self.node = context.get_node_id()
        self.ip = ray.util.get_node_ip_address()

    def ready(self, timeout: float) -> dict[str, Any]:
        return {"started": self.pool.wait_ready(timeout), "node": self.node, "ip": self.ip,
                "device": self.pool.devices[0]}  # fmt: skip

    def evaluate(self, problem: Problem, source: str, options) -> dict[str, Any]:
        result = self.pool.submit_options(problem, source, options).result()
        result.node = self.node
        return result.to_dict()

    def close(self) -> None:
        self.pool.close()


class _Slot:
    """One actor's place in the pool: the actor, replaced when it dies."""

    def __init__(self, index: int, kind: str):
        self.index = index
        self.kind = kind  # "cuda" or "cpu"
        self.actor = None
        self.label = kind  # "cuda:3@10.0.0.5" once started
        self.node = ""
        self.started = False
        self.settled = threading.Event()  # set once the first start succeeded or failed
        self.why = ""  # why it could not start


class RayPool(QueuedPool):
    """Ray actors that evaluate candidates, one per GPU of the cluster, or `workers` CPU actors
    with device="cpu" (or where the cluster has no GPU; default 2, fewer if it has fewer CPUs).
    An actor past the cluster's free GPUs waits up to `start_timeout` for one, then is left out.
    The same interface as cudaforge.WorkerPool; use as a context manager, or call close().

    `address` goes to ray.init: None joins the cluster RAY_ADDRESS or `ray start` names, else
    starts a local instance; "local" always starts one; "auto", "HOST:PORT" or "ray://HOST:PORT"
    join a running cluster. A Ray already initialized in this process is used as it is (then
    address must be None) and left running by close(); an instance this pool started is shut
    down by close(). `init_options`: more keywords for ray.init (runtime_env, num_cpus, ...).
    `log_dir` is a folder on each node for its worker's log."""

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        *,
        device: str | None = None,
        timeout: float = 60.0,
        compile_timeout: float = 300.0,
        start_timeout: float = 300.0,
        log_dir: str | os.PathLike | None = None,
        init_options: dict[str, Any] | None = None,
    ):
        ray = _ray()
        if device not in (None, "cpu", "cuda"):
            raise ValueError(
                f"device must be None, 'cpu' or 'cuda' (a GPU per actor), not {device!r}"
            )
        if workers is not None and workers < 1:
            raise ValueError("a Ray pool needs at least one worker")
        self.timeout = timeout
        self.compile_timeout = compile_timeout
        self.start_timeout = start_timeout
        self.restarts = 0
        self._own_ray = not ray.is_initialized()
        if self._own_ray:
            ray.init(address=address, **(init_options or {}))
        elif address is not None or init_options:
            raise ValueError(
                "Ray is already initialized in this process: pass address=None and "
                "no init_options to use that connection, or ray.shutdown() first"
            )
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        if device not in (None, "cpu") and not gpus:
            self._shutdown()
            raise NoGPUError(
                f"device={device!r}: the Ray cluster has no GPU "
                f"(its resources: {_resource_text(resources)})"
            )
        kind = "cuda" if gpus and device != "cpu" else "cpu"
        if workers is None:
            workers = gpus if kind == "cuda" else max(1, min(2, int(resources.get("CPU", 1))))
        options = {"num_gpus": 1} if kind == "cuda" else {"num_cpus": 1}
        self._actor_class = ray.remote(**options)(_EvalActor)
        self._actor_args = (kind, start_timeout, None if log_dir is None else str(log_dir))
        self._init_queue()
        self._slots = [_Slot(i, kind) for i in range(workers)]
        self._alive = len(self._slots)
        self._start_serving(self._slots, "cudaforge-ray")

    # ------------------------------------------------------------------ public

    @property
    def size(self) -> int:
        return len(self._slots)

    @property
    def devices(self) -> list[str]:
        """Each actor's device, as "cuda:<id>@<node ip>" or "cpu@<node ip>" once it has started
        ("cuda" or "cpu" before)."""
        return [s.label for s in self._slots]

    @property
    def nodes(self) -> list[str]:
        """Each actor's Ray node id ("" until it has started)."""
        return [s.node for s in self._slots]

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every actor and its worker have started; False if one could not."""
        if not _wait_all([s.settled for s in self._slots], timeout):
            return False
        return all(s.started for s in self._slots)

    def _enqueue(self, job: _Job) -> bool:
        if not self._alive:
            return False
        self._jobs.put(job)
        return True

    def _refusal(self) -> str:
        return self._none_left()

    def _after_close(self) -> None:
        """Shut Ray down if this pool started it."""
        self._shutdown()

    # ------------------------------------------------------------------ per actor thread

    def _serve(self, slot: _Slot) -> None:
        try:
            slot.why = self._start(slot)
            slot.started = not slot.why
            slot.settled.set()
            while slot.actor is not None:
                job = self._jobs.get()
                if job is None:
                    break
                if not job.future.set_running_or_notify_cancel():
                    continue
                try:
                    result = self._run(slot, job)
                except Exception as e:  # noqa: BLE001 - the pool must answer every job
                    result = _failed(job, "crashed", f"Ray pool error: {type(e).__name__}: {e}")
                job.future.set_result(result)
        finally:
            slot.settled.set()
            self._stop(slot)
            if not self._closed:
                self._retire(slot)

    def _start(self, slot: _Slot) -> str:
        """Start the slot's actor and wait for its worker; '' once it is ready, else why not."""
        ray = _ray()
        slot.actor = self._actor_class.remote(*self._actor_args)
        ref = slot.actor.ready.remote(self.start_timeout)
        deadline = time.monotonic() + self.start_timeout
        why = ""
        try:
            # in short waits, so that close() is not held up by an actor waiting for a GPU
            while not why and not ray.wait([ref], timeout=1.0)[0]:
                if self._closed:
                    why = "the pool was closed while it started"
                elif time.monotonic() > deadline:
                    why = (
                        f"did not start within {self.start_timeout:g} s (is a "
                        f"{slot.kind.upper()} free in the cluster? free now: "
                        f"{_resource_text(ray.available_resources())})"
                    )
            if not why:
                info = ray.get(ref)
                slot.node, slot.label = info["node"], f"{info['device']}@{info['ip']}"
                if not info["started"]:
                    why = f"its worker process on {slot.label} did not start"
        except ray.exceptions.RayError as e:
            why = f"failed to start: {_first_line(e)}"
        if why:
            self._stop(slot)
            return f"Ray actor {slot.index} {why}"
        return ""

    def _stop(self, slot: _Slot) -> None:
        if slot.actor is None:
            return
        ray = _ray()
        with contextlib.suppress(Exception):
            ray.get(slot.actor.close.remote(), timeout=10)
        with contextlib.suppress(Exception):
            ray.kill(slot.actor, no_restart=True)
        slot.actor = None

    def _replace(self, slot: _Slot) -> None:
        self._stop(slot)
        with self._lock:
            self.restarts += 1
            if self._closed:
                return
        why = self._start(slot)
        if why:
            slot.why = why

    def _retire(self, slot: _Slot) -> None:
        """The slot has no actor and will take no more jobs; with none left, fail the queue."""
        with self._lock:
            self._alive -= 1
            if self._alive:
                return
            reason = self._none_left()
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None and job.future.set_running_or_notify_cancel():
                    job.future.set_result(_failed(job, "crashed", reason))

    def _none_left(self) -> str:
        whys = "; ".join(s.why for s in self._slots if s.why) or "they were stopped"
        return f"no Ray actor is left to evaluate on: {whys}"

    def _run(self, slot: _Slot, job: _Job) -> EvalResult:
        ray = _ray()
        # the actor's own pool enforces the evaluation's deadlines; this one is for the actor
        limit = 2 * self.start_timeout + job.options.compile_timeout + job.options.timeout
        limit += ACTOR_GRACE_S
        started = time.monotonic()
        for attempt in (1, 2):
            where = f"Ray actor {slot.index} ({slot.label})"
            node = slot.node
            try:
                data = ray.get(
                    slot.actor.evaluate.remote(job.problem, job.source, job.options), timeout=limit
                )
            except ray.exceptions.GetTimeoutError:
                status, error = "timeout", f"{where} gave no result within {limit:g} s"
            except ray.exceptions.RayActorError as e:
                status, error = "crashed", f"{where} died ({_first_line(e)})"
                if attempt == 1:
                    # most likely lost before the job came (node gone, killed from outside):
                    # once more on a fresh actor; a candidate that kills its actor dies twice
                    self._replace(slot)
                    if slot.actor is not None:
                        continue
                    error += f"; no new actor: {slot.why}"
            except ray.exceptions.RayError as e:
                # the actor answered with an exception (e.g. cudaforge differs on that node):
                # it may be alive, but a fresh one is cheap next to trusting a broken one
                status, error = "crashed", f"{where} failed: {_first_line(e)}"
            else:
                result = EvalResult.from_dict(data)
                result.worker = slot.index
                return result
            break
        if slot.actor is not None:
            self._replace(slot)
            error += "; it was replaced"
        result = _failed(job, status, error)
        result.worker = slot.index
        result.node = node
        result.phase_seconds["total"] = time.monotonic() - started
        return result

    def _shutdown(self) -> None:
        if self._own_ray:
            self._own_ray = False
            with contextlib.suppress(Exception):
                _ray().shutdown()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _resource_text(resources: dict[str, float]) -> str:
    return ", ".join(f"{k} {resources[k]:g}" for k in ("CPU", "GPU") if k in resources) or "none"


__all__ = ["RayPool"]
