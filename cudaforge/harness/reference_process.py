"""The reference process: `python -m cudaforge.harness.reference_process CONTROL_FD INDEX`, one
per pool slot, started in the same sandbox as a candidate's worker (processes.py) and kept for
the pool's life. It never imports a candidate: a candidate's module and the worker's entry
point are refused at import (`_NoCandidates`), the one place a candidate is executed
(correctness.py's load) refuses to run in this process (NEVER_RUNS_CANDIDATES), and a request
that carries a candidate's source ends the process.

For each evaluation the pool sends "begin" (the problem and the options, as JSON) with the two
ends of the channel to the candidate's worker, a pipe from it and a Unix socket to it (SCM_RIGHTS
over the control socket). The process rebuilds the reference Model, then answers each output the worker sends (in a device area it lends the
worker on a GPU, area.py, else as host copies; wire.recv_tensors, their total size bounded by
the reference's own outputs) with a Judgement: first to the pool ("checked"), then to the
worker. "end" closes the pipes, frees the models and the area ("ended")."""

from __future__ import annotations

import gc
import importlib.abc
import os
import select
import socket
import sys
import time

from . import wire
from .lifeline import die_with_pool

# read by correctness.py's load when this module is the process's __main__
NEVER_RUNS_CANDIDATES = True
# a candidate's worker: its entry point, and the module each candidate's code becomes
CANDIDATE_MODULES = ("cudaforge.harness.worker",)
CANDIDATE_PREFIX = "cudaforge_candidate_"
MAX_AREAS = 4  # device areas one evaluation may ask for (a larger output asks again)


