"""One slot of a worker pool (one GPU, or one CPU share): its reference process, kept for the
pool's life, and its candidate workers, one per evaluation, the next one started while the
current one runs. `Slot.run` is one evaluation from the pool's side: the conversation with the
worker and the reference process, its deadlines, and the verdict the pool assembles.

What can go wrong, and what the slot does:
- the candidate raises, or fails to compile: an ordinary result (runtime_error, compile_error...);
- the worker dies (segfault, abort, os._exit): "crashed" with the signal and the tail of its log
  (faulthandler's traceback included);
- no answer in time (`compile_timeout` while loading, `timeout` after): the worker's process
  group is killed, "timeout";
- the worker breaks the protocol (a frame that is not JSON, a result that fails the schema,
  outputs the reference process cannot read, correct outputs the reference never judged):
  it is killed, "crashed" with the reason;
- the reference process dies: it is restarted, and the evaluation is "crashed".
Every worker is discarded after its evaluation; the slot carries on in every case.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from pathlib import Path

from . import wire
from .options import options_dict
from .processes import SandboxedProcess, close_fds, describe_exit
from .reference import Judgement
from .results import EvalResult
from .secrets import redact_all
from .verdict import Verdict

REFERENCE_END_GRACE = 30.0  # s for the reference process to finish its last check after a job


class CandidateWorker:
    """A started worker process and the pipe ends the pool keeps: requests to it, results from
    it, and the two ends (from it, to it) that go to the reference process for its job."""

    def __init__(self, slot: Slot, generation: int):
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()  # worker -> reference: outputs
        # reference -> worker: verdicts, and a lent device area's descriptor (area.py)
        back_r, back_w = (end.detach() for end in socket.socketpair())
        log = slot.log_dir / f"worker{slot.index}-{generation}.log"
        ends = (req_r, res_w, out_w, back_r)
        try:
            self.process = SandboxedProcess(
                "cudaforge.harness.worker", [*map(str, ends), str(slot.index)], ends, slot.env, log
            )
        except BaseException:
            close_fds(req_r, req_w, res_r, res_w, out_r, out_w, back_r, back_w)
            raise
        close_fds(*ends)
        self.requests, self.results = req_w, res_r
        self.for_reference = [out_r, back_w]

    def kill(self) -> None:
        self.process.kill()
        close_fds(self.requests, self.results, *self.for_reference)
        self.requests = self.results = -1
        self.for_reference = []


class ReferenceHandle:
    """The slot's reference process and the pool's end of its control socket."""

    def __init__(self, slot: Slot, generation: int):
        ours, theirs = socket.socketpair()
        log = slot.log_dir / f"reference{slot.index}-{generation}.log"
        try:
            self.process = SandboxedProcess("cudaforge.harness.reference_process",
                                            [str(theirs.fileno()), str(slot.index)],
                                            (theirs.fileno(),), slot.env, log)  # fmt: skip
        finally:
            theirs.close()
        self.socket = ours
        self.fd = ours.fileno()

    def kill(self) -> None:
        self.process.kill()
        with contextlib.suppress(OSError):
            self.socket.close()


class Slot:
    """What one pool thread serves jobs with."""

    def __init__(self, index: int, env: dict[str, str], device: str, log_dir: Path,
                 start_timeout: float, spares: int = 1):  # fmt: skip
        self.index = index
        self.env = env
        self.device = device  # "cuda:<id>" or "cpu", for messages
        self.log_dir = log_dir
        self.start_timeout = start_timeout
        self.generation = 0
        self.restarts = 0  # processes replaced after a crash, a hang or a broken protocol
        self.reference: ReferenceHandle | None = None
        self.spares_wanted = max(1, spares)
        self.spares: list[CandidateWorker] = []  # started ahead, oldest first

    # ------------------------------------------------------------------ processes

    def start(self) -> None:
        self.reference = self._new_reference()
        self.spares = [self._new_worker() for _ in range(self.spares_wanted)]

    def _new_worker(self) -> CandidateWorker:
        self.generation += 1
        return CandidateWorker(self, self.generation)

    def _new_reference(self) -> ReferenceHandle:
        self.generation += 1
        return ReferenceHandle(self, self.generation)

    def wait_ready(self) -> str | None:
        """None once the reference process and the spare worker are ready; else why not."""
        why = self._reference_ready()
        if why is None and self.spares:
            why = self.spares[0].process.wait_ready(self.spares[0].results, self.start_timeout)
            if why:
                why = f"worker {self.index} {why}"
        return why

    def _reference_ready(self) -> str | None:
        if self.reference is None or not self.reference.process.alive():
            if self.reference is not None:
                self.reference.kill()
                self.restarts += 1
            self.reference = self._new_reference()
        why = self.reference.process.wait_ready(self.reference.fd, self.start_timeout)
        return f"the reference process of worker {self.index} {why}" if why else None

    def take_worker(self) -> tuple[CandidateWorker | None, str]:
        """The oldest spare (a fresh one if it died), and a new spare started behind it."""
        for _ in range(2):
            worker = self.spares.pop(0) if self.spares else None
            if worker is None or not worker.process.alive():
                if worker is not None:
                    worker.kill()
                worker = self._new_worker()
            why = worker.process.wait_ready(worker.results, self.start_timeout)
            if why is None:
                while len(self.spares) < self.spares_wanted:
                    self.spares.append(self._new_worker())  # starts while this one evaluates
                return worker, ""
            tail = worker.process.log_tail()
            worker.kill()
            self.restarts += 1
        return None, f"worker {self.index} {why}. {crash_summary(tail)}"

    def pids(self) -> list[int]:
        found = []
        for handle in self.spares:
            if handle.process.alive():
                found.append(handle.process.pid)
        return found

    def close(self) -> None:
        for worker in self.spares:
            worker.kill()
        if self.reference is not None:
            with contextlib.suppress(OSError):
                wire.send(self.reference.fd, {"type": "stop"})
            self.reference.process.exit_code(2.0)
            self.reference.kill()
        self.spares, self.reference = [], None

    # ------------------------------------------------------------------ one evaluation

    def run(self, problem, source: str, options, failed) -> EvalResult:
        """Evaluate `source` on a fresh worker, judged by the reference process. `failed(status,
        error)` makes the result for a job that ends without one from the worker."""
        started = time.monotonic()
        why = self._reference_ready()
        worker, why_worker = (None, "") if why else self.take_worker()
        if why or worker is None:
            result = failed("crashed", why or why_worker)
            return self._sealed(result, None)
        request = {"problem": problem.to_dict(), "options": options_dict(options)}
        for attempt in (1, 2):
            verdict = Verdict(options)
            try:
                result = self._converse(worker, request, source, options, verdict, failed, started)
            finally:
                ended = self._end_reference(verdict)
                worker.kill()
            if result is not None:
                break
            # the worker died before it took the job: not the candidate's doing; once more
            worker, why_worker = self.take_worker() if attempt == 1 else (None, "")
            if worker is None:
                result = failed("crashed", f"worker {self.index} died twice before taking the "
                                f"job {why_worker}".strip())  # fmt: skip
                return self._sealed(result, None)
        if not ended:
            result.notes.append("the reference process did not finish in time; it was replaced")
        verdict.apply(result)
        result.worker = self.index
        result.phase_seconds["total"] = time.monotonic() - started
        return self._sealed(result, worker)

    def _converse(self, worker, request, source, options, verdict, failed, started):
        reference = self.reference
        wire.send(reference.fd, {"type": "begin", **request})
        socket.send_fds(reference.socket, [b"F"], worker.for_reference)
        close_fds(*worker.for_reference)
        worker.for_reference = []
        with contextlib.suppress(OSError):  # a dead worker shows up as EOF below
            wire.send(worker.requests, {"type": "evaluate", "source": source, **request})
        phase, limit = "loading", options.compile_timeout
        deadline = started + limit
        accepted = False
        while True:
            remaining = deadline - time.monotonic()
            ready = []
            if remaining > 0:
                ready, _, _ = select.select([reference.fd, worker.results], [], [], remaining)
            if not ready:
                pid = worker.process.pid
                worker.kill()
                self.restarts += 1
                result = failed("timeout", f"no result within {limit:g} s while {phase} the "
                                f"candidate; its worker (pid {pid}) was killed and replaced")  # fmt: skip
                result.compiled = phase == "running"
                return result
            if reference.fd in ready:
                trouble = self._hear_reference(verdict)
                if trouble and trouble != "ended":
                    worker.kill()
                    self.restarts += 1
                    return failed("crashed", trouble)
                continue
            try:
                message = wire.recv(worker.results, time.monotonic() + 1.0)
            except wire.PeerClosed:
                code = worker.process.exit_code()
                tail = worker.process.log_tail()
                self.restarts += 1
                if not accepted:
                    return None
                result = failed("crashed", f"the worker process died while {phase} the candidate "
                                f"({describe_exit(code)}); it was replaced. "
                                f"{crash_summary(tail)}")  # fmt: skip
                result.traceback = tail
                result.compiled = phase == "running"
                return result
            except (wire.WireError, wire.MessageLate) as e:
                return self._liar(worker, failed, f"a frame that breaks the protocol ({e})")
            kind = message.get("type")
            if kind == "phase" and message.get("phase") == "accepted":
                accepted = True
            elif kind == "phase":
                phase, limit = "running", options.timeout
                deadline = time.monotonic() + limit
            elif kind == "result":
                try:
                    data = wire.validate_result(message.get("result"))
                    if data.get("status") == "crashed":  # a sticky CUDA error: it is replaced
                        self.restarts += 1
                    return EvalResult.from_dict(redact_all(data))
                except (ValueError, TypeError) as e:
                    return self._liar(worker, failed, f"a result that fails the schema ({e})")
            else:
                return self._liar(worker, failed, f"a message of type {str(kind)[:40]!r}")

    def _liar(self, worker, failed, what: str) -> EvalResult:
        worker.kill()
        self.restarts += 1
        return failed("crashed", f"the worker process sent {what}; it was killed")

    def _hear_reference(self, verdict: Verdict) -> str:
        """Read one report of the reference process into `verdict`; why the evaluation cannot go
        on ('' when it can)."""
        try:
            report = wire.recv(self.reference.fd, time.monotonic() + wire.BODY_GRACE)
        except (wire.PeerClosed, wire.WireError, wire.MessageLate) as e:
            self._replace_reference()
            return f"the reference process of worker {self.index} failed ({e}); it was replaced"
        kind = report.get("type")
        if kind == "checked":
            judgement = Judgement.from_dict(report.get("judgement") or {})
            verdict.record(str(report.get("phase")), int(report.get("index", -1)),
                           int(report.get("call", -1)), int(report.get("of", 0)), judgement,
                           via=str(report.get("via", "host")))  # fmt: skip
        elif kind == "lent":
            verdict.lent(str(report.get("why") or "")[:500])
        elif kind == "begun":
            verdict.usable_extra = list(report.get("usable_extra") or [])
        elif kind == "broken":
            verdict.broken = str(report.get("reason", ""))[:1000]
            return f"the candidate's process broke the protocol to the reference ({verdict.broken})"
        elif kind == "ended":
            return "ended"
        return ""

    def _end_reference(self, verdict: Verdict) -> bool:
        """Tell the reference process the job is over and read its last reports."""
        reference = self.reference
        if reference is None or not reference.process.alive():
            return True
        with contextlib.suppress(OSError):
            wire.send(reference.fd, {"type": "end"})
        deadline = time.monotonic() + REFERENCE_END_GRACE
        while time.monotonic() < deadline:
            wait = max(0.0, deadline - time.monotonic())
            if not select.select([reference.fd], [], [], wait)[0]:
                break
            heard = self._hear_reference(verdict)
            if heard == "ended":
                return True
            if self.reference is not reference:  # it failed and was replaced
                return True
        self._replace_reference()
        return False

    def _replace_reference(self) -> None:
        if self.reference is not None:
            self.reference.kill()
        self.restarts += 1
        self.reference = self._new_reference()

    def _sealed(self, result: EvalResult, worker: CandidateWorker | None) -> EvalResult:
        """The result as it leaves the pool: the worker's sandbox notes, every secret redacted."""
        if worker is not None:
            for note in worker.process.notes:
                if note not in result.notes:
                    result.notes.append(note)
        return EvalResult.from_dict(redact_all(result.to_dict()))


def crash_summary(log: str) -> str:
    """The lines of a dead worker's log that say what happened: faulthandler's "Fatal Python
    error" and the candidate's frames, else the last lines."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith("Fatal Python error")]
    frames = [line for line in lines if '"<candidate' in line]
    picked = fatal[:1] + frames[:3] if fatal or frames else lines[-4:]
    return ("Log: " + " | ".join(picked)) if picked else "The worker wrote nothing."


__all__ = ["CandidateWorker", "ReferenceHandle", "Slot", "crash_summary"]
