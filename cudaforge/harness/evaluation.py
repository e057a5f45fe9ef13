"""One evaluation in a worker: its state and bookkeeping, shared by the phases (correctness.py,
timing.py). The guards fired, passed and skipped; stopping with a status; an exception turned into
the result (compile error, load error, runtime error, a lost CUDA context); the device set up and
everything released afterwards; the checks made between phases (tampering, torch settings,
persisting L2)."""

from __future__ import annotations

import contextlib
import gc
import sys
import time
import traceback
from collections.abc import Callable

from .guards import (
    GUARDS,
    HARNESS_MODULES,
    _fingerprint,
    _fingerprint_diff,
    _PersistingL2,
    _Poison,
    _TorchSettings,
)
from .options import EvalOptions
from .problem import Problem
from .results import EvalResult, TrialFailure

# True in a worker process (worker.py): it ends after its one evaluation, so cleanup() leaves
# the garbage collection and the allocator's cache to the exit (50 ms per evaluation)
EXITS_AFTER = False


class _Stop(Exception):
    """Ends an evaluation early; the result already says why."""


class _CompiledReferenceFailed(Exception):
    """torch.compile of the reference failed: a note in the result, not the candidate's fault."""


class Evaluation:
    """The state of one evaluation; the phases are methods of the subclasses that add them."""

    def __init__(self, problem, source, options, result, on_phase, judge=None):
        import torch

        self.torch = torch
        self.problem: Problem = problem
        self.source: str = source
        self.opts: EvalOptions = options
        self.result: EvalResult = result
        self.on_phase = on_phase or (lambda phase: None)
        # the reference's side of every comparison: the reference process's (RemoteJudge), or
        # None for one built here at load (a ReferenceJudge)
        self.judge = judge
        self.device = None
        self.cuda = False
        self.poison = None
        self.l2 = None
        self.harness_stream = None
        self.flush = None
        self.warm_host_s: dict[str, float] = {}  # the host's time to issue a call, per side
        self.hooks = None
        self.candidate_module = None
        self.settings = None
        self.fingerprint = None
        self.fired: dict[str, str] = {}
        self.copied_outputs: set[int] = set()  # outputs noted as copied to the caller's layout
        self.passed: list[str] = []
        self.skipped: dict[str, str] = {}
        self.own_names: set[str] = set()
        self.output_bytes = 0
        self.input_bytes = 0

    # ------------------------------------------------------------------ bookkeeping

    def timed(self, phase: str, fn: Callable[[], None]) -> None:
        started = time.perf_counter()
        try:
            fn()
        finally:
            self.result.phase_seconds[phase] = time.perf_counter() - started

    def finish(self) -> None:
        r = self.result
        self.record_guards()
        rejecting = [g for g in r.guards if g not in self.opts.ignore_guards]
        if r.status in ("load_error", "ok") and r.correct:
            r.status = "rejected" if rejecting else "ok"
            if rejecting:
                r.error = "rejected by guard(s) " + ", ".join(
                    f"{g} ({r.guard_details.get(g, '')})" for g in rejecting
                )
        if r.candidate_ms and r.reference_ms:
            r.speedup = r.reference_ms / r.candidate_ms
        eager = r.eager_candidate_ms  # torch.compile's time is eager: so is the candidate's here
        if eager and r.compiled_reference_ms:
            r.speedup_vs_compile = r.compiled_reference_ms / eager

    def record_guards(self) -> None:
        r = self.result
        r.guards = [g for g in GUARDS if g in self.fired]
        r.guard_details = {g: self.fired[g] for g in r.guards}
        r.guards_skipped = {g: why for g, why in self.skipped.items() if g not in self.fired}
        r.guards_passed = [
            g for g in GUARDS if g in self.passed and g not in self.fired and g not in self.skipped
        ]

    def fire(self, guard: str, detail: str) -> None:
        self.fired.setdefault(guard, detail)

    def passed_guard(self, *guards: str) -> None:
        for g in guards:
            if g not in self.passed:
                self.passed.append(g)

    def stop(self, status: str, error: str, failure: TrialFailure | None = None) -> None:
        r = self.result
        r.status = status
        r.error = error
        if failure is not None:
            r.failure = failure
        self.record_guards()
        raise _Stop

    # ------------------------------------------------------------------ setup and cleanup

    def setup(self) -> None:
        torch = self.torch
        name = self.opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(name)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            props = torch.cuda.get_device_properties(self.device)
            self.result.device = f"{props.name} ({self.device})"
            self.harness_stream = torch.cuda.Stream(self.device)
            self.l2 = _PersistingL2(self.device)
            self.poison = _Poison(torch, self.device)
        else:
            self.result.device = "cpu"
            why = "needs a CUDA GPU"
            self.skipped.update(
                unwritten_output="needs the CUDA caching allocator to poison",
                no_own_kernels=f"{why} (CUPTI kernel records)",
                timing_mismatch=f"{why} (CUPTI kernel records)",
                unmeasured_work=f"{why} (streams)",
                persisting_l2=f"{why} (L2 cache)",
            )
        self.settings = _TorchSettings(torch, self.opts.allow_tf32)
        self.settings.apply()

    def cleanup(self) -> None:
        torch = self.torch
        if self.hooks is not None:
            self.hooks.remove()
        name = getattr(self.candidate_module, "__name__", None)
        if name:
            sys.modules.pop(name, None)
        self.candidate_module = None
        # drop every tensor and model this evaluation holds before returning memory to the GPU
        for name in (
            "candidate",
            "reference",
            "ref_module",
            "timed_buffers",
            "flush",
            "judge",
        ):
            self.__dict__.pop(name, None)
        self.poison = None
        if self.settings is not None:
            self.settings.restore()
        if EXITS_AFTER:  # a worker: the process ends after this evaluation and frees it all
            return
        gc.collect()
        if self.cuda:
            with contextlib.suppress(Exception):
                if self.l2 is not None:
                    self.l2.check_and_reset()
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()

    # ------------------------------------------------------------------ running the models

    def call(self, model, inputs: list, who: str):
        """One forward; exceptions become the result (runtime_error or crashed)."""
        try:
            return model(*inputs)
        except Exception as e:
            if who == "compiled reference" and _context_alive(self.torch, self.device):
                raise _CompiledReferenceFailed(one_line(e)) from e
            if who == "reference":
                self.fail_from_exception(e, where="reference")
            self.fail_from_exception(e, where="forward")

    def sync(self, who: str = "candidate") -> None:
        if not self.cuda:
            return
        try:
            self.torch.cuda.synchronize(self.device)  # device-wide: every stream
        except Exception as e:  # noqa: BLE001
            self.fail_from_exception(e, where="forward" if who == "candidate" else who)

    def fail_from_exception(self, e: BaseException, where: str) -> None:
        r = self.result
        r.traceback = _candidate_traceback(e, getattr(self, "candidate_filename", "<candidate"))
        kind = type(e).__name__
        if self.cuda and not _context_alive(self.torch, self.device):
            self.stop(
                "crashed",
                f"sticky CUDA error during the {where}: {one_line(e)}; the CUDA context is lost "
                "and this worker will be replaced",
            )
        if kind == "CompileError" or (
            isinstance(e, RuntimeError) and str(e).startswith("Error building extension")
        ):
            r.compile_log = str(getattr(e, "log", "") or e)
            self.stop("compile_error", f"the candidate's CUDA code did not compile: {_first(e)}")
        if where == "harness":
            r.status, r.error = "runtime_error", f"harness error: {kind}: {one_line(e)}"
            return
        if where == "reference":
            self.stop("runtime_error", f"the reference failed: {kind}: {one_line(e)}")
        if where in ("import", "init"):
            what = (
                "importing the candidate" if where == "import" else "ModelNew(*get_init_inputs())"
            )
            self.stop("load_error", f"{what} raised {kind}: {one_line(e)}")
        self.stop("runtime_error", f"the candidate's forward raised {kind}: {one_line(e)}")

    # ------------------------------------------------------------------ state checks

    def check_tampering(self, when: str) -> None:
        if self.fingerprint is None:
            return
        changed = _fingerprint_diff(self.fingerprint, _fingerprint(self.torch))
        if sys.gettrace() is not None or sys.getprofile() is not None:
            changed.append("sys.settrace/setprofile hook")
        if changed:
            self.fire(
                "tampering",
                f"after {when}: replaced {', '.join(changed[:6])}"
                + (f" and {len(changed) - 6} more" if len(changed) > 6 else ""),
            )
            self.stop("rejected", f"tampering: {self.fired['tampering']}")
        self.passed_guard("tampering")

    def check_settings(self, when: str) -> None:
        changed = self.settings.changed()
        if changed:
            self.result.notes.append(
                f"the candidate changed torch settings while {when}: {', '.join(changed)}; "
                "the harness's settings were restored"
            )
            self.settings.apply()

    def check_l2(self) -> None:
        if self.l2 is None:
            return
        if self.l2.reason:
            self.skipped.setdefault("persisting_l2", self.l2.reason)
            return
        detail = self.l2.check_and_reset()
        if detail:
            self.fire("persisting_l2", detail + " (reset before timing)")
        else:
            self.passed_guard("persisting_l2")


