"""Evaluating a candidate against its problem's PyTorch reference: correctness, timing and the guards
that keep a fast wrong (or fast-looking) kernel from passing. The result is an EvalResult.

`evaluate()` is what users call: it sends the work to a worker process (harness/worker.py), so
the calling process never imports or runs a candidate. `run_evaluation()` is what a worker runs.

What one evaluation does, in order (the why of each step is in DESIGN.md "Verification"):

1. load: the reference Model and the candidate's ModelNew are built from the same seed. Hooks on
   cudaforge.compile and torch's load_inline/load record the CUDA sources compiled, so the
   candidate's own kernels can be told from torch's.
2. correctness: `trials` trials, each with fresh inputs from seed + t. The candidate runs first and
   twice, each time on its own clone of the inputs, then the reference on another clone. Before
   each candidate run the CUDA caching allocator's free blocks are filled with NaN bytes, so an
   output element the candidate never writes is NaN and fails. Every output is checked: type,
   shape, dtype, strides, device, then values (atol/rtol per dtype, NaN/Inf where the reference
   has none, and a relative-L2 bound that keeps all-zero outputs of tiny-valued problems from
   passing). An output sharing memory with an input, or the second call returning the first call's
   memory, fails; so does an input the candidate changed and the reference does not.
3. timing: the same procedure for candidate and reference: warm-up, then the timed runs, each
   on one of `input_sets` input buffers (rotating) refilled with fresh values before the run, the
   L2 cache flushed (a buffer of several times the L2 written) and CUDA events around the forward.
   All of that preparation runs on a separate harness stream, outside the events. On a GPU the
   two sides' runs alternate until each median's 95% interval is within `precision` (or the
   budget or `max_runs` is spent: stopping.py, interleave.py), and forwards under
   `graph_below_ms` are also timed as CUDA-graph replays (graphs.py); `timing_rule="fixed"` runs
   `timed_runs` of each side, one side after the other. Median, interval and spread
   ((p75 - p25) / median) of the event times. Then `traced_runs` more runs the same way
   with CUPTI recording every kernel (the per-kernel times, the candidate's share, work outside
   the events): kept apart from the timed runs because CUPTI's trace slows some kernels (below).
   Then one checked run per input buffer, synchronized, whose outputs are compared with the
   reference afterwards.
4. revalidation: two more runs on values the candidate has not seen, written in place into the
   buffers it was timed on (same pointers), each compared with the reference.
5. guards (GUARDS below): each is recorded as fired (guards, guard_details), passed, or skipped
   with the reason (on a CPU, those that need CUDA).

Without a GPU the same steps run on the CPU with wall-clock timing; nothing is poisoned, flushed
or traced there, and the result says so in guards_skipped.

Where each part lives: options.py (EvalOptions, the tolerance table), compare.py (what counts as a
correct output, aliasing), guards.py (the guards and their machinery), tracer.py (compile hooks,
CUPTI), evaluation.py (one evaluation's state), correctness.py (load, trials, revalidation),
timing.py (timed, traced and checked runs), stopping.py (when the runs stop; the tie rule),
interleave.py (their order), timed_sides.py (one run of a side), graphs.py (CUDA-graph timing),
ties.py (which of two results is faster), reference.py (the reference's side of every
comparison), pool.py, slot.py and worker.py (the worker processes), reference_process.py (where
a pool judges the outputs), verdict.py (the verdict the pool assembles).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from .correctness import CorrectnessPhases
from .evaluation import _Stop
from .options import EvalOptions, make_options
from .pool import default_pool
from .problem import Problem
from .quiet import gpu_quiet
from .results import EvalResult
from .timing import TimingPhases


def evaluate(
    problem: Problem | str,
    candidate_source: str,
    *,
    trials: int = 5,
    timed_runs: int = 100,
    warmup: int = 10,
    atol: float | Mapping[str, float] | None = None,
    rtol: float | Mapping[str, float] | None = None,
    compare_compile: bool = False,
    device: str | None = None,
    timeout: float = 60.0,
    pool=None,
    **options: Any,
) -> EvalResult:
    """Evaluate `candidate_source` (Python defining ModelNew) against `problem` in a worker process.

    `pool`: a cudaforge.WorkerPool; None uses the process-wide default pool (one worker per visible
    GPU, or CPU workers without one), started on first use and kept warm. Further options (see
    EvalOptions): input_sets, fresh_inputs, norm_tol, seed, bandwidth_ceiling (bytes/s), allow_tf32,
    profile, ignore_guards, extra_sizes, compile_timeout (s). Times in the result are in ms.
    `timeout` (s) covers everything after the candidate is built, torch.compile of the reference
    included when compare_compile is set.
    Never raises for a bad candidate: what went wrong is in the result's status and error."""
    opts = make_options(
        trials=trials,
        timed_runs=timed_runs,
        warmup=warmup,
        atol=atol,
        rtol=rtol,
        compare_compile=compare_compile,
        device=device,
        timeout=timeout,
        **options,
    )
    if isinstance(problem, str):
        problem = Problem.from_source(problem)
    if not isinstance(candidate_source, str):
        raise TypeError("candidate_source must be the candidate's Python source (a str)")
    if pool is None:
        pool = default_pool()
    return pool.submit_options(problem, candidate_source, opts).result()


def run_evaluation(
    problem: Problem | str,
    candidate_source: str,
    options: EvalOptions | None = None,
    on_phase: Callable[[str], None] | None = None,
    judge=None,
) -> EvalResult:
    """Run one evaluation in this process. This imports and runs the candidate here: only worker
    processes call it (evaluate() does that for you). `on_phase("loaded")` is called once the
    candidate is built, so a pool can switch from the compile timeout to the run timeout.
    `judge`: the reference's side of the comparisons (a worker's RemoteJudge to its pool's
    reference process); None judges here, against a reference built in this process."""
    options = options or EvalOptions()
    if isinstance(problem, str):
        problem = Problem.from_source(problem)
    result = EvalResult(
        problem=problem.name,
        problem_hash=problem.hash,
        candidate_hash=hashlib.sha256(candidate_source.encode()).hexdigest(),
        seed=options.seed,
    )
    started = time.perf_counter()
    run = _Evaluation(problem, candidate_source, options, result, on_phase, judge)
    try:
        run.execute()
    except _Stop:
        pass
    except Exception as e:  # noqa: BLE001 - the harness itself failed: say so, never hang up
        with contextlib.suppress(_Stop):
            run.fail_from_exception(e, where="harness")
    finally:
        cleaning = time.perf_counter()
        run.cleanup()
        result.phase_seconds["cleanup"] = time.perf_counter() - cleaning
    result.phase_seconds["total"] = time.perf_counter() - started
    return result


class _Evaluation(CorrectnessPhases, TimingPhases):
    """One evaluation, its phases in order."""

    def execute(self) -> None:
        torch = self.torch
        with torch.no_grad():
            self.timed("setup", self.setup)
            self.timed("load", self.load)
            self.timed("correctness", self.correctness)
            with gpu_quiet() as waited:  # no other process of the pool on the GPU meanwhile
                if waited is not None:  # a phase of its own: the phases add up to the whole
                    self.result.phase_seconds["gpu_lock_wait"] = waited
                self.timed("timing", self.timing)
            self.timed("revalidation", self.revalidation)
            self.timed("end", lambda: self.check_tampering("the end"))
            if self.opts.compare_compile:
                self.timed("compile_reference", self.compile_reference)
            if self.opts.profile:
                self.timed("profile", self.run_profile)
        self.finish()