class _NoCandidates(importlib.abc.MetaPathFinder):
    """Refuses to import a candidate's module or a candidate worker's entry point."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in CANDIDATE_MODULES or fullname.startswith(CANDIDATE_PREFIX):
            raise ImportError(f"the reference process never imports {fullname}")


def forbid_candidates() -> None:
    """Install the import refusal; fails if a forbidden module is already loaded."""
    loaded = [name for name in CANDIDATE_MODULES if name in sys.modules]
    loaded += [name for name in sys.modules if name.startswith(CANDIDATE_PREFIX)]
    if loaded:
        raise RuntimeError(f"the reference process has loaded {', '.join(loaded)}")
    sys.meta_path.insert(0, _NoCandidates())


def _check_header(header: dict) -> tuple[str, int, int, int]:
    from .reference import PHASES

    phase, index, call, of = (header.get(k) for k in ("phase", "index", "call", "of"))
    if phase not in PHASES:
        raise wire.WireError(f"a check of phase {str(phase)[:30]!r}")
    if not all(type(v) is int and 0 <= v < 1 << 31 for v in (index, call, of)) or call > 1:
        raise wire.WireError("a check whose index, call or count is not a small int")
    return phase, index, call, of


class ReferenceProcess:
    def __init__(self, control: int, index: int):
        import torch

        self.torch = torch
        self.control = control
        self.socket = socket.socket(fileno=control)  # for the pipe ends that come with "begin"
        self.index = index
        self.device = torch.device("cpu")
        if torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
            torch.zeros(1, device=self.device)  # the context now, not in the first evaluation
        self.area = None  # the device area lent for the current evaluation (area.py)
        self.areas_lent = 0

    def run(self) -> None:
        wire.send(self.control, {"type": "ready", "pid": os.getpid(), "role": "reference",
                                 "device": str(self.device)})  # fmt: skip
        while True:
            try:
                message = wire.recv(self.control)
            except wire.PeerClosed:
                return
            kind = message.get("type")
            if kind == "stop":
                return
            if kind != "begin":
                continue
            if "source" in message:
                raise SystemExit("the reference process was sent a candidate's source")
            _, fds, _, _ = socket.recv_fds(self.socket, 1, 2)
            if len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                wire.send(self.control, {"type": "begun", "error": "no pipes came with begin"})
                continue
            self.serve(message, fds[0], fds[1])

    def serve(self, message: dict, from_candidate: int, to_candidate: int) -> None:
        from .options import options_from_dict
        from .problem import Problem
        from .reference import ReferenceJudge

        torch = self.torch
        judge = None
        self.areas_lent = 0
        try:
            problem = Problem.from_dict(message["problem"])
            options = options_from_dict(message["options"])
            device = torch.device(options.device) if options.device else self.device
            judge = ReferenceJudge(problem, options, device)
            with torch.no_grad():
                judge.build()
            wire.send(self.control, {"type": "begun", "usable_extra": judge.usable_extra})
            self.prefetch(judge, "correctness", 0)  # while the candidate's process compiles
        except Exception as e:  # noqa: BLE001 - the candidate's side reports the same failure
            judge = None
            wire.send(self.control, {"type": "begun", "error": f"{type(e).__name__}: {e}"[:2000]})
        reading = judge is not None
        limit = None
        while True:
            watched = [self.control] + ([from_candidate] if reading else [])
            ready, _, _ = select.select(watched, [], [])
            if self.control in ready:
                try:
                    if wire.recv(self.control).get("type") == "end":
                        break
                except wire.PeerClosed:
                    os._exit(0)
                continue
            if limit is None:
                limit = self.size_limit(judge)
            try:
                header = wire.recv(from_candidate, time.monotonic() + 1.0)
                if header.get("type") == "area":
                    self.lend_area(header, limit, to_candidate)
                    continue
                via = "area" if header.get("in_area") is True else "host"
                header, tensors = wire.read_tensors(from_candidate, header, time.monotonic() + 1.0,
                                                    max_bytes=limit, area=self.area)  # fmt: skip
                phase, index, call, of = _check_header(header)
                judgement = self.judge(judge, header, tensors, phase, index, call, of)
            except wire.PeerClosed:
                reading = False  # the worker is done, or dead
                continue
            except (wire.WireError, wire.MessageLate) as e:
                wire.send(self.control, {"type": "broken", "reason": str(e)[:1000]})
                reading = False
                continue
            report = {"phase": phase, "index": index, "call": call, "of": of, "via": via,
                      "judgement": judgement.to_dict()}  # fmt: skip
            wire.send(self.control, {"type": "checked", **report})  # the pool hears it first
            try:
                wire.send(to_candidate, judgement.to_dict())
            except OSError:
                reading = False
            upcoming = judge.next_check(phase, index, call)
            if reading and upcoming is not None and judgement.passed:
                self.prefetch(judge, *upcoming)
        for fd in (from_candidate, to_candidate):
            os.close(fd)
        if judge is not None:
            judge.settings.restore()
            judge.close()
        gc.collect()
        self.free_area()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        wire.send(self.control, {"type": "ended"})

    def prefetch(self, judge, phase: str, index: int) -> None:
        """The reference's side of the next check, computed while the candidate's process runs
        its own (inputs are drawn on the CPU in most problems: seconds for gigabytes)."""
        free = None
        if self.device.type == "cuda":
            free = self.torch.cuda.mem_get_info(self.device)[0]
        with self.torch.no_grad():
            judge.prefetch(phase, index, free)

    def lend_area(self, header: dict, limit: int, to_candidate: int) -> None:
        """Answer a worker's request for a device area of `bytes` (at most `limit`): a new area
        and its descriptor, or why not (the worker then sends host copies). WireError for a
        request that is not well formed, or past the few an evaluation needs."""
        nbytes = header.get("bytes")
        if type(nbytes) is not int or not 0 < nbytes <= limit:
            raise wire.WireError(f"a device area of {str(nbytes)[:30]} bytes (limit {limit})")
        self.areas_lent += 1
        if self.areas_lent > MAX_AREAS:
            raise wire.WireError(f"more than {MAX_AREAS} device areas asked for in one evaluation")
        why = ""
        if self.device.type != "cuda":
            why = "the reference runs on the CPU"
        else:
            from ..errors import CudaforgeError
            from .area import DeviceArea

            self.free_area()
            try:
                self.area, fd = DeviceArea.create(nbytes, self.device)
            except (CudaforgeError, RuntimeError) as e:
                why = f"{type(e).__name__}: {e}"[:500]
        report = {"type": "lent", "bytes": nbytes, "why": why}
        wire.send(self.control, report)
        if why:
            wire.send(to_candidate, {"type": "area", "ok": False, "why": why})
            return
        from .area import send_fd

        try:
            wire.send(to_candidate, {"type": "area", "ok": True, "size": self.area.size})
            send_fd(to_candidate, fd)
        finally:
            os.close(fd)

    def free_area(self) -> None:
        if self.area is not None:
            area, self.area = self.area, None
            area.free()

    def size_limit(self, judge) -> int:
        """The most bytes one check may send: several times the reference's inputs and
        outputs, so a wrong shape is still judged, but a flood is refused before allocating."""
        torch = self.torch
        from .compare import leaves

        base, _, out = judge.expected("correctness", 0)
        values = leaves(out) + list(base)
        known = sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))
        return 8 * known + (256 << 20)

    def judge(self, judge, header: dict, tensors: list, phase, index, call, of):
        from .host_copy import unpack

        out, facts = unpack(header.get("outputs"), tensors, judge.device)
        inputs, input_facts = None, None
        if header.get("inputs") is not None:
            inputs, input_facts = unpack(header["inputs"], tensors, judge.device)
        with self.torch.no_grad():
            return judge.judge(phase, index, call, out, inputs, facts=facts,
                               input_facts=input_facts, of=of)  # fmt: skip


def main(control: int, index: int) -> None:
    forbid_candidates()
    die_with_pool(control)
    ReferenceProcess(control, index).run()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m cudaforge.harness.reference_process CONTROL_FD INDEX")
    main(int(sys.argv[1]), int(sys.argv[2]))
    sys.stdout.flush()
    os._exit(0)