# ====================================================================== helpers


def tensor_bytes(values) -> int:
    """Bytes of the tensors among `values`."""
    import torch

    return sum(t.numel() * t.element_size() for t in values if isinstance(t, torch.Tensor))


def cloned(values: list) -> list:
    """`values` with every tensor cloned (inputs for one run, the originals kept apart)."""
    import torch

    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def refill(buffers: list, fresh: list) -> None:
    """Fresh values into the same tensors (same pointers), where the shapes agree."""
    import torch

    for b, f in zip(buffers, fresh, strict=False):
        if isinstance(b, torch.Tensor) and isinstance(f, torch.Tensor) and b.shape == f.shape:
            b.copy_(f)


def _context_alive(torch, device) -> bool:
    """False after a sticky CUDA error (illegal address, trap): nothing can run any more."""
    try:
        torch.cuda.synchronize(device)
        probe = torch.ones(1, device=device)
        return float((probe + 1).item()) == 2.0
    except Exception:  # noqa: BLE001
        return False


def one_line(e: BaseException, limit: int = 400) -> str:
    """An exception's message on one line, at most `limit` characters."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first(e: BaseException) -> str:
    line = getattr(e, "line", None)
    if line:
        return one_line(line)
    return one_line(str(e).splitlines()[0] if str(e) else type(e).__name__)


# the modules whose frames are the harness's, not the candidate's (the problem's are kept)
_HARNESS_FILES = tuple(
    f"cudaforge/harness/{name}.py" for name in HARNESS_MODULES if name not in ("problem", "results")
)


def _candidate_traceback(e: BaseException, filename: str) -> str:
    """The traceback without the harness's own frames."""
    frames = [
        f for f in traceback.extract_tb(e.__traceback__) if not f.filename.endswith(_HARNESS_FILES)
    ]
    lines = traceback.format_list(frames)
    lines += traceback.format_exception_only(type(e), e)
    return "".join(lines)[-8000:]
